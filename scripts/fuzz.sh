#!/usr/bin/env bash
# Coverage-guided fuzzing of everything that reads bytes a user did not write (libFuzzer via
# cargo fuzz, AddressSanitizer). Usage:
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 600 s, every target)
# Targets: store_mutate ragged_batch dataset_json copy_options arrow_convert zarr_meta
# convert_files text_state rendezvous flight_ticket (see fuzz/).
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). The corpus grows in
# fuzz/corpus/<target> (not committed) from the committed seeds in fuzz/seeds/<target>; a crash
# leaves its input in fuzz/artifacts/<target> and fails the script. Set ZRECORD_FUZZ_TARGET_DIR
# to keep the (long) sanitizer build outside the checkout. Prints one summary line per target.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-600}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(store_mutate ragged_batch dataset_json copy_options arrow_convert zarr_meta convert_files text_state rendezvous flight_ticket)
fi
export CARGO_TARGET_DIR="${ZRECORD_FUZZ_TARGET_DIR:-$PWD/target}"
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# Debug assertions on (overflow checks), optimised, with ASan.
cargo +nightly fuzz build --fuzz-dir .
mkdir -p logs
status=0
printf '%-14s %10s %12s %8s %8s %s\n' target seconds executions exec/s cov crashes
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
  log="logs/$t.log"
  before=$(ls "artifacts/$t" | wc -l)
  set +e
  cargo +nightly fuzz run --fuzz-dir . "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=4096 -timeout=60 -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -n1)
  rate=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -n1)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -n1 | grep -Eo '[0-9]+')
  after=$(ls "artifacts/$t" | wc -l)
  printf '%-14s %10s %12s %8s %8s %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$((after - before))"
  if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
    echo "  $t FAILED (rc $rc): see fuzz/$log and fuzz/artifacts/$t" >&2
    grep -E 'panicked|ERROR: AddressSanitizer|SUMMARY' "$log" | head -n 5 >&2 || true
    status=1
  fi
done
exit $status
