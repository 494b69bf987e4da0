"""The ``zrec`` command for pip users: the console entry point ``zrec`` and ``python -m zrecord``
run the same clap command line that the Rust binary ``zrec`` is, compiled into the extension
(``zrecord._zrecord.cli_main``), so ``zrec info|verify|sql|convert|gc|demo|ballista`` need no
Rust toolchain.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``zrec`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit code."""
    from ._zrecord import cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    return cli_main(["zrec", *args])


def entry() -> None:
    """Console-script entry point (``[project.scripts] zrec``) and ``python -m zrecord``."""
    # This process exists to run the command: Ctrl-C ends it as it ends the binary (a
    # command's own handler, e.g. convert's cleanup, still replaces the default). SIGPIPE stays
    # ignored, as in the binary: Ballista servers and object-store clients must see EPIPE on
    # a closed socket, not die of it (a closed stdout ends the command with status 141).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())
