"""The gate suites as the orchestrator runs them (a pytest subprocess under -p gates.census): each CPU
suite green with its census met; a weakened copy trips the census; every mutation pin KILLED."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from gates.census import census_verdict
from gates.manifest import load_manifest
from orchestrator.box.mutate import KILLED, NOT_RUN, run_pins, run_suite
from orchestrator.box.tree import Tree
from gates.pins import load_pins

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = load_manifest(ROOT)
CPU_SUITES = [s.name for s in MANIFEST.suites if s.needs == ("cpu",)]
IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", ".regate")


@pytest.mark.parametrize("name", CPU_SUITES)
def test_cpu_suite_green_with_its_census(name):
    suite = MANIFEST.suite(name)
    run = run_suite(Tree(ROOT), suite)
    assert not run.get("timed_out"), f"{name} timed out after {suite.timeout_s} s"
    state, reasons = census_verdict(run["record"], suite.census_tests, suite.census_checks)
    assert (state, reasons) == ("GREEN", []), run["detail"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_suite_skips_cleanly_without_a_gpu():
    suite = MANIFEST.suite("packed_gemm")
    run = run_suite(Tree(ROOT), suite)
    outcomes = {t["outcome"] for t in run["record"]["tests"].values()}
    assert outcomes == {"skipped"} and len(run["record"]["tests"]) == suite.census_tests
    assert run["record"]["collection_errors"] == 0
    assert census_verdict(run["record"], suite.census_tests, suite.census_checks)[0] == "RED"  # not run != green


def test_a_weakened_copy_trips_the_census(tmp_path):
    """One check removed from a non-sacred suite: everything it still runs passes, and it is RED."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=IGNORE)
    path = tree / "gates/suites/test_paged_forward.py"
    text = path.read_text()
    line = '        check.equal(b[i], a[i], f"prompt {i}: tokens, scattered vs adjacent blocks")\n'
    assert line in text
    path.write_text(text.replace(line, ""))
    suite = MANIFEST.suite("paged_forward")
    run = run_suite(Tree(tree), suite)
    record = run["record"]
    assert record["checks_passed"] == record["checks_total"] and run["failures"] == 0
    state, reasons = census_verdict(record, suite.census_tests, suite.census_checks)
    removed = 5  # the line ran once per prompt
    assert state == "RED"
    assert reasons == [f"checks: {suite.census_checks - removed} executed, census requires exactly "
                       f"{suite.census_checks}"]


def test_pins_target_suites_of_the_manifest():
    for pin in load_pins(ROOT):
        suite = MANIFEST.suite(pin.suite)
        for sel in pin.select:
            assert sel.split("::")[0] in suite.files, (pin.name, sel)


@pytest.mark.slow
def test_every_pin_is_killed_on_this_engine():
    """Baselines are the suites above (green); each pin runs its narrowed selection in a fresh copy."""
    results = run_pins(ROOT, baseline=False)
    assert {r["pin"] for r in results} == {p.name for p in load_pins(ROOT)}
    needs_gpu = {p.name for p in load_pins(ROOT) if "cuda" in MANIFEST.suite(p.suite).needs}
    expected = {r["pin"]: KILLED if torch.cuda.is_available() or r["pin"] not in needs_gpu else NOT_RUN
                for r in results}
    wrong = [(r["pin"], r["state"], r["detail"]) for r in results if r["state"] != expected[r["pin"]]]
    assert not wrong


def test_cuda_pins_exist_for_the_cuda_engine_suite():
    pins = {p.name: p for p in load_pins(ROOT)}
    assert pins["packed-head-dequant-on-cuda"].suite == "cuda_engine"
    assert pins["graph-replays-stale-block-tables"].suite == "cuda_engine"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_a_cuda_pin_is_not_run_without_a_gpu():
    """Its suite would skip every test: "green under the mutation" would be a lie, so NOT_RUN."""
    [r] = run_pins(ROOT, ["packed-head-dequant-on-cuda"])
    assert r["state"] == NOT_RUN and "needs a CUDA GPU" in r["detail"]
