"""SACRED: the engine on CUDA end to end, both lm_head arms, on a 27b-shaped checkpoint cut to 4
layers (full 5120 hidden, the real 248320 x 5120 NVFP4 head) and on the tiny one.

- arm against arm, greedy over NEW tokens at batch 1 and in a mixed batch (prompt lengths 1 to 33,
  KV blocks handed out scattered so no sequence's blocks are adjacent). On CUDA the two arms are NOT
  the same function: the dequant arm multiplies each weight rounded to BF16 (q * s * g does not fit
  BF16's 8 bits), the fp4 GEMM the exact q * s products with the global scale applied in FP32. Measured
  on the H200 (docs/lab/2026-12-03-gpu-gate.md): 228 of 448 top-k logits differ, and greedy runs flip at BF16
  near-ties. So each pair of runs must be identical up to its first divergence, their logits on that
  shared prefix within ARM_TOL, and a divergence only where both sides' top1 - top2 margins are within
  ARM_TOL (a near-tie; tallied as `arm_diverged_at_near_tie`), never at a decided position.
- CUDA graphs: the decode graph's replays (the batch padded to its bucket) against eager decode (the
  batch as it is), judged the same way: the two round differently through different GEMM shapes, and
  a replay that reads a stale static buffer fails here and against the oracle.
- ours (BF16 activations) against the oracle (transformers, FP32 on the GPU, teacher-forced on our
  tokens) by margins: top-k logits within LOGIT_TOL at every position; a token that differs where
  the oracle's top1 - top2 margin exceeds 2 x LOGIT_TOL fails; a position whose margin is within it is
  undetermined and tallied (`oracle_undetermined`, count/of), as the seed's "~8 of 32".
- the packed head really runs on the fp4 GEMM: the Linear dispatches to the registered kernel (a spy
  sees the call), nothing keeps a dequantized operand, and the device memory after prepare (the
  CUDA allocator's count) is lower than the dequant arm's by the head's BF16 size minus its packed
  size (1.70 GiB on the real head), within 1%.

Runs through `gates.suites.twin`, so its census is counted on the CPU (REGATE_CENSUS_TWIN=1) too.
Mutations this file must catch (gates/mutations/): the packed head dequantizing on CUDA; the decode
graph replaying a stale slot mapping.
"""
from __future__ import annotations

import functools
import gc
import random

import pytest
import torch

from engine.backends import Fp4Gemm, fp4_gemm_for
from engine.engine import Engine
from engine.linear import Nvfp4Linear
from engine.residency import iter_linears, iter_nvfp4_weights
from gates.suites.support import (ARMS, build_oracle_at, cached_checkpoint, compare_free_running, judge_margins,
                                  oracle_logits)
from gates.suites.twin import BACKEND, DEVICE, TWIN, allocated_bytes, needs_cuda, release_cached

pytestmark = needs_cuda

CKPTS = {"27b-4L": {"preset": "27b", "layers": 4}, "tiny": {"preset": "tiny"}}
# Oracle tolerance per checkpoint (BF16 activations against FP32). Measured on the H200, 2026-12-03
# (docs/lab/2026-12-03-gpu-gate.md): max |top-k logit - oracle| 0.164 on 27b-4L (logits of std 4 over 248320
# ids), 0.617 on tiny (one position of 192; the rest far below): the tiny tower's 128-wide BF16
# rounding weighs more per logit. ~1.5x room on each.
LOGIT_TOL = {"27b-4L": 0.25, "tiny": 1.0}
# Two CUDA runs of one prompt (two head GEMMs, or two batch shapes) on the same prefix: their logits
# differ by the BF16 output rounding (one ulp is 0.125 for logits in [16, 32)) plus the dequant
# arm's BF16 weight rounding (~0.004 here). Two ulps of room.
ARM_TOL = 0.25
NEW = 32
LENGTHS = (1, 5, 16, 17, 33, 8)  # inside a 16-token block, exactly one, spilling, several; batch 1 uses 8
MAX_SEQS, MAX_LEN, BLOCK = 8, 96, 16
NUM_BLOCKS = MAX_SEQS * MAX_LEN // BLOCK
SCATTERED = list(range(NUM_BLOCKS - 2, -1, -2)) + list(range(1, NUM_BLOCKS, 2))  # never adjacent


def checkpoint(name: str):
    params = CKPTS["tiny" if TWIN else name]
    return cached_checkpoint(naming="modelopt", head="nvfp4", seed=0, **params)


def prompts(name: str) -> list[list[int]]:
    vocab = 512 if TWIN or name == "tiny" else 248_320
    rng = random.Random(f"cuda-engine/{name}")
    return [[rng.randrange(vocab) for _ in range(n)] for n in LENGTHS]


def engine(name: str, arm: str, graphs: bool = True) -> Engine:
    return Engine(checkpoint(name), backend=BACKEND, lm_head=arm, max_num_seqs=MAX_SEQS, block_size=BLOCK,
                  max_model_len=MAX_LEN, num_blocks=NUM_BLOCKS, block_order=SCATTERED,
                  cuda_graphs=graphs and not TWIN)


@functools.lru_cache(maxsize=None)
def decoded(name: str, arm: str, graphs: bool = True) -> dict:
    """Greedy tokens and top-k of batch 1 (the last prompt alone) and of the mixed batch."""
    eng = engine(name, arm, graphs)
    out = {"graphs": sorted(eng.runner().graphs)}
    for batch, ps in (("single", prompts(name)[-1:]), ("mixed", prompts(name))):
        out[batch] = eng.generate([list(p) for p in ps], NEW)
        out[f"{batch}_topk"] = [[(tuple(t.logits), tuple(t.ids)) for t in seq] for seq in eng.last_topk]
    del eng
    gc.collect()
    release_cached()
    return out


@functools.lru_cache(maxsize=1)
def oracle(name: str):
    return build_oracle_at(checkpoint(name), DEVICE)


def judge_pair(check, what: str, a: tuple[list, list], b: tuple[list, list]) -> bool:
    """Two checks: logits agree on the shared prefix; any divergence sits at a near-tie. True if it diverged."""
    v = compare_free_running(a[0], a[1], b[0], b[1])
    check(v.max_delta <= ARM_TOL, f"{what}: top-k logits on the shared prefix differ by {v.max_delta:.3g} (> {ARM_TOL})")
    check(v.diverged_at is None or v.tie_margin <= ARM_TOL,
          f"{what}: ids diverge at pos {v.diverged_at} where a side was decided (margin {v.tie_margin:.3g} > {ARM_TOL})")
    return v.diverged_at is not None


@pytest.mark.parametrize("name", list(CKPTS))
def test_arms_agree(check, name):
    packed, dequant = decoded(name, "packed"), decoded(name, "dequant")
    diverged = total = 0
    for batch in ("single", "mixed"):
        for i, (a, b) in enumerate(zip(packed[batch], dequant[batch], strict=True)):
            check.equal(len(a), NEW, f"{batch} seq {i}: packed continuation length")
            check.equal(len(b), NEW, f"{batch} seq {i}: dequant continuation length")
            diverged += judge_pair(check, f"{batch} seq {i} packed vs dequant", (a, packed[f"{batch}_topk"][i]),
                                   (b, dequant[f"{batch}_topk"][i]))
            total += 1
    check.tally("arm_diverged_at_near_tie", diverged, total)


@pytest.mark.parametrize("name", list(CKPTS))
def test_graph_replay_agrees_with_eager(check, name):
    graphs, eager = decoded(name, "packed"), decoded(name, "packed", graphs=False)
    check(graphs["graphs"] == [1, 2, 4, 8] and not eager["graphs"],
          f"decode graphs captured for buckets {graphs['graphs']} (expected [1, 2, 4, 8]), eager none")
    diverged = 0
    for i, (g, e) in enumerate(zip(graphs["mixed"], eager["mixed"], strict=True)):
        diverged += judge_pair(check, f"mixed seq {i} graph vs eager", (g, graphs["mixed_topk"][i]),
                               (e, eager["mixed_topk"][i]))
    check.tally("graph_diverged_at_near_tie", diverged, len(LENGTHS))


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("name", list(CKPTS))
def test_ours_against_oracle(check, name, arm):
    ours = decoded(name, arm)
    model, tol = oracle(name), LOGIT_TOL[name]
    margin_tol = 2 * tol  # within it, a flipped top-1 cannot be blamed on either side
    worst, undetermined, total = 0.0, 0, 0
    for i, prompt in enumerate(prompts(name)):
        tokens, n = ours["mixed"][i], len(prompt)
        logits = oracle_logits(model, list(prompt) + tokens)[n - 1:n - 1 + len(tokens)]
        for j, (vals, ids) in enumerate(ours["mixed_topk"][i]):
            delta = float((torch.tensor(vals) - logits[j, list(ids)]).abs().max())
            worst = max(worst, delta)
            check(delta <= tol, f"seq {i} pos {j}: top-k logits off the oracle's by {delta:.3g} (> {tol})")
        verdict = judge_margins(tokens, logits, margin_tol)
        detail = ", ".join(f"pos {j}: ours {a} oracle {b} margin {m:.3g}" for j, a, b, m in verdict.failed)
        check(not verdict.failed, f"seq {i}: ids differ where the oracle was decided (margin > {margin_tol}): {detail}")
        undetermined, total = undetermined + verdict.undetermined, total + verdict.compared
    check.tally("oracle_undetermined", undetermined, total)
    check.note(f"{name} {arm}: max |top-k logit - oracle| {worst:.4g}; undetermined {undetermined}/{total} "
               f"(margin <= {margin_tol})")


@pytest.mark.parametrize("name", list(CKPTS))
def test_packed_head_runs_on_the_fp4_gemm(check, name):
    gemm = fp4_gemm_for(BACKEND)
    check(gemm is not None, f"the {BACKEND} backend has no fp4 GEMM registered")
    eng = engine(name, "packed", graphs=False)
    head = eng.model.lm_head
    check(isinstance(head, Nvfp4Linear) and gemm is not None and head.gemm is gemm,
          f"packed arm: the head is {type(head).__name__} on {getattr(head, 'gemm', None)}, expected an "
          "Nvfp4Linear on the registered fp4 GEMM")
    tower = [lin for lin in iter_linears(eng.model) if isinstance(lin, Nvfp4Linear) and lin.role == "tower"]
    check(bool(tower) and all(lin.gemm is gemm and gemm is not None for lin in tower),
          f"{sum(lin.gemm is not gemm for lin in tower)}/{len(tower)} tower projections off the fp4 GEMM")
    kept = [w.name for w in iter_nvfp4_weights(eng.model) if w.keep_dequant_b or w.dequant_b is not None]
    check(not kept, f"dequantized operands kept on a backend with an fp4 GEMM: {kept}")
    calls = []
    if isinstance(getattr(head, "gemm", None), Fp4Gemm):
        real = head.gemm
        head.gemm = Fp4Gemm(real.prepare, lambda x, w: (calls.append(w.name), real.matmul(x, w))[1])
    eng.score(prompts(name)[-1])
    check("lm_head" in calls, f"a packed-arm forward never called the fp4 GEMM for the head (calls: {calls[:5]})")


@pytest.mark.parametrize("name", list(CKPTS))
def test_head_residency_measured_by_the_allocator(check, name):
    held = {}
    for arm in ("dequant", "packed"):
        gc.collect()
        release_cached()
        before = allocated_bytes()
        eng = engine(name, arm, graphs=False)
        held[arm] = eng.memory["after_prepare"]["device_bytes"] - before
        if arm == "dequant":
            check(not any(w.name == "lm_head" for w in iter_nvfp4_weights(eng.model)),
                  "dequant arm: the head must hold BF16 only, no Nvfp4Weight")
        n, k = eng.config["vocab_size"], eng.config["hidden_size"]
        del eng
    expected = 2 * n * k - (n * k // 2 + n * k // 16)  # BF16 head minus packed nibbles and E4M3 scales
    saved = held["dequant"] - held["packed"]
    check(abs(saved - expected) <= 0.01 * expected,
          f"device bytes after prepare: dequant {held['dequant']} - packed {held['packed']} = {saved}, "
          f"expected {expected} ({expected / 2**30:.3f} GiB) within 1%")
    check.note(f"{name}: allocator after prepare: dequant {held['dequant'] / 2**30:.4f} GiB, packed "
               f"{held['packed'] / 2**30:.4f} GiB, saved {saved / 2**30:.4f} GiB (expected {expected / 2**30:.4f})")
