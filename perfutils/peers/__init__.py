"""Other projects' kernels, measured beside ours: ``fast_llm`` (Fast-LLM's entropy-loss kernels, run from the
checkouts named in ``$FAST_LLM_PATH``). Liger's and quack's come from their installed packages
(:mod:`perfutils.measure.providers`)."""
