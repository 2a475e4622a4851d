#!/usr/bin/env bash
# How the committed H100 data was produced: stages run on the GPU machine from the repo root, each
# well under 10 minutes; every stage is resumable (rerun it and it measures only what is missing).
#   scripts/collect_h100.sh ceilings|tuning|case|fused|two_pass|benchmark|resume-demo|ptxas-torch|gpu-tests|occupancy|tuning-table|remeasure-split-row
set -euo pipefail
export PYTHONUNBUFFERED=1
stage="${1:?stage}"
case "$stage" in
  ceilings)
    python3 - <<'PY'
from pathlib import Path
import torch
from perfutils import ceilings, metadata, records
df = ceilings.measure_ceilings()
copy = float(df.loc[df["ceiling"].str.startswith("dram_copy"), "value"].max())
path = records.data_path("data", torch.cuda.get_device_name(), "ceilings")
if path.exists():
    raise SystemExit(f"{path} exists: not overwriting recorded ceilings")
meta = metadata.collect_metadata({"study": "ceilings"}, copy)
meta["copy_gbps"] = copy
ceilings.write_ceilings(df, path, meta)
print(df.to_string())
PY
    ;;
  tuning) python3 -m perfutils sweep --config notebooks/params/split_row_tuning.yaml ;;
  case) python3 -m perfutils.studies case_study --out data ;;
  fused) python3 -m perfutils sweep --config notebooks/params/sweep_fused.yaml ;;
  two_pass) python3 -m perfutils sweep --config notebooks/params/sweep_two_pass.yaml ;;
  benchmark)
    python3 -m perfutils.studies benchmark --out data --tokens 4096 --vocab 32768 65536 131072 262144
    python3 -m perfutils.studies benchmark --out data --tokens 1024 16384 --vocab 32768 131072 ;;
  resume-demo)  # SIGKILL a real sweep mid-way, check the CSV, resume it
    rm -rf /tmp/resume_demo
    timeout -s KILL 12 python3 -m perfutils sweep --config notebooks/params/resume_demo.yaml || echo "killed: exit $?"
    f=$(ls /tmp/resume_demo/*/resume_demo.csv); echo "rows after kill: $(($(wc -l < "$f") - 1))"
    python3 -c "from perfutils.records import load_records; print('loads cleanly:', len(load_records('$f')), 'rows')"
    python3 -m perfutils sweep --config notebooks/params/resume_demo.yaml | grep -E "already|done"
    echo "rows after resume: $(($(wc -l < "$f") - 1))" ;;
  ptxas-torch)  # the same kernels built by torch's ptxas (what torch.compile switches a process to)
    TRITON_PTXAS_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas"))')" \
      python3 -m perfutils sweep --config notebooks/params/ptxas_torch_spot.yaml ;;
  gpu-tests) python3 -m pytest tests/test_gpu_kernels.py -q -s -rs -p no:cacheprovider ;;
  occupancy) python3 -m perfutils.occupancy_check --out data ;;
  tuning-table) python3 -m perfutils.tuning --gpu-dir data/h100-sxm-80gb --overwrite ;;
  remeasure-split-row)  # after a split_row kernel change: forget its rows (and auto's) in the benchmark and
    # case study, which git keeps, and measure just those again; the sidecars record the new session.
    python3 - <<'PY'
import pandas as pd
import torch
from perfutils import records
for study in ("benchmark", "case_study"):
    path = records.data_path("data", torch.cuda.get_device_name(), study)
    df = pd.read_csv(path)
    keep = ~df["variant"].isin(["split_row", "auto"])
    print(f"{path}: re-measuring {int((~keep).sum())} split_row/auto rows of {len(df)}")
    records.write_table(df[keep], path, records.load_metadata(path), overwrite=True)
PY
    python3 -m perfutils.studies case_study --out data
    python3 -m perfutils.studies benchmark --out data --tokens 4096 --vocab 32768 65536 131072 262144
    python3 -m perfutils.studies benchmark --out data --tokens 1024 16384 --vocab 32768 131072 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
