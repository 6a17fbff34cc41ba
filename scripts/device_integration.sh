#!/usr/bin/env bash
# The lead's integration script for the GPU box (engine, grid and orchestrator issues). Stages run in
# the order given; each logs to $OUT/<stage>.log and prints its exit code and wall seconds, and a
# failing stage does not stop the next one.
#   setup    install the carried wheels (.whl/: slimmed Ray etc.), print versions, `engine build` marker
#   cudatest every cuda-marked test (kernels, engine CUDA graphs / arms) + the packed_gemm gate suite
#   synth    the 27b checkpoint cut to $LAYERS layers (cached under $REGATE_CACHE)
#   arms     greedy packed vs dequant on CUDA (must be identical), engine info per arm
#   bench    engine bench per arm at batch 1 and 16
#   grid     grids/lmhead.yaml --until-binding (max $MAX_LEGS legs)
#   gate     orchestrator gate --head HEAD on this box (embedded default: local Ray, one box)
# Usage: bash scripts/device_integration.sh setup cudatest synth arms bench grid gate
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REGATE_CACHE=${REGATE_CACHE:-/tmp/regate-cache} REGATE_SYNTH_DEVICE=cuda
export PYTHONPATH=/tmp/site:$PWD
LAYERS=${LAYERS:-4}; MAX_LEGS=${MAX_LEGS:-4}; PY=python3
ckpt() { $PY -c "from engine.ckpt_cache import cached_checkpoint as c; print(c(preset='27b', layers=$LAYERS, naming='modelopt', head='nvfp4', seed=0))" | tail -1; }

stage_setup() {
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c 'import torch, triton, ray, filelock; print("torch", torch.__version__, "triton", triton.__version__, "ray", ray.__version__, "filelock", filelock.__version__)'
  $PY -m engine.cli build
}
stage_cudatest() {
  $PY -m pytest -q -p no:cacheprovider -m cuda tests/ -rs
  REGATE_CENSUS_OUT=$OUT/packed_gemm_census.json $PY -m pytest -q -p no:cacheprovider -p gates.census gates/suites/test_packed_gemm.py
  cat "$OUT/packed_gemm_census.json"
}
stage_synth() { ckpt; du -sh "$(ckpt)"; }
stage_arms() {
  local d; d=$(ckpt)
  for arm in packed dequant; do
    $PY -m engine.cli generate --model "$d" --backend cuda --lm-head $arm --prompt-ids 1,2,3,4,5,6,7,8 --max-new 32 --json > "$OUT/gen_$arm.json"
    $PY -m engine.cli info --model "$d" --backend cuda --lm-head $arm --json > "$OUT/info_$arm.json"
  done
  $PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
g = {a: json.loads(open(f"{out}/gen_{a}.json").read().strip().splitlines()[-1]) for a in ("packed", "dequant")}
print("packed :", g["packed"]); print("dequant:", g["dequant"])
print("GREEDY IDENTICAL" if g["packed"].get("tokens", g["packed"]) == g["dequant"].get("tokens", g["dequant"]) else "GREEDY DIFFERS")
PY
}
stage_bench() {
  local d; d=$(ckpt)
  for b in 1 16; do for arm in packed dequant; do
    $PY -m engine.cli bench --model "$d" --backend cuda --lm-head $arm --batch $b --prompt-len 128 --gen-len 64 --iters 5 --warmup 2 --json | tail -1 | tee -a "$OUT/bench.jsonl"
  done; done
}
stage_grid() { $PY -m orchestrator.cli grid grids/lmhead.yaml --until-binding --max-legs "$MAX_LEGS" --out "$OUT/grid.json"; }
stage_gate() {
  local repo=$PWD
  if [ ! -d .git ]; then git clone -q .regate-bundle/repo.bundle /tmp/repo && repo=/tmp/repo; fi
  (cd "$repo" && $PY -m orchestrator.cli gate --head HEAD --json) | tail -40
}

for s in "$@"; do
  t0=$(date +%s)
  "stage_$s" > "$OUT/$s.log" 2>&1; rc=$?
  echo "== $s rc=$rc $(( $(date +%s) - t0 ))s"; tail -n "${TAIL:-8}" "$OUT/$s.log"
done
