"""Every code block in docs/ runs: Python blocks in order in one namespace per page, `sh`
blocks line by line (the `zrec` CLI), each page in a fresh folder. Other fences must be `text`
(install commands, file trees, output), so no example can silently escape the check. Also: the
generated API page is up to date."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from _servers import zrec_bin

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*\n(.*?)^```\s*$", re.S | re.M)
REQUIRES = re.compile(r"<!--\s*requires:\s*([^>]*?)\s*-->")
README = ROOT / "README.md"
# The README's tour runs like a docs page; its set-up commands (```bash) are shown, not run.
PAGES = sorted(p for p in DOCS.rglob("*.md") if not p.is_symlink()) + [README]


def blocks(page):
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def test_pages_found_and_fences_known():
    assert len(PAGES) >= 10
    for page in PAGES:
        for lang, _ in blocks(page):
            allowed = ("python", "sh", "text", "bash") if page == README else ("python", "sh", "text")
            assert lang in allowed, f"{page.relative_to(ROOT)}: a ```{lang or '(none)'} block is neither run nor marked text"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) if p != README else "README.md" for p in PAGES])
def test_page_runs(page, tmp_path):
    """The page's blocks, in order, as one script in a fresh interpreter (pages do not share
    imports: a page that starts JAX threads must not leak them into one that forks)."""
    text = page.read_text()
    for req in REQUIRES.findall(text):
        for mod in req.split():
            pytest.importorskip(mod)
    runnable = [(lang, code) for lang, code in blocks(page) if lang in ("python", "sh")]
    if not runnable:
        pytest.skip("no runnable blocks")
    zrec = None
    script = ["import subprocess"]
    for i, (lang, code) in enumerate(runnable):
        where = f"{page.relative_to(ROOT)} block {i + 1}"
        script.append(f"# --- {where}")
        if lang == "python":
            script.append(code)
            continue
        if zrec is None:
            zrec = zrec_bin()  # the one the other tests run (skips when none is built)
        for line in code.strip().splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            assert argv[0] == "zrec", f"{where}: only zrec commands run in sh blocks, got {argv[0]}"
            script.append(f"subprocess.run({[zrec, *argv[1:]]!r}, check=True)")
    path = tmp_path / "page.py"
    path.write_text("\n".join(script) + "\n")
    env = dict(os.environ, ZRECORD_PROGRESS="0")
    r = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"{page.relative_to(ROOT)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def test_api_reference_is_current():
    pytest.importorskip("torch")  # the page documents zrecord.torch
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_api.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_site_builds_strict(tmp_path):
    """mkdocs (material theme) builds the site with --strict: no broken links or nav entries."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "tutorial" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
