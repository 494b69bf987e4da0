#!/usr/bin/env bash
# Prepare the Python test environments in DIR (scripts/test.sh runs this in the background while
# cargo compiles, so the downloads overlap the build): a venv with the third-party packages of
# the wheel's extras (test, hf, sql, then torch, grain, jax, each optional) and MPI, and a second
# venv with the oldest `datasets` the `hf` extra allows, for the conversion tests. Nothing of
# zrecord is installed here: scripts/test_python.sh installs the wheel it builds into both.
#
#   bash scripts/python_env.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: python_env.sh DIR}
PY="${PYTHON:-python3}"
# Like the wheel, its dependencies must install without a Rust toolchain.
export PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e '\.rustup' | paste -sd: -)"
PIP=(-m pip install -q --disable-pip-version-check)

# The requirement lines of the named extras (and the base dependencies), read from pyproject.toml.
reqs() {
  "$PY" - "$@" <<'PYEOF'
import ast
import re
import sys

try:
    import tomllib

    project = tomllib.load(open("pyproject.toml", "rb"))["project"]
    deps, extras = project["dependencies"], project["optional-dependencies"]
except ImportError:  # Python 3.10: the one-line lists of this pyproject.toml, read directly
    text = open("pyproject.toml").read()
    deps = ast.literal_eval(re.search(r"^dependencies = (\[.*\])$", text, re.M).group(1))
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = {m.group(1): ast.literal_eval(m.group(2)) for m in re.finditer(r"^([a-z]+) = (\[.*\])$", section, re.M)}
lines = list(deps)
for extra in sys.argv[1:]:
    lines += extras[extra]
print("\n".join(lines))
PYEOF
}

"$PY" -m venv "$DIR/venv"
V="$DIR/venv/bin/python"
"$V" "${PIP[@]}" -r <(reqs test hf sql)
# Framework adapters: the PyPI torch wheel brings the CUDA libraries (~5 GB installed); each is
# optional, and its tests skip (saying so) if it cannot be installed.
"$V" "${PIP[@]}" -r <(reqs torch) || echo "torch not installed: zrecord.torch tests will be skipped"
"$V" "${PIP[@]}" -r <(reqs grain) || echo "grain not installed: its test will be skipped"
"$V" "${PIP[@]}" -r <(reqs jax) || echo "jax not installed: its tests will be skipped"
# MPI for the distributed store's mpiexec tests: mpi4py and the mpich wheel (brings mpiexec).
"$V" "${PIP[@]}" mpi4py mpich || echo "mpi4py / mpich not installed: the mpiexec tests will be skipped"

# The oldest supported conversion stack: `datasets`, pyarrow and numpy at the floors pyproject.toml
# states (newest patch of that minor): the main venv has the newest pip resolves, this one the
# oldest, and both run the conversion tests.
floor() { reqs test hf | sed -n "s/^$1>=\([0-9][0-9.]*\).*/\1/p" | head -1; }
oldest=()
for pkg in datasets pyarrow numpy; do
  oldest+=("$pkg~=$(floor $pkg).0")
done
"$PY" -m venv "$DIR/venv-datasets-oldest"
"$DIR/venv-datasets-oldest/bin/python" "${PIP[@]}" -r <(reqs test hf | grep -v -e '^datasets' -e '^pyarrow' -e '^numpy') "${oldest[@]}"
echo "test environments ready [$(date +%T)]"
touch "$DIR/ready"
