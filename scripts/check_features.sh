#!/usr/bin/env bash
# The core (`--no-default-features`: stores, memory, io, gather, loader, Arrow and dataset
# conversion) and each optional feature on top of it alone must compile. `cargo check` only
# (no code generation); CI runs this after the test suite. Prints the time of each check.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
for f in "" sql ballista dist zarr remote text images; do
  start=$SECONDS
  cargo check --locked --lib --no-default-features ${f:+--features "$f"} --quiet
  echo "cargo check --no-default-features ${f:+--features $f}: ok ($((SECONDS - start)) s)"
done
