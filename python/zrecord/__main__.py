"""``python -m zrecord ARGS`` is ``zrec ARGS``."""

from zrecord._cli import entry

entry()
