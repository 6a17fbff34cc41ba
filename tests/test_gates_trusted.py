"""The gate set comes from the trusted manifest: a head cannot drop, rename or lower a suite (issue 25
case 4), unless the run accepts it, which is recorded and shown."""
from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import PASSING_TEST, commit_all, make_stub_repo, suite  # noqa: E402
from orch_jobs import gate_without_ray  # noqa: E402

from gates.manifest import load_manifest, parse_manifest  # noqa: E402
from gates.trusted import gate_set  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRUSTED = load_manifest(ROOT)


def _head(edit) -> object:
    raw = yaml.safe_load((ROOT / "gates" / "gates.yaml").read_text())
    edit(raw["suites"])
    return parse_manifest(raw)


def _drop(name):
    return lambda suites: suites.remove(next(s for s in suites if s["name"] == name))


def test_case4_a_head_that_drops_dense_lmhead_fp4_is_a_change_and_the_suite_still_runs():
    gs = gate_set(TRUSTED, _head(_drop("dense_lmhead_fp4")))
    assert not gs.ok
    assert [(c.suite, c.what) for c in gs.changes] == [("dense_lmhead_fp4", "dropped")]
    assert "dense_lmhead_fp4" in [s.name for s in gs.suites], "the trusted suite judges the head anyway"
    assert "not accepted; --accept-gate-change accepts it" in gs.message()


def test_an_accepted_drop_is_recorded_and_not_run():
    gs = gate_set(TRUSTED, _head(_drop("dense_lmhead_fp4")), accept=True)
    assert gs.ok and gs.record()["accepted"] and gs.record()["changes"][0]["what"] == "dropped"
    assert "dense_lmhead_fp4" not in [s.name for s in gs.suites]
    [(skipped, why)] = gs.skipped
    assert skipped.name == "dense_lmhead_fp4" and "accepted by --accept-gate-change" in why


def test_a_rename_is_a_drop_and_the_new_name_runs_as_well():
    def rename(suites):
        next(s for s in suites if s["name"] == "paged_forward")["name"] = "paged_forward_v2"
    gs = gate_set(TRUSTED, _head(rename))
    assert [(c.suite, c.what) for c in gs.changes] == [("paged_forward", "dropped")]
    assert {"paged_forward", "paged_forward_v2"} <= {s.name for s in gs.suites}


def test_a_lowered_census_runs_the_trusted_census_unless_accepted():
    def lower(suites):
        next(s for s in suites if s["name"] == "paged_forward")["census"]["checks"] -= 1
    gs = gate_set(TRUSTED, _head(lower))
    [change] = gs.changes
    assert change.what == "census lowered" and "checks" in change.detail
    mine = TRUSTED.suite("paged_forward")
    assert next(s for s in gs.suites if s.name == "paged_forward").census_checks == mine.census_checks
    accepted = gate_set(TRUSTED, _head(lower), accept=True)
    assert next(s for s in accepted.suites if s.name == "paged_forward").census_checks == mine.census_checks - 1


def test_moving_a_suite_to_hardware_this_box_lacks_is_a_change():
    def cuda_only(suites):
        next(s for s in suites if s["name"] == "paged_forward")["needs"] = ["cuda"]
    [change] = gate_set(TRUSTED, _head(cuda_only)).changes
    assert change.what == "needs changed"


def test_a_raised_census_and_a_new_suite_are_not_weakenings():
    def more(suites):
        next(s for s in suites if s["name"] == "paged_forward")["census"]["tests"] += 2
        suites.append({**suites[0], "name": "extra", "sacred": False})
        suites[-1].pop("digest", None)
    gs = gate_set(TRUSTED, _head(more))
    assert gs.ok and not gs.changes
    assert next(s for s in gs.suites if s.name == "paged_forward").census_tests == \
        TRUSTED.suite("paged_forward").census_tests + 2
    assert gs.suites[-1].name == "extra"


def test_sacredness_and_the_mutation_mode_stay_the_trusted_ones():
    def unsacred(suites):
        suites[0]["sacred"] = False
    gs = gate_set(dataclasses.replace(TRUSTED, mutations="on_gate"), _head(unsacred))
    assert next(s for s in gs.suites if s.name == "paged_engine").sacred and gs.mutations == "on_gate"


@pytest.fixture
def two_suites(tmp_path, monkeypatch):
    """A stub head with two suites, and a copy of its tree as the trusted root."""
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    suites = [suite("fast", "tests/test_fast.py", 2, 3), suite("guard", "tests/test_guard.py", 2, 3)]
    repo = make_stub_repo(tmp_path / "repo", suites, {"tests/test_fast.py": PASSING_TEST,
                                                      "tests/test_guard.py": PASSING_TEST})
    trusted = tmp_path / "trusted"
    shutil.copytree(repo, trusted, ignore=shutil.ignore_patterns(".git"))
    manifest = repo / "gates" / "gates.yaml"
    raw = yaml.safe_load(manifest.read_text())
    raw["suites"] = raw["suites"][:1]  # the head drops `guard`
    manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
    commit_all(repo, "drop the guard suite")
    return repo, trusted


def test_case4_a_gate_of_a_head_that_dropped_a_suite_fails(two_suites, tmp_path):
    """Issue 25 case 4, end to end: at 47ce0b3 this head PASSED with nothing under Not run."""
    repo, trusted = two_suites
    rec = gate_without_ray(repo, tmp_path, trusted=trusted)
    assert rec["state"] == "FAILED", rec.get("error")
    assert [s["name"] for s in rec["suites"]] == ["fast", "guard"]
    assert rec["gate_set"]["ok"] is False and rec["gate_set"]["changes"][0]["suite"] == "guard"
    page = Path(rec["report_path"]).read_text()
    assert "Gate set changed by this head (NOT accepted)" in page and "no longer lists it" in page


def test_an_accepted_drop_passes_as_partial_and_says_what_did_not_run(two_suites, tmp_path):
    repo, trusted = two_suites
    rec = gate_without_ray(repo, tmp_path, trusted=trusted, accept_gate_change=True)
    assert rec["state"] == "PASSED" and rec["gate_set"]["accepted"] is True
    assert rec["shown_state"] == "PASSED (partial: guard not run on this box)"
    assert {"what": "suite guard", "why": "dropped by the head's gates.yaml; accepted by --accept-gate-change"} \
        in rec["not_run"]
    page = Path(rec["report_path"]).read_text()
    assert "Gate set changed by this head (change accepted)" in page
