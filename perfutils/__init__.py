"""Performance tools for the loss kernels, in three rooms and a front door.

* ``perfutils.model`` — models that need no GPU: hardware limits, occupancy, roofline, register counts
  (the analytic estimate, and offline sm_90 compiles).
* ``perfutils.measure`` — everything that runs on a GPU and records: timing, sweeps, studies, the data files.
* ``perfutils.plots`` — figures and tables, each a function of a recorded DataFrame.
* At the top: ``cli`` (``python -m perfutils``), ``report`` (``make report``) and ``notebook`` (what every
  notebook needs first: its folders, its MODE).

Rooms and modules are imported on first use (``perfutils.model``...), so importing perfutils is cheap and
works on a machine without a GPU.
"""

import importlib

_SUBMODULES = ("cli", "measure", "model", "notebook", "plots", "report")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"perfutils.{name}")
    raise AttributeError(f"module 'perfutils' has no attribute {name!r}")


__all__ = list(_SUBMODULES)
