#!/usr/bin/env bash
# The one script sent to the GPU box for the packed NVFP4 GEMM (issue 4). Stages, in the order given:
#   test   the kernel tests (CPU + cuda-marked) and `engine build`'s marker
#   tile   build the CUDA tile GEMM extension, its tests (and the early-weights ones), the marker
#   tilesweep  time every built tile config (SWEEP_SHAPES, SWEEP_MS, SWEEP_KINDS) for kernels/table.py TILE
#   splitsweep  time the split-K policies (SWEEP_MS, SWEEP_WAVES) at the 27B decode shapes
#   deltasweep  every split of the decode delta rule over programs and warps (tools/tune/delta_sweep.py;
#          DELTA_BATCHES, default "1,16"), each checked against one program per head, then timed
#   prefillsweep  the prefill delta rule's state columns and warps a program (tools/tune/delta_prefill_sweep.py;
#          PREFILL_BATCHES, default "1,16", 128-token prompts), each checked against the engine's launch, then timed
#   attnsweep  the attention kernels' launch shapes, decode (keys a step, warps; contexts ATTN_CONTEXTS, default
#          "192,2048") and prefill (queries, keys, warps; 128-token prompts) at batches ATTN_BATCHES (default "1,16")
#          (tools/tune/attention_sweep.py), each checked against the engine's launch, then timed
#   samplebench  the decode step's pick on kernels/sample.py against torch's topk + argmax (graph replays, 27b
#          vocabulary, batches SAMPLE_BATCHES, default "1,16"; bit-identical checked first)
#   normsweep  the residual add + RMSNorm's warps a row (tools/tune/norm_sweep.py; NORM_BATCHES default "1,16",
#          NORM_SPLITS default "0,4,7"), each checked against the engine's launch, as graph replays
#   dequantsweep  dequantize + cuBLAS against the tile kernels at prefill-sized M (tools/tune/dequant_sweep.py;
#          DEQUANT_MS, default "128,256,512,1024,2048,4096"): the crossovers for kernels/table.py DEQUANT_BY_SHAPE
#   readfloor  what a plain read of each 27B GEMM's bytes costs (tools/tune/read_floor.py), beside the tile GEMM
#          at M=1 on the same bytes: is the GEMM's ~5 us over bytes / bandwidth its own, or any read's?
#   fieldcompare  fla-core's gated delta rule (decode, prefill) against ours at the 27B shape; needs fla-core's
#          and einops' wheels in .whl/field/ (bash ../shared/tools/device-wheels.sh fla-core einops, then move those
#          two into .whl/field/; carry .whl), installed to their own site, never the gate's (see device_gate.sh)
#   sweep  time candidate configs (SWEEP_SHAPES, SWEEP_MS) for kernels/table.py
#   bench  the benchmark table + JSON line (docs/BENCHMARKS.md)
#   tune   sweep (to $OUT/sweep.json), then bench with the sweep's fastest config per M
#   ncu    Nsight Compute on one tile GEMM (NCU_M rows, NCU_N x NCU_K; default the head): speed of light, memory
#          workload, occupancy, warp stalls; NCU_EXTRA more ncu flags (e.g. "--section SourceCounters")
#   rsprobe  the wgmma chain microbenchmark (scripts/probe_wgmma_rs.cu): JSON lines to $OUT/rsprobe.jsonl
# Logs go to $OUT/<stage>.log (or ./device-out when OUT is unset).
# Usage: bash scripts/device_kernels.sh test sweep bench ncu
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.log"
$PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/device.log"

stage_test() {
  $PY -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_cuda.py -rs
  $PY -c 'from kernels.build import build; print(build()[0])'
}
stage_tile() {  # build the CUDA tile GEMM, check it, print the marker
  local t0=$SECONDS; $PY -c "from kernels.tile_gemm import extension; extension()"; echo "extension build $((SECONDS - t0)) s"
  $PY -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py tests/test_projections_cuda.py -rs -x \
    -k "${TILE_TESTS:-tile or prepare or graph or early}"
  $PY -c 'from kernels.build import build; print(build()[0])'
}
stage_tilesweep() {
  $PY -m tools.tune.bench --tile-sweep --shapes "${SWEEP_SHAPES:-lm_head}" --ms "${SWEEP_MS:-1,4,16,64,256}" \
    --tile-kinds "${SWEEP_KINDS:-sync,wgmma}" --sweep-out "$OUT/tilesweep.json" | grep -v '^{'
}
stage_splitsweep() {  # tools/tune/split_sweep.py: SPLIT_WAVES at the 27B decode shapes
  $PY -m tools.tune.split_sweep --ms "${SWEEP_MS:-1,16}" --waves "${SWEEP_WAVES:-2,4,8,16}" > "$OUT/splitsweep.txt"
  head -n -1 "$OUT/splitsweep.txt"; tail -1 "$OUT/splitsweep.txt" > "$OUT/splitsweep.json"
}
stage_deltasweep() {  # tools/tune/delta_sweep.py (issue 24: the batch-16 delta rule, 2.26 ms of a 9.6 ms step)
  $PY -m tools.tune.delta_sweep --batches "${DELTA_BATCHES:-1,16}" > "$OUT/deltasweep.txt" || return 1
  head -n -1 "$OUT/deltasweep.txt"; tail -1 "$OUT/deltasweep.txt" > "$OUT/deltasweep.json"
}
stage_prefillsweep() {  # tools/tune/delta_prefill_sweep.py (issue 24: ~5 ms of a 64-layer batch-1 prefill)
  $PY -m tools.tune.delta_prefill_sweep --batches "${PREFILL_BATCHES:-1,16}" > "$OUT/prefillsweep.txt" || return 1
  head -n -1 "$OUT/prefillsweep.txt"; tail -1 "$OUT/prefillsweep.txt" > "$OUT/prefillsweep.json"
}
stage_attnsweep() {  # tools/tune/attention_sweep.py (the engine's decode attention launch spills 780 B)
  $PY -m tools.tune.attention_sweep --batches "${ATTN_BATCHES:-1,16}" --contexts "${ATTN_CONTEXTS:-192,2048}" \
    > "$OUT/attnsweep.txt" || return 1
  head -n -1 "$OUT/attnsweep.txt"; tail -1 "$OUT/attnsweep.txt" > "$OUT/attnsweep.json"
}
stage_fieldcompare() {  # tools/tune/field_compare.py (issue 24: field libraries by measurement)
  [ -d /tmp/fla-site/fla ] || $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla-site \
    .whl/field/fla_core-*.whl .whl/field/einops-*.whl || return 1
  PYTHONPATH=/tmp/fla-site:$PWD $PY -m tools.tune.field_compare > "$OUT/fieldcompare.txt" || return 1
  head -n -1 "$OUT/fieldcompare.txt"; tail -1 "$OUT/fieldcompare.txt" > "$OUT/fieldcompare.json"
}
stage_dequantsweep() {  # its kernel's tests on the GPU first (bit for bit against dequantize_raw)
  $PY -m pytest -q -p no:cacheprovider tests/test_tile_dequant.py -rs || return 1
  $PY -m tools.tune.dequant_sweep --ms "${DEQUANT_MS:-128,256,512,1024,2048,4096}" > "$OUT/dequantsweep.txt" || return 1
  head -n -1 "$OUT/dequantsweep.txt"; tail -1 "$OUT/dequantsweep.txt" > "$OUT/dequantsweep.json"
}
stage_readfloor() {
  $PY -m tools.tune.read_floor > "$OUT/readfloor.txt" || return 1
  head -n -1 "$OUT/readfloor.txt"; tail -1 "$OUT/readfloor.txt" > "$OUT/readfloor.json"
}
stage_samplebench() { $PY -m tools.tune.sample_bench --batches "${SAMPLE_BATCHES:-1,16}"; }
stage_normsweep() { $PY -m tools.tune.norm_sweep --batches "${NORM_BATCHES:-1,16}" --splits "${NORM_SPLITS:-0,4,7}"; }
stage_tilebench() { $PY -m tools.tune.bench --tile-table-from "$OUT/tilesweep.json"; }  # after tilesweep
stage_sweep() {
  $PY -m tools.tune.bench --sweep --shapes "${SWEEP_SHAPES:-lm_head,down_proj}" --ms "${SWEEP_MS:-1,4,16,64,256}"
}
stage_bench() { $PY -m tools.tune.bench; }
stage_tune() {  # sweep, then bench with the sweep's fastest configs (copy them into kernels/table.py)
  $PY -m tools.tune.bench --sweep --shapes "${SWEEP_SHAPES:-lm_head}" --ms "${SWEEP_MS:-1,4,16,64,256}" \
    --sweep-out "$OUT/sweep.json" | grep -v '^{'
  $PY -m tools.tune.bench --table-from "$OUT/sweep.json"
}
stage_rsprobe() {
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels/csrc -o /tmp/probe_wgmma_rs \
    scripts/probe_wgmma_rs.cu 2>&1 | grep -v C7519
  /tmp/probe_wgmma_rs | tee "$OUT/rsprobe.jsonl"
}
stage_ncu() {  # NCU_M rows of x against an NCU_N x NCU_K operand (default the head's, 248320 x 5120; gate_up is
  # 34816 x 5120, down 5120 x 17408); NCU_CFG a config's JSON, e.g. '{"block_m": 64}' (default: the table's for
  # that shape, kernels.table.tile_config). ncu flushes the caches before each profiled launch (its default).
  ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-gemm_kernel}" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis ${NCU_EXTRA:-} \
    $PY -c "
import torch
from tools.tune.bench import random_packed
from kernels.table import config_from_dict
from kernels.tile_gemm import tile_gemm
from kernels.tile_layout import repack
import json
cfg = config_from_dict(json.loads('${NCU_CFG:-}')) if '${NCU_CFG:-}' else None
op = repack(*random_packed(${NCU_N:-248320}, ${NCU_K:-5120}, 0))
x = torch.randn(${NCU_M:-1}, ${NCU_K:-5120}, dtype=torch.bfloat16, device='cuda')
for _ in range(5): tile_gemm(x, op, 1e-3, config=cfg)
torch.cuda.synchronize()"
}

rc=0
for stage in "$@"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  "stage_$stage" 2>&1 | tee "$OUT/$stage.log" || rc=1
done
exit $rc
