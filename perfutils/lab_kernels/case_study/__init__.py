"""Kernels that exist only for the case study of notebook 02 (Fast-LLM issue #497).

``ablation``: a reverse-KL forward+backward kernel family that walks, one ``tl.constexpr`` switch at a
time, from a re-implementation in spirit of the #497 kernel to the project's fused kernel
(:mod:`kernels.fused`). Not part of the public API (``kernels.prepare`` does not know these variants);
the measurement harness reaches them through :mod:`perfutils.measure.providers`.
"""
