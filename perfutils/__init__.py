"""Performance tools for the loss kernels: occupancy, registers, roofline, timing, sweeps, records, figures.

Submodules are imported on first use (``perfutils.occupancy``...), so importing perfutils is cheap
and works on a machine without a GPU.
"""

import importlib

_SUBMODULES = (
    "cli",
    "measure",
    "model",
    "notebook",
    "report",
    "plots",
)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"perfutils.{name}")
    raise AttributeError(f"module 'perfutils' has no attribute {name!r}")


__all__ = list(_SUBMODULES)
