"""tools/ablation: the parts' parsing, what an ablation replaces through the Engine's `substitute` hook,
the tool's command, and the grid's refusal of an ablated record (wrong tokens: timing only). The GEMM
side is tests/test_ablation_gemm.py; the CUDA half tests/test_ablation_cuda.py."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from engine.backends import Fp4Gemm, register_fp4_gemm, unregister_fp4_gemm
from engine.options import EngineOptions
from engine_oracle import tiny
from tools import plain_read
from tools.ablation import parts as ablate
from tools.ablation.parts import Ablation, AblationError


@pytest.mark.parametrize("text, want", [
    ("", {}),
    ("norm", {"norm": "free"}),
    ("norm+tower:read", {"norm": "free", "tower": "read"}),
    ("norm:empty+tower:empty", {"norm": "empty", "tower": "empty"}),
    (" lm_head:free + delta_rule+attention ", {"lm_head": "free", "delta_rule": "free", "attention": "free"}),
])
def test_parse_reads_parts_and_modes_in_order(text, want):
    got = ablate.parse(text)
    assert got == want and list(got) == list(want)
    assert ablate.parse(ablate.label(got)) == got
    assert str(Ablation(text)) == ablate.label(got)


@pytest.mark.parametrize("text, match", [
    ("norms", r"unknown part 'norms' in 'norms'; expected tower \+ lm_head \+ norm \+ delta_rule \+ attention, "
              r"each with an optional :free\|:empty\|:read"),
    ("norm,tower", r"unknown part 'norm,tower'"),  # a comma is the A/B script's separator, not ours
    ("norm:read", r"'norm' has no mode 'read' in 'norm:read'; expected free, empty$"),
    ("tower:fast", r"'tower' has no mode 'fast'.*expected free, empty, read$"),
    ("tower+tower:read", r"'tower' named twice"),
])
def test_parse_refuses_what_it_does_not_know_naming_the_flag(text, match):
    with pytest.raises(AblationError, match=match) as e:
        Ablation(text)
    assert str(e.value).startswith("--ablate: ")


def test_ablate_is_no_engine_option():
    """The engine takes an ablation only through its constructor's hook, never as an option a grid
    arm, a config or the orchestrator could set."""
    with pytest.raises(ValueError, match="option ablate: unknown"):
        EngineOptions.parse(["ablate=norm"])


def _recording_kernels(calls: list) -> SimpleNamespace:
    def fn(name):
        return lambda *a, **kw: calls.append(name) or name
    names = ("rms_norm", "add_rms_norm", "conv_step", "delta_step", "attention_prep",
             "paged_decode_gated", "silu_mul", "delta_prefill")
    return SimpleNamespace(prefill=True, **{n: fn(n) for n in names})


def test_the_fused_kernels_of_an_ablated_part_launch_nothing_and_return_their_shapes():
    calls: list = []
    ns = _recording_kernels(calls)
    out = Ablation("norm+delta_rule+attention")("fused", ns)
    h, z = torch.randn(2, 8), torch.randn(2, 6, dtype=torch.bfloat16)
    assert out.rms_norm(h, None, 1e-6) is h
    res, x = out.add_rms_norm(h, object(), None, 1e-6, num_warps=4)
    assert res is h and x is h
    qkv = torch.randn(2, 12)
    assert out.conv_step(qkv, None, None, None) is qkv
    y = out.delta_step(qkv, z, None, None)
    assert y.shape == z.shape and y.dtype == z.dtype
    q = torch.randn(3, 4, 16, dtype=torch.bfloat16)
    assert out.attention_prep(q, None, None) is q
    o = out.paged_decode_gated(q, None, None, None, None, None, 1.0)
    assert o.shape == (3, 64) and o.dtype == torch.bfloat16
    assert calls == []  # not one of the real functions ran
    assert out.silu_mul() == "silu_mul" and out.delta_prefill() == "delta_prefill" and out.prefill is True
    assert ns.rms_norm(h, None, 1e-6) == "rms_norm"  # the engine's own namespace is left as it was


def test_the_empty_mode_launches_one_empty_kernel_in_each_ones_place(monkeypatch):
    from tools import plain_read

    launched: list = []
    monkeypatch.setattr(plain_read, "empty_launch", lambda device: launched.append(device))
    calls: list = []
    out = Ablation("norm:empty+attention")("fused", _recording_kernels(calls))
    h = torch.randn(2, 8)
    assert out.rms_norm(h, None, 1e-6) is h and out.add_rms_norm(h, None, None, 1e-6) == (h, h)
    q = torch.randn(1, 2, 4)
    assert out.attention_prep(q) is q  # attention: free, no launch
    assert launched == [h.device] * 2 and calls == []


def test_only_the_named_parts_are_replaced():
    calls: list = []
    ns = _recording_kernels(calls)
    assert Ablation("tower")("fused", ns) is ns
    out = Ablation("attention")("fused", ns)
    assert out.rms_norm(None, None, None) == "rms_norm" and out.delta_step(None, None) == "delta_step"
    assert calls == ["rms_norm", "delta_step"]


def test_the_fused_kernels_record_which_ablated_parts_ran():
    ab = Ablation("norm+attention")
    out = ab("fused", _recording_kernels([]))
    assert ab.unused() == ["norm", "attention"]
    out.rms_norm(torch.randn(2, 8), None, 1e-6)
    assert ab.unused() == ["attention"]


@pytest.fixture
def reads(monkeypatch):
    """No plain read or empty kernel runs on the CPU: each is recorded."""
    got: list = []
    monkeypatch.setattr(plain_read, "read_pair", lambda a, b: got.append(("read", a.data_ptr(), b.data_ptr())))
    monkeypatch.setattr(plain_read, "empty_launch", lambda device: got.append(("empty", device.type)))
    return got


def test_a_gemm_part_replaces_every_launch_and_keeps_prepare_and_merge(reads):
    from nvfp4 import Nvfp4Weight, quantize

    seen = []
    g = Fp4Gemm(prepare=lambda w: None, matmul=lambda x, w: seen.append("mm"), merge=lambda ws: None,
                matmul_merged=lambda x, m: seen.append("merged"), matmul_split=lambda x, w: seen.append("split"))
    ab = Ablation("tower:read")
    assert ab("lm_head", g) is g
    t = ab("tower", g)
    assert t.prepare is g.prepare and t.merge is g.merge and ab.unused() == ["tower"]
    w = Nvfp4Weight.from_quantized("layers.0.mlp.up_proj", quantize(torch.randn(64, 128) * 0.02))
    y = t.matmul(torch.randn(3, 128).to(torch.bfloat16), w)
    assert y.shape == (3, 64) and y.dtype == torch.bfloat16
    assert t.matmul_split(torch.randn(3, 128).to(torch.bfloat16), w).shape == (3, 64)
    assert seen == [] and ab.unused() == []  # the real GEMM never ran
    assert reads == [("read", w.packed.data_ptr(), w.block_scale.data_ptr())] * 2
    assert Fp4Gemm(prepare=g.prepare, matmul=g.matmul).matmul_split is None
    assert ab("tower", Fp4Gemm(prepare=g.prepare, matmul=g.matmul)).matmul_split is None  # none where it had none
    with pytest.raises(AblationError, match=r"--ablate tower:read: tower can be ablated only where it runs "
                                            r"on the fp4 GEMM; this backend has none"):
        ab("tower", None)


class _Gemm:
    """A CPU stand-in for the fp4 GEMM (the product from the dequantized weights) that records which
    weights reached it."""

    def __init__(self):
        self.calls: list[str] = []

    def prepare(self, w):
        pass

    def matmul(self, x, w):
        self.calls.append(w.name)
        return (x.float() @ w.dequantize(torch.float32).t()).to(torch.bfloat16)


@pytest.fixture
def cpu_gemm():
    g = _Gemm()
    register_fp4_gemm("cpu", Fp4Gemm(g.prepare, g.matmul))
    yield g
    unregister_fp4_gemm("cpu")


def test_the_engine_is_real_without_the_hook(monkeypatch, cpu_gemm):
    from engine.engine import Engine

    monkeypatch.setenv("REGATE_ABLATE", "tower")  # the old variable does nothing
    eng = Engine(tiny(), backend="cpu", lm_head="packed")
    assert eng.substituted is None
    eng.generate([[3, 1, 4]], 2)
    assert "lm_head" in cpu_gemm.calls and any(c.startswith("layers.") for c in cpu_gemm.calls)


@pytest.mark.parametrize("text, tower, head", [("tower", False, True), ("lm_head", True, False),
                                               ("tower+lm_head:empty", False, False)])
def test_only_the_ablated_gemms_leave_the_real_gemm(reads, cpu_gemm, text, tower, head):
    from engine.engine import Engine

    ab = Ablation(text)
    eng = Engine(tiny(), backend="cpu", lm_head="packed", substitute=ab)
    assert eng.substituted == text
    out = eng.generate([[3, 1, 4, 1, 5]], 3)
    assert len(out[0]) == 3 and ab.unused() == []  # it runs to the end; its tokens mean nothing
    assert ("lm_head" in cpu_gemm.calls) == head
    assert any(c.startswith("layers.") for c in cpu_gemm.calls) == tower
    assert all(r[0] == "empty" for r in reads) and (len(reads) > 0) == ("empty" in text)


def test_what_the_backend_does_not_run_as_a_kernel_cannot_be_ablated(cpu_gemm):
    from engine.engine import Engine

    with pytest.raises(AblationError, match="norm can be ablated only on the fused decode kernels"):
        Engine(tiny(), backend="cpu", lm_head="packed", substitute=Ablation("norm"))
    unregister_fp4_gemm("cpu")
    with pytest.raises(AblationError, match="tower can be ablated only where it runs on the fp4 GEMM"):
        Engine(tiny(), backend="cpu", lm_head="packed", substitute=Ablation("tower"))


def test_a_bench_of_an_ablated_engine_says_so_and_a_grid_refuses_its_number(cpu_gemm, capsys):
    from engine.commands.bench import print_table, run_bench
    from grids.runner import GridError, parse_bench

    r = run_bench(tiny(), "cpu", "packed", 1, 4, 3, 1, 0, 0, substitute=Ablation("tower"))
    assert r["ablated"] == "tower" and "ablate" not in r["options"]
    print_table(r, None)
    assert "ABLATED (tower): timing only, the tokens are wrong" in capsys.readouterr().out
    with pytest.raises(GridError, match=r"cell x: the bench ran an ablated engine \(tower: tools/ablation\)"):
        parse_bench(json.dumps(r), "cell x")
    real = run_bench(tiny(), "cpu", "packed", 1, 4, 3, 1, 0, 0)
    assert real["ablated"] is None
    parse_bench(json.dumps(real), "cell x")  # the real engine's record is taken


def _tool(args: list[str]):
    from tools.ablation.cli import app

    return CliRunner().invoke(app, args + ["--model", str(tiny()), "--backend", "cpu", "--prompt-len", "4",
                                           "--gen-len", "3", "--iters", "1", "--warmup", "0", "--json"])


def test_the_tool_prints_the_benchs_line_naming_the_ablation(cpu_gemm):
    res = _tool(["--ablate", "tower", "--option", "merge_projections=0"])
    assert res.exit_code == 0, res.output
    line = json.loads(res.stdout.strip().splitlines()[-1])
    assert line["ablated"] == "tower" and line["options"]["merge_projections"] is False
    assert line["params"]["lm_head"] == "packed" and line["decode_tok_s"] > 0


@pytest.mark.parametrize("args, match", [
    (["--ablate", "lm_head", "--lm-head", "dequant"],
     r"ablation: --ablate lm_head: lm_head never ran in this engine \(cpu, the dequant arm\), so nothing of it was timed"),
    (["--ablate", "bogus"], r"ablation: --ablate: unknown part 'bogus'"),
    (["--ablate", "tower", "--option", "split_waves=0"], r"ablation: option split_waves"),
])
def test_the_tool_refuses_what_it_could_not_time(cpu_gemm, args, match):
    res = _tool(args)
    assert res.exit_code == 2
    assert re.search(match, res.output), res.output
