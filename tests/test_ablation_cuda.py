"""tools/ablation on the GPU: an ablated engine decodes to the end from its CUDA graphs, and an eager
decode step launches no kernel of an ablated part (the GEMM's `read` launches the plain read instead)."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine_oracle import tiny
from tools.ablation.parts import Ablation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ALL = "norm+delta_rule+attention+tower:read+lm_head:read"
# Kernel names a part launches on the fused path (Triton functions; the tile GEMM's C++ templates).
KERNELS = {"norm": ("add_rms_norm",), "delta_rule": ("delta_step", "conv_step"),
           "attention": ("attention_prep", "paged_decode"), "gemm": ("tile_gemm", "wgmma")}


def _engine(monkeypatch, text: str, graphs: bool | None = None) -> Engine:
    return Engine(tiny(), backend="cuda", lm_head="packed", max_num_seqs=2, max_model_len=64, cuda_graphs=graphs,
                  substitute=Ablation(text) if text else None)


@pytest.mark.parametrize("text", ["norm", "norm:empty", "delta_rule", "attention:empty", "tower", "tower:empty",
                                  "tower:read", "lm_head", ALL])
def test_an_ablated_engine_decodes_from_its_graphs_to_the_end(monkeypatch, text):
    eng = _engine(monkeypatch, text)
    out = eng.generate([[3, 1, 4, 1, 5], [2, 7, 1]], 6)
    assert [len(o) for o in out] == [6, 6]
    assert eng.substituted == text
    assert eng.runner().graphs, "the decode steps did not run from CUDA graphs"


def _decode_kernels(eng: Engine) -> list[str]:
    from tools.attribution.capture import decode_window, profiled

    _, trace = profiled(lambda: eng.generate([[3, 1, 4, 1, 5]], 4), eng.device)
    lo, hi = decode_window(trace)
    return [a["name"] for a in trace.device if lo <= a["start"] < hi]


def test_an_eager_step_launches_no_kernel_of_an_ablated_part(monkeypatch):
    real = _decode_kernels(_engine(monkeypatch, "", graphs=False))
    for names in KERNELS.values():  # the names match: the check below is not vacuous
        assert any(n in k for k in real for n in names), (names, sorted(set(real)))
    assert not any("read_pair" in k for k in real)
    ablated = _decode_kernels(_engine(monkeypatch, ALL, graphs=False))
    for part, names in KERNELS.items():
        assert not any(n in k for k in ablated for n in names), (part, sorted(set(ablated)))
    assert any("read_pair" in k for k in ablated)
