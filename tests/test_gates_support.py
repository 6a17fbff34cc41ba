"""gates.suites.support: the margin rule and the field walk the suites judge the engine with."""
from __future__ import annotations

import sys

import torch

from nvfp4 import Nvfp4Weight, quantize
from gates.suites.support import (compare_free_running, judge_greedy, judge_margins, layer_type_of,
                                  live_float_tensors, nvfp4_weights, walk)


def _logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


def test_agreeing_tokens_are_all_compared():
    v = judge_greedy([1, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]))
    assert (v.compared, v.failed, v.undetermined) == (2, [], None)


def test_a_decided_difference_fails_and_comparison_goes_on():
    v = judge_greedy([2, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]), tol=0.5)
    assert v.failed == [(0, 2, 1, 1.0)] and v.compared == 2 and v.undetermined is None


def test_margins_judge_every_position_and_count_the_undetermined():
    logits = _logits([[0.0, 2.0, 1.9], [3.0, 1.0, 0.0], [0.0, 0.0, 4.0]])
    v = judge_margins([2, 0, 1], logits, tol=0.5)  # pos 0 undetermined (0.1), pos 2 decided and wrong
    assert (v.compared, v.undetermined) == (3, 1)
    assert v.failed == [(2, 1, 2, 4.0)]
    assert judge_margins([1, 0, 2], logits, tol=0.01).undetermined == 0


def _run(ids, tops):
    return ids, [(tuple(t), tuple(range(len(t)))) for t in tops]


def test_free_runs_identical_have_no_divergence_and_their_logit_delta():
    a = _run([1, 2], [[5.0, 4.0], [6.0, 1.0]])
    b = _run([1, 2], [[5.1, 4.0], [6.0, 0.5]])
    v = compare_free_running(*a, *b)
    assert v.diverged_at is None and v.tie_margin == 0.0 and abs(v.max_delta - 0.5) < 1e-9


def test_free_runs_diverge_at_a_near_tie_and_later_logits_are_not_compared():
    a = _run([1, 7, 9], [[5.0, 4.0], [6.0, 5.9], [100.0, 0.0]])
    b = _run([1, 8, 3], [[5.0, 4.0], [6.05, 6.0], [-50.0, -60.0]])  # after the split anything goes
    v = compare_free_running(*a, *b)
    assert v.diverged_at == 1 and abs(v.tie_margin - 0.1) < 1e-9 and abs(v.max_delta - 0.1) < 1e-9


def test_sorted_topk_compare_order_statistics_whatever_the_ids():
    a = ([4], [((3.0, 2.0), (4, 5))])
    b = ([4], [((3.0, 2.0), (4, 6))])  # a different runner-up id with the same value: no delta
    assert compare_free_running(*a, *b).max_delta == 0.0


def test_an_undecided_difference_is_listed_with_its_margin_and_ends_the_comparison():
    v = judge_greedy([2, 2, 2], _logits([[0.0, 1.0, 0.9995], [0.0, 5.0, 0.0], [0.0, 5.0, 0.0]]), tol=2e-3)
    assert v.failed == [] and v.compared == 0
    j, ours, best, margin = v.undetermined
    assert (j, ours, best) == (0, 2, 1) and abs(margin - 5e-4) < 1e-6


class _Opaque:
    """Not an engine class: the walk must still look inside."""

    def __init__(self, payload):
        self.payload = payload


def _weight(name: str) -> Nvfp4Weight:
    return Nvfp4Weight.from_quantized(name, quantize(torch.randn(4, 16)))


def test_walk_finds_weights_stashed_anywhere_once():
    a, b, c = _weight("layers.0.mlp.up_proj"), _weight("layers.1.self_attn.q_proj"), _weight("lm_head")
    root = {"x": [a, (b,)], "y": _Opaque({"deep": [c, a]}), "f": len, "t": torch.zeros(2)}
    found = nvfp4_weights(root)
    assert sorted(w.name for w in found) == ["layers.0.mlp.up_proj", "layers.1.self_attn.q_proj", "lm_head"]
    paths = {p for p, o in walk(root) if o is c}
    assert paths == {"['y'].payload['deep'][0]"}


def test_layer_type_of_names():
    types = ["linear_attention", "full_attention"]
    assert layer_type_of(_weight("layers.1.self_attn.o_proj"), types) == "full_attention"
    assert layer_type_of(_weight("lm_head"), types) == "lm_head"


def test_live_float_tensors_sees_a_copy_held_anywhere():
    shape = (3, 37)  # unlikely to exist elsewhere in the process
    assert live_float_tensors({shape}) == []
    held = {"cache": [torch.ones(shape)]}
    assert [tuple(t.shape) for t in live_float_tensors({shape})] == [shape]
    del held
    assert live_float_tensors({shape}) == []


# --- the oracle's own decode (issue 25 case 7) -----------------------------------------------------

import pytest  # noqa: E402

from engine.loader import load_checkpoint  # noqa: E402
from gates.suites import support  # noqa: E402


def test_the_spec_unpacker_agrees_with_compressed_tensors_bit_for_bit():
    pytest.importorskip("compressed_tensors")
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    spec, peer = support.spec_unpack(every_byte, 4, 128), support.peer_unpack(every_byte, 4, 128)
    assert torch.equal(spec, peer) and torch.equal(torch.signbit(spec), torch.signbit(peer))
    assert support.oracle_unpacker()[0] == "compressed-tensors"


@pytest.mark.parametrize("naming", support.NAMINGS)
def test_case7_the_oracle_does_not_decode_with_the_decoder_it_judges(naming, monkeypatch):
    """Issue 25 case 7: the oracle's weights came from `Nvfp4Weight.dequantize`, the engine's decoder;
    break that decoder and the oracle must not move with it."""
    model_dir = support.checkpoint(naming, "model.")
    ckpt = load_checkpoint(model_dir)
    honest = support.oracle_state_dict(ckpt, model_dir)
    monkeypatch.setattr(Nvfp4Weight, "dequantize", lambda self, dtype=torch.float32: torch.zeros(
        self.packed.shape[0], self.packed.shape[1] * 2, dtype=dtype))
    assert all(torch.equal(honest[k], v) for k, v in support.oracle_state_dict(ckpt, model_dir).items())


@pytest.mark.parametrize("naming", support.NAMINGS)
def test_the_oracle_decode_agrees_with_the_engines_to_rounding(naming):
    model_dir = support.checkpoint(naming, "model.language_model.")
    ckpt = load_checkpoint(model_dir)
    raw = support.RawTensors(model_dir)
    nvfp4 = {n: w for n, w in ckpt.linears.items() if isinstance(w, Nvfp4Weight)}
    assert "lm_head" in nvfp4 and len(nvfp4) > 1
    for name, w in nvfp4.items():
        module = "lm_head" if name == "lm_head" else f"{ckpt.prefix}{name}"
        ours = support.oracle_nvfp4(raw, module)
        torch.testing.assert_close(ours, w.dequantize(torch.float32), rtol=1e-6, atol=0, msg=module)


def test_without_compressed_tensors_the_spec_path_gives_the_same_oracle(monkeypatch):
    model_dir = support.checkpoint("compressed-tensors", "model.")
    ckpt = load_checkpoint(model_dir)
    with_peer = support.oracle_state_dict(ckpt, model_dir)
    monkeypatch.setitem(sys.modules, "compressed_tensors.compressors.nvfp4.helpers", None)  # as on the GPU box
    assert support.oracle_unpacker()[0] == "spec"
    without = support.oracle_state_dict(ckpt, model_dir)
    assert all(torch.equal(with_peer[k], v) for k, v in without.items())


def test_a_module_without_nvfp4_tensors_is_named():
    raw = support.RawTensors(support.checkpoint("modelopt", "model."))
    with pytest.raises(KeyError, match="model.layers.0.nope: no NVFP4 tensors under either naming"):
        support.oracle_nvfp4(raw, "model.layers.0.nope")


FAKE_FIELD = {  # stand-ins for fla-core and causal-conv1d that fail loudly if the oracle calls them
    "fla/__init__.py": "def _no(*a, **k):\n    raise RuntimeError('FAKE FLA CALLED')\n"
                       "chunk_gated_delta_rule = fused_recurrent_gated_delta_rule = _no\n",
    "causal_conv1d/__init__.py": "def _no(*a, **k):\n    raise RuntimeError('FAKE CONV CALLED')\n"
                                 "causal_conv1d_fn = causal_conv1d_update = _no\n",
}
ORACLE_RUN = """
import sys
from gates.suites.support import build_oracle, oracle_logits
if sys.argv[1] == "imported-first":
    import transformers.models.qwen3_5.modeling_qwen3_5  # resolves its kernels to the fakes
print(repr(float(oracle_logits(build_oracle("modelopt", "model."), list(range(20, 37))).double().sum())))
"""


def _oracle_run(tmp_path, mode: str):
    import os
    import subprocess
    from pathlib import Path

    for rel, text in FAKE_FIELD.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    return subprocess.run([sys.executable, "-c", ORACLE_RUN, mode], capture_output=True, text=True, env=env,
                          cwd=root, timeout=600)


def test_the_oracle_runs_pytorch_even_where_field_kernels_import(tmp_path):
    """With fla and causal_conv1d importable (fakes that raise), the oracle still runs transformers'
    PyTorch paths and gives the logits it gives without them; a process that imported the modeling
    module before the oracle, with them importable, is refused by name."""
    from gates.suites.support import build_oracle, oracle_logits

    alone = float(oracle_logits(build_oracle("modelopt", "model."), list(range(20, 37))).double().sum())
    run = _oracle_run(tmp_path, "oracle-first")
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.strip().splitlines()[-1]) == alone
    refused = _oracle_run(tmp_path, "imported-first")
    assert refused.returncode != 0 and "could import" in refused.stderr and "'fla'" in refused.stderr, \
        refused.stderr[-2000:]
