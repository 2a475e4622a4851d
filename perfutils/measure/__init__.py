"""Everything that runs on a GPU and records what it measured: ``data/<gpu-slug>/<study>.csv`` + ``.json``.

* The data files: ``schema`` (columns, keys, where a file lives), ``records`` (reading, validating),
  ``store`` (atomic, resumable writing), ``metadata`` (the sidecar: GPU, clocks, versions, git state).
* Timing: ``timing`` (do_bench median/p20/p80, first-call time, peak memory, copy bandwidth).
* Sweeps over a grid: ``sweep_config`` (the grid), ``sweep`` (the resumable loop), ``measurer`` (one
  configuration on the GPU); ``python -m perfutils sweep`` runs one.
* Hand-picked studies: ``studies`` + ``providers`` (the #497 case study, the peer benchmark; ``case_497`` and
  ``fast_llm``: the #497 stages with Fast-LLM's own kernels run from a checkout; ``vocab_sweep`` + ``host_cost``:
  what users call over 17 vocabularies, with host µs and syncs per call, notebook 09), ``teaching``
  (notebooks 06/07), ``profiling`` with ``loss_step``, ``profiler`` and ``ncu`` (notebook 08), ``session`` (what
  the notebooks' own studies share), ``ceilings`` (the micro-benchmarks behind the roofline).
* Derived tables and checks: ``tuning`` (the table behind ``variant="auto"``), ``explorations`` (designs tried,
  in one file), ``occupancy_check`` (perfutils' occupancy against the driver's).
"""
