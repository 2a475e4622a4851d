"""Models that need no GPU: what the hardware allows and what a kernel should cost.

``hardware`` (SM limits per compute capability, datasheet specs), ``occupancy`` (NVIDIA's occupancy
calculator, ported), ``roofline`` (ceilings, a loss's minimal bytes and flops, where a time sits under the
roofs), ``register_estimate`` (the back-of-envelope register count), and the offline sm_90 compile behind
register counts without a GPU: ``offline_compile`` (the entry point), ``specialization`` (what a launch
compiles), ``triton_compile`` and ``compile_worker`` (the compile, in a clean process), ``cubin`` and
``cuda_tools`` (running ptxas and the disassemblers; finding them is the data room's, whose sidecars record
them), ``compiled_kernel`` (the numbers a GPU launch reports).
"""
