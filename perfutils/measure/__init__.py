"""The harness: what runs on a GPU and times, for every study (:mod:`perfutils.studies`), writing through the data room.

``timing`` (do_bench median/p20/p80, first call, peak memory, copy bandwidth), ``host_cost`` (host µs and syncs per
call), ``profiler`` (torch.profiler's kernel table), ``ncu`` (the Nsight Compute runner and parsers), ``sweep_config`` /
``sweep`` / ``measurer`` (a resumable grid, one configuration on the GPU; ``python -m perfutils sweep``), ``providers``
(who is measured: our variants and the baselines), ``session`` (one study's resumable data file).
"""
