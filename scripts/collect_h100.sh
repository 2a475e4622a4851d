#!/usr/bin/env bash
# How the committed H100 data was produced: stages run on the GPU machine from the repo root, each
# well under 10 minutes; every stage is resumable (rerun it and it measures only what is missing).
#   scripts/collect_h100.sh ceilings|tuning|unsplit-tuning|case|fused|two_pass|benchmark|resume-demo|ptxas-torch|gpu-tests|host-overhead|
#                           occupancy|tuning-table|forget-project|remeasure-project|ncu-split-row|
#                           case-497-measure|case-497-ablation|case-497-ncu [extra args for perfutils.studies.case_497]|
#                           vocab-stages|vocab-<stage> [more stages]
# The case-497 stages run Fast-LLM from the checkouts in FAST_LLM_PATH (see perfutils/studies/case_497.py), e.g.
#   PYTHONPATH=$PWD FAST_LLM_PATH=.peers/fast_llm-27f4747e:.peers/fast_llm-7d61a1ba scripts/collect_h100.sh case-497-measure
# The vocab sweep (notebook 09: the public call, its autograd form, the kernel-only plan and the peers over 17
# vocabularies) is cut into stages of a few minutes each; `vocab-stages` lists them (no GPU), `vocab-<stage>` runs
# one (each stops starting rows after 7 minutes; run it again to resume). The peers stages run Fast-LLM HEAD from
# FAST_LLM_PATH (left out with a message without it), e.g.
#   PYTHONPATH=$PWD FAST_LLM_PATH=.peers/fast_llm-7d61a1ba scripts/collect_h100.sh vocab-peers-4096-1
# Issue 13's grid with every provider of a cell in one process (public_call.csv: public call, autograd form, plan,
# Fast-LLM): vocab-same-4096-1 and vocab-same-16384-1, with FAST_LLM_PATH as above.
# Where the tree was copied to the GPU machine with an older .git (git_commit would name that older commit), name
# the code's commit for the sidecars: FUSED_LOSS_CODE_COMMIT=<git rev-parse HEAD of the copied tree>.
set -euo pipefail
export PYTHONUNBUFFERED=1
stage="${1:?stage}"
shift
case "$stage" in
  ceilings)
    python3 - <<'PY'
from pathlib import Path
import torch
from perfutils.studies import ceilings
from perfutils.data import metadata, schema
df = ceilings.measure_ceilings()
copy = float(df.loc[df["ceiling"].str.startswith("dram_copy"), "value"].max())
path = schema.data_path("data", torch.cuda.get_device_name(), "ceilings")
if path.exists():
    raise SystemExit(f"{path} exists: not overwriting recorded ceilings")
meta = metadata.collect_metadata({"study": "ceilings"}, copy)
meta["copy_gbps"] = copy
ceilings.write_ceilings(df, path, meta)
print(df.to_string())
PY
    ;;
  tuning) python3 -m perfutils sweep --config notebooks/params/split_row_tuning.yaml ;;
  unsplit-tuning) python3 -m perfutils sweep --config notebooks/params/split_row_unsplit_tuning.yaml ;;
  case) python3 -m perfutils studies case_study --out data ;;
  fused) python3 -m perfutils sweep --config notebooks/params/sweep_fused.yaml ;;
  two_pass) python3 -m perfutils sweep --config notebooks/params/sweep_two_pass.yaml ;;
  benchmark)
    python3 -m perfutils studies benchmark --out data --tokens 4096 --vocab 32768 65536 131072 262144
    python3 -m perfutils studies benchmark --out data --tokens 1024 16384 --vocab 32768 131072 ;;
  resume-demo)  # SIGKILL a real sweep mid-way, check the CSV, resume it
    rm -rf /tmp/resume_demo
    timeout -s KILL 12 python3 -m perfutils sweep --config notebooks/params/resume_demo.yaml || echo "killed: exit $?"
    f=$(ls /tmp/resume_demo/*/resume_demo.csv); echo "rows after kill: $(($(wc -l < "$f") - 1))"
    python3 -c "from perfutils.data.records import load_records; print('loads cleanly:', len(load_records('$f')), 'rows')"
    python3 -m perfutils sweep --config notebooks/params/resume_demo.yaml | grep -E "already|done"
    echo "rows after resume: $(($(wc -l < "$f") - 1))" ;;
  ptxas-torch)  # the same kernels built by torch's ptxas (what torch.compile switches a process to)
    TRITON_PTXAS_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas"))')" \
      python3 -m perfutils sweep --config notebooks/params/ptxas_torch_spot.yaml ;;
  gpu-tests)  # GPU_TEST_SHARDS pytest processes side by side (default 8): a cold machine spends the suite compiling
    # (CPU-bound, 16 cores) and the tests time nothing; one process at a time takes > 500 s cold, 8 take ~2 minutes.
    # Each shard has its own tuning cache (no two processes writing one file); ${OUT:-/tmp}/gpu_tests_shard_*.txt
    shards="${GPU_TEST_SHARDS:-8}" logs="${OUT:-/tmp}"
    python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu_kernels.py tests/test_gpu_operators.py tests/test_training.py \
      tests/test_gpu_vocab_sweep.py 2>/dev/null | grep '::' > /tmp/gpu_test_ids
    for s in $(seq 0 $((shards - 1))); do
      awk -v s="$s" -v n="$shards" 'NR % n == s' /tmp/gpu_test_ids > "/tmp/gpu_test_ids_$s"
      mapfile -t ids < "/tmp/gpu_test_ids_$s"  # one id a line: ids hold spaces ("all -inf")
      FUSED_LOSS_CACHE_DIR="/tmp/gpu_tests_tune_$s" python3 -m pytest -q -rs -p no:cacheprovider \
        "${ids[@]}" > "$logs/gpu_tests_shard_$s.txt" 2>&1 &
    done
    failed=0
    for job in $(jobs -p); do wait "$job" || failed=1; done
    tail -n 3 "$logs"/gpu_tests_shard_*.txt
    exit "$failed" ;;
  host-overhead) python3 -m perfutils host-overhead --out data ;;  # host_overhead.csv: each piece of a call
  occupancy) python3 -m perfutils occupancy-check --out data ;;
  tuning-table) python3 -m perfutils tuning --gpu-dir data/h100-sxm-80gb --overwrite ;;
  forget-project)  # after a kernel or tuning-table change: forget the project variants' rows in the
    # benchmark and case study (each whole file first kept as <stem>.replaced-<UTC>.*); the stages case and
    # benchmark then measure just those again and the sidecars record the new session.
    python3 - <<'PY'
import torch
from perfutils.data import schema, store
for study, variants in (("benchmark", ["fused", "two_pass", "split_row", "auto"]), ("case_study", ["split_row", "auto"])):
    store.forget_rows(schema.data_path("data", torch.cuda.get_device_name(), study), variants)
PY
    ;;
  ncu-split-row)  # Nsight Compute sections (speed of light, warp stalls, occupancy, memory) of the kernel
    # auto runs for four of the issue's shapes; text log in data/<gpu>/logs
    log="data/h100-sxm-80gb/logs/ncu_split_row_$(date -u +%F).txt"
    [ -e "$log" ] && { echo "$log exists: not overwriting" >&2; exit 1; }
    { python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
      ncu --version | tail -1
      for shape in "cross_entropy labels 32768" "cross_entropy labels 131072" "reverse_kl logits 32768" "reverse_kl logits 131072"; do
        echo "=== $shape (4096 tokens, bf16, variant auto)"
        timeout 120 ncu --clock-control none -k 'regex:split_row|fused_loss' -c 1 \
          --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
          python3 - $shape <<'PY' 2>&1 | grep -vE "^==PROF==|^\s*$"
import sys
import torch
import kernels
torch.manual_seed(0)
loss, fmt, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = (torch.randn(4096, vocab, device="cuda") * 2).bfloat16()
t = torch.randint(0, vocab, (4096,), device="cuda") if fmt == "labels" else (torch.randn(4096, vocab, device="cuda") * 2).bfloat16()
plan = kernels.prepare(x, t, loss=loss, target_format=fmt)
plan.run()
torch.cuda.synchronize()
print(plan.variant, plan.config)
PY
      done; } > "$log" 2>&1
    echo "wrote $log" ;;
  remeasure-project) for s in forget-project case benchmark tuning-table; do "$0" "$s"; done ;;
  case-497-measure) python3 -m perfutils case-497 measure --out data "$@" ;;  # case_497.csv, resumable
  case-497-ablation) python3 -m perfutils case-497 ablation --out data "$@" ;;  # case_497_ablation.csv, resumable
  case-497-ncu) python3 -m perfutils case-497 ncu --out data "$@" ;;  # logs/ncu_case_497_<date>.txt + case_497_ncu.csv
  vocab-stages) python3 -m perfutils vocab-sweep stages ;;
  vocab-*) python3 -m perfutils vocab-sweep run "${stage#vocab-}" "$@" --out data ;;  # vocab_sweep.csv, resumable
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
