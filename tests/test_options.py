"""engine/options.py: EngineOptions' defaults are the engine as it ran before options (issue 51),
its parsing names the field and what it takes, and its JSON, digest and changed() are canonical."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from engine.options import EngineOptions
from kernels.policy import KernelPolicy

# The defaults the REGATE_* variables had (unset) before they became options: a change here changes
# what a default engine runs, so it must be deliberate. The one deliberate change since: the recurrent
# state stored in FP16 (2026-12-07, 1.07x faster at batch 16 and 1.18x at batch 64 on the H100).
BEFORE = {"delta_target": 1024,
          "dequant_min_m": None, "fp4_gemm": True, "fused_decode": True, "fused_prefill": True,
          "merge_projections": True, "nvfp4_w4a4": False,
          "prefill_bucket": 0, "prefill_graphs": 8, "prefill_warm": [], "recurrent_state": "fp16",
          "split_sum_in_norm": True, "split_waves": 2, "tile_by_shape": True, "tile_gemm": True}


def test_the_defaults_are_the_engine_before_options():
    assert EngineOptions().to_json() == BEFORE
    assert list(EngineOptions().to_json()) == sorted(BEFORE)  # flat and sorted
    assert EngineOptions().changed() == {}


def test_every_kernel_defaults_to_the_policy_the_engine_passes():
    """A kernel called without a policy (tests, tuning scripts) runs KernelPolicy's defaults."""
    from kernels import gdn_decode, merge, nvfp4_gemm, table, tile_gemm
    fns = (gdn_decode.delta_step, gdn_decode.programs_per_head,
           merge.matmul_merged, nvfp4_gemm.prepare, nvfp4_gemm.matmul, nvfp4_gemm.matmul_split, nvfp4_gemm.merge,
           nvfp4_gemm.matmul_merged, table.tile_config, table.dequant_from, tile_gemm.tile_gemm)
    for fn in fns:
        assert inspect.signature(fn).parameters["policy"].default == KernelPolicy(), fn.__qualname__
    assert inspect.signature(tile_gemm.groups_per_split).parameters["waves"].default == KernelPolicy().split_waves


def test_parse_and_from_mapping_agree_and_canonicalize():
    a = EngineOptions.parse(["merge_projections=off", "split_waves=4", "prefill_warm=128,256"])
    b = EngineOptions.from_mapping({"merge_projections": False, "split_waves": 4, "prefill_warm": [128, 256]})
    assert a == b and a.digest() == b.digest() != EngineOptions().digest()
    assert a.changed() == {"merge_projections": False, "prefill_warm": [128, 256], "split_waves": 4}
    assert EngineOptions.parse("dequant_min_m=none") == EngineOptions()
    assert EngineOptions.parse("dequant_min_m=0").kernels.dequant_min_m == 0


@pytest.mark.parametrize("pairs, match", [
    (["warp_speed=1"], "option warp_speed: unknown; expected one of delta_target, "),
    (["split_waves"], "option 'split_waves': expected KEY=VALUE"),
    (["tile_by_shape=1", "tile_by_shape=0"], "option tile_by_shape: given twice"),
    (["pdl=0"], "option pdl: unknown; expected one of "),  # always on since 2026-12-07
    (["fused_sample=0"], "option fused_sample: unknown; expected one of "),  # the only CUDA pick since 2026-12-07
    (["merge_projections=maybe"], r"option merge_projections: expected a boolean \(1/0, true/false, on/off\), found 'maybe'"),
    (["prefill_graphs=many"], "option prefill_graphs: expected an integer, found 'many'"),
    (["prefill_bucket=-1"], "option prefill_bucket: expected a count >= 0, found -1"),
    (["split_waves=0"], "option split_waves: expected a count of waves >= 1, found 0"),
    (["gemm_prefetch_ahead=4"], "option gemm_prefetch_ahead: unknown; expected one of "),  # deleted 2026-12-07
    (["gemm_early_weights=0"], "option gemm_early_weights: unknown; expected one of "),  # deleted 2026-12-07
    (["delta_prefill_chunk=16"], "option delta_prefill_chunk: unknown; expected one of "),  # deleted 2026-12-07
    (["prefill_attention=0"], "option prefill_attention: unknown; expected one of "),  # the only path since 2026-12-07
    (["delta_target=0"], "option delta_target: expected a positive number of programs, found 0"),
    (["dequant_min_m=-2"], "option dequant_min_m: expected None or an M >= 0, found -2"),
    (["prefill_warm=0"], r"option prefill_warm: expected prompt lengths > 0, found \[0\]"),
    (["ablate=norm"], "option ablate: unknown; expected one of "),
    (["recurrent_state=bf16"], "option recurrent_state: expected one of fp32, fp16, found 'bf16'"),  # tools/ablation's --ablate since 2026-12-07
])
def test_bad_input_names_the_field_and_what_it_takes(pairs, match):
    with pytest.raises(ValueError, match=match):
        EngineOptions.parse(pairs)


def test_from_mapping_refuses_a_wrong_type():
    with pytest.raises(ValueError, match=r"option split_waves: expected an integer, found \[2\]"):
        EngineOptions.from_mapping({"split_waves": [2]})
    with pytest.raises(ValueError, match="option tile_by_shape: expected a boolean"):
        EngineOptions.from_mapping({"tile_by_shape": 2})


def test_the_bench_cli_takes_options_and_records_them(tmp_path):
    """`engine bench --option`: the JSON line's "options" is the engine's, flat; a bad one exits 2 naming it."""
    import json

    from typer.testing import CliRunner

    from engine.cli import _register_all, app
    from engine_oracle import tiny

    if not app.registered_commands:
        _register_all()
    base = ["bench", "--model", str(tiny()), "--gen-len", "3", "--iters", "1", "--warmup", "0", "--json"]
    res = CliRunner().invoke(app, base + ["--option", "split_sum_in_norm=0", "--option", "merge_projections=0"])
    assert res.exit_code == 0, res.output
    line = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    assert line["options"] == {**BEFORE, "split_sum_in_norm": False, "merge_projections": False}
    bad = CliRunner().invoke(app, base + ["--option", "merge_projections=sometimes"])
    assert bad.exit_code == 2 and "bench: option merge_projections: expected a boolean" in bad.output


def test_every_shipped_grid_spec_names_only_options_the_engine_has():
    """A grid spec in grids/ whose arm names a deleted option would be refused only on the GPU box,
    leg by leg: the engine's own reader takes every arm here."""
    from grids.spec import load_spec

    specs = sorted((Path(__file__).resolve().parent.parent / "grids").glob("*.yaml"))
    assert any(s.name == "options-64.yaml" for s in specs)
    for path in specs:
        for arm in load_spec(path).arms:
            EngineOptions.from_mapping(dict(arm.options))  # raises naming the unknown key
