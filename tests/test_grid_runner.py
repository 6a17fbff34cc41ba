"""The leg runner end to end against a fake bench script: fresh processes, alternation, raw kept,
--until-binding stopping, and failures that name cell, arm and leg."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from grids.runner import GridError, arm_order, parse_bench, run_grid
from grids.spec import parse_spec
from orchestrator.box.grid import TreeCommand
from orchestrator.box.tree import Tree

FAKE = Path(__file__).with_name("grid_fake_bench.py")


def _spec(legs=3, max_legs=8, batches=(1,)):
    return parse_spec({
        "name": "fake", "backend": "cpu", "legs": legs, "max_legs": max_legs, "warmup": 0, "iters": 2,
        "checkpoint": {"preset": "tiny"},
        "arms": {"packed": {"lm_head": "packed"}, "dequant": {"lm_head": "dequant"}},
        "cells": [{"batch": b, "prompt_len": 4, "gen_len": 4} for b in batches],
    }, "fake.yaml")


def _script(tmp_path: Path, script: Path) -> TreeCommand:
    """A fake bench (or attribute) script, one fresh process per call, as the tree runner starts them."""
    return TreeCommand(Tree(tmp_path), (sys.executable, str(script)))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REGATE_FAKE_BENCH_LOG", str(log))

    def run(rates, spec, **kw):
        monkeypatch.setenv("REGATE_FAKE_BENCH_RATES", json.dumps(rates))
        result = run_grid(spec, bench=_script(tmp_path, FAKE),
                          checkpoint=lambda **p: tmp_path / f"ckpt-{p['preset']}", **kw)
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        return result, calls
    return run


def test_legs_alternate_in_fresh_processes_and_keep_raw(fake, tmp_path):
    events = []
    out = tmp_path / "out" / "grid.json"
    result, calls = fake({"packed": [11.197, 11.193, 11.195], "dequant": [9.418, 10.163, 9.9]},
                         _spec(legs=3), progress=events.append, out=out)
    assert [c["lm_head"] for c in calls] == ["packed", "dequant", "dequant", "packed", "packed", "dequant"]
    assert len({c["pid"] for c in calls}) == 6  # one process per arm per leg
    assert "--model" in calls[0]["argv"] and str(tmp_path / "ckpt-tiny") in calls[0]["argv"]
    cell = result["cells"][0]
    assert cell["orders"] == [["packed", "dequant"], ["dequant", "packed"], ["packed", "dequant"]]
    assert cell["arms"]["packed"]["legs"] == [11.197, 11.193, 11.195]
    assert cell["arms"]["dequant"]["legs"] == [9.418, 10.163, 9.9]
    assert [r["meta"]["call"] for r in cell["arms"]["dequant"]["raw"]] == [0, 1, 2]
    assert cell["verdict"]["direction"]["state"] == "established"  # 3 separated legs: p = 1/20
    assert cell["verdict"]["magnitude"]["state"] == "owed"
    assert result["schema_version"] == 1 and result["spec"] == "fake" and result["complete"]
    assert json.loads(out.read_text()) == result
    assert [e.arm for e in events if e.arm] == [c["lm_head"] for c in calls]
    assert [e.leg for e in events if e.verdict] == [1, 2, 3]


def test_until_binding_stops_when_every_cell_binds(fake):
    rates = {"packed@b1": [10.0, 10.01, 10.005], "dequant@b1": [9.0, 9.01, 9.005],  # binds at leg 3
             "packed@b16": [10.0], "dequant@b16": [9.0, 9.5]}  # dequant 5.6% apart: never binds
    result, calls = fake(rates, _spec(legs=3, max_legs=5, batches=(1, 16)), until_binding=True)
    tight, noisy = result["cells"]
    assert len(tight["arms"]["packed"]["legs"]) == 3
    assert tight["verdict"]["magnitude"]["state"] == "binding"
    assert len(noisy["arms"]["dequant"]["legs"]) == 5  # ran to max_legs
    assert noisy["verdict"]["magnitude"]["state"] == "owed"
    assert len(calls) == 2 * (3 + 5)


@pytest.mark.parametrize("legs, max_legs, key", [(2, 8, "legs"), (3, 8, "max_legs")])
def test_case3_until_binding_refuses_too_few_legs(fake, legs, max_legs, key):
    """Issue 25 case 3: a grid run until binding with fewer legs than any claim needs is refused."""
    cap = 2 if key == "max_legs" else None
    with pytest.raises(GridError, match=f"{key}: 2 legs per arm cannot establish a claim"):
        fake({"packed": [10.0], "dequant": [9.0]}, _spec(legs=legs, max_legs=max_legs), until_binding=True,
             max_legs=cap)


def test_without_until_binding_runs_the_spec_legs_only(fake):
    result, calls = fake({"packed": [10.0], "dequant": [9.0, 9.5]}, _spec(legs=2, max_legs=6))
    assert len(calls) == 4
    assert result["cells"][0]["verdict"]["magnitude"]["state"] == "owed"


def test_max_legs_caps_even_the_spec_legs(fake):
    result, calls = fake({"packed": [10.0], "dequant": [9.0]}, _spec(legs=3), max_legs=1)
    assert len(calls) == 2 and result["max_legs"] == 1


def test_failing_bench_names_cell_arm_leg_with_stderr(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("REGATE_FAKE_BENCH_FAIL", "dequant:1")
    out = tmp_path / "partial.json"
    with pytest.raises(GridError) as e:
        fake({"packed": [10.0], "dequant": [9.0]}, _spec(legs=3), out=out)
    msg = str(e.value)
    assert "cell 0 (b1 p4 g4 tiny modelopt), arm dequant, leg 2" in msg
    assert "exited 3" in msg and "illegal memory access" in msg
    partial = json.loads(out.read_text())  # the finished leg survives
    assert not partial["complete"] and partial["cells"][0]["arms"]["dequant"]["legs"] == [9.0]


def test_bench_without_json_is_an_error(fake, monkeypatch):
    monkeypatch.setenv("REGATE_FAKE_BENCH_GARBAGE", "1")
    with pytest.raises(GridError, match="arm packed, leg 1: bench printed no JSON line"):
        fake({"packed": [10.0], "dequant": [9.0]}, _spec(legs=1))


def test_checkpoint_failure_names_the_cell():
    def broken(**params):
        raise ValueError("preset '99b' unknown")
    with pytest.raises(GridError, match=r"cell 0 \(b1 p4 g4 tiny modelopt\): cannot make checkpoint"):
        run_grid(_spec(), bench=lambda args, timeout_s: "", checkpoint=broken)


@pytest.mark.parametrize("stdout, needle", [
    ('{"schema_version": 2, "decode_tok_s": 5}', "schema_version: expected 1, found 2"),
    ('{"schema_version": 1, "decode_tok_s": 0}', "decode_tok_s: expected a positive number, found 0"),
    ('{"schema_version": 1}', "decode_tok_s: expected a positive number, found None"),
])
def test_bench_json_is_checked(stdout, needle):
    with pytest.raises(GridError, match=needle):
        parse_bench("table\n" + stdout + "\n", "cell 0, arm a, leg 1")


@pytest.mark.parametrize("params", [
    {"backend": "cuda", "lm_head": "packed", "head_fp4_gemm": False, "fp4_gemm_reason": "option fp4_gemm=0"},
    {"backend": "cuda", "lm_head": "packed"},  # a bench too old to say is not trusted either
])
def test_a_packed_cuda_leg_off_the_fp4_gemm_is_an_error(params):
    line = json.dumps({"schema_version": 1, "decode_tok_s": 50.0, "params": params})
    with pytest.raises(GridError, match="packed arm's head did not run on the fp4 GEMM.*never a number"):
        parse_bench(line + "\n", "cell 0, arm packed, leg 1")


@pytest.mark.parametrize("params", [
    {"backend": "cuda", "lm_head": "packed", "head_fp4_gemm": True},
    {"backend": "cuda", "lm_head": "dequant", "head_fp4_gemm": False},
    {"backend": "cpu", "lm_head": "packed", "head_fp4_gemm": False},  # the CPU has no fp4 GEMM by design
])
def test_other_legs_pass_the_fp4_check(params):
    line = json.dumps({"schema_version": 1, "decode_tok_s": 50.0, "params": params})
    assert parse_bench(line, "x")["decode_tok_s"] == 50.0


def test_parse_takes_the_last_json_line():
    text = '{"schema_version": 1, "decode_tok_s": 1.0}\nnoise\n{"schema_version": 1, "decode_tok_s": 2.5}\n'
    assert parse_bench(text, "x")["decode_tok_s"] == 2.5


def test_arm_order_flips_every_leg():
    arms = _spec().arms
    assert [tuple(a.name for a in arm_order(arms, leg)) for leg in range(4)] == [
        ("packed", "dequant"), ("dequant", "packed"), ("packed", "dequant"), ("dequant", "packed")]


FAKE_ATTRIBUTE = Path(__file__).with_name("grid_fake_attribute.py")


def _attributed_spec(batches=(1,)):
    return parse_spec({
        "name": "fake", "backend": "cpu", "legs": 2, "warmup": 0, "iters": 2, "checkpoint": {"preset": "tiny"},
        "arms": {"packed": {"lm_head": "packed"}, "dequant": {"lm_head": "dequant"}},
        "cells": [{"batch": b, "prompt_len": 4, "gen_len": 4} for b in batches],
        "attribute": {"lengths": [8, 136], "iters": 2},
    }, "fake.yaml")


def test_attribution_runs_once_per_arm_per_cell_after_the_legs(fake, monkeypatch, tmp_path):
    attr = _script(tmp_path, FAKE_ATTRIBUTE)
    out = tmp_path / "grid.json"
    result, calls = fake({"packed": [11.0], "dequant": [10.0]}, _attributed_spec(batches=(1, 16)),
                         attribute=attr, out=out)
    keys = [c["key"] for c in calls]
    assert keys[:8] == ["packed", "dequant"] * 2 + ["dequant", "packed"] * 2, "attribution runs after every leg"
    assert keys[8:] == ["attribute:packed", "attribute:dequant"] * 2
    assert len({c["pid"] for c in calls}) == len(calls)  # a fresh process each
    argv = calls[10]["argv"]
    assert argv[argv.index("--lengths") + 1] == "8,136" and argv[argv.index("--batch") + 1] == "16"
    assert argv[argv.index("--iters") + 1] == "2" and argv[argv.index("--model") + 1] == str(tmp_path / "ckpt-tiny")
    for cell in result["cells"]:
        a = cell["attribution"]
        assert a["lengths"] == [8, 136] and a["errors"] == {} and set(a["arms"]) == {"packed", "dequant"}
        assert a["arms"]["dequant"]["parts"][0] == {"name": "lm_head", "ms_per_step": 3.0, "spread_ms": 0.01,
                                                    "bytes_per_step": 100}
    assert json.loads(out.read_text()) == result and result["complete"]


def test_a_failed_attribution_is_kept_as_its_arms_error_and_the_legs_stay(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("REGATE_FAKE_ATTRIBUTE_FAIL", "dequant")
    result, _ = fake({"packed": [11.0], "dequant": [10.0]}, _attributed_spec(),
                     attribute=_script(tmp_path, FAKE_ATTRIBUTE))
    (cell,) = result["cells"]
    assert cell["arms"]["packed"]["legs"] == [11.0, 11.0]
    assert set(cell["attribution"]["arms"]) == {"packed"}
    why = cell["attribution"]["errors"]["dequant"]
    assert why.startswith("grid fake: cell 0 (b1 p4 g4 tiny modelopt), arm dequant, attribution: exited 2")
    assert "a CUDA graph replay ran 3 device activities" in why


def test_without_the_attribute_key_no_attribution_runs(fake, tmp_path):
    result, calls = fake({"packed": [11.0], "dequant": [10.0]}, _spec(legs=1),
                         attribute=_script(tmp_path, FAKE_ATTRIBUTE))
    assert "attribution" not in result["cells"][0] and len(calls) == 2


def test_the_attribution_runner_follows_the_bench_runner(tmp_path):
    from grids.attribution import parse_attribute
    from orchestrator.box.grid import runners

    tree = Tree(tmp_path, python="/tree/python")
    here = runners(tree)
    assert here["bench"] == TreeCommand(tree, tuple(tree.engine("bench")))
    assert here["attribute"] == TreeCommand(tree, tuple(tree.py("-m", "tools.attribution")))
    assert here["bench"].command[:3] == ("/tree/python", "-I", "-S")  # the head's isolated Python (pyboot)
    assert runners(tree, ("fake", "bench"))["attribute"] == here["attribute"]  # the tree's tool either way
    with pytest.raises(Exception, match="expected kind 'attribution' schema_version 1, found kind None"):
        parse_attribute('{"schema_version": 1, "decode_tok_s": 3}', "w")
    with pytest.raises(Exception, match="JSON parts: expected a list"):
        parse_attribute('{"schema_version": 1, "kind": "attribution", "parts": [{"ms": 1}]}', "w")
    with pytest.raises(Exception, match="printed no JSON line"):
        parse_attribute("nothing", "w")


# ---- per-arm bench runners (orchestrator compare: each revision's own tree) -------------------------

def test_each_arm_may_have_its_own_bench_runner(tmp_path):
    seen = []

    def runner(name, rate):
        def run(args, timeout_s):
            seen.append(name)
            return json.dumps({"schema_version": 1, "decode_tok_s": rate})
        return run
    result = run_grid(_spec(legs=2), benches={"packed": runner("P", 11.0), "dequant": runner("D", 9.0)},
                      checkpoint=lambda **p: tmp_path)
    assert seen == ["P", "D", "D", "P"]  # alternation kept, each arm on its own runner
    assert result["cells"][0]["arms"]["dequant"]["legs"] == [9.0, 9.0]


def test_a_shared_bench_fills_the_arms_benches_does_not_name(tmp_path):
    shared = lambda args, timeout_s: json.dumps({"schema_version": 1, "decode_tok_s": 5.0})  # noqa: E731
    own = lambda args, timeout_s: json.dumps({"schema_version": 1, "decode_tok_s": 7.0})  # noqa: E731
    result = run_grid(_spec(legs=1), bench=shared, benches={"packed": own}, checkpoint=lambda **p: tmp_path)
    arms = result["cells"][0]["arms"]
    assert (arms["packed"]["legs"], arms["dequant"]["legs"]) == ([7.0], [5.0])


@pytest.mark.parametrize("kw, words", [
    ({"benches": {"packed": lambda a, t: ""}}, "arm dequant: no bench runner given"),
    ({"bench": lambda a, t: "", "benches": {"fp8": lambda a, t: ""}}, "'fp8' is not an arm of the spec"),
])
def test_bench_runners_that_do_not_cover_the_arms_are_refused(tmp_path, kw, words):
    with pytest.raises(GridError, match=words):
        run_grid(_spec(), checkpoint=lambda **p: tmp_path, **kw)


def _options_spec(options: dict):
    return parse_spec({
        "name": "opts", "backend": "cpu", "legs": 3, "warmup": 0, "iters": 2, "checkpoint": {"preset": "tiny"},
        "arms": {"base": {"lm_head": "packed"}, "changed": {"lm_head": "packed", "options": options}},
        "cells": [{"batch": 1, "prompt_len": 4, "gen_len": 4}],
    }, "opts.yaml")


def test_a_leg_whose_bench_ran_other_options_is_refused_naming_the_field():
    """After each leg the bench's "options" must hold what the arm sets, and equal the arm's first leg's
    (the rest are the tree's own defaults, which a head may change); the differing field is named with
    grid, cell, arm and leg; a bench that reports none passes only an arm that sets none."""
    from engine.options import EngineOptions
    from grids.runner import check_options

    spec = _options_spec({"tile_by_shape": 0})
    base, changed = spec.arms
    ran = EngineOptions().with_kernels(tile_by_shape=False).to_json()
    check_options({"options": ran}, changed, "w")  # as asked
    with pytest.raises(GridError, match=r"w: the bench ran with option tile_by_shape=True, the arm sets '0'"):
        check_options({"options": EngineOptions().to_json()}, changed, "w")
    head_default = {**ran, "merge_projections": False}  # a head whose default differs: its own engine, taken
    check_options({"options": head_default}, changed, "w")
    with pytest.raises(GridError, match=r"other options than the arm's first leg \(merge_projections: False then True\)"):
        check_options({"options": ran}, changed, "w", first={"options": head_default})
    check_options({}, base, "w")  # a revision from before options
    check_options({}, base, "w", first={})
    with pytest.raises(GridError, match=r"the bench reported no options, the arm sets \{'tile_by_shape': '0'\}"):
        check_options({}, changed, "w")
    with pytest.raises(GridError, match=r"option tile_by_shape='\(unknown\)'"):  # a bench that does not know the option
        check_options({"options": {"merge_projections": True}}, changed, "w")

    def bench(args, timeout_s):  # every leg reports the defaults: the changed arm's option did not take
        return json.dumps({"schema_version": 1, "decode_tok_s": 10.0, "options": EngineOptions().to_json()})
    with pytest.raises(GridError, match=r"grid opts: cell 0 \(.*\), arm changed, leg 1: the bench ran with option tile_by_shape"):
        run_grid(spec, bench=bench, checkpoint=lambda **params: "/ck")


def test_an_arm_whose_second_leg_ran_other_options_is_refused():
    """Every leg of an arm measures one engine: the base arm's second bench reports another option than
    its first (as a tree whose defaults moved between legs would), and the grid stops naming the leg."""
    from engine.options import EngineOptions

    spec = _options_spec({"tile_by_shape": 0})
    calls = {"base": 0}

    def bench(args, timeout_s):
        opts = EngineOptions().with_kernels(tile_by_shape="tile_by_shape=0" not in args)
        if "tile_by_shape=0" not in args:
            calls["base"] += 1
            opts = opts if calls["base"] == 1 else EngineOptions().with_kernels(tile_by_shape=True, split_waves=3)
        return json.dumps({"schema_version": 1, "decode_tok_s": 10.0, "options": opts.to_json()})
    with pytest.raises(GridError, match=r"arm base, leg 2: the bench ran under other options than the arm's "
                                        r"first leg \(split_waves: 2 then 3\)"):
        run_grid(spec, bench=bench, checkpoint=lambda **params: "/ck")


@pytest.mark.parametrize("reported,text,same", [
    (True, "1", True), (True, "on", True), (False, "0", True), (False, "true", False), (True, "2", False),
    (2, "2", True), (2, "3", False), (None, "none", True), (None, "0", False), ([16, 32], "16,32", True),
    ([16, 32], "16", False), ([], "", True), ("norm+tower", "norm+tower", True), ("", "x", False)])
def test_an_arms_option_text_is_read_as_the_benchs_value(reported, text, same):
    """The spec reader imports no engine, so an arm's `tile_by_shape: 0` is compared with the bench's reported
    value by that value's type (engine/options.py's own readings of 1/0, on/off, lists, none)."""
    from grids.runner import matches
    assert matches(reported, text) is same


def _prefill_spec(legs=3):
    return parse_spec({
        "name": "prefill", "backend": "cpu", "legs": legs, "warmup": 0, "iters": 2, "metric": "prefill",
        "checkpoint": {"preset": "tiny"},
        "arms": {"default": {"lm_head": "packed"}, "changed": {"lm_head": "packed", "options": {"prefill_graphs": 0}}},
        "cells": [{"batch": 2, "prompt_len": 64, "gen_len": 4}],
    }, "prefill.yaml")


def _bench_line(decode, prefill_ms, options):
    return json.dumps({"schema_version": 1, "decode_tok_s": decode, "prefill_ms": prefill_ms, "options": options})


def test_a_prefill_grid_judges_prefill_tokens_per_second_not_decode(tmp_path):
    """metric: prefill: a leg is batch x prompt_len tokens over the bench's prefill time, so an option
    that only slows the prefill is found slower even where its decode is faster; the cell carries the
    metric (its own ledger key and history page, never the decode cell's)."""
    from orchestrator.report.claims import cell_key

    def runner(decode, prefill_ms, options):
        return lambda args, timeout_s: _bench_line(decode, prefill_ms, options)
    result = run_grid(_prefill_spec(), benches={"default": runner(50.0, 20.0, {"prefill_graphs": 8}),
                                               "changed": runner(60.0, 25.0, {"prefill_graphs": 0})},
                      checkpoint=lambda **p: tmp_path)
    cell = result["cells"][0]
    assert result["metric"] == "prefill"
    assert cell["arms"]["default"]["legs"] == [2 * 64 * 1000 / 20.0] * 3  # 6400 tok/s
    assert cell["arms"]["changed"]["legs"] == [2 * 64 * 1000 / 25.0] * 3
    assert cell["verdict"]["direction"]["winner"] == "default" and cell["verdict"]["direction"]["state"] == "established"
    assert cell["cell"]["metric"] == "prefill" and cell["cell"]["label"].endswith(" prefill")
    decode = run_grid(_spec(legs=1), bench=lambda a, t: _bench_line(5.0, 1.0, {}), checkpoint=lambda **p: tmp_path)
    assert "metric" not in decode["cells"][0]["cell"] and decode["metric"] == "decode"
    assert "metric=prefill" in cell_key(cell["cell"]) and "metric" not in cell_key(decode["cells"][0]["cell"])


@pytest.mark.parametrize("prefill_ms, found", [(None, "None"), (0, "0"), (float("nan"), "nan")])
def test_a_prefill_leg_without_a_prefill_time_is_refused_naming_the_field(tmp_path, prefill_ms, found):
    bench = lambda a, t: _bench_line(5.0, prefill_ms, {"prefill_graphs": 0})  # noqa: E731
    with pytest.raises(GridError, match=rf"cell 0 .*arm default, leg 1: bench JSON prefill_ms: expected a positive "
                                        rf"number, found {found}"):
        run_grid(_prefill_spec(legs=1), bench=bench, checkpoint=lambda **p: tmp_path)


def test_a_spec_names_its_metric_or_is_refused():
    with pytest.raises(Exception, match=r"metric: expected one of decode, prefill, found 'ttft'"):
        parse_spec({"name": "x", "metric": "ttft", "arms": {"a": {"lm_head": "packed"}, "b": {"lm_head": "dequant"}},
                    "cells": [{"batch": 1, "prompt_len": 4, "gen_len": 4}]}, "x.yaml")
