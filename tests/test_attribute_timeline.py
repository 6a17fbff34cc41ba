"""The timeline rules of `python -m tools.attribution` on hand-built traces: host ranges (innermost wins, the
uncovered rest is the gap), device activities (overlaps shared, idle is the gap), kernels booked by
their launch's range, and CUDA-graph replays matched to an eager step or refused."""
from __future__ import annotations

import pytest

from engine import scopes
from tools.attribution.capture import RUN, AttributionError, Trace, device_parts, eager_step_parts, host_parts
from tools.attribution.timeline import Span, device_split, host_split


def test_host_ranges_innermost_wins_and_the_rest_is_the_gap():
    ranges = [Span("forward", 10, 90), Span("norm", 12, 20), Span("lm_head", 30, 60), Span("sample", 70, 75),
              Span("norm", 80, 85)]
    out = host_split(ranges, (0, 100), "host")
    assert out == {"host": 10 + 10, "forward": 2 + 10 + 10 + 5 + 5, "norm": 8 + 5, "lm_head": 30, "sample": 5}
    assert sum(out.values()) == 100  # a partition of the window


def test_host_ranges_are_clipped_to_the_window_and_must_nest():
    assert host_split([Span("a", -5, 5), Span("b", 8, 20)], (0, 10), "gap") == {"gap": 3, "a": 5, "b": 2}
    with pytest.raises(ValueError, match="'b' .* crosses the end of 'a'"):
        host_split([Span("a", 0, 10), Span("b", 5, 15)], (0, 20), "gap")


def test_on_one_stream_an_overlap_belongs_to_the_kernel_that_started_first():
    """A GEMM launched early (programmatic dependent launch) only waits while the kernel before it
    ends: that time is the earlier kernel's, on the same stream; on two streams it is shared."""
    same = [Span("delta_rule", 0, 10, 7), Span("tower.out_proj", 8, 15, 7), Span("norm", 15, 16, 7)]
    assert device_split(same, (0, 20), "idle") == {"delta_rule": 10, "tower.out_proj": 5, "norm": 1, "idle": 4}
    two = [Span("delta_rule", 0, 10, 7), Span("tower.out_proj", 8, 15, 8)]
    assert device_split(two, (0, 15), "idle") == {"delta_rule": 9, "tower.out_proj": 6, "idle": 0}
    # three on one stream and one on another: the stream's first takes its half
    mixed = [Span("a", 0, 4, 1), Span("b", 2, 4, 1), Span("c", 2, 4, 2)]
    assert device_split(mixed, (0, 4), "idle") == {"a": 2 + 1, "c": 1, "idle": 0}


def test_device_overlaps_are_shared_and_idle_is_measured():
    acts = [Span("tower.down", 0, 10), Span("lm_head", 5, 15), Span("norm", 20, 22)]
    out = device_split(acts, (0, 30), "idle")
    assert out == {"tower.down": 5 + 2.5, "lm_head": 2.5 + 5, "norm": 2, "idle": 8 + 5}
    assert sum(out.values()) == 30
    assert device_split([], (0, 7), "idle") == {"idle": 7}


def _rng(i, name, start, end, thread=1):
    return {"id": i, "name": name, "start": start, "end": end, "thread": thread}


def _launch(corr, at, name="cudaLaunchKernel"):
    return {"name": name, "start": at, "end": at + 0.5, "corr": corr}


def _trace_with_launches():
    t = Trace()
    t.ranges = [_rng(1, RUN, 0, 100), _rng(2, scopes.FORWARD, 10, 80), _rng(3, "part:norm", 12, 20),
                _rng(4, "part:lm_head", 40, 60)]
    t.launches = [_launch(11, 13), _launch(12, 41), _launch(13, 70), _launch(14, 4), _launch(15, 63),
                  _launch(16, 50)]
    t.device = [{"name": "rms", "start": 15, "end": 25, "corr": 11},
                {"name": "gemm", "start": 45, "end": 75, "corr": 12},
                {"name": "add", "start": 76, "end": 78, "corr": 13},  # launched in the forward, outside parts
                {"name": "copy", "start": 5, "end": 8, "corr": 14},  # launched outside the forward
                {"name": "misc", "start": 79, "end": 80, "corr": 15},  # launched between parts
                {"name": "late", "start": 95, "end": 120, "corr": 16},  # clipped at the window's end
                {"name": "orphan", "start": 90, "end": 91, "corr": 99}]  # no runtime call recorded: other
    return t


def test_kernels_are_booked_to_the_range_they_were_launched_from():
    out = device_parts(_trace_with_launches())
    assert out == {"norm": 10, "lm_head": 30 + 5, "other": 2 + 3 + 1 + 1, "idle": 100 - 10 - 35 - 7}
    assert sum(out.values()) == 100


def test_host_parts_read_the_runs_thread_only():
    t = _trace_with_launches()
    t.ranges.append(_rng(9, "part:attention", 0, 100, thread=2))  # another thread's range is not this step's
    out = host_parts(t)
    assert out == {"host": 10 + 20, "other": 70 - 8 - 20, "norm": 8, "lm_head": 20}


def _graph_trace(kernels_per_replay):
    t = Trace()
    t.ranges = [_rng(1, RUN, 0, 100), _rng(2, scopes.FORWARD, 10, 40), _rng(3, scopes.FORWARD, 50, 80)]
    t.launches = [_launch(21, 11, "cudaGraphLaunch"), _launch(22, 51, "cudaGraphLaunch_v10000")]
    for corr, base in ((21, 12), (22, 52)):
        for i, name in enumerate(kernels_per_replay):
            t.device.append({"name": name, "start": base + 5 * i, "end": base + 5 * i + 4, "corr": corr})
    return t


def _eager_trace():
    """An eager step: its inputs copied in before the run window, an id gather before the forward and
    the sampling after it (both captured in the graph too)."""
    t = Trace()
    t.ranges = [_rng(1, RUN, 3, 50), _rng(2, scopes.FORWARD, 5, 45), _rng(3, "part:norm", 6, 10),
                _rng(4, "part:lm_head", 20, 30), _rng(5, "part:sample", 46, 49)]
    t.launches = [_launch(31, 1, "cudaMemcpyAsync"), _launch(32, 7), _launch(33, 11), _launch(34, 21),
                  _launch(35, 4), _launch(36, 47)]
    t.device = [{"name": "h2d", "start": 1, "end": 2, "corr": 31},  # the inputs' copy: not in the graph
                {"name": "gemm", "start": 21, "end": 29, "corr": 34},  # listed out of order: launch order counts
                {"name": "rms", "start": 7, "end": 9, "corr": 32}, {"name": "add", "start": 12, "end": 13, "corr": 33},
                {"name": "gather", "start": 4, "end": 5, "corr": 35}, {"name": "topk", "start": 47, "end": 48, "corr": 36}]
    return t


def test_innermost_range_of_each_time_in_one_sweep():
    from tools.attribution.capture import innermost

    rs = [_rng(1, "a", 0, 100), _rng(2, "b", 10, 20), _rng(3, "c", 12, 14), _rng(4, "d", 30, 40)]
    found = innermost(rs, [35, 13, 5, 15, 25, 150, 12, -1])
    assert [r["name"] if r else None for r in found] == ["d", "c", "a", "b", "a", None, "c", None]


def test_graph_replays_take_the_parts_of_the_eager_step_in_launch_order():
    eager = eager_step_parts(_eager_trace())
    assert eager == (["gather", "rms", "add", "gemm", "topk"], ["other", "norm", "other", "lm_head", "sample"])
    out = device_parts(_graph_trace(["gather", "rms", "add", "gemm", "topk"]), eager)
    assert out == {"norm": 8, "other": 16, "lm_head": 8, "sample": 8, "idle": 100 - 40}


def test_graph_replays_that_differ_from_the_eager_step_are_refused():
    eager = eager_step_parts(_eager_trace())
    with pytest.raises(AttributionError, match="ran 4 device activities, the eager step of its bucket 5"):
        device_parts(_graph_trace(["gather", "rms", "add", "gemm"]), eager)  # the sampling left out
    with pytest.raises(AttributionError, match="activity 2 of a CUDA graph replay is 'mul'"):
        device_parts(_graph_trace(["gather", "rms", "mul", "gemm", "topk"]), eager)
    with pytest.raises(AttributionError, match="no eager step"):
        device_parts(_graph_trace(["gather", "rms", "add", "gemm", "topk"]), None)
    with pytest.raises(AttributionError, match="left no kernel in the trace.*--eager"):
        device_parts(_graph_trace([]), eager)


def test_a_trace_without_exactly_one_run_window_is_refused():
    t = _trace_with_launches()
    t.ranges = [r for r in t.ranges if r["name"] != RUN]
    with pytest.raises(AttributionError, match="expected one 'regate:run' range, found 0"):
        device_parts(t)


def test_a_graph_replays_a_captured_copy_as_a_copy_kernel_of_its_own_name():
    from tools.attribution.capture import same_activity

    assert same_activity("memcpy32_post", "Memcpy DtoD (Device -> Device)")
    assert same_activity("Memset (Device)", "memset32_aligned1D")
    assert not same_activity("memcpy32_post", "void rms_norm_kernel<...>")
    assert not same_activity("gemm_a", "gemm_b")
    eager = (["rms", "Memcpy DtoD (Device -> Device)", "gemm"], ["norm", "other", "lm_head"])
    out = device_parts(_graph_trace(["rms", "memcpy32_post", "gemm"]), eager)
    assert out == {"norm": 8, "other": 8, "lm_head": 8, "idle": 100 - 24}


def test_a_graph_replay_outside_the_span_is_not_mapped_to_the_decode_step():
    """A prefill replayed from its own graph (engine/prefill_graphs.py) before the decode window runs
    other kernels than the decode step; it lies outside the span, so it is left out, never refused."""
    eager = eager_step_parts(_eager_trace())
    t = _graph_trace(["gather", "rms", "add", "gemm", "topk"])
    t.launches.append(_launch(23, 1, "cudaGraphLaunch"))
    t.device += [{"name": n, "start": 2 + 2 * i, "end": 3 + 2 * i, "corr": 23} for i, n in enumerate(["copy", "conv", "attn"])]
    out = device_parts(t, eager, (10, 100))
    assert out == {"norm": 8, "other": 16, "lm_head": 8, "sample": 8, "idle": 90 - 40}
    with pytest.raises(AttributionError, match="ran 3 device activities"):
        device_parts(t, eager, (0, 100))
