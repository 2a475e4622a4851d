"""Teaching kernels of notebooks 05 (register pressure), 06 (Triton basics), 07 (fusion) and 12 (the learning path):
small, commented line by line.

The notebooks display their source instead of defining them; each module holds one kernel (or one family),
its host wrapper, its PyTorch reference and the traffic the notebook counts:

* ``vector_add`` (06): ``add_kernel`` with a boundary mask, the same kernel under ``triton.autotune``;
* ``softmax`` (06): one program per row, the row kept on chip, beside the naive five-op version;
* ``activations`` (07): ReLU / sigmoid / swish in one pass, against PyTorch's unfused and fused ops;
* ``evonorm`` (07): a normalisation + activation (EvoNorm-B0 style) fused into one pass;
* ``label_index`` (05): cross-entropy's one-hot term with the label tested in the row's int64 frame or the tile's
  int32 one (what the index arithmetic costs in registers and instructions);
* ``lagged_exchange`` (12, step 7): the lagged split-row exchange of ``kernels.split_row`` without the product's
  machinery, cross-entropy from labels, one launch per step on a CPU;
* ``checks``: the argument checks they share.

Measured by :mod:`perfutils.studies.teaching`, drawn by :mod:`perfutils.plots.teaching`.
"""
