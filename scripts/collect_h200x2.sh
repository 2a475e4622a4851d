#!/usr/bin/env bash
# The tensor-parallel measurements (issue 16) on two H200 GPUs of one host, from the repo root (the project need not
# be installed: PYTHONPATH is set here). Each stage fits in one command of at most ~8 minutes; `tp` is resumable.
#   scripts/collect_h200x2.sh tp        # tp=2 (both designs, + Fast-LLM's TP path if FAST_LLM_PATH names a checkout)
#                                       # vs tp=1 -> data/<gpu-slug>/tensor_parallel.csv + .json; prints "done" when the
#                                       # grid is complete, else "run the same command again" (time budget reached)
#   scripts/collect_h200x2.sh tp-smoke  # ~2 minutes: two losses at 4096 x 131072 into /tmp/tp-smoke (not data/),
#                                       # to see that everything runs before the full grid
#   scripts/collect_h200x2.sh tp-tests  # the vocab-parallel tests on the two GPUs (NCCL, compiled kernels)
#   scripts/collect_h200x2.sh nvlink    # ~30 s: the NVLink between the two GPUs as the exchange uses it (bulk copies,
#                                       # the exchange's stores, a word's round trip) -> data/<gpu-slug>/nvlink.csv
# NVLink multicast stays off, for this shell and every process it starts (it can put a shared host's GPUs out of
# service): NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
set -euo pipefail
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stage="${1:?stage: tp | tp-smoke | tp-tests | nvlink}"
case "$stage" in
  tp)
    args=(--out data --budget-s "${BUDGET_S:-360}")
    if [ -n "${FAST_LLM_PATH:-}" ]; then args+=(--fast-llm "$FAST_LLM_PATH"); fi
    python3 -m perfutils tensor-parallel "${args[@]}"
    slug=$(python3 -c "import torch; from perfutils.data.schema import gpu_slug; print(gpu_slug(torch.cuda.get_device_name(0)))")
    python3 -c "from perfutils.plots.tensor_parallel import print_summary; print_summary('data/$slug/tensor_parallel.csv')" ;;
  tp-smoke)
    python3 -m perfutils tensor-parallel --out /tmp/tp-smoke --tokens 4096 --vocab 131072 \
      --losses cross_entropy/labels reverse_kl/logits ${FAST_LLM_PATH:+--fast-llm "$FAST_LLM_PATH"} ;;
  tp-tests)
    slug=$(python3 -c "import torch; from perfutils.data.schema import gpu_slug; print(gpu_slug(torch.cuda.get_device_name(0)))")
    log="data/$slug/logs/gpu_tests_vocab_parallel_$(date -u +%F).txt"
    mkdir -p "$(dirname "$log")"
    { nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())"
      timeout 540 python3 -m pytest tests/test_vocab_parallel.py -q -rs -p no:cacheprovider 2>&1; } | tee "$log" ;;
  nvlink) python3 -m perfutils nvlink --out data ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
