"""The typed run record (orchestrator/record.py): its JSON round trip, the migration of records stored
by older code, and errors that name the field."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import report_records as rr
from orchestrator.record import SCHEMA_VERSION, Record, RecordError, Suite, migrate
from orchestrator.report.render import html

# A record as `orchestrator gate --grid smoke` stored it before this module (schema_version 1) on a
# 2-core CPU box, read back from its database (grid legs' raw bench JSON and residency weights trimmed).
V1 = json.loads((Path(__file__).parent / "fixtures" / "record-v1-cpu-gate.json").read_text())


def _without_version(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "schema_version"}


def test_a_stored_v1_record_reads_and_writes_back_every_field():
    record = Record.from_json(V1)
    assert record.provenance.md5_driver == V1["provenance"]["md5_head"]
    assert [s.name for s in record.suites_not_run] == ["packed_gemm", "cuda_engine"]
    assert record.suites[0].pid == V1["suites"][0]["pid"] and record.box.labels["box"] == "vm"
    out = record.to_json()
    assert out["schema_version"] == SCHEMA_VERSION == 3 and list(out)[:5] == [
        "schema_version", "run_id", "kind", "state", "shown_state"]
    assert _without_version(out) == _without_version(V1), "a field was lost, renamed or changed"
    assert Record.from_json(out).to_json() == out


def test_migration_keeps_what_the_report_shows():
    old = copy.deepcopy(V1)
    old.pop("schema_version")  # the oldest records carry no version
    old["residency"] = old["residency"][0]  # and stored a single residency reading bare
    old.pop("shown_state")
    migrated = Record.from_json(old)
    assert migrated.residency == V1["residency"][:1]
    assert migrated.to_json()["shown_state"] == V1["shown_state"]
    assert old.get("schema_version") is None and isinstance(old["residency"], dict), "the input is not changed"
    assert html(old) == html(migrated)


def test_unknown_keys_are_kept_on_every_level():
    data = copy.deepcopy(V1)
    data["added_later"] = {"x": 1}
    data["suites"][0]["flaky_reruns"] = 2
    data["provenance"]["signature"] = "sig"
    out = Record.from_json(data).to_json()
    assert out["added_later"] == {"x": 1} and out["suites"][0]["flaky_reruns"] == 2
    assert out["provenance"] == {**V1["provenance"], "signature": "sig"}


def test_the_code_names_the_driver_md5_and_the_json_keeps_its_key():
    record = Record.from_json(rr.record())
    record.provenance.md5_driver = "d" * 32
    assert record.to_json()["provenance"]["md5_head"] == "d" * 32 and "md5_driver" not in record.to_json()["provenance"]


def test_optional_fields_stay_absent_when_unset():
    suite = Suite(name="s", state="GREEN")
    assert {"why", "pid", "output_tail"}.isdisjoint(suite.to_json())
    assert "interrupted" not in Record(run_id="r", state="QUEUED").to_json()


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("state"), "run record r-0001: field 'state' missing"),
    (lambda r: r["suites"][1].pop("name"), r"run record r-0001: field 'suites\[1\].name' missing"),
    (lambda r: r["suites"][0].update(tests_total="235"), r"suites\[0\].tests_total: expected an integer, found '235'"),
    (lambda r: r["provenance"].update(md5_head=7), "provenance.md5_head: expected a string, found 7"),
    (lambda r: r.update(suites={"a": 1}), "run record r-0001: suites: expected a list"),
    (lambda r: r.update(lock="held"), "lock: expected an object, found 'held'"),
    (lambda r: r["mutations"][0].update(failures=True), r"mutations\[0\].failures: expected an integer"),
    (lambda r: r.update(schema_version=SCHEMA_VERSION + 1), "schema_version: expected 1..3, found 4"),
    (lambda r: r.update(kind="bench"), "run record r-0001: kind: expected one of gate, grid, compare, found 'bench'"),
    (lambda r: r["head"].update(dirty="yes"), "head.dirty: expected true or false, found 'yes'"),
])
def test_a_bad_record_names_the_field(change, message):
    bad = rr.record()
    change(bad)
    with pytest.raises(RecordError, match=message):
        Record.from_json(bad)


def test_migrate_refuses_what_it_does_not_know():
    with pytest.raises(RecordError, match="schema_version: expected 1..3, found '1'"):
        migrate({"schema_version": "1"})
    with pytest.raises(RecordError, match="expected a JSON object, found list"):
        Record.from_json([V1])


def test_a_version_2_record_reads_as_a_gate_and_a_grid_record_round_trips():
    v2 = {**rr.record(), "schema_version": 2}
    v2.pop("kind")
    assert Record.from_json(v2).kind == "gate" and "dirty" not in Record.from_json(v2).to_json()["head"]
    grid = Record.from_json(rr.record(kind="grid", head={**rr.BASE["head"], "dirty": True}, suites=[]))
    out = grid.to_json()
    assert out["kind"] == "grid" and out["head"]["dirty"] is True and Record.from_json(out).to_json() == out
    assert out["shown_state"] == "DONE (grid only: no gate ran)" and not grid.full_pass  # a grid is no pass
