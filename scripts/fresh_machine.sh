#!/usr/bin/env bash
# Time the README's two quick-start commands as a newcomer meets them: a fresh clone of this
# checkout's HEAD, an empty cargo registry (a new CARGO_HOME: every crate is downloaded), no
# target folder, no pip cache, fresh build-tool and test venvs. Prints one line per command and
# their total; the logs stay in the work folder.
#
#   bash scripts/fresh_machine.sh [WORK_DIR]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d "${TMPDIR:-/tmp}/zrecord-fresh.XXXXXX")}
mkdir -p "$WORK"
rm -rf "$WORK/zrecord" "$WORK/cargo-home" "$WORK/tools-venv"
git clone -q "$SRC" "$WORK/zrecord"
cd "$WORK/zrecord"
# cargo and rustc stay the installed toolchain (rustup's RUSTUP_HOME); only the registry and
# build caches are new.
export CARGO_HOME="$WORK/cargo-home"
unset CARGO_TARGET_DIR
export PIP_NO_CACHE_DIR=1
export ZRECORD_VENV="$WORK/tools-venv"
export CARGO_TERM_COLOR=never

t0=$(date +%s)
cargo run --bin zrec -- demo > "$WORK/demo.log" 2>&1
t1=$(date +%s)
bash scripts/test.sh > "$WORK/test.log" 2>&1
t2=$(date +%s)
# Which crates the second command compiled (the first built the rest).
compiled=$(grep -c '^ *Compiling ' "$WORK/test.log" || true)
printf 'cargo run --bin zrec -- demo: %d s (%.1f min)\n' $((t1 - t0)) "$(awk "BEGIN {print ($t1 - $t0) / 60}")"
printf 'bash scripts/test.sh:         %d s (%.1f min), %s crates compiled: %s\n' $((t2 - t1)) "$(awk "BEGIN {print ($t2 - $t1) / 60}")" "$compiled" \
  "$(grep '^ *Compiling ' "$WORK/test.log" | awk '{print $2}' | sort -u | tr '\n' ' ')"
printf 'both:                         %d s (%.1f min)\n' $((t2 - t0)) "$(awk "BEGIN {print ($t2 - $t0) / 60}")"
echo "logs: $WORK/demo.log $WORK/test.log"
