"""Presentation: figures and tables, each a function of a recorded DataFrame (replayable on a CPU).

``figures`` (deterministic SVG/PNG files, captions), ``sweeps`` (notebook 01: bandwidth vs occupancy,
heatmaps), ``case_study`` (02: the #497 kernel, its spills, the ablation, the fixes), ``roofline`` (03),
``occupancy`` (04), ``registers`` (05), ``teaching`` (06-07), ``profiling`` (08), ``vocab_sweep`` (09),
``tensor_parallel`` (10), ``prediction`` and ``designs`` (11: the model's check, the kernel designs tried),
``summary`` (the results tables of the report's landing page, in Markdown: ``python -m perfutils.plots.summary``).
"""
