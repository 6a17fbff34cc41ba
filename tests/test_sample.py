"""The decode step's pick on a kernel (kernels/sample.py) against its reference, torch's topk and
argmax: on the GPU when there is one, else under Triton's CPU interpreter (tests/conftest.py)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
pytest.importorskip("triton")
from kernels import sample  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _pick(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled [rows, 1+2k] FP64, prev_ids) from the kernel, both first filled with garbage."""
    rows = logits.shape[0]
    out = torch.full((rows, 1 + 2 * k), -7.0, dtype=torch.float64, device=DEV)
    prev = torch.full((rows + 2,), -1, dtype=torch.long, device=DEV)
    sample.greedy_topk(logits, k, out, prev)
    return out, prev


def _stable_reference(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[greedy, k values, k ids] by a full sort on (value descending, id ascending): the order the
    engine's pick promises, written without topk's own tie rule."""
    rows = []
    for row in logits.float().cpu():
        order = sorted(range(row.numel()), key=lambda i: (-row[i].item(), i))[:k]
        rows.append([float(order[0])] + [row[i].item() for i in order] + [float(i) for i in order])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("rows, vocab, k", [(1, 100, 1), (3, 4096, 5), (2, 4097, 5), (2, 10_000, 8), (1, 9000, 3)])
def test_the_pick_is_torch_topk_and_argmax_bit_for_bit(rows, vocab, k):
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(2), "little"))
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(DEV)
    out, prev = _pick(logits, k)
    vals, ids = logits.topk(k, dim=-1)
    assert torch.equal(out[:, 0].long(), logits.argmax(dim=-1))
    assert torch.equal(out[:, 1:1 + k], vals.double()) and torch.equal(out[:, 1 + k:].long(), ids)
    assert torch.equal(prev[:rows], logits.argmax(dim=-1)) and (prev[rows:] == -1).all()


def test_ties_go_to_the_lower_id_in_every_place():
    """Logits from 5 values over 3000 ids: every pick is a tie; the order is (value down, id up),
    across chunk boundaries too (BLOCK-wide chunks, 3000 < 2 * BLOCK so a tie spans both)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(2), "little"))
    logits = torch.randint(0, 5, (3, 2 * sample.BLOCK + 37), generator=g).float()
    logits[1, sample.BLOCK + 3] = 9.0  # one row's maximum in its second chunk only
    logits[2, [sample.BLOCK - 1, sample.BLOCK, 17]] = 9.0  # a tie on both sides of a chunk boundary
    out, _ = _pick(logits.to(DEV), 6)
    assert torch.equal(out.cpu(), _stable_reference(logits, 6))
    assert out[2, 7:10].long().tolist() == [17, sample.BLOCK - 1, sample.BLOCK]
    assert torch.equal(out[:, 0].long().cpu(), logits.argmax(dim=-1))


def test_nan_and_infinities_rank_as_torch_ranks_them():
    logits = torch.randn(3, 300)
    logits[0, 250] = float("nan")  # above every number: argmax's pick, its logit written back as NaN
    logits[1, :] = float("-inf")
    logits[1, [7, 200]] = torch.tensor([1.0, 2.0])  # two live logits, the rest -inf (ids in order)
    logits[2, 42] = float("inf")
    out, _ = _pick(logits.to(DEV), 4)
    out = out.cpu()
    assert out[0, 0] == 250 and out[0, 5] == 250 and torch.isnan(out[0, 1])
    assert out[1, 5:].long().tolist() == [200, 7, 0, 1] and out[1, 1:3].tolist() == [2.0, 1.0]
    assert out[1, 3:5].tolist() == [float("-inf")] * 2
    assert out[2, 0] == 42 and out[2, 1] == float("inf")
    for r in (0, 1, 2):
        assert out[r, 0] == logits[r].argmax().item()


def test_bf16_logits_and_k_equal_to_the_vocabulary():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 6, generator=g).to(torch.bfloat16)
    out, _ = _pick(logits.to(DEV), 6)
    vals, ids = logits.float().topk(6, dim=-1)
    assert torch.equal(out[:, 1:7].cpu(), vals.double()) and torch.equal(out[:, 7:].long().cpu(), ids)


@pytest.mark.parametrize("bad, match", [
    ({"k": 0}, "k=0 must be within 1..64"),
    ({"k": 65}, "k=65 must be within 1..64"),
    ({"sampled": torch.zeros(2, 11, dtype=torch.float32)}, "sampled must be FP64"),
    ({"sampled": torch.zeros(2, 10, dtype=torch.float64)}, r"sampled must be FP64 \[>= 2, >= 11\]"),
    ({"prev_ids": torch.zeros(1, dtype=torch.long)}, "prev_ids must be int64 with >= 2 entries"),
    ({"logits": torch.zeros(64, 2).t()}, "logits need unit stride"),
])
def test_bad_arguments_are_refused_by_name(bad, match):
    args = {"logits": torch.zeros(2, 64), "k": 5, "sampled": torch.zeros(2, 11, dtype=torch.float64),
            "prev_ids": torch.zeros(2, dtype=torch.long), **bad}
    args = {n: v.to(DEV) if isinstance(v, torch.Tensor) else v for n, v in args.items()}
    with pytest.raises(ValueError, match=match):
        sample.greedy_topk(args["logits"], args["k"], args["sampled"], args["prev_ids"])


def test_the_engine_picks_the_same_tokens_and_top_k_with_the_kernel(tmp_path, monkeypatch):
    """A CUDA engine's pick (inside its decode graphs) is the kernel; the CPU backend keeps torch's, so
    here the runner's pick is set by hand (the kernel on the CPU, torch's as the twin on CUDA). Either way
    generate's tokens and every step's top-k equal the reference engine's."""
    from engine.engine import Engine
    from tools.synth.checkpoint import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "tiny", preset="tiny", seed=3)
    prompts = [[5, 9, 2, 11], [7, 1], [3, 3, 3, 8, 1, 2]]

    def run(kernel: bool):
        eng = Engine(ckpt, backend=DEV.type, lm_head="packed", max_num_seqs=3, max_model_len=64)
        runner = eng.runner()
        assert runner.sample_kernel is (sample.greedy_topk if DEV.type == "cuda" else None)
        runner.sample_kernel = sample.greedy_topk if kernel else None
        return eng.generate(prompts, 12), eng.last_topk

    tokens, topk = run(True)
    want_tokens, want_topk = run(False)
    assert tokens == want_tokens
    for seq, want_seq in zip(topk, want_topk, strict=True):
        for step, (got, want) in enumerate(zip(seq, want_seq, strict=True)):
            assert got.logits == want.logits  # bit for bit
            # the kernel's tie rule (step 0 is the prefill's pick, torch's)
            assert step == 0 or got.ids == _lower_id_first(got), got
            # the same ids up to torch's order of equal values (on CUDA not by id), the k-th value's
            # ties aside: there each may keep a different id of that value
            assert _pairs(got, got.logits[-1]) == _pairs(want, got.logits[-1]), (got, want)


def _pairs(t, boundary: float) -> list[tuple[float, int]]:
    """(value, id) of a top-k but those of the boundary value, in one order."""
    return sorted((v, i) for v, i in zip(t.logits, t.ids) if v != boundary)


def _lower_id_first(t) -> list[int]:
    return [i for _, i in sorted(zip(t.logits, t.ids), key=lambda p: (-p[0], p[1]))]


def test_the_benchs_reference_is_the_runners_pick():
    """tools/tune/sample_bench.py times torch's side as the runner runs it: the same row as the kernel."""
    from tools.tune.sample_bench import reference

    logits = torch.randn(2, 5000).to(DEV)
    out, prev = _pick(logits, 5)
    ref_out, ref_prev = torch.zeros_like(out), torch.full_like(prev, -1)
    reference(logits, 5, ref_out, ref_prev)
    assert torch.equal(out, ref_out) and torch.equal(prev, ref_prev)


def test_the_kernel_picks_by_default_on_cuda_and_never_on_the_cpu():
    from engine.fused import fused_sample

    pick = fused_sample(torch.device("cuda"))
    assert pick is sample.greedy_topk
    assert fused_sample(torch.device("cpu")) is None
