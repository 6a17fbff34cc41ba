"""The offline sweep loop and the tile kernel's candidate set (pure Python; no GPU)."""
from __future__ import annotations

import json

import pytest
import torch

from kernels import table
from kernels.table import TileConfig, WgmmaConfig
from tools.tune.sweep import run_sweep
from tools.tune.tile_sweep import candidates, sweep


def test_run_sweep_skips_wrong_and_failing_configs_and_keeps_the_fastest(tmp_path, capsys):
    times = {"a": 0.3, "b": 0.1, "c": 0.2, "wrong": 0.01, "boom": 0.0}

    def time_fn(n, k, m, config, rep_ms):
        if config.name == "boom":
            raise RuntimeError("too much shared memory")
        return times[config.name] * m

    class Cfg:
        def __init__(self, name):
            self.name = name

    out = tmp_path / "sweep.json"
    run_sweep("demo", {"head": (64, 256)}, [1, 2], str(out), candidates=lambda m: [Cfg(n) for n in times],
              correct=lambda cfg, m: cfg.name != "wrong", time_fn=time_fn, label=lambda c: c.name)
    printed = capsys.readouterr()
    assert "BEST head M=1: b 0.1000 ms" in printed.out and "BEST head M=2: b 0.2000 ms" in printed.out
    assert "wrong: WRONG vs reference, skipped" in printed.err and "boom: FAILED RuntimeError" in printed.err
    line = json.loads(out.read_text())
    assert line["sweep"] == "demo" and {r["config"]["name"] for r in line["results"]} == {"a", "b", "c"}


def test_tile_candidates_cover_m_in_one_block_and_skip_spilling_shapes():
    for m in (1, 4, 9, 16, 17, 64, 256):
        cands = candidates(m)
        sync = [c for c in cands if isinstance(c, TileConfig)]
        wgmma = [c for c in cands if isinstance(c, WgmmaConfig)]
        assert sync and wgmma and len(sync) + len(wgmma) == len(cands) == len(set(cands))
        assert max(c.m_tiles for c in sync) * 8 >= min(m, 64)
        assert not any(c.rows_per_warp == 4 and c.m_tiles >= 4 for c in sync)
        assert max(c.block_m for c in wgmma) >= min(m, 256) and {c.warpgroups for c in wgmma} == {1, 2}


def test_tile_candidates_of_one_kind_keep_the_incumbent():
    for m in (1, 16, 64, 256):
        cands = candidates(m, kinds=("wgmma",))
        assert cands[0] == table.config_for(m, table.TILE)  # the table's current choice is always timed beside them
        assert all(isinstance(c, WgmmaConfig) for c in cands[1:])
    with pytest.raises(ValueError, match="subset"):
        sweep({}, [1], None, time_fn=None, kinds=("wmma",))


def test_the_prefill_delta_sweep_starts_at_the_engines_launch_and_skips_spilling_ones():
    from kernels import gdn_prefill
    from tools.tune.delta_prefill_sweep import candidates

    got = candidates(dk=128, dv=128)
    assert got[0] == (gdn_prefill.BLOCK_V, gdn_prefill.WARPS) and len(set(got)) == len(got)
    assert all(4 <= 128 * bv / (32 * w) <= 64 for bv, w in got[1:])
    assert (8, 1) in got and (32, 1) not in got  # 128 state elements a thread spill


def test_the_attention_sweep_starts_at_the_engines_launches_and_names_each_once():
    from kernels import paged_attention, paged_prefill
    from tools.tune.attention_sweep import decode_candidates, prefill_candidates

    dec, pre = decode_candidates(), prefill_candidates()
    assert dec[0] == (paged_attention.TILE, paged_attention.WARPS) and len(set(dec)) == len(dec) == 12
    assert pre[0] == (paged_prefill.BM, paged_prefill.BN, paged_prefill.WARPS) and len(set(pre)) == len(pre) == 24
    assert (32, 8) in dec  # no spill by ptxas at head dim 256


def test_a_sweep_tools_command_line_shows_rows_unless_json_and_needs_a_gpu(monkeypatch, capsys):
    from tools.tune.bench import sweep_cli

    args = ("tools.tune.x_sweep", "Title line.\nmore", [], {"--tokens": {"type": int, "default": 7}}, str, "HEAD")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="x_sweep: needs a CUDA GPU"):
        sweep_cli(*args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a, show = sweep_cli(*args)
    assert (a.batches, a.tokens, a.json) == ("1,16", 7, False)
    show({"us": 1})
    assert capsys.readouterr().out == "HEAD\n{'us': 1}\n"
    a, show = sweep_cli(args[0], args[1], ["--json"], *args[3:])
    assert a.json and show is None and capsys.readouterr().out == ""


def test_read_floor_names_the_shapes_whose_m1_gemm_splits_k():
    """`read_floor`'s split count is kernels.tile_gemm's rule on the table's config: on the H200's 132
    SMs gate_up and the head are one launch; down, o_proj and the GDN projections split K (their GEMM
    time then includes the reduce kernel, and the tool also times them without it)."""
    from tools.tune import read_floor

    got = {name: read_floor.splits_at_m1(name, 132) for name in read_floor.SHAPES}
    assert got["gate_up"] == 1 and got["lm_head"] == 1
    assert got["down"] > 1 and got["attn_o_proj"] > 1 and got["gdn_out_proj"] > 1
    assert all(v >= 1 for v in got.values())


def test_a_sweeps_fastest_row_per_batch():
    from tools.tune.bench import fastest_by_batch

    rows = [{"batch": 16, "us": 3.0, "k": "a"}, {"batch": 1, "us": 2.0, "k": "b"}, {"batch": 16, "us": 1.5, "k": "c"},
            {"batch": 1, "us": 2.5, "k": "d"}]
    got = fastest_by_batch(rows)
    assert list(got) == [1, 16] and (got[1]["k"], got[16]["k"]) == ("b", "c")
