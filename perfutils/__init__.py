"""Performance tools for the loss kernels, in rooms (README "The rooms of the code" says where a change goes).

* ``perfutils.data`` — what a recorded file is (schema, records, store, metadata); every other room reads it.
* ``perfutils.model`` — models that need no GPU: hardware limits, occupancy, roofline, register counts.
* ``perfutils.measure`` (the harness: timing, sweeps, sessions, Nsight Compute), ``perfutils.peers`` (Fast-LLM's
  kernels) and ``perfutils.studies`` (one module per study, ``python -m perfutils <study>``) run on a GPU.
* ``perfutils.plots`` — figures and tables, each a function of a recorded DataFrame (it reads ``data`` only).
* At the top: ``cli`` (``python -m perfutils``), ``report`` (``make report``) and ``notebook`` (what every
  notebook needs first: its folders, its MODE).

Rooms and modules are imported on first use (``perfutils.model``...), so importing perfutils is cheap and
works on a machine without a GPU.
"""

import importlib

_SUBMODULES = ("cli", "data", "measure", "model", "notebook", "peers", "plots", "report", "studies")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"perfutils.{name}")
    raise AttributeError(f"module 'perfutils' has no attribute {name!r}")


__all__ = list(_SUBMODULES)
