"""engine/ablate.py: the option ablate's parsing, what each ablation replaces, and every place that must
refuse an ablated engine (wrong tokens: timing only). The CUDA half is tests/test_ablate_cuda.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from engine import ablate
from engine.options import EngineOptions
from engine.backends import Fp4Gemm, register_fp4_gemm, unregister_fp4_gemm
from engine.errors import AblationError
from engine_oracle import tiny


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


@pytest.mark.parametrize("text, match", [
    ("norms", r"unknown part 'norms' in 'norms'; expected tower \+ lm_head \+ norm \+ delta_rule \+ attention, "
              r"each with an optional :free\|:empty\|:read"),
    ("norm,tower", r"unknown part 'norm,tower'"),  # a comma is the A/B script's separator, not ours
    ("norm:read", r"'norm' has no mode 'read' in 'norm:read'; expected free, empty$"),
    ("tower:fast", r"'tower' has no mode 'fast'.*expected free, empty, read$"),
    ("tower+tower:read", r"'tower' named twice"),
])
def test_parse_refuses_what_it_does_not_know_naming_the_option(text, match):
    with pytest.raises(AblationError, match=match) as e:
        ablate.parse(text)
    assert str(e.value).startswith("option ablate: ")


def _recording_kernels(calls: list) -> SimpleNamespace:
    def fn(name):
        return lambda *a, **kw: calls.append(name) or name
    names = ("rms_norm", "add_rms_norm", "conv_step", "delta_step", "attention_prep",
             "paged_decode_gated", "silu_mul", "delta_prefill")
    return SimpleNamespace(prefill=True, **{n: fn(n) for n in names})


def test_the_fused_kernels_of_an_ablated_part_launch_nothing_and_return_their_shapes():
    calls: list = []
    ns = _recording_kernels(calls)
    out = ablate.fused(ns, ablate.parse("norm+delta_rule+attention"))
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
    from kernels import plain_read

    launched: list = []
    monkeypatch.setattr(plain_read, "empty_launch", lambda device: launched.append(device))
    calls: list = []
    out = ablate.fused(_recording_kernels(calls), ablate.parse("norm:empty+attention"))
    h = torch.randn(2, 8)
    assert out.rms_norm(h, None, 1e-6) is h and out.add_rms_norm(h, None, None, 1e-6) == (h, h)
    q = torch.randn(1, 2, 4)
    assert out.attention_prep(q) is q  # attention: free, no launch
    assert launched == [h.device] * 2 and calls == []


def test_only_the_named_parts_are_replaced():
    calls: list = []
    ns = _recording_kernels(calls)
    assert ablate.fused(ns, ablate.parse("tower")) is ns
    out = ablate.fused(ns, ablate.parse("attention"))
    assert out.rms_norm(None, None, None) == "rms_norm" and out.delta_step(None, None) == "delta_step"
    assert calls == ["rms_norm", "delta_step"]


def test_a_gemm_part_passes_its_mode_to_every_launch_and_keeps_prepare_and_merge():
    seen = []
    g = Fp4Gemm(prepare=lambda w: None, matmul=lambda x, w, ablate=None: seen.append(("mm", ablate)),
                merge=lambda ws: None, matmul_merged=lambda x, m, ablate=None: seen.append(("merged", ablate)),
                matmul_split=lambda x, w, ablate=None: seen.append(("split", ablate)))
    abl = ablate.parse("tower:read")
    assert ablate.gemm(g, abl, "lm_head") is g and ablate.gemm(None, {}, "tower") is None
    t = ablate.gemm(g, abl, "tower")
    assert t.prepare is g.prepare and t.merge is g.merge
    t.matmul(0, 0), t.matmul_merged(0, 0), t.matmul_split(0, 0)
    assert seen == [("mm", "read"), ("merged", "read"), ("split", "read")]
    with pytest.raises(AblationError, match=r"option ablate=tower:read: tower can be ablated only where it runs "
                                            r"on the fp4 GEMM; this backend has none"):
        ablate.gemm(None, abl, "tower")


class _Gemm:
    """A CPU stand-in for the fp4 GEMM that honours `ablate` as the CUDA one does (no product: the
    output unwritten) and records which weights each mode saw."""

    def __init__(self):
        self.calls: list[tuple[str, str | None]] = []

    def prepare(self, w):
        pass

    def matmul(self, x, w, ablate=None):
        self.calls.append((w.name, ablate))
        if ablate is not None:
            return torch.empty(x.shape[0], w.out_features, dtype=torch.bfloat16)
        return (x.float() @ w.dequantize(torch.float32).t()).to(torch.bfloat16)


@pytest.fixture
def cpu_gemm():
    g = _Gemm()
    register_fp4_gemm("cpu", Fp4Gemm(g.prepare, g.matmul))
    yield g
    unregister_fp4_gemm("cpu")


def test_an_engine_refuses_to_start_ablated_unless_it_was_asked_for_one(monkeypatch, cpu_gemm):
    from engine.engine import Engine

    with pytest.raises(AblationError, match=r"option ablate=tower: an ablated engine computes wrong tokens; only "
                                            r"`engine bench` and `python -m tools.attribution` build one"):
        Engine(tiny(), backend="cpu", lm_head="packed", options=EngineOptions(ablate="tower"))
    with pytest.raises(AblationError, match="unknown part 'bogus'"):
        EngineOptions(ablate="bogus")
    monkeypatch.setenv("REGATE_ABLATE", "tower")  # the old variable does nothing now: the engine is real
    assert Engine(tiny(), backend="cpu", lm_head="packed").ablation == {}


@pytest.mark.parametrize("text, tower, head", [("tower:read", "read", None), ("lm_head", None, "free"),
                                               ("tower+lm_head:read", "free", "read")])
def test_the_ablated_gemms_get_their_mode_and_the_others_none(cpu_gemm, text, tower, head):
    from engine.engine import Engine

    eng = Engine(tiny(), backend="cpu", lm_head="packed", allow_ablation=True, options=EngineOptions(ablate=text))
    out = eng.generate([[3, 1, 4, 1, 5]], 3)
    assert len(out[0]) == 3  # it runs to the end; its tokens mean nothing
    modes = {name: mode for name, mode in cpu_gemm.calls}
    assert modes.pop("lm_head") == head
    assert modes and set(modes.values()) == {tower}, modes


def test_what_the_backend_does_not_run_as_a_kernel_cannot_be_ablated(cpu_gemm):
    from engine.engine import Engine

    with pytest.raises(AblationError, match="norm can be ablated only on the fused decode kernels"):
        Engine(tiny(), backend="cpu", lm_head="packed", allow_ablation=True, options=EngineOptions(ablate="norm"))
    with pytest.raises(AblationError, match="the dequant arm's head does not run on the fp4 GEMM here"):
        Engine(tiny(), backend="cpu", lm_head="dequant", allow_ablation=True, options=EngineOptions(ablate="lm_head"))
    unregister_fp4_gemm("cpu")
    with pytest.raises(AblationError, match="tower can be ablated only where it runs on the fp4 GEMM"):
        Engine(tiny(), backend="cpu", lm_head="packed", allow_ablation=True, options=EngineOptions(ablate="tower"))


def test_a_bench_of_an_ablated_engine_says_so_and_a_grid_refuses_its_number(cpu_gemm, capsys):
    from engine.commands.bench import print_table, run_bench
    from grids.runner import GridError, parse_bench

    r = run_bench(tiny(), "cpu", "packed", 1, 4, 3, 1, 0, 0, options=EngineOptions(ablate="tower:read"))
    assert r["ablated"] == "tower:read" and r["options"]["ablate"] == "tower:read"
    print_table(r, None)
    assert "ABLATED (option ablate=tower:read): timing only, the tokens are wrong" in capsys.readouterr().out
    with pytest.raises(GridError, match=r"cell x: the bench ran an ablated engine \(option ablate=tower:read"):
        parse_bench(json.dumps(r), "cell x")
    real = run_bench(tiny(), "cpu", "packed", 1, 4, 3, 1, 0, 0)
    assert real["ablated"] is None
    parse_bench(json.dumps(real), "cell x")  # the real engine's record is taken


@pytest.fixture(scope="module")
def orchestrator_app():
    from orchestrator import cli

    if not cli.app.registered_commands:
        cli._register_all()
    return cli.app


@pytest.mark.parametrize("command", ["gate", "compare", "grid", "mutate", "serve"])
def test_the_orchestrators_measuring_commands_refuse_to_start(orchestrator_app, command):
    # --help: were the refusal missing, the command would print its help and exit 0, not run
    res = CliRunner().invoke(orchestrator_app, [command, "--help"], env={"REGATE_ABLATE": "norm"})
    assert res.exit_code == 2
    assert (f"orchestrator: error: REGATE_ABLATE=norm is set: it builds engines with parts removed (wrong tokens, "
            f"timing only; engine/ablate.py), which `orchestrator {command}` never gates or measures") in res.output


def test_the_orchestrators_other_commands_still_run(orchestrator_app):
    res = CliRunner().invoke(orchestrator_app, ["owed", "--help"], env={"REGATE_ABLATE": "norm"})
    assert res.exit_code == 0, res.output
