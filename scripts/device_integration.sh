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
#   twobox   (2 GPUs) a Ray cluster of two boxes, one GPU and one lock each; two heads gated
#            concurrently, each pinned to the box it was sent to; box gpu0's gate also runs the grid
# Usage: bash scripts/device_integration.sh setup cudatest synth arms bench grid gate
# The wheels: `bash ../shared/tools/device-wheels.sh croniter python-dateutil pytz six` (the box lacks
# croniter, which orchestrator/schedule.py imports; without it cudatest fails at collection), carry [".whl"].
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REGATE_CACHE=${REGATE_CACHE:-/tmp/regate-cache} REGATE_SYNTH_DEVICE=cuda
export PYTHONPATH=/tmp/site:$PWD
LAYERS=${LAYERS:-4}; MAX_LEGS=${MAX_LEGS:-4}; PY=${PY:-python3}
ckpt() { $PY -c "from tools.synth.cache import cached_checkpoint as c; print(c(preset='27b', layers=$LAYERS, naming='modelopt', head='nvfp4', seed=0))" | tail -1; }

stage_setup() {
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c 'import torch, triton, ray; print("torch", torch.__version__, "triton", triton.__version__, "ray", ray.__version__)'
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
stage_twobox() {
  rm -rf /tmp/repo2 /tmp/orch2; git clone -q .regate-bundle/repo.bundle /tmp/repo2 || return 1
  mkdir -p /tmp/orch2
  (cd /tmp/repo2 && git -c user.email=ci@regate -c user.name=regate commit -q --allow-empty -m "second head")
  local h1 h2; h1=$(git -C /tmp/repo2 rev-parse HEAD~1); h2=$(git -C /tmp/repo2 rev-parse HEAD)
  local m=${BOX_MARKERS:-'["packed NVFP4 W4A16 GEMM: ENABLED"]'} g=${BOX_GPUS:-1}
  cat > /tmp/orch2/orchestrator.yaml <<Y
ray_address: auto
db_path: /tmp/orch2/regate.db
reports_dir: /tmp/orch2/reports
boxes:
  - {name: gpu0, lock_path: /tmp/orch2/gpu0.lock, gpus: $g, required_markers: $m}
  - {name: gpu1, lock_path: /tmp/orch2/gpu1.lock, gpus: $g, required_markers: $m}
Y
  local ray="$PY -m ray.scripts.scripts"
  export RAY_AUTH_MODE=token  # the cluster and its clients share ~/.ray/auth_token
  mkdir -p ~/.ray; [ -s ~/.ray/auth_token ] || $PY -c "import secrets; print(secrets.token_hex(32))" > ~/.ray/auth_token
  CUDA_VISIBLE_DEVICES=0 $ray start --head --port=6390 --num-cpus=8 --num-gpus=$g --resources='{"box:gpu0": 1}' --labels=box=gpu0 --include-dashboard=false --disable-usage-stats
  CUDA_VISIBLE_DEVICES=1 $ray start --address=127.0.0.1:6390 --num-cpus=8 --num-gpus=$g --resources='{"box:gpu1": 1}' --labels=box=gpu1 --disable-usage-stats
  export RAY_ADDRESS=127.0.0.1:6390
  local t0; t0=$(date +%s)
  (cd /tmp/repo2 && $PY -m orchestrator.cli gate --config /tmp/orch2/orchestrator.yaml --head "$h1" --box gpu0 ${GRID:+--grid $GRID} --json > "$OUT/gate_gpu0.log" 2>&1; echo "gpu0 rc=$? $(( $(date +%s) - t0 ))s") &
  (cd /tmp/repo2 && $PY -m orchestrator.cli gate --config /tmp/orch2/orchestrator.yaml --head "$h2" --box gpu1 --json > "$OUT/gate_gpu1.log" 2>&1; echo "gpu1 rc=$? $(( $(date +%s) - t0 ))s") &
  wait
  $ray stop --force >/dev/null 2>&1
  for b in gpu0 gpu1; do grep -v gcs_client "$OUT/gate_$b.log" | tail -25; done
  tar czf "$OUT/reports.tgz" -C /tmp/orch2 reports regate.db
}

for s in "$@"; do
  t0=$(date +%s)
  "stage_$s" > "$OUT/$s.log" 2>&1; rc=$?
  echo "== $s rc=$rc $(( $(date +%s) - t0 ))s"; tail -n "${TAIL:-8}" "$OUT/$s.log"
done
