#!/usr/bin/env bash
# The Python half of the test suite (scripts/test.sh runs it last): build the abi3 wheel, check
# its manylinux tag, install it with its extras into a venv made fresh for this run, and run the
# pytest suite (tests/python, including the docs' code blocks) against the installed wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== Python package: build the abi3 wheel (dev profile, shared target dir), check it, install it into a fresh venv, pytest there [$(date +%T)]"
PY="${PYTHON:-python3}"
# Build tools live in a cached venv; the tests run in a venv made fresh for this run.
TOOLS="${ZRECORD_VENV:-$HOME/.cache/zrecord-venv}"
if [ ! -x "$TOOLS/bin/python" ]; then
  "$PY" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9,<2" auditwheel
# ZRECORD_WHEEL=path tests a wheel built elsewhere; ZRECORD_WHEEL_PROFILE=release builds the
# optimised wheel (what scripts/wheel.sh does; ~35 min on 2 cores from nothing).
if [ -n "${ZRECORD_WHEEL:-}" ]; then
  WHEEL="$ZRECORD_WHEEL"
else
  DIST="$CARGO_TARGET_DIR/wheels-test"
  rm -rf "$DIST"
  PROFILE_FLAG=()
  [ "${ZRECORD_WHEEL_PROFILE:-dev}" = release ] && PROFILE_FLAG=(--release)
  VIRTUAL_ENV="$TOOLS" PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/maturin" build --locked --quiet "${PROFILE_FLAG[@]}" --features python --out "$DIST" 2>&1 | tail -3
  WHEEL=$(ls "$DIST"/zrecord-*.whl)
fi
echo "wheel: $(basename "$WHEEL")"
case "$(basename "$WHEEL")" in
  *-abi3-manylinux*) ;;
  *) echo "expected an abi3 manylinux wheel, got $(basename "$WHEEL")"; exit 1 ;;
esac
AUDIT=$("$TOOLS/bin/auditwheel" show "$WHEEL")
sed -n 1,4p <<< "$AUDIT"
grep -q 'consistent with' <<< "$AUDIT" || { echo "auditwheel found no manylinux tag for $WHEEL"; exit 1; }

# From here on no Rust toolchain on PATH: the wheel must install and work without one.
NORUST_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e '\.rustup' | paste -sd: -)
if PATH="$NORUST_PATH" command -v cargo >/dev/null 2>&1; then
  echo "note: cargo is still reachable at $(PATH="$NORUST_PATH" command -v cargo)"
fi
export PATH="$NORUST_PATH"
# The test venvs (third-party packages only): prepared by scripts/test.sh while cargo built
# (ZRECORD_TEST_ENV), else here.
if [ -n "${ZRECORD_TEST_ENV:-}" ]; then
  TESTVENV="$ZRECORD_TEST_ENV"
  [ -f "$TESTVENV/ready" ] || { echo "ZRECORD_TEST_ENV=$TESTVENV is not a prepared environment (scripts/python_env.sh)"; exit 1; }
else
  TESTVENV="$(mktemp -d "${TMPDIR:-/tmp}/zrecord-wheel-test.XXXXXX")"
  trap 'rm -rf "$TESTVENV"' EXIT
  bash scripts/python_env.sh "$TESTVENV"
fi
TPY="$TESTVENV/venv/bin/python"
# The wheel with its extras: test tools (pytest, pyarrow, polars, ml_dtypes, tqdm, mkdocs), Hugging
# Face conversion (datasets, Pillow), the datafusion package for the FFI table test, the framework
# adapters (optional: their tests skip, saying so, if an extra cannot be installed).
"$TPY" -m pip install -q --disable-pip-version-check "$WHEEL[test,hf,sql]"
for extra in torch grain jax; do
  "$TPY" -m pip install -q --disable-pip-version-check "$WHEEL[$extra]" || echo "$extra not installed: its tests will be skipped"
done
# The extras above must have brought these (pip only warns about an extra a wheel lacks).
"$TPY" -c "import pytest, pyarrow, polars, ml_dtypes, tqdm, mkdocs, material, datasets, PIL, datafusion" \
  || { echo "the wheel's test/hf/sql extras did not install their packages"; exit 1; }
"$TPY" - <<'PYEOF'
import importlib.util
for m in ("torch", "torchdata", "grain", "jax"):
    print(f"{m}: {'installed' if importlib.util.find_spec(m) else 'NOT installed (its tests skip)'}")
PYEOF
# Run from the repository root: `zrecord` must come from the installed wheel, not the source tree.
"$TPY" -c "import zrecord, sys; assert 'site-packages' in zrecord.__file__, zrecord.__file__; print('testing', zrecord.__file__)"
# The CLI tests (conversion, Ballista processes, remote gc) and the docs' shell blocks run the
# wheel's own `zrec` console script (pip users' zrec, the clap CLI inside the extension), with
# no Rust toolchain on PATH.
test -x "$(dirname "$TPY")/zrec" || { echo "the wheel installed no zrec command"; exit 1; }
"$TPY" -m pytest tests/python -q -p no:cacheprovider -rs --durations=12

# The conversion tests again with the oldest `datasets`, pyarrow and numpy pyproject.toml allows
# (the run above had the newest pip resolves); conversion reads a private mapping of `datasets`
# with a tested fallback.
OLD="$TESTVENV/venv-datasets-oldest/bin/python"
"$OLD" -m pip install -q --disable-pip-version-check "$WHEEL[test,hf]"
versions='import datasets, pyarrow, numpy; print("datasets", datasets.__version__, "pyarrow", pyarrow.__version__, "numpy", numpy.__version__)'
echo "== conversion tests, oldest supported: $("$OLD" -c "$versions"); newest (above): $("$TPY" -c "$versions") [$(date +%T)]"
"$OLD" -m pytest tests/python/test_convert.py -q -p no:cacheprovider
# Each venv goes once its tests ran (the main one holds torch and the CUDA libraries, ~6 GB): a
# machine with little disk still gets through the interpreters below.
# (Only venvs this run made: scripts/test.sh's, or the one made above.)
if [ -z "${ZRECORD_TEST_ENV:-}" ] || [ "${ZRECORD_TEST_ENV_DISPOSABLE:-0}" = 1 ]; then
  rm -rf "$TESTVENV/venv" "$TESTVENV/venv-datasets-oldest"
fi

# abi3: the same wheel on other interpreters (ZRECORD_EXTRA_PYTHONS, a space-separated list of
# python executables; CI passes the oldest and newest CPython of its machine), core extras only
# (their torch / HF / Grain / JAX tests skip).
for XPY in ${ZRECORD_EXTRA_PYTHONS:-}; do
  [ -x "$XPY" ] || continue
  XV="$TESTVENV/venv-$("$XPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  echo "== the wheel on $("$XPY" --version) [$(date +%T)]"
  "$XPY" -m venv "$XV"
  "$XV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL[test]"
  "$XV/bin/python" -m pytest tests/python -q -p no:cacheprovider
  rm -rf "$XV"
done
echo "== all tests passed [$(date +%T)]"
