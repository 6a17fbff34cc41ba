"""Named parts of a decode step, marked in the model code for `python -m tools.attribution`.

Each part of the step runs inside `scope(<part>)`, a range named `part:<part>`; the attribution
reads those ranges (and on CUDA the kernels launched inside them) back. The scopes cost nothing
unless attribution turns them on: switched off, `scope` returns one shared null context, so the
step records no range and runs no extra op
(tests/test_attribute.py proves it against a full op profile).

Two ways to record a range, both measured on this 2-core box:
- `kineto`: a profiler user-scope range, so the CUDA kernels launched inside it are correlated to it
  (the CUDA attribution). ~3 us a range (`torch.profiler.record_function` costs ~8.5 us; torch's C++
  `_RecordFunctionFast` is FUNCTION scope, so seeing it means recording every aten op: +20% a step).
- `clock`: the host clock (`time.perf_counter_ns`, the clock the step is timed by), ~0.8 us a range.
  The CPU attribution uses it: ~40 ranges a step of the tiny checkpoint cost ~0.5% of its ~6 ms,
  where the kineto ranges would cost ~3% and blur the 1% closure the attribution checks.

Parts (docs/ENGINE.md, "python -m tools.attribution"):
- `lm_head`: the head GEMM;
- `tower.qkvo`, `tower.gate_up`, `tower.down`, `tower.in_proj`, `tower.out_proj`: the tower GEMMs
  by projection family (full-attention q/k/v/o; MLP gate and up; MLP down; Gated DeltaNet
  in_proj_qkv/z/b/a; Gated DeltaNet out_proj);
- `delta_rule`: the Gated DeltaNet core (decay and beta, causal conv, the delta rule, state writes);
- `attention`: the full-attention core (RoPE, the KV write, paged attention, the output gate);
- `norm`: every RMSNorm (layer norms, q/k norms, the final norm, the gated norm);
- `embed`: the embedding gather; `sample`: logits to tokens (FP32 logits, top-k, argmax);
- `forward` is not a part: it marks the model's forward, so time in it outside every part is the
  measured `other` (residual adds, the SwiGLU activation and their Python).
The attribution's side (the list of parts it expects, the part each projection's weight bytes are
booked to, its own RUN range) is tools/attribution; the engine only marks.
"""
from __future__ import annotations

import contextlib
from time import perf_counter_ns

import torch

PREFIX = "part:"
FORWARD = "regate:forward"  # the model's forward step (not a part: its own time is `other`)
# One run of decode steps inside generate(), from the first step's launch (the prefill read back,
# the device idle) to the last step read back: the window the attribution measures, so the host-bound
# prefill's jitter (tens of ms between runs at 64 layers) stays out of the two-length difference.
DECODE = "regate:decode"
MODES = ("kineto", "clock")

_mode: str | None = None  # None: off
_OFF = contextlib.nullcontext()
_clock_log: list = []  # flat: name, t on enter; None, t on exit (no tuple built inside the step)
_clock_ranges: dict[str, "_ClockRange"] = {}  # by range name, made once each


class _KinetoRange:
    """A profiler user-scope range (what CUDA kernels are correlated with), entered through the
    direct binding: ~3 us a range here, against ~8.5 us for torch.profiler.record_function."""
    __slots__ = ("name", "handle")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.handle = torch._C._autograd._record_function_with_args_enter(self.name)

    def __exit__(self, *exc):
        torch._C._autograd._record_function_with_args_exit(self.handle)


class _ClockRange:
    """A range timed by the host clock: two appends to a log, ~0.8 us a range. Stateless, so one
    object per name serves nested and repeated ranges alike."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    # The log's append and the clock are bound once (default arguments), not looked up per range.
    def __enter__(self, _append=_clock_log.append, _now=perf_counter_ns):
        _append(self.name)
        _append(_now())

    def __exit__(self, exc_type, exc, tb, _append=_clock_log.append, _now=perf_counter_ns):
        _append(None)
        _append(_now())


def enabled() -> bool:
    return _mode is not None


def set_mode(mode: str | None) -> str | None:
    """Turn the scopes on (`kineto` or `clock`) or off (None); returns the previous mode. Turning
    `clock` on starts an empty log."""
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"scope mode {mode!r}: expected one of {MODES} or None")
    if mode == "clock":
        _clock_log.clear()
    else:
        _clock_parts.clear()
    previous, _mode = _mode, mode
    return previous


def clock_log() -> list[tuple[str | None, int]]:
    """The `clock` ranges recorded since it was turned on: (name, ns) on enter, (None, ns) on exit."""
    return list(zip(_clock_log[0::2], _clock_log[1::2]))


def _range(name: str):
    if _mode == "clock":
        r = _clock_ranges.get(name)
        if r is None:
            r = _clock_ranges[name] = _ClockRange(name)
        return r
    return _KinetoRange(name)


_clock_parts: dict[str, _ClockRange] = {}  # part -> its range while `clock` is on; empty otherwise


def scope(part: str):
    """A `part:<part>` range while attribution is on; a shared no-op context otherwise."""
    r = _clock_parts.get(part)  # the clock's ranges are found in one lookup: they are the cheap ones
    if r is not None:
        return r
    if _mode is None:
        return _OFF
    r = _range(PREFIX + part)
    if _mode == "clock":
        _clock_parts[part] = r
    return r


def marker(name: str):
    """A range with a name of its own (FORWARD, DECODE, the attribution's RUN), on the parts' switch."""
    return _OFF if _mode is None else _range(name)

