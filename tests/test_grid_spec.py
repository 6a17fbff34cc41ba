"""Grid specs: the shipped grids load, and every bad field is named with expected vs found."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from grids.spec import Checkpoint, SpecError, load_spec, parse_spec

GRIDS = Path(__file__).resolve().parents[1] / "grids"
GOOD = {
    "name": "g", "backend": "cuda", "legs": 2,
    "checkpoint": {"preset": "27b", "layers": 4},
    "arms": {"packed": {"lm_head": "packed"}, "dequant": {"lm_head": "dequant", "backend": "cpu",
                                                         "extra_args": ["--foo", 1]}},
    "cells": [{"batch": 1, "prompt_len": 8, "gen_len": 8},
              {"batch": 16, "prompt_len": 8, "gen_len": 8, "checkpoint": {"layers": 8, "seed": 3}}],
}


def test_shipped_grids_load():
    lmhead = load_spec(GRIDS / "lmhead.yaml")
    assert [a.lm_head for a in lmhead.arms] == ["packed", "dequant"]
    assert {a.backend for a in lmhead.arms} == {"cuda"}
    assert sorted(c.batch for c in lmhead.cells) == [1, 16]
    assert all(c.checkpoint.preset == "27b" and c.checkpoint.layers for c in lmhead.cells)
    full = load_spec(GRIDS / "lmhead-64.yaml")  # issue 24's closing grid: batch 1 on all 64 layers
    assert [a.lm_head for a in full.arms] == ["packed", "dequant"] and full.legs >= 3
    assert [(c.batch, c.checkpoint.layers) for c in full.cells] == [(1, 64)]
    smoke = load_spec(GRIDS / "smoke.yaml")
    assert {a.backend for a in smoke.arms} == {"cpu"}
    assert all(c.checkpoint.preset == "tiny" for c in smoke.cells)


def test_defaults_merge_into_cells():
    spec = parse_spec(GOOD)
    assert spec.arms[1].backend == "cpu" and spec.arms[0].backend == "cuda"
    assert spec.arms[1].extra_args == ("--foo", "1")
    assert spec.cells[0].checkpoint == Checkpoint(preset="27b", layers=4)
    assert spec.cells[1].checkpoint == Checkpoint(preset="27b", layers=8, seed=3)
    assert spec.policy.rule == "rank" and spec.policy.tolerance == 0.02
    assert spec.max_legs >= spec.legs
    assert {a.backend for a in spec.with_backend("cpu").arms} == {"cpu"}


def _with(path: str, value):
    data = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize("path, value, needle", [
    ("cells.1.batch", "16", "cells[1].batch: expected an integer >= 1, found '16'"),
    ("cells.0.gen_len", 0, "cells[0].gen_len: expected an integer >= 1, found 0"),
    ("arms.packed.lm_head", "fp8", "arms.packed.lm_head: expected one of packed, dequant, found 'fp8'"),
    ("arms.packed.speed", 3, "arms.packed.speed: unknown key"),
    ("backend", "rocm", "backend: expected one of cpu, cuda, found 'rocm'"),
    ("legs", 0, "legs: expected an integer >= 1, found 0"),
    ("verdict", {"rule": "vibes"}, "verdict.rule: expected one of rank, every-leg, found 'vibes'"),
    ("verdict", {"tolerance": 2}, "verdict.tolerance: expected a number in (0, 1), found 2.0"),
    ("checkpoint", {"layer": 4}, "checkpoint.layer: unknown key"),
    ("cells.0.checkpoint", {"layers": -1}, "cells[0].checkpoint.layers: expected an integer >= 1"),
    ("name", KeyError, "name: expected a non-empty string, found None"),
    ("cells", [], "cells: expected a non-empty list"),
    ("arms", {"packed": {"lm_head": "packed"}}, "arms: expected exactly 2 arms, found 1"),
    ("colour", "red", "colour: unknown key"),
])
def test_bad_fields_are_named(path, value, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(_with(path, value), "g.yaml")
    assert str(e.value).startswith("g.yaml: ")
    assert needle in str(e.value)


def test_direction_rule_is_the_issues_spelling_of_rule():
    assert parse_spec(_with("verdict", {"direction_rule": "every-leg"})).policy.rule == "every-leg"
    with pytest.raises(SpecError, match="verdict.direction_rule: expected one of rank, every-leg"):
        parse_spec(_with("verdict", {"direction_rule": "most-legs"}))
    with pytest.raises(SpecError, match="not both"):
        parse_spec(_with("verdict", {"rule": "rank", "direction_rule": "rank"}))


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read grid spec"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="--backend"):
        parse_spec(GOOD).with_backend("tpu")


def test_until_binding_flag_is_read_and_validated():
    from grids.spec import SpecError, parse_spec
    base = {"name": "g", "arms": {"a": {"lm_head": "packed"}, "b": {"lm_head": "dequant"}},
            "cells": [{"batch": 1, "prompt_len": 4, "gen_len": 4}]}
    assert parse_spec(base).until_binding is False
    assert parse_spec({**base, "until_binding": True}).until_binding is True
    with pytest.raises(SpecError, match="until_binding"):
        parse_spec({**base, "until_binding": "yes"})


@pytest.mark.parametrize("legs", [1, 2])
def test_case3_until_binding_spec_below_the_claim_minimum_is_refused(legs):
    """Issue 25 case 3: `legs: 1` was accepted for a grid that promises to run until binding."""
    from grids.spec import SpecError, parse_spec
    base = {"name": "g", "arms": {"a": {"lm_head": "packed"}, "b": {"lm_head": "dequant"}},
            "cells": [{"batch": 1, "prompt_len": 4, "gen_len": 4}], "legs": legs}
    assert parse_spec(base).legs == legs  # a plain grid may run few legs: its verdicts stay owed
    with pytest.raises(SpecError, match=f"legs: {legs} legs per arm cannot establish a claim "
                                        r"\(at least 3 needed\); until_binding: true refuses it"):
        parse_spec({**base, "until_binding": True})

def test_attribute_is_optional_and_validated():
    from grids.spec import Attribute
    assert parse_spec(GOOD).attribute is None
    assert parse_spec({**GOOD, "attribute": {"lengths": [8, 136]}}).attribute == Attribute((8, 136), 3)
    assert parse_spec({**GOOD, "attribute": {"lengths": [4, 20], "iters": 5}}).attribute == Attribute((4, 20), 5)
    for bad, needle in (
        ({"lengths": [136, 8]}, "attribute.lengths: expected two increasing integers >= 2 ([short, long] "
                                "generation lengths), found [136, 8]"),
        ({"lengths": [1, 8]}, "attribute.lengths: expected two increasing integers >= 2"),
        ({"lengths": [8, 136, 200]}, "attribute.lengths: expected two increasing integers >= 2"),
        ({"lengths": [8, "136"]}, "attribute.lengths: expected two increasing integers >= 2"),
        ({"lengths": [True, 136]}, "attribute.lengths: expected two increasing integers >= 2"),
        ({}, "attribute.lengths: expected two increasing integers >= 2 ([short, long] generation lengths), "
             "found None"),
        ({"lengths": [8, 136], "iters": 0}, "attribute.iters: expected an integer >= 1, found 0"),
        ({"lengths": [8, 136], "steps": 3}, "attribute.steps: unknown key (expected one of iters, lengths)"),
        ([8, 136], "attribute: expected a mapping, found [8, 136]"),
    ):
        with pytest.raises(SpecError) as e:
            parse_spec({**GOOD, "attribute": bad}, "g.yaml")
        assert str(e.value).startswith("g.yaml: ") and needle in str(e.value), str(e.value)


# ---- issue 27: bounds, finite numbers, options the runner owns, paths relative to the repo root ---

@pytest.mark.parametrize("path, value, needle", [
    ("legs", 1_000_000, "legs: expected an integer <= 200"),
    ("max_legs", 201, "max_legs: expected an integer <= 200"),
    ("warmup", 101, "warmup: expected an integer <= 100"),
    ("iters", 1001, "iters: expected an integer <= 1000"),
    ("cells.0.batch", 1025, "cells[0].batch: expected an integer <= 1024"),
    ("cells.1.prompt_len", 131073, "cells[1].prompt_len: expected an integer <= 131072"),
    ("cells.0.gen_len", 10**9, "cells[0].gen_len: expected an integer <= 131072"),
    ("cells.0.checkpoint", {"layers": 4096}, "cells[0].checkpoint.layers: expected an integer <= 1024"),
    ("timeout_s", float("nan"), "timeout_s: expected a finite positive number, found nan"),
    ("timeout_s", float("inf"), "timeout_s: expected a finite positive number, found inf"),
    ("timeout_s", 86401, "timeout_s: expected a number <= 86400"),
    ("attribute", {"lengths": [8, 200_000]}, "attribute.lengths: expected generation lengths <= 131072"),
])
def test_out_of_bounds_and_non_finite_fields_are_named(path, value, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(_with(path, value), "g.yaml")
    assert str(e.value).startswith("g.yaml: ") and needle in str(e.value), str(e.value)


def test_the_bounds_themselves_are_accepted():
    data = {**GOOD, "legs": 200, "timeout_s": 86400, "cells": [{"batch": 1024, "prompt_len": 131072, "gen_len": 131072}]}
    spec = parse_spec(data)
    assert (spec.legs, spec.max_legs, spec.cells[0].batch, spec.cells[0].prompt_len) == (200, 200, 1024, 131072)


@pytest.mark.parametrize("extra, taken", [
    (["--model", "/elsewhere"], "--model"), (["--model=/elsewhere"], "--model=/elsewhere"),
    (["--batch", "64"], "--batch"), (["--lm-head", "dequant"], "--lm-head"), (["--seed", "1", "--json"], "--json"),
    (["--lengths=2,4"], "--lengths=2,4"),
])
def test_extra_args_may_not_set_what_the_runner_sets(extra, taken):
    with pytest.raises(SpecError) as e:
        parse_spec(_with("arms.dequant.extra_args", extra), "g.yaml")
    assert f"g.yaml: arms.dequant.extra_args: {taken!r} sets an option the runner sets itself" in str(e.value)


def test_runner_options_are_every_option_the_runner_sets():
    """RUNNER_OPTIONS must follow grids.runner and grids.attribution: an option either adds is refused
    in extra_args only if it is listed."""
    from grids import attribution, runner
    from grids.spec import RUNNER_OPTIONS
    spec = parse_spec({**_with("arms.dequant.extra_args", []), "attribute": {"lengths": [8, 16]}})
    cell, arm = spec.cells[0], spec.arms[0]
    argv = runner.bench_args(spec, cell, arm, "/ck") + attribution.attribute_args(spec, cell, arm, "/ck")
    assert {a for a in argv if a.startswith("--")} <= set(RUNNER_OPTIONS)


@pytest.mark.parametrize("given, expected", [
    ("grids/smoke.yaml", "grids/smoke.yaml"), ("smoke", "smoke"), ("./grids//smoke.yaml", "grids/smoke.yaml"),
    ("{repo}/grids/smoke.yaml", "grids/smoke.yaml"), ("{repo}/sub/../grids/lmhead.yaml", "grids/lmhead.yaml"),
])
def test_grid_paths_are_relative_to_the_repository_root(tmp_path, given, expected):
    from grids.spec import repo_relative
    (tmp_path / "sub").mkdir()
    assert repo_relative(given.format(repo=tmp_path), tmp_path) == expected


@pytest.mark.parametrize("given", ["{out}/grids/smoke.yaml", "../grids/smoke.yaml", "grids/../../x.yaml"])
def test_grid_paths_outside_the_repository_are_refused(tmp_path, given):
    from grids.spec import repo_relative
    (tmp_path / "repo").mkdir()
    with pytest.raises(SpecError, match="outside the repository"):
        repo_relative(given.format(out=tmp_path / "other"), tmp_path / "repo")


def test_an_arm_carries_engine_options_checked_at_load():
    """An arm's `options` are engine options (engine/options.py): sorted, as --option pairs for each leg;
    a key or value of the wrong form is an error naming the arm (what a key means is the head's bench's
    to check: the spec reader imports no engine); --option in extra_args is refused."""
    from grids import runner
    spec = parse_spec(_with("arms.dequant.options", {"split_waves": 4, "tile_by_shape": False, "prefill_warm": [16, 32]}))
    arm = spec.arms[1]
    assert arm.options == (("prefill_warm", "16,32"), ("split_waves", "4"), ("tile_by_shape", "0"))
    argv = runner.bench_args(spec, spec.cells[0], arm, "/ck")
    at = argv.index("--option")
    assert argv[at:at + 6] == ["--option", "prefill_warm=16,32", "--option", "split_waves=4", "--option", "tile_by_shape=0"]
    assert "--option" not in runner.bench_args(spec, spec.cells[0], spec.arms[0], "/ck")
    for options, needle in (({"Warp Speed": 1}, "arms.dequant.options: option 'Warp Speed': expected a lower-case name"),
                            ({"split_waves": {"a": 1}}, "arms.dequant.options.split_waves: expected a value"),
                            ([1], "arms.dequant.options: expected")):
        with pytest.raises(SpecError, match=needle):
            parse_spec(_with("arms.dequant.options", options))
    with pytest.raises(SpecError, match="sets an option the runner sets itself"):
        parse_spec(_with("arms.dequant.extra_args", ["--option", "tile_by_shape=0"]))
