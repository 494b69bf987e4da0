#!/usr/bin/env bash
# The Rust test suite under a sanitizer (nightly toolchain):
#
#   scripts/sanitize.sh address   # AddressSanitizer + LeakSanitizer: every lib and integration test
#   scripts/sanitize.sh thread    # ThreadSanitizer (std rebuilt instrumented, needs rust-src):
#                                 # the concurrent parts: pool, loader, sampler, concurrent gathers,
#                                 # gathers racing close, the hostile-input tests
#
# Extra arguments go to the test binaries (a name filter, --test-threads ...). Each sanitizer
# builds the whole dependency tree once into its own target directory (ZRECORD_SANITIZE_TARGET_DIR,
# default ./target/sanitize-<kind>): about 45 min for address and 60 for thread on 2 cores, then
# incremental. Doc tests are not run (rustdoc would need the same flags; they hold no unsafe code).
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-address}"
shift || true
triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="${ZRECORD_SANITIZE_TARGET_DIR:-$PWD/target/sanitize-$kind}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
supp="$PWD/scripts/sanitize"
case "$kind" in
  address)
    export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes --cfg zrecord_sanitize"
    # Leaks are checked; the suppressions cover threads of detached pools still exiting at the
    # check (glibc's thread-local destructor list), the same list the fuzz targets use.
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1}"
    export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}"
    targets=(--lib --bins --tests)
    build_std=()
    ;;
  thread)
    export RUSTFLAGS="-Zsanitizer=thread -Cforce-frame-pointers=yes --cfg zrecord_sanitize"
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp}"
    targets=(--lib --test it)
    build_std=(-Zbuild-std)
    ;;
  *)
    echo "usage: $0 address|thread [test args...]" >&2
    exit 2
    ;;
esac
cargo +nightly test --locked --no-fail-fast "${build_std[@]}" --target "$triple" "${targets[@]}" -- "$@"
