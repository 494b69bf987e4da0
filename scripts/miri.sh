#!/usr/bin/env bash
# The unit tests of the modules with unsafe code that miri can execute, under miri (undefined
# behaviour, out-of-bounds and use-after-free checks, Stacked Borrows): the memory pool and its
# uninitialised regions, tensors and ragged batches built in them, DLPack export/import, Arrow
# buffers over pooled memory, the sampler, the Zarr scatter kernels. (Store reads map files, and zstd is C: miri runs
# neither; those paths are covered by the ASan fuzz targets, scripts/fuzz.sh.)
# Needs the nightly toolchain with the miri and rust-src components.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${ZRECORD_MIRI_TARGET_DIR:-$PWD/target/miri}"
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation -Zmiri-strict-provenance}"
cargo +nightly miri setup
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(memory:: loader::sampler arrow::tensor zarr::cast zarr::query)
cargo +nightly miri test --lib -- "${filters[@]}"
