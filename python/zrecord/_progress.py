"""Progress bars for long calls (verify, writes, conversion, COPY, dictionary training).

``progress=None`` (the default everywhere) shows a tqdm bar only when tqdm is installed and the
call runs longer than two seconds; ``progress=True`` shows it at once; ``progress=False`` or the
environment variable ``ZRECORD_PROGRESS=0`` never shows one. Bars go to stderr."""

from __future__ import annotations

import os

DELAY_SECONDS = 2.0
# With progress=None, calls whose input is known to be smaller than this never set up a bar
# (small appends in a loop pay nothing for it).
MIN_BYTES = 64 << 20


def enabled(progress):
    if progress is False:
        return False
    if progress is None and os.environ.get("ZRECORD_PROGRESS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return True


def bar(total, desc, unit="rec", progress=None, nbytes=None):
    """A tqdm bar (or None when progress is off, the work is known to be small, or tqdm is not
    installed)."""
    if not enabled(progress):
        return None
    if progress is None and nbytes is not None and nbytes < MIN_BYTES:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, delay=0 if progress else DELAY_SECONDS, leave=bool(progress))
