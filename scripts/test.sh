#!/usr/bin/env bash
# The whole test suite (the README's test command). Installs nothing system-wide beyond what
# it checks for; CI's .ci/run prepares the machine and then calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's ./target unless told otherwise: the README's two commands (`cargo run --bin
# zrec -- demo` and this script) then share one build. CI points it at a cache outside the clone.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# The Python test venvs (torch, JAX, datasets... ~4 GB of downloads) are prepared in the
# background while cargo compiles; scripts/test_python.sh waits for nothing else.
PYENV="$(mktemp -d "${TMPDIR:-/tmp}/zrecord-test-env.XXXXXX")"
setsid bash scripts/python_env.sh "$PYENV" > "$PYENV/prepare.log" 2>&1 &
PYENV_JOB=$!
# `set +e` first: under `set -e` a failing cleanup command (kill of a job that already ended)
# would replace the script's exit status with 1.
trap 'set +e; kill -- -$PYENV_JOB 2>/dev/null; kill $PYENV_JOB 2>/dev/null; wait $PYENV_JOB 2>/dev/null; rm -rf "$PYENV"' EXIT

echo "== cargo test (unit, integration, property, doc tests, sql/*.slt) [$(date +%T)]"
cargo test --locked

echo "== examples compile (dev profile; CI's .ci/run also compiles the benches) [$(date +%T)]"
cargo build --locked --examples --quiet

echo "== examples [$(date +%T)]"
cargo run --locked --quiet --example transcode

echo "== quick start: zrec demo on the built-in sample (dev profile, small scale) [$(date +%T)]"
cargo run --locked --quiet --bin zrec -- demo --scale 0.05

echo "== unsafe code under valgrind memcheck (memory, codec, arrow unit tests) [$(date +%T)]"
if command -v valgrind >/dev/null 2>&1; then
  bin=$(cargo test --locked --lib --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "zrecord":
        print(m["executable"])' | tail -1)
  # One run for every filter (the test binary's symbols are read once).
  valgrind --quiet --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    "$bin" --test-threads=1 -q memory:: store::codec:: io:: store::publish:: arrow::
else
  echo "valgrind not installed: skipped (CI installs it)"
fi
echo "== Python test environments (prepared while cargo built) [$(date +%T)]"
if ! wait $PYENV_JOB; then
  tail -n 30 "$PYENV/prepare.log"
  echo "preparing the Python test environments failed (log above)"
  exit 1
fi
grep -i -e "not installed" -e "environments ready" "$PYENV/prepare.log" || true
ZRECORD_TEST_ENV="$PYENV" ZRECORD_TEST_ENV_DISPOSABLE=1 bash scripts/test_python.sh
