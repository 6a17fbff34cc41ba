"""The option recurrent_state (the Gated DeltaNet recurrent state stored in FP16, its maths FP32) on
the CPU path, and tools/state_precision.py, which measures what it does against the FP32 oracle. The
kernels' side is in tests/test_fused_decode.py and tests/test_fused_prefill.py."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from engine_oracle import tiny
from tools import state_precision


def _engine(state: str):
    from engine.engine import Engine
    from engine.options import EngineOptions

    return Engine(tiny(), backend="cpu", max_num_seqs=2, max_model_len=64, options=EngineOptions(recurrent_state=state))


def test_the_state_is_stored_in_fp16_and_its_maths_stay_fp32():
    ref, eng = _engine("fp32"), _engine("fp16")
    prompts = [[5, 17, 99, 3], [7, 7, 300, 2, 9]]
    assert ref.generate(prompts, 6) and eng.generate(prompts, 6)
    s32, s16 = ref.runner().state.recurrent_states, eng.runner().state.recurrent_states
    assert s32.dtype == torch.float32 and s16.dtype == torch.float16 and s16.shape == s32.shape
    assert s16.nbytes * 2 == s32.nbytes
    # the stored state is the FP32 one to within the FP16 roundings of the steps that made it, not 0
    assert s16.float().abs().max() > 0.01
    torch.testing.assert_close(s16.float(), s32, rtol=0.01, atol=1e-3)
    assert not torch.equal(s16.float(), s32)  # rounded, not kept
    for a, b in zip(ref.last_topk, eng.last_topk):
        assert max(abs(x - y) for ta, tb in zip(a, b) for x, y in zip(ta.logits, tb.logits)) < 0.01


def test_the_recurrence_alone_rounds_at_fp16_level_and_more_where_heads_remember():
    rows = state_precision.recurrence_drift([0.5, 1.0], [16, 256], heads=4, dk=32, dv=32)
    by = {(r["decay"], r["steps"]): r for r in rows}
    assert [(r["decay"], r["steps"]) for r in rows] == [(0.5, 16), (0.5, 256), (1.0, 16), (1.0, 256)]
    for r in rows:  # a state that forgets keeps about one rounding (2^-11 relative); it is never exact
        assert 2**-14 < r["fp16_state_rel"] < 0.01 and 2**-14 < r["fp16_out_rel"] < 0.01
    assert by[(1.0, 256)]["fp16_state_rel"] > 1.5 * by[(0.5, 256)]["fp16_state_rel"]  # long memory piles it up


def test_the_long_memory_copy_redraws_only_the_decays(tmp_path):
    from safetensors.torch import load_file

    src = tmp_path / "ck"
    shutil.copytree(tiny(), src)
    out = state_precision.long_memory(src)
    assert out.name == "ck-long-memory" and state_precision.long_memory(src) == out  # written once
    before, after = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(("linear_attn.A_log", "linear_attn.dt_bias")) for k in changed)
    # each layer's heads: A in [1, 16], dt in [0.001, 0.1], so decays exp(-A dt) from ~0.2 to ~0.999
    decays = []
    for name in sorted(k for k in changed if k.endswith("A_log")):
        a, dt = after[name].float().exp(), torch.nn.functional.softplus(after[name.replace("A_log", "dt_bias")].float())
        assert a.min() >= 0.99 and a.max() <= 16.1 and dt.min() >= 0.9e-3 and dt.max() <= 0.11
        decays += torch.exp(-a * dt).tolist()
    assert len(decays) == 12  # tiny: 3 Gated DeltaNet layers of 4 value heads
    assert max(decays) > 0.99 and min(decays) < 0.5  # some heads remember, others forget (seed 0)
    # the synthesizer's own (at a = 0): every head forgets at once
    a_log = [before[k].float() for k in sorted(changed) if k.endswith("A_log")]
    dt_bias = [before[k].float() for k in sorted(changed) if k.endswith("dt_bias")]
    assert max(math.exp(-(x.exp() * torch.nn.functional.softplus(y)).min().item()) for x, y in zip(a_log, dt_bias)) < 0.5


def test_the_tool_prints_both_states_against_the_oracle():
    res = CliRunner().invoke(state_precision.app, ["--preset", "tiny", "--seqs", "1", "--prompt-len", "8",
                                                  "--new", "8", "--steps", "4,16", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["kind"] == "state_precision" and r["params"]["long_memory"] is True
    fp32, fp16 = r["arms"]["fp32"], r["arms"]["fp16"]
    assert fp32["positions"] == fp16["positions"] == 8 and fp32["failed"] == fp16["failed"] == 0
    assert fp32["max_abs"] < 2e-5 < fp16["max_abs"] < 0.25  # the FP32 state is the oracle's; FP16 rounds
    assert list(r["against_fp32"]) == ["fp16"] and len(r["against_fp32"]["fp16"]) == 1
    assert [x["steps"] for x in r["recurrence"]] == [4, 16] * len(state_precision.DECAYS)


@pytest.mark.parametrize("args", [["--new", "2"], ["--seqs", "0"], ["--steps", "0,4"], ["--steps", "x"],
                                  ["--preset", "huge", "--new", "4"]])
def test_the_tool_refuses_bad_input(args):
    res = CliRunner().invoke(state_precision.app, args)
    assert res.exit_code == 2 and "state_precision:" in res.output
