#!/usr/bin/env bash
# Release wheel: `maturin build --release` (abi3, CPython >= 3.10), manylinux check, install into
# a fresh venv with no Rust toolchain on PATH, and the whole pytest suite against it. Too long for
# CI's budget on 2 cores (~35 min from nothing), so run it before a release; CI tests the dev-profile
# wheel the same way. The wheel is left in $CARGO_TARGET_DIR/wheels-test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# The test binary for the CLI-based tests comes from a dev build.
cargo build --locked --quiet --bin zrec
ZRECORD_WHEEL_PROFILE=release bash scripts/test_python.sh
