#!/usr/bin/env bash
# The GPU gate: every change to engine/, kernels/ or gates/ ends with `orchestrator gate --head HEAD
# --json` run on the GPU box from a fresh clone, and its JSON line, wall time and sha go in
# docs/BENCHMARKS.md's current-state table.
#
# Here, on the driving machine, once per commit to gate:
#   bash scripts/device_gate.sh bundle      # HEAD's history as .regate-bundle/repo.bundle (git-ignored)
#   bash ../shared/tools/device-wheels.sh croniter python-dateutil pytz six filelock   # .whl/: Ray, filelock 4 etc.
# On the GPU box (a device run with carry [".whl", ".regate-bundle"]), stages in the order given:
#   gate     clone the bundle to a fresh dir; `orchestrator gate --head HEAD --json $GATE_ARGS` there (the
#            sandbox needs bwrap: carry .debs/ from ../shared/tools/device-debs.sh bubblewrap libcap2); the JSON line,
#            rc, wall seconds and sha; the record and HTML report under $OUT
#   compare  `orchestrator compare --base $COMPARE_BASE --head HEAD --grid $GRID_SPEC --json` on the clone (default
#            base HEAD~1, grid grids/lmhead-64.yaml: full depth); the JSON line, rc, wall seconds; the record
#            (phases: builds warm or cold, lock wait, each leg) under $OUT/compare_record.json
#   sandboxcost  after `gate` (build dir warm): the same head gated again (--force) under each isolation of
#            $SANDBOX_ORDER (default "none bwrap"), each wall time and state: the sandbox's own cost. A dry run on a
#            CPU machine: NO_WHEELS=1 PY=.venv/bin/python SANDBOX_GPUS=0 SANDBOX_MARKERS='[]' bash scripts/device_gate.sh bundle sandboxcost
#   killcompare  a compare killed (SIGKILL of its process group) $KILL_AFTER_S (default 150) seconds in, then
#            `compare` again on the same box: the second must start and complete
#   history  `orchestrator history --grid $GRID_SPEC` on the clone's state (after compare or grid stages, which
#            recorded runs of its cell); the cell pages under $OUT/history/
#   bisect   `orchestrator bisect --good $BISECT_GOOD --bad $BISECT_BAD --grid $BISECT_GRID --json` on the clone
#            (defaults HEAD~2, HEAD, grids/cuda_smoke.yaml: each step is a recorded compare); its JSON under $OUT
#   pins     the CUDA suites' mutation pins on the same clone, after `gate` (each must be KILLED)
#   grid     `orchestrator grid $GRID_SPEC $GRID_ARGS` (default --until-binding) on the clone, no suites (default grids/lmhead-64.yaml:
#            packed vs dequant head at batch 1 on the full 64-layer shape); the grid's JSON under $OUT
#   serve    `orchestrator serve` on the clone's state: one POST /api/gate (grid cuda_smoke) and a schedule
#            slot every minute for the same grid; waits until the firing and the run are recorded and
#            prints them (the firing of an identical queued gate is answered with that gate's run).
#            A dry run on a CPU machine: NO_WHEELS=1 PY=.venv/bin/python SERVE_GRID=smoke SERVE_GPUS=0
#            SERVE_MARKERS='[]' bash scripts/device_gate.sh serve
#   suites   the CUDA suites alone under the census plugin, no orchestrator (for debugging a suite;
#            $SUITES picks them, default "packed_gemm cuda_engine")
#   cudatest every cuda-marked test of tests/
#   attribute `python -m tools.attribution --compare` on the 27b shape cut to each of $ATTR_LAYERS (default "8 64")
#            layers, at each batch of $ATTR_BATCHES (default "1 16"); the JSON lines under $OUT/attribute/
#   fused    the fused decode kernels against their reference twins on the GPU (tests/test_fused_decode.py),
#            then `engine bench` of the packed arm on the 27b shape cut to $FUSED_LAYERS (default 8) layers,
#            batch 1 and 16, --option fused_decode=0 and =1 side by side, interleaved
#   merge    the merged projections against their twins on the GPU (tests/test_projections_cuda.py,
#            test_kernels_cuda.py, test_fused_decode.py), then `engine bench` of the packed arm on the 27b shape
#            cut to $MERGE_LAYERS (default 16) layers, batch 1 and 16, the variants of $MERGE_VARIANTS
#            (--option merge_projections values, default "0 1") interleaved
#   ab       engine options decided by `orchestrator grid` on the clone: $AB_TESTS (default tests/test_fused_decode.py;
#            none: no tests) on the GPU, then for each variant of $AB_VARIANTS after the first (space-separated; a
#            variant is comma-separated KEY=value engine options, e.g. "merge_projections=1 merge_projections=0") a two-arm grid, the first
#            variant against it: packed lm_head, the 27b shape cut to $AB_LAYERS (default 64) layers, a cell per
#            batch of $AB_BATCHES (default "1 16"), prompt 128, 64 tokens, $AB_LEGS legs (default 3), judged on
#            $AB_METRIC (decode, the default, or prefill tok/s: grids/metric.py); each grid's JSON under $OUT/ab-<n>.json.
#            A dry run on a CPU machine: NO_WHEELS=1 PY=$PWD/.venv/bin/python AB_BACKEND=cpu AB_PRESET=tiny AB_BATCHES=1
#            AB_TESTS=none AB_VARIANTS="merge_projections=1 merge_projections=0" bash scripts/device_gate.sh bundle ab
#   ablate   the engine with parts removed (tools/ablation; timing only, so never a grid: a grid refuses an
#            ablated bench): the ablation's GPU tests ($ABLATE_TESTS; none skips them), then `engine bench` of the
#            real engine and `python -m tools.ablation --ablate <item>` per item of $ABLATE (default "norm
#            norm:empty tower tower:empty tower:read tower:read+lm_head:read delta_rule attention": the step without
#            that part, with an empty launch in each of its launches' places (:empty) or, for a GEMM part's :read, a
#            plain read of its bytes), interleaved, $AB_LEGS times (default 1), at each batch of $AB_BATCHES on the 27b
#            shape cut to $AB_LAYERS layers; then `python -m tools.ablation.table`: what each item saves the step, and a
#            part's link apart from its work
#   kernels  scripts/decode_kernels.py (a decode step's kernels: count, device time, gaps) on the 27b shape
#            cut to $KERNELS_LAYERS (default 64) layers at each batch of $KERNELS_BATCHES (default "1"); $KERNELS_ARGS
#            are passed on (e.g. "--prefill --prompt-len 128": one prefill's kernels), $KERNELS_TAG names the output
# Each stage logs to $OUT/<stage>.log and prints its rc and wall seconds; a failing stage does not
# stop the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
PY=${PY:-python3}
CLONE=${CLONE:-/tmp/regate-gate}
export PYTHONUNBUFFERED=1 REGATE_CACHE=${REGATE_CACHE:-/tmp/regate-cache} REGATE_SYNTH_DEVICE=cuda

stage_bundle() {
  mkdir -p .regate-bundle
  grep -qx '/.regate-bundle/' .git/info/exclude 2>/dev/null || echo '/.regate-bundle/' >> .git/info/exclude
  # HEAD and its branch: the clone's origin/HEAD names the branch, the trusted ref a gate defaults to
  local branch; branch=$(git symbolic-ref --quiet --short HEAD || true)
  git bundle create -q .regate-bundle/repo.bundle HEAD ${branch:+"$branch"} && git rev-parse HEAD > .regate-bundle/sha
  echo "bundle of $(cat .regate-bundle/sha) ($(du -h .regate-bundle/repo.bundle | cut -f1))"
}

# Only .whl/*.whl: field libraries (.whl/field/: fla-core, einops) stay out of the gate's site, because
# transformers' Qwen3.5, the suites' oracle, picks fla's Triton kernels whenever fla imports, and those
# fail on the CPU oracle's tensors (measured: the gate at e0321fd, paged_engine and dense_lmhead_fp4 RED).
install_wheels() {
  install_debs
  [ -d /tmp/site ] || [ -n "${NO_WHEELS:-}" ] && return 0  # NO_WHEELS=1: PY already has Ray (a dry run here)
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
}

# bubblewrap for the sandbox (orchestrator/box/sandbox.py), carried as Debian packages (.debs/, made by
# ../shared/tools/device-debs.sh bubblewrap libcap2): the box has no network and no bwrap of its own.
install_debs() {
  command -v bwrap >/dev/null 2>&1 && return 0
  ls .debs/*.deb >/dev/null 2>&1 || return 0
  for d in .debs/*.deb; do dpkg -x "$d" /opt/debroot; done
  export PATH=/opt/debroot/usr/bin:$PATH
  export LD_LIBRARY_PATH=/opt/debroot/usr/lib/x86_64-linux-gnu:/opt/debroot/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  bwrap --version
}

clone() {
  local sha; sha=$(cat .regate-bundle/sha)
  if [ -d "$CLONE/.git" ]; then
    # a newer bundle on a warm box: the same clone (its .regate state) moved to the bundle's head, its
    # origin refs too (the trusted ref); without this a second `gate` gated the clone's old head again
    [ "$(git -C "$CLONE" rev-parse HEAD)" = "$sha" ] && return 0
    git -C "$CLONE" fetch -q "$PWD/.regate-bundle/repo.bundle" '+refs/heads/*:refs/remotes/origin/*' \
      && git -C "$CLONE" checkout -q --detach "$sha"
    return
  fi
  git clone -q .regate-bundle/repo.bundle "$CLONE" && git -C "$CLONE" checkout -q "$sha"
}

# each line prefixed with the seconds since the stage began: where a run's time goes, even when it is killed
stamp() { local t0=$SECONDS l; while IFS= read -r l; do printf '%4ds %s\n' $((SECONDS - t0)) "$l"; done; }

in_clone() { (cd "$CLONE" && PYTHONPATH=/tmp/site:$CLONE "$@"); }

stage_gate() {
  install_wheels && clone || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
  local t0=$SECONDS rc
  in_clone $PY -m orchestrator.cli gate --head HEAD --json ${GATE_ARGS:-} > "$OUT/gate.stdout" 2> "$OUT/gate.stderr"; rc=$?
  grep -v -e gcs_client -e 'Token authentication' "$OUT/gate.stderr" | tail -30
  echo "gate rc=$rc wall_s=$((SECONDS - t0)) sha=$(git -C "$CLONE" rev-parse HEAD)"
  tail -1 "$OUT/gate.stdout" | tee "$OUT/gate.json"
  local run; run=$($PY -c "import json,sys; print(json.loads(open('$OUT/gate.json').read())['run_id'])" 2>/dev/null)
  [ -n "$run" ] && cp "$CLONE/.regate/reports/$run.html" "$OUT/gate_report.html" 2>/dev/null
  [ -n "$run" ] && in_clone $PY -m orchestrator.cli show "$run" --json > "$OUT/gate_record.json" 2>/dev/null
  return $rc
}

stage_sandboxcost() {  # the sandbox's cost: gates of the same head (--force, build dir warm) under $SANDBOX_ORDER
  install_wheels && clone || return 1
  local iso t0 rc box markers=${SANDBOX_MARKERS:-'["packed NVFP4 W4A16 GEMM: ENABLED"]'}
  box=$(hostname | cut -d. -f1); mkdir -p "$CLONE/.regate"
  for iso in ${SANDBOX_ORDER:-none bwrap}; do
    cat > "$CLONE/.regate/isolation-$iso.yaml" <<Y
boxes:
  - {name: $box, lock_path: ~/gpu.lock, gpus: ${SANDBOX_GPUS:-1}, required_markers: $markers, isolation: $iso}
Y
    t0=$SECONDS
    in_clone $PY -m orchestrator.cli gate --head HEAD --force --json --config ".regate/isolation-$iso.yaml" \
      > "$OUT/gate-$iso.stdout" 2> "$OUT/gate-$iso.stderr"; rc=$?
    echo "isolation $iso: rc=$rc wall_s=$((SECONDS - t0))"
    tail -1 "$OUT/gate-$iso.stdout" | $PY -c "import json,sys; r=json.loads(sys.stdin.read()); print(r['state'], r['isolation'])"
  done
}

stage_grid() {  # a throughput grid alone on the clone (no suites): $GRID_SPEC, default grids/lmhead-64.yaml
  install_wheels && clone || return 1
  local t0=$SECONDS rc
  in_clone $PY -m orchestrator.cli grid "${GRID_SPEC:-grids/lmhead-64.yaml}" ${GRID_ARGS---until-binding} --out "$OUT/grid.json" \
    > "$OUT/grid.stdout" 2> "$OUT/grid.stderr"; rc=$?
  grep -v -e gcs_client -e 'Token authentication' "$OUT/grid.stderr" | tail -30; cat "$OUT/grid.stdout"
  echo "grid rc=$rc wall_s=$((SECONDS - t0)) sha=$(git -C "$CLONE" rev-parse HEAD)"
  return $rc
}

stage_compare() {
  install_wheels && clone || return 1
  local t0=$SECONDS rc tag=${COMPARE_TAG:-compare}
  in_clone $PY -m orchestrator.cli compare --base "${COMPARE_BASE:-HEAD~1}" --head HEAD \
    --grid "${GRID_SPEC:-grids/lmhead-64.yaml}" --json 2>&1 > "$OUT/$tag.stdout" | stamp > "$OUT/$tag.stderr"; rc=${PIPESTATUS[0]}
  grep -v -e gcs_client -e 'Token authentication' "$OUT/$tag.stderr" | tail -30
  echo "$tag rc=$rc wall_s=$((SECONDS - t0)) sha=$(git -C "$CLONE" rev-parse HEAD)"
  tail -1 "$OUT/$tag.stdout" | tee "$OUT/$tag.json"
  local run; run=$($PY -c "import json; print(json.loads(open('$OUT/$tag.json').read())['run_id'])" 2>/dev/null)
  [ -n "$run" ] && in_clone $PY -m orchestrator.cli show "$run" > "$OUT/${tag}_show.txt" 2>/dev/null
  [ -n "$run" ] && in_clone $PY -m orchestrator.cli show "$run" --json > "$OUT/${tag}_record.json" 2>/dev/null
  return $rc
}

stage_killcompare() {  # a compare killed mid-run, then a compare on the same box must complete
  install_wheels && clone || return 1
  (cd "$CLONE" && PYTHONPATH=/tmp/site:$CLONE setsid $PY -m orchestrator.cli compare --base "${COMPARE_BASE:-HEAD~1}" \
    --head HEAD --grid "${GRID_SPEC:-grids/lmhead-64.yaml}" > "$OUT/killed.stdout" 2>&1) &
  local pid=$!
  sleep "${KILL_AFTER_S:-150}"
  pkill -9 -s "$(ps -o sid= -p "$(pgrep -P $pid | head -1)" | tr -d ' ')" 2>/dev/null || kill -9 $pid
  wait $pid 2>/dev/null
  echo "killed after ${KILL_AFTER_S:-150} s; its last lines:"; tail -5 "$OUT/killed.stdout"
  COMPARE_TAG=after_kill stage_compare
}

stage_history() {
  install_wheels && clone || return 1
  in_clone $PY -m orchestrator.cli history --grid "${GRID_SPEC:-grids/lmhead-64.yaml}" 2>&1 | tail -30
  in_clone $PY -m orchestrator.cli history --grid "${GRID_SPEC:-grids/lmhead-64.yaml}" --json > "$OUT/history.jsonl" 2>/dev/null
  mkdir -p "$OUT/history" && cp "$CLONE"/.regate/reports/history/*.html "$OUT/history/" 2>/dev/null
  ls "$OUT/history"
}

stage_bisect() {
  install_wheels && clone || return 1
  local t0=$SECONDS rc
  in_clone $PY -m orchestrator.cli bisect --good "${BISECT_GOOD:-HEAD~2}" --bad "${BISECT_BAD:-HEAD}" \
    --grid "${BISECT_GRID:-grids/cuda_smoke.yaml}" --json 2>&1 > "$OUT/bisect.stdout" | stamp > "$OUT/bisect.stderr"; rc=${PIPESTATUS[0]}
  grep -v -e gcs_client -e 'Token authentication' "$OUT/bisect.stderr" | tail -20; cat "$OUT/bisect.stdout"
  echo "bisect rc=$rc wall_s=$((SECONDS - t0))"
  return $rc
}

stage_pins() {  # after `gate`, which ran the suites unmutated on this tree: no second baseline
  install_wheels && clone || return 1
  in_clone $PY - <<'PY'
import json, sys
from gates.manifest import load_manifest
from orchestrator.box.mutate import KILLED, run_pins
from gates.pins import load_pins
m = load_manifest(".")
names = [p.name for p in load_pins(".") if "cuda" in m.suite(p.suite).needs]
results = run_pins(".", names, baseline=False, progress=lambda r: print(r["state"], r["pin"], r["detail"], flush=True))
print(json.dumps(results))
sys.exit(0 if results and all(r["state"] == KILLED for r in results) else 1)
PY
}

stage_serve() {
  install_wheels && clone || return 1
  local box grid=${SERVE_GRID:-cuda_smoke} markers=${SERVE_MARKERS:-'["packed NVFP4 W4A16 GEMM: ENABLED"]'}
  box=$(hostname | cut -d. -f1)
  mkdir -p "$CLONE/.regate"
  cat > "$CLONE/.regate/serve.yaml" <<Y
db_path: $CLONE/.regate/regate.db
reports_dir: $CLONE/.regate/reports
boxes:
  - {name: $box, lock_path: ~/gpu.lock, gpus: ${SERVE_GPUS:-1}, required_markers: $markers}
schedules:
  - {id: every-minute-$grid, cron: "* * * * *", rev: HEAD, grid: $grid, box: $box}
Y
  (cd "$CLONE" && PYTHONPATH=/tmp/site:$CLONE setsid $PY -m orchestrator.cli serve --port 0 \
     --config .regate/serve.yaml --repo . > "$OUT/serve.stdout" 2> "$OUT/serve.stderr") &
  local url="" i
  for i in $(seq 60); do url=$(grep -o 'http://[0-9.:]*' "$OUT/serve.stdout" | head -1); [ -n "$url" ] && break; sleep 1; done
  [ -n "$url" ] || { echo "serve did not start"; tail -20 "$OUT/serve.stderr"; return 1; }
  echo "serving at $url"
  curl -s -XPOST -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat "$CLONE/.regate/api-token")" \
    -d "{\"head\": \"HEAD\", \"grid\": \"$grid\"}" "$url/api/gate" | tee "$OUT/post.json"; echo
  local deadline=$((SECONDS + ${SERVE_WAIT_S:-480})) fired=""
  while [ $SECONDS -lt $deadline ]; do
    sleep 10
    curl -s "$url/api/runs" > "$OUT/runs.json"
    fired=$(in_clone $PY -c "
import sqlite3; c = sqlite3.connect('.regate/regate.db')
print(c.execute('select count(*) from schedule_firings').fetchone()[0])" 2>/dev/null)
    $PY - "$OUT/runs.json" "$fired" <<'PY' && break
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
busy = [r for r in runs if r.get("state") in ("QUEUED", "RUNNING")]
sys.exit(0 if runs and not busy and sys.argv[2] not in ("", "0") else 1)
PY
  done
  in_clone $PY -c "
import sqlite3; c = sqlite3.connect('.regate/regate.db'); c.row_factory = sqlite3.Row
for r in c.execute('select * from schedule_firings'): print('firing', dict(r))"
  $PY -c "
import json; [print('run', r.get('run_id'), r.get('state'), r.get('kind', ''), r.get('grid', '')) for r in json.load(open('$OUT/runs.json'))['runs']]"
  pkill -TERM -f 'orchestrator.cli serve' ; sleep 3
  tail -5 "$OUT/serve.stderr"
  tar czf "$OUT/serve_state.tgz" -C "$CLONE/.regate" reports regate.db 2>/dev/null
}

stage_suites() {
  install_wheels || return 1
  local s rc=0
  for s in ${SUITES:-packed_gemm cuda_engine}; do
    PYTHONPATH=/tmp/site:$PWD REGATE_CENSUS_OUT="$OUT/census_$s.json" $PY -m pytest -q -p no:cacheprovider \
      -p gates.census "gates/suites/test_$s.py" 2>&1 | tail -25 || rc=1
    $PY -c "
import json; r = json.load(open('$OUT/census_$s.json'))
print('$s', r['tests_passed'], '/', r['tests_total'], 'tests', r['checks_passed'], '/', r['checks_total'], 'checks', r['tallies'])
[print('  note', n) for t in r['tests'].values() for n in t['notes']]"
  done
  return $rc
}

stage_cudatest() {
  install_wheels || return 1
  PYTHONPATH=/tmp/site:$PWD $PY -m pytest -q -p no:cacheprovider -m cuda tests/ -rs
}

stage_attribute() {
  mkdir -p "$OUT/attribute"
  local L B ck
  for L in ${ATTR_LAYERS:-8 64}; do
    ck=$(PYTHONPATH=$PWD $PY -c "from tools.synth.cache import cached_checkpoint as c; print(c(preset='27b', layers=$L))" | tail -1)
    for B in ${ATTR_BATCHES:-1 16}; do
      echo "-- 27b-${L}L batch $B"
      PYTHONPATH=$PWD timeout "${ATTR_TIMEOUT_S:-300}" $PY -m tools.attribution --model "$ck" --backend cuda \
        --compare --lengths "${ATTR_LENGTHS:-8,136}" --batch "$B" --iters "${ATTR_ITERS:-3}" --json \
        > "$OUT/attribute/27b-${L}L-b$B.json" 2> "$OUT/attribute/27b-${L}L-b$B.txt"
      echo "rc=$?"; tail -"${ATTR_TAIL:-40}" "$OUT/attribute/27b-${L}L-b$B.txt"
    done
  done
  tar czf "$OUT/attribute.tgz" -C "$OUT" attribute && rm -r "$OUT/attribute"  # few files come back
}

stage_fused() {
  PYTHONPATH=$PWD $PY -m pytest -q -p no:cacheprovider tests/test_fused_decode.py 2>&1 | tail -15
  local L=${FUSED_LAYERS:-8} B F ck
  ck=$(PYTHONPATH=$PWD $PY -c "from tools.synth.cache import cached_checkpoint as c; print(c(preset='27b', layers=$L))" | tail -1)
  for B in ${FUSED_BATCHES:-1 16}; do for F in 0 1; do
    PYTHONPATH=$PWD $PY -m engine.cli bench --model "$ck" --backend cuda --lm-head packed --option fused_decode=$F \
      --batch "$B" --prompt-len 128 --gen-len 64 --iters 3 --json 2>/dev/null | tail -1 > "$OUT/bench-${L}L-b$B-f$F.json"
    $PY -c "
import json; r = json.load(open('$OUT/bench-${L}L-b$B-f$F.json')); p = r['params']
print('27b-${L}L batch', p['batch'], 'fused', p.get('fused_decode'), 'graphs', p['cuda_graphs'], round(r['ms_per_step'], 3),
      'ms/step', round(r['decode_tok_s'], 1), 'tok/s prefill', round(r['prefill_ms'], 1), 'ms')" || echo "bench b$B fused=$F failed"
  done; done
}

stage_merge() {
  PYTHONPATH=$PWD timeout "${MERGE_TEST_S:-240}" $PY -m pytest -q -p no:cacheprovider \
    ${MERGE_TESTS:-tests/test_projections_cuda.py tests/test_kernels_cuda.py tests/test_fused_decode.py} 2>&1 | tail -25
  local L=${MERGE_LAYERS:-16} B V ck
  ck=$(PYTHONPATH=$PWD $PY -c "from tools.synth.cache import cached_checkpoint as c; print(c(preset='27b', layers=$L))" | tail -1)
  for B in ${MERGE_BATCHES:-1 16}; do for V in ${MERGE_VARIANTS:-0 1}; do
    PYTHONPATH=$PWD timeout 120 $PY -m engine.cli bench --option merge_projections=$V \
      --model "$ck" --backend cuda --lm-head packed --batch "$B" --prompt-len 128 --gen-len 64 --iters 3 --json \
      2>/dev/null | tail -1 > "$OUT/bench-${L}L-b$B-v$V.json"
    $PY -c "
import json; r = json.load(open('$OUT/bench-${L}L-b$B-v$V.json')); p = r['params']
print('27b-${L}L batch', p['batch'], 'merge=$V', round(r['ms_per_step'], 3), 'ms/step',
      round(r['decode_tok_s'], 1), 'tok/s prefill', round(r['prefill_ms'], 1), 'ms')" || echo "bench b$B v$V failed"
  done; done
}

ckpt_27b() { PYTHONPATH=$PWD $PY -c "from tools.synth.cache import cached_checkpoint as c; print(c(preset='27b', layers=$1))" | tail -1; }

ab_spec() {  # the two-arm grid spec of `ab` (JSON, which YAML reads): options $1 against options $2
  $PY - "$1" "$2" <<'PY'
import json, os, sys
def options(variant):  # "k=v,k2=v2" -> {k: v}
    return dict(p.split("=", 1) for p in variant.split(",") if "=" in p)
first, variant = sys.argv[1], sys.argv[2]
legs, preset = int(os.environ.get("AB_LEGS", "3")), os.environ.get("AB_PRESET", "27b")
layers = os.environ.get("AB_LAYERS", "64" if preset == "27b" else "")
print(json.dumps({
    "name": "ab-" + variant.replace(",", "-").replace("=", ""), "backend": os.environ.get("AB_BACKEND", "cuda"),
    "legs": legs, "max_legs": legs,
    "warmup": 1, "iters": 3, "timeout_s": 300, "metric": os.environ.get("AB_METRIC", "decode"),
    "verdict": {"rule": "rank", "alpha": 0.05, "tolerance": 0.02},
    "checkpoint": {"preset": preset, "naming": "modelopt", "head": "nvfp4", "seed": 0,
                   **({"layers": int(layers)} if layers else {})},
    "arms": {"first": {"lm_head": "packed", "options": options(first)},
             "variant": {"lm_head": "packed", "options": options(variant)}},
    "cells": [{"batch": int(b), "prompt_len": 128, "gen_len": 64} for b in os.environ.get("AB_BATCHES", "1 16").split()],
}, indent=1))
PY
}

stage_ab() {
  install_wheels && clone || return 1
  [ "${AB_TESTS:-}" = none ] || in_clone timeout "${AB_TEST_S:-240}" $PY -m pytest -q -p no:cacheprovider \
    ${AB_TESTS:-tests/test_fused_decode.py} 2>&1 | tail -15
  local n=0 rc=0 V first; set -- ${AB_VARIANTS:-merge_projections=1 merge_projections=0}; first=$1; shift
  for V in "$@"; do
    n=$((n + 1)); ab_spec "$first" "$V" > "$CLONE/.regate-ab-$n.yaml" || return 1
    echo "-- grid $n: $V against $first"
    in_clone $PY -m orchestrator.cli grid ".regate-ab-$n.yaml" --out "$OUT/ab-$n.json" > "$OUT/ab-$n.stdout" \
      2> "$OUT/ab-$n.stderr" || rc=1
    cat "$OUT/ab-$n.stdout"
  done
  return $rc
}

stage_ablate() {
  [ "${ABLATE_TESTS:-}" = none ] || PYTHONPATH=$PWD timeout "${AB_TEST_S:-240}" $PY -m pytest -q -p no:cacheprovider \
    ${ABLATE_TESTS:-tests/test_ablation_cuda.py tests/test_ablation_gemm.py} 2>&1 | tail -15
  local L=${AB_LAYERS:-64} B V ck tag leg f cmd
  ck=$(ckpt_27b "$L")
  for leg in $(seq 1 "${AB_LEGS:-1}"); do for B in ${AB_BATCHES:-1 16}; do
    for V in real ${ABLATE:-norm norm:empty tower tower:empty tower:read tower:read+lm_head:read delta_rule attention}; do
    tag=$(echo "$V" | tr ',=:+' '_-__'); f="/tmp/ablate-bench-${L}L-b$B-$tag-leg$leg"
    # the real engine's `engine bench`, each ablation's `python -m tools.ablation` (the same record)
    if [ "$V" = real ]; then cmd=(-m engine.cli bench); else cmd=(-m tools.ablation --ablate "$V"); fi
    PYTHONPATH=$PWD timeout "${AB_BENCH_S:-120}" $PY "${cmd[@]}" --model "$ck" --backend cuda \
      --lm-head packed --batch "$B" --prompt-len 128 --gen-len 64 --iters 3 --json 2>"$f.err" | tail -1 > "$f.json"
    $PY -c "
import json; r = json.load(open('$f.json')); p = r['params']
open('$OUT/ablation-benches.jsonl', 'a').write(json.dumps({'layers': $L, 'variant': '$V', 'leg': $leg, **r}) + '\\n')
print('27b-${L}L leg $leg batch', p['batch'], '$V', round(r['ms_per_step'], 3), 'ms/step')" 2>/dev/null \
      || { echo "bench b$B $V leg $leg failed:"; tail -n 5 "$f.err"; }
  done; done; done
  [ -s "$OUT/ablation-benches.jsonl" ] && PYTHONPATH=$PWD $PY -m tools.ablation.table "$OUT/ablation-benches.jsonl" | tee "$OUT/ablation.txt" \
    | head -n -1
}

stage_kernels() {
  local L=${KERNELS_LAYERS:-64} B ck
  ck=$(ckpt_27b "$L")
  for B in ${KERNELS_BATCHES:-1}; do
    echo "-- 27b-${L}L batch $B"
    PYTHONPATH=$PWD timeout "${KERNELS_S:-180}" $PY scripts/decode_kernels.py --model "$ck" --batch "$B" \
      --top "${KERNELS_TOP:-40}" ${KERNELS_ARGS:-} > "$OUT/kernels-${L}L-b$B${KERNELS_TAG:-}.txt" 2>&1
    echo "rc=$?"; head -n -1 "$OUT/kernels-${L}L-b$B${KERNELS_TAG:-}.txt" | tail -n "$((${KERNELS_TOP:-40} + 5))"
  done
}

for s in "$@"; do
  t0=$SECONDS
  "stage_$s" > "$OUT/$s.log" 2>&1; rc=$?
  echo "== $s rc=$rc $((SECONDS - t0))s"; tail -n "${TAIL:-12}" "$OUT/$s.log"
done
