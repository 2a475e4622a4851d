"""The lab's own Triton kernels, kept out of the product (:mod:`kernels`): the teaching kernels of notebooks 05-07
(:mod:`.teaching`), the #497 case study's ablation family (:mod:`.case_study`), the micro-benchmarks behind the
measured ceilings (:mod:`.microbench`) and issue 39's explorations of rows streamed through TMA
(:mod:`.streamed_row`) and of a row's programs in one cluster (:mod:`.cluster_row`). They may use the product's
building blocks; the product never uses them."""
