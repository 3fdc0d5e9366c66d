"""numpy on first use: the device path (randomise, seal, send) must run where numpy is absent.

Modules write ``from deniable.core.lazy import numpy as np`` (under ``TYPE_CHECKING`` they import
the real module for mypy); the first attribute access imports numpy, or raises a one-line
ModuleNotFoundError naming the extra that installs it. ``FloatArray`` and ``IntArray`` are the
array annotations, real for mypy and placeholders at run time.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

NUMPY_HINT = (
    "numpy is needed here (vectorised aggregation, simulation, or the parameters of a shuffle-only "
    "protocol): pip install numpy, or deniable[server]"
)


class LazyModule:
    """Stands in for a module until an attribute is read, then forwards to the real one."""

    def __init__(self, name: str, hint: str) -> None:
        """Remember which module to import and what to say if it is not installed."""
        self._name = name
        self._hint = hint
        self._module: ModuleType | None = None

    def _load(self) -> ModuleType:
        """Import the module once; a clear error if it is missing."""
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ModuleNotFoundError as exc:
                raise ModuleNotFoundError(self._hint, name=self._name) from exc
        return self._module

    def __getattr__(self, attribute: str) -> Any:
        """Forward to the real module, importing it now if needed."""
        return getattr(self._load(), attribute)


numpy = LazyModule("numpy", NUMPY_HINT)
numpy_typing = LazyModule("numpy.typing", NUMPY_HINT)

if TYPE_CHECKING:
    import numpy as _np
    import numpy.typing as _npt

    FloatArray = _npt.NDArray[_np.float64]
    IntArray = _npt.NDArray[_np.int64]
else:  # annotations are not evaluated at run time; the names stay importable without numpy
    FloatArray = IntArray = object
