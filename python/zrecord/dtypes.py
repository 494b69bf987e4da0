"""The dtype catalog: native-endian bool, integers, floats, complex, bfloat16 and float8.

Each name is a NumPy dtype where NumPy (or ``ml_dtypes``, when installed) has one, else the
catalog name string; writers accept either, plus NumPy dtypes and type objects.
"""

from __future__ import annotations

import numpy as _np

from ._zrecord import dtype_names as _dtype_names

try:  # bfloat16 and float8 types live in ml_dtypes
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - depends on the environment
    _ml = None

NAMES: tuple[str, ...] = tuple(_dtype_names())


def as_numpy(name: str):
    """The NumPy dtype for a catalog name, or the name itself when NumPy lacks the type."""
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        if _ml is not None:
            return _np.dtype(getattr(_ml, name))
        return name
    return _np.dtype(name)


for _n in NAMES:
    globals()[_n] = as_numpy(_n)

bool_ = as_numpy("bool")

__all__ = list(NAMES) + ["NAMES", "as_numpy", "bool_"]
