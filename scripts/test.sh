#!/usr/bin/env bash
# The whole test suite (the README's test command). Installs nothing system-wide beyond what
# it checks for; CI's .ci/run prepares the machine and then calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/zrecord-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== cargo test (unit, integration, property, doc tests, sql/*.slt)"
cargo test --locked

echo "== benches and examples compile (dev profile)"
cargo build --locked --benches --examples --quiet

echo "== examples"
cargo run --locked --quiet --example transcode

echo "== quick start: zrec demo on the built-in sample (dev profile, small scale)"
cargo run --locked --quiet --bin zrec -- demo --scale 0.05

echo "== unsafe code under valgrind memcheck (memory, codec, arrow unit tests)"
if command -v valgrind >/dev/null 2>&1; then
  bin=$(cargo test --locked --lib --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "zrecord":
        print(m["executable"])' | tail -1)
  for filter in memory:: store::codec:: store::bytes:: store::publish:: arrow::; do
    valgrind --quiet --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
      "$bin" --test-threads=1 -q "$filter"
  done
else
  echo "valgrind not installed: skipped (CI installs it)"
fi
echo "== Python package: venv, maturin develop (dev profile, shared target dir), pytest"
VENV="${ZRECORD_VENV:-$HOME/.cache/zrecord-venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Test dependencies (CPU wheels only; torch from PyPI pulls CUDA and is left out, see README).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "maturin>=1.5,<2" "numpy>=1.26" pytest pyarrow polars ml_dtypes
# Dataset conversion tests: Hugging Face datasets, Pillow as the image reference, tqdm progress.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check datasets Pillow tqdm
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "jax[cpu]" 2>/dev/null \
  || echo "jax not installed: its DLPack test will be skipped"
# The datafusion package of the crate's major version, for the datafusion-ffi table provider test.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "datafusion>=55,<56"
VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" develop --quiet --features python 2>&1 | tail -3
# The CLI conversion tests run the zrec binary `cargo test` built.
ZREC_BIN="$CARGO_TARGET_DIR/debug/zrec" "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider
echo "== all tests passed"
