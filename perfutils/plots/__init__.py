"""Presentation: figures and tables, each a function of a recorded DataFrame (replayable on a CPU).

``figures`` (deterministic SVG/PNG files, captions), ``sweeps`` (notebooks 01-02: bandwidth vs occupancy,
heatmaps, the case study), ``roofline`` (03), ``occupancy`` (04), ``registers`` (05), ``teaching`` (06-07),
``profiling`` (08), ``vocab_sweep`` (09), ``summary`` (the README's Markdown results:
``python -m perfutils.plots.summary``).
"""
