"""The extension's type stubs cannot drift: `mypy.stubtest` checks every class, function,
parameter name, default and kind of `zrecord/_zrecord.pyi` against the built extension."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_stubs_match_the_extension():
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "zrecord._zrecord", "--concise", "--ignore-disjoint-bases",
         "--allowlist", os.path.join(HERE, "stubtest_allowlist.txt")],
        capture_output=True, text=True, timeout=600, cwd=HERE,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
