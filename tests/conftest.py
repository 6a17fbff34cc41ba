"""Session-wide test setup.

Without a GPU, Triton kernels can run only under Triton's CPU interpreter, and the interpreter must
be on before `triton.language` is first imported anywhere (transformers imports it too): set here,
before any test module loads, so tests/test_fused_decode.py checks the kernels' maths in CI.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# ---- the fast subset: `pytest -m "not slow"` ------------------------------------------------------
# A test is slow when it is marked so, or when its measured wall time (setup, call and teardown) on the
# 2-core CPU box is at least SLOW_S: tests/durations.json, refreshed by
# `.venv/bin/python -m pytest -q --store-durations` (the way pytest-split keeps its timings). A test not
# measured yet counts as fast until the next refresh.
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SLOW_S = 1.0
DURATIONS = Path(__file__).with_name("durations.json")
_measured: dict[str, float] = {}


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's wall time to {DURATIONS.name} (what marks a test slow)")


def pytest_collection_modifyitems(config, items):
    stored = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    for item in items:
        if stored.get(item.nodeid, 0.0) >= SLOW_S:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("--store-durations") or not _measured:
        return
    stored = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    stored.update({k: round(v, 3) for k, v in _measured.items()})
    tmp = DURATIONS.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(stored.items())), indent=0) + "\n")
    tmp.replace(DURATIONS)
