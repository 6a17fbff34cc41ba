"""`python -m tools.attribution` on the CPU with the tiny checkpoint: the scopes cost nothing when off, every
part is measured and the parts partition the profiled step, a slowdown injected into one part shows
up in that part and no other, and the command's output and usage errors. Never a wall time."""
from __future__ import annotations

import json
import math
import time

import pytest
import torch
from typer.testing import CliRunner

from engine import scopes
from tools.attribution.measure import attribute_arm
from engine.floor import read_bandwidth
from tools.attribution.capture import PARTS, RUN, TOWER_FAMILIES
from tools.attribution.traffic import bytes_per_part, linear_part
from tools.attribution.cli import app
from engine.commands.bench import synthetic_prompts
from engine.engine import Engine
from engine.model.norm import RMSNorm
from engine_oracle import tiny

SLEEP_S = 0.002  # per RMSNorm call: ~11 calls a decode step on the tiny checkpoint, ~22 ms a step


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core box a second thread makes every op wait for a busy core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _engine(batch=1):
    eng = Engine(tiny(), max_num_seqs=batch, max_model_len=64)
    return eng, synthetic_prompts(batch, 5, eng.model.config.vocab_size, seed=0)


def _op_names(eng, prompts) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.generate(prompts, 3)
    return [e.name for e in prof.events()]


def test_scopes_off_record_nothing_and_on_add_only_their_ranges():
    eng, prompts = _engine()
    eng.generate(prompts, 3)
    assert not scopes.enabled()
    off = _op_names(eng, prompts)
    assert not [n for n in off if n.startswith((scopes.PREFIX, "regate:", "profiler::"))]
    previous = scopes.set_mode("kineto")
    try:
        on = _op_names(eng, prompts)
    finally:
        scopes.set_mode(previous)
    ranges = {n for n in on if n.startswith((scopes.PREFIX, "regate:"))}
    assert ranges == {scopes.PREFIX + p for p in PARTS} | {scopes.FORWARD, scopes.DECODE}
    assert [n for n in on if not n.startswith((scopes.PREFIX, "regate:", "profiler::"))] == off


def _innermost_open_range() -> str | None:
    open_ = []
    for name, _ in scopes.clock_log():
        if name is None:
            open_.pop()
        else:
            open_.append(name)
    return open_[-1] if open_ else None


def test_every_gemm_runs_inside_the_part_its_weight_bytes_are_booked_to(monkeypatch):
    from engine.linear import DenseLinear, Nvfp4Linear

    seen: dict[str, set] = {}
    for cls in (DenseLinear, Nvfp4Linear):
        def spy(self, x, _original=cls.__call__):
            seen.setdefault(self.name, set()).add((self.role, _innermost_open_range()))
            return _original(self, x)
        monkeypatch.setattr(cls, "__call__", spy)
    for arm in ("packed", "dequant"):
        eng = Engine(tiny(), lm_head=arm, max_num_seqs=1, max_model_len=16)
        previous = scopes.set_mode("clock")
        try:
            eng.generate([[1, 2, 3]], 3)
        finally:
            scopes.set_mode(previous)
        assert len(seen) == 3 * 8 + 7 + 1  # 3 Gated DeltaNet layers x 8 projections, 1 attention layer x 7, the head
        for name, calls in seen.items():
            (role, inside), = calls
            assert inside == scopes.PREFIX + linear_part(name, role), (arm, name, inside)
        seen.clear()


def _per_step_calls(eng, prompts, method) -> float:
    calls = []
    for n in (4, 6):
        method.calls = 0
        eng.generate(prompts, n)
        calls.append(method.calls)
    return (calls[1] - calls[0]) / 2


def test_an_injected_slowdown_shows_in_its_part_and_no_other(monkeypatch, one_thread):
    eng, prompts = _engine()
    base = attribute_arm(eng, prompts, (3, 11), iters=3, warmup=1)
    original = RMSNorm.__call__

    def slow_norm(self, x):  # extra work inside the norm's own part
        slow_norm.calls += 1
        with scopes.scope("norm"):
            time.sleep(SLEEP_S)
            return original(self, x)
    slow_norm.calls = 0
    monkeypatch.setattr(RMSNorm, "__call__", slow_norm)
    expected_ms = _per_step_calls(eng, prompts, slow_norm) * SLEEP_S * 1e3
    assert expected_ms >= 10 * SLEEP_S * 1e3  # 11 norms a step: the injection dominates the step
    slow = attribute_arm(eng, prompts, (3, 11), iters=3, warmup=0)
    before, after = ({p["name"]: p["ms_per_step"] for p in r["parts"]} for r in (base, slow))
    assert set(before) == set(after)
    growth = after["norm"] - before["norm"]
    assert 0.9 * expected_ms < growth < 1.5 * expected_ms  # a sleep never undershoots; a busy box oversleeps
    for name in set(before) - {"norm"}:
        assert abs(after[name] - before[name]) < 0.2 * growth, (name, before[name], after[name], growth)
    # The step timed without the profiler grew by the same amount: the profile closes on it.
    assert abs(slow["closure"] - 1) < 0.2, slow["closure"]


def test_a_prefill_slower_in_one_length_moves_neither_the_step_nor_any_part(monkeypatch, one_thread):
    """The measured window is the decode run: a prefill that takes 200 ms longer in the short runs
    only (as the host-bound prefill jitters between runs on a GPU box) would, in a whole-run
    difference, take 200 / 8 = 25 ms off every step of a ~5 ms step (checked: the step comes out
    near zero or negative); here the step and the parts stay where they were, within this shared
    box's noise (its runs vary by tens of percent)."""
    from engine.model_runner import ModelRunner

    eng, prompts = _engine()
    base = attribute_arm(eng, prompts, (3, 11), iters=3, warmup=1)
    original = ModelRunner.prefill

    def slow_short_prefill(self, seqs, *args, **kwargs):
        if seqs[0].max_new_tokens == 3:  # the short run's prefill only
            time.sleep(0.2)
        return original(self, seqs, *args, **kwargs)
    monkeypatch.setattr(ModelRunner, "prefill", slow_short_prefill)
    slow = attribute_arm(eng, prompts, (3, 11), iters=3, warmup=0)
    shift_ms = 200.0 / 8  # what a whole-run window would take off each step
    for key in ("total_ms_per_step", "profiled_ms_per_step"):
        assert abs(slow[key] - base[key]) < 0.2 * shift_ms, (key, base[key], slow[key])
    # the profile against the step timed apart: on this shared 2-core box the two runs can differ by
    # 2x (a CI run read 0.494); a whole-run window would give a step near zero or negative, far outside
    assert 0.25 < slow["closure"] < 4.0, slow["closure"]


def test_the_decode_window_is_one_decode_run_inside_the_run():
    from tools.attribution import capture

    def trace(*ranges):
        return capture.Trace(ranges=[{"id": i, "name": n, "start": a, "end": b, "thread": 0}
                                     for i, (n, a, b) in enumerate(ranges)])
    assert capture.decode_window(trace((RUN, 0, 100), (scopes.DECODE, 40, 99))) == (40, 99)
    for bad in (trace((RUN, 0, 100)),
                trace((RUN, 0, 100), (scopes.DECODE, 10, 20), (scopes.DECODE, 30, 90)),
                trace((RUN, 0, 100), (scopes.DECODE, 50, 120))):
        with pytest.raises(capture.AttributionError, match="expected one 'regate:decode' range .* found"):
            capture.decode_window(bad)


def test_every_part_is_measured_and_the_parts_partition_the_profiled_step(one_thread):
    eng, prompts = _engine(batch=2)
    r = attribute_arm(eng, prompts, (3, 11), iters=2, warmup=0)
    names = [p["name"] for p in r["parts"]]
    assert names == [*PARTS, "other", "host"]
    total = sum(p["ms_per_step"] for p in r["parts"])
    assert total == pytest.approx(r["profiled_ms_per_step"], rel=1e-9) == r["sum_of_parts_ms_per_step"]
    assert r["closure"] == pytest.approx(total / r["total_ms_per_step"], rel=1e-12)
    assert r["profiler_overhead"] == pytest.approx(r["profiled_ms_per_step"] / r["total_ms_per_step"] - 1)
    assert r["records_per_step"] > 0  # the part ranges a step opens, on the CPU
    assert r["overhead_us_per_record"] == pytest.approx(
        (r["profiled_ms_per_step"] - r["total_ms_per_step"]) * 1e3 / r["records_per_step"])
    weights = bytes_per_part(eng.residency())
    assert set(weights) == {"lm_head", *TOWER_FAMILIES}
    assert sum(weights.values()) == eng.residency()["totals"]["bytes_per_decode_step"] == r["weight_bytes_per_step"]
    for p in r["parts"]:
        assert p.get("bytes_per_step") == weights.get(p["name"]), p
    assert r["steps"] == 8 and r["batch"] == 2 and len(r["walls_ms"]["11"]) == 2 and r["decode"] == "cpu"


def test_the_kineto_recorder_sees_the_same_parts_on_the_cpu():
    """The recorder CUDA uses, run on the CPU: the same ranges, partitioning its window exactly."""
    from tools.attribution import capture

    eng, prompts = _engine()
    _, trace = capture.profiled(lambda: eng.generate(prompts, 3), eng.device, recorder="kineto")
    parts = capture.host_parts(trace)
    lo, hi = capture.window(trace)
    assert set(parts) == {*PARTS, "other", "host"}
    assert sum(parts.values()) == pytest.approx(hi - lo, rel=1e-9)
    with pytest.raises(capture.AttributionError, match="recorder 'nvtx': expected kineto or clock"):
        capture.profiled(lambda: None, eng.device, recorder="nvtx")
    assert not scopes.enabled()


def test_read_bandwidth_is_measured_here():
    bw = read_bandwidth(torch.device("cpu"), nbytes=16 * 2**20, repeats=2)
    assert bw["gb_s"] == pytest.approx(bw["bytes"] / bw["best_s"] / 1e9) and bw["gb_s"] > 0
    assert "measured by this command" in bw["method"]


@pytest.mark.parametrize("args, needle", [
    (["--lengths", "136,8"], "--lengths: expected two increasing integers >= 2 (short,long), found '136,8'"),
    (["--lengths", "1,8"], "--lengths: expected two increasing integers >= 2"),
    (["--lengths", "8"], "--lengths: expected two increasing integers >= 2"),
    (["--lengths", "8,x"], "--lengths: expected two comma-separated integers like 8,136, found '8,x'"),
    (["--batch", "0"], "--batch: expected an integer >= 1, found 0"),
    (["--iters", "0"], "--iters: expected an integer >= 1, found 0"),
    (["--backend", "rocm"], "--backend: expected cpu or cuda, found 'rocm'"),
    (["--lm-head", "fp8"], "--lm-head: expected one of packed, dequant, found 'fp8'"),
])
def test_usage_errors_exit_2_naming_the_option(args, needle):
    res = CliRunner().invoke(app, ["--model", str(tiny()), *args])
    assert res.exit_code == 2 and needle in res.output, res.output


def test_prompts_past_the_default_prefill_budget_are_still_prefilled_at_once():
    """2 x 1100 prompt tokens exceed the engine's default prefill budget (2048 tokens a step), which
    would split the prefill and break the one run of decode steps the window is; the command sizes
    the budget to the batch, and the engine's own refusal names why."""
    res = CliRunner().invoke(app, ["--model", str(tiny()), "--lengths", "2,3", "--batch", "2",
                                   "--prompt-len", "1100", "--iters", "1", "--warmup", "0", "--threads", "1", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    # the step is a difference of two wall times one decode step apart: on this 2-core VM it has come out
    # negative (CI at 642803d: -0.47 ms); this test is about the prefill budget, so only that it is a number
    assert r["batch"] == 2 and r["prompt_len"] == 1100 and math.isfinite(r["total_ms_per_step"])
    eng = Engine(tiny(), max_num_seqs=2, max_model_len=1103)  # the default budget: two prefills
    with pytest.raises(Exception, match="2 prefill steps for 2 prompts; the decode window needs every prompt"):
        attribute_arm(eng, synthetic_prompts(2, 1100, eng.model.config.vocab_size, seed=0), (2, 3), iters=1, warmup=0)


def test_compare_prints_one_json_line_with_both_arms_and_their_difference():
    res = CliRunner().invoke(app, ["--model", str(tiny()), "--compare", "--lengths", "3,5", "--iters",
                                   "1", "--warmup", "0", "--threads", "1", "--json"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["kind"] == "attribution" and r["schema_version"] == 1 and set(r["arms"]) == {"packed", "dequant"}
    assert r["bandwidth"]["gb_s"] > 0 and r["params"]["torch_threads"] == 1
    for arm in r["arms"].values():
        assert {"parts", "total_ms_per_step", "closure", "profiler_overhead", "box_read_gb_s"} <= set(arm)
        assert {"name", "ms_per_step", "share", "spread_ms"} <= set(arm["parts"][0])
    d = r["difference"]
    assert (d["a"], d["b"]) == ("packed", "dequant")
    assert [p["name"] for p in d["parts"]] == [p["name"] for p in r["arms"]["packed"]["parts"]]
    lm = next(p for p in d["parts"] if p["name"] == "lm_head")
    assert lm["delta_ms"] == pytest.approx(lm["a_ms"] - lm["b_ms"])
    assert all(p["noise_ms"] is None and p["beyond_noise"] is None for p in d["parts"])  # one run: no band
    assert "difference packed - dequant" in res.stderr and "closure" in res.stderr


class _Event:
    """A profiler event as torch 2.11 gives it (no activity_type) or, with `kind`, as torch >= 2.12."""

    def __init__(self, name: str, annotation: bool = False, kind: str | None = None):
        self._name, self._annotation = name, annotation
        if kind is not None:
            self.activity_type = lambda: kind

    def name(self):
        return self._name

    def is_user_annotation(self):
        return self._annotation


@pytest.mark.parametrize("event, work", [
    (_Event("void nvfp4_gemm_kernel<128>(...)"), True),
    (_Event("Memcpy DtoD (Device -> Device)"), True),
    (_Event("Memset (Device)"), True),
    (_Event("part:lm_head"), False),  # a range's extent on the device timeline, not work
    (_Event("anything", annotation=True), False),
    (_Event(RUN), False),
    (_Event("Context Sync"), False),
    (_Event("k", kind="kernel"), True),
    (_Event("part:norm", kind="gpu_user_annotation"), False),
])
def test_device_work_is_told_apart_from_annotations_with_and_without_activity_type(event, work):
    from tools.attribution.capture import is_device_work

    assert is_device_work(event) is work


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_graph_replays_are_matched_to_the_eager_step_and_the_parts_partition_them():
    """The CUDA path end to end (tiny checkpoint, CUDA graphs, decoding ahead): every replayed kernel
    finds its part in the eager step of its bucket, the id gather and the sampling included."""
    eng = Engine(tiny(), backend="cuda", max_num_seqs=2, max_model_len=64)
    prompts = synthetic_prompts(2, 5, eng.model.config.vocab_size, seed=0)
    assert eng.runner().graphs
    r = attribute_arm(eng, prompts, (3, 11), iters=1, warmup=1)
    names = {p["name"] for p in r["parts"]}
    assert {"sample", "idle"} <= names and r["decode"] == "cuda-graphs"
    assert sum(p["ms_per_step"] for p in r["parts"]) == pytest.approx(r["profiled_ms_per_step"], rel=1e-6)
    assert next(p for p in r["parts"] if p["name"] == "sample")["ms_per_step"] > 0
    assert r["records_per_step"] > 10  # kernels and copies a step replays


class _MetaEvent:
    def __init__(self, text):
        self.text = text

    def metadata_json(self):
        return self.text


@pytest.mark.parametrize("text, meta", [
    ('"grid": [544, 1, 1], "registers per thread": 98, "est. achieved occupancy %": 25',
     {"grid": [544, 1, 1], "registers per thread": 98, "est. achieved occupancy %": 25}),
    ("", {}),
    ('"grid": [544, 1', {}),  # cut short: no metadata rather than a guess
])
def test_kernel_metadata_is_read_as_a_dict_or_left_out(text, meta):
    from tools.attribution.capture import event_meta

    assert event_meta(_MetaEvent(text)) == meta
    assert event_meta(object()) == {}  # an event without metadata at all


def test_the_kernel_listing_splits_one_kernel_by_grid_and_names_registers_and_occupancy():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "decode_kernels.py"
    spec = importlib.util.spec_from_file_location("decode_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gemm = "void tile_gemm_kernel<1, 1, 4, false, 1>(TileGemmArgs, int)"
    rows = [{"name": gemm, "start": 0.0, "end": 30.0, "meta": {"grid": [544, 1, 1], "registers per thread": 98,
                                                              "est. achieved occupancy %": 25}},
            {"name": gemm, "start": 31.0, "end": 41.0, "meta": {"grid": [80, 4, 1]}},
            {"name": "add_rms_norm_kernel", "start": 42.0, "end": 45.0}]
    stats = mod.kernel_stats(rows)
    assert stats == {f"{gemm[:60]} grid 544x1x1 regs 98 occ% 25": [1, 30.0, 0.0],
                     f"{gemm[:60]} grid 80x4x1": [1, 10.0, 1.0], "add_rms_norm_kernel": [1, 3.0, 1.0]}
