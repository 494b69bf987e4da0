#!/usr/bin/env bash
# The README's second command reuses the first's build: every dependency artifact that
# `cargo run --bin zrec` (the quick start) builds is the very artifact `cargo test` links, so the
# test build compiles only zrecord and the test-only crates. Dev-dependencies that turn on extra
# features of shared crates would give those crates (and everything above them: ring, rustls,
# object_store, DataFusion, Ballista) a second build; this check names any such crate.
# Needs both builds done (cheap otherwise: cargo only reports fresh artifacts).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
artifacts() {
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or m["package_id"].startswith("path+"):
        continue
    name = m["package_id"].rsplit("#", 1)[-1] + ":" + m["target"]["kind"][0]
    for f in m["filenames"]:
        print(name, f.rsplit("/", 1)[-1])'
}
cargo build --locked --bin zrec --message-format=json 2>/dev/null | artifacts | sort -u > "$CARGO_TARGET_DIR/reuse-run.txt"
cargo test --locked --no-run --message-format=json 2>/dev/null | artifacts | sort -u > "$CARGO_TARGET_DIR/reuse-test.txt"
# A crate of the first build whose artifact the second does not use is a second build of it.
missing=$(comm -23 "$CARGO_TARGET_DIR/reuse-run.txt" "$CARGO_TARGET_DIR/reuse-test.txt" | awk '{print $1}' | sort -u)
n_run=$(wc -l < "$CARGO_TARGET_DIR/reuse-run.txt")
n_extra=$(comm -13 "$CARGO_TARGET_DIR/reuse-run.txt" "$CARGO_TARGET_DIR/reuse-test.txt" | awk '{print $1}' | sort -u | wc -l)
if [ -n "$missing" ]; then
  echo "cargo test rebuilds dependencies that cargo run --bin zrec already built (features differ):"
  echo "$missing" | sed 's/^/  /'
  exit 1
fi
echo "build reuse: cargo test links all $n_run dependency artifacts of cargo run --bin zrec and adds $n_extra test-only crates"
