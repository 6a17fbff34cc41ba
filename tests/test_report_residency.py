"""The residency model: per backend and weight class, what each arm keeps resident, and the delta."""
from __future__ import annotations

import random

import pytest
import torch

import report_records as rr
from nvfp4 import Nvfp4Weight, quantize
from orchestrator.record import Record
from orchestrator.report import residency

GIB = 2**30


@pytest.mark.parametrize("seed", range(3))
def test_byte_model_matches_a_real_weight(seed):
    """Reference twin: the model's byte counts against an Nvfp4Weight built from random data."""
    rng = random.Random(seed)
    n, k = rng.randint(1, 40), 16 * rng.randint(1, 12)
    dense = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    w = Nvfp4Weight.from_quantized("lm_head", quantize(dense))
    assert residency.packed_bytes(n, k) == w.packed_bytes
    w.dequant_b = w.dequantize(torch.bfloat16)
    assert residency.bf16_bytes(n, k) == w.resident_dequant_bytes


def test_the_seed_table_for_the_27b_head():
    rows = {(r["backend"], r["class"]): r for r in residency.model_rows(rr._weights())}
    cuda, cpu = rows[("cuda", "head")], rows[("cpu", "head")]
    assert round(cuda["arms"]["packed"]["packed"] / GIB, 3) == 0.666
    assert round(cuda["arms"]["dequant"]["dequant"] / GIB, 3) == 2.368
    assert round(cuda["delta"] / GIB, 2) == -1.70
    assert round(cpu["delta"] / GIB, 2) == 0.67
    assert cpu["arms"]["packed"]["dequant"] == cpu["arms"]["dequant"]["dequant"]
    assert rows[("cuda", "tower")]["delta"] == rows[("cpu", "tower")]["delta"] == 0


def test_bf16_tower_weight_is_bf16_in_both_arms():
    ws = [{"name": "layers.0.linear_attn.in_proj_b", "class": "tower", "format": "bf16", "n": 48, "k": 64}]
    (row, _) = residency.model_rows(ws)
    bf16 = {"packed": 0, "dequant": 2 * 48 * 64, "total": 2 * 48 * 64}
    assert row["arms"]["packed"] == row["arms"]["dequant"] == bf16


def test_measured_reading_is_checked_against_the_model():
    weights = rr._weights()
    good = residency.check({"weights": weights, "backend": "cpu", "arm": "dequant"})
    assert all(r["agrees"] for r in good)
    weights[1]["dequant_bytes"] = 2 * weights[1]["n"] * weights[1]["k"]  # a tower projection kept its BF16
    bad = {r["class"]: r for r in residency.check({"weights": weights, "backend": "cpu", "arm": "dequant"})}
    assert bad["tower"]["agrees"] is False and bad["head"]["agrees"] is True
    unknown = residency.check({"weights": weights, "backend": "vulkan", "arm": "packed"})
    assert all(r["agrees"] is None for r in unknown)


def test_no_residency_no_section():
    assert residency.section(Record.from_json(rr.record())) is None


@pytest.mark.parametrize("b, signed, text", [
    (715161604, False, "0.666 GiB"), (2542796800, False, "2.368 GiB"), (-1827635196, True, "-1.70 GiB"),
    (715161604, True, "+0.67 GiB"), (131072, False, "128.0 KiB"), (0, True, "±0"), (None, False, "—"),
])
def test_bytes_read_as_the_seed_writes_them(b, signed, text):
    from orchestrator.report.render import _bytes
    assert _bytes(b, signed) == text
