#!/usr/bin/env bash
# The transformer rows of BENCHMARKS.md ("Transformer"): a ViT of over 1 M parameters on
# MNIST 5k, 2 ranks on 2 cores (one rank per core, one torch thread per rank), DDP (gloo)
# and post-local SGD against syncopate over TCP, without and with a straggler that burns its
# CPU; medians of RUNS interleaved runs (every system once per repetition, in turn), then the
# markdown table with the load average before and after every row's runs.
#
#   benches/torch/run_vit.sh                 # the whole table, into vit-results.jsonl
#   RUNS=5 OUT=t.jsonl API=serve benches/torch/run_vit.sh   # the server's AdamW for every protocol
#   SMOKE=1 benches/torch/run_vit.sh         # seconds: a tiny model, one run, a debug build
#
# Needs torch and the syncopate wheel built with `maturin build --release`. Run it on a
# quiet machine: rows measured beside other jobs are not comparable.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
runs="${RUNS:-3}"
out="${OUT:-vit-results.jsonl}"
api="${API:-loop}"
workers="${WORKERS:-2}"
extra=()
if [[ -n "${SMOKE:-}" ]]; then
  runs=1
  extra=(--allow-debug --allow-small --dim 32 --depth 1 --heads 2 --gradients 40 --eval-every 5 --warmup 2
         --local-start 4 --period 2 --target 0.2)
fi
echo "regime: $workers ranks, $(nproc) cores, 1 torch thread per rank; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" "$here/vit.py" --workers "$workers" --case none --api "$api" --runs "$runs" --out "$out" \
  --systems ddp,ddp-scaled,bsp,backup,ssp,asp ${extra[@]+"${extra[@]}"}
"$python" "$here/vit.py" --workers "$workers" --case burn4x --api "$api" --runs "$runs" --out "$out" \
  --systems ddp,ddp-scaled,localsgd,bsp,backup,ssp,asp ${extra[@]+"${extra[@]}"}
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" "$here/vit.py" --table "$out"
