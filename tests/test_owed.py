"""The owed ledger: opened by a run's owed claims, settled by a later binding run, closed by a person."""
from __future__ import annotations

import pytest

import report_records as rr
from orchestrator import db, owed

SHA = rr.BASE["head"]["sha"]
OTHER = "c0ffee" + SHA[6:]


@pytest.fixture
def conn(tmp_path):
    c = db.connect(tmp_path / "regate.db")
    owed.ensure_schema(c)
    yield c
    c.close()


def test_seed_run_opens_magnitude_and_direction_with_reasons(conn):
    out = owed.sync_from_record(conn, rr.seed_record(run_id="r-1"))
    assert len(out["opened"]) == 2 and not out["settled"]
    items = {i["what"]: i for i in owed.list_open(conn, SHA[:8])}
    assert set(items) == {"magnitude", "direction"}
    assert "dequant legs disagree by 7.9% > 2%" in items["magnitude"]["reason"]
    assert items["direction"]["legs_needed"] == 3
    assert {i["opened_by"] for i in items.values()} == {"r-1"}
    assert items["magnitude"]["cell"] == "batch=1 gen_len=32 preset=27b prompt_len=128"
    assert items["magnitude"]["label"] == items["magnitude"]["cell"]  # the fixture's cell has no label


def test_sync_is_idempotent_and_keeps_the_opener(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-1"))
    out = owed.sync_from_record(conn, rr.seed_record(run_id="r-2"))
    assert not out["opened"] and len(out["refreshed"]) == 2
    items = owed.list_open(conn)
    assert len(items) == 2
    assert {(i["opened_by"], i["last_seen_by"]) for i in items} == {("r-1", "r-2")}


def test_binding_run_of_the_same_head_and_cell_settles(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-1"))
    other_cell = rr.record(run_id="r-2", grid=rr.grid(rr.binding_verdict(), cell={"batch": 8}))
    other_head = rr.record(run_id="r-3", head={"rev": "x", "sha": OTHER}, grid=rr.grid(rr.binding_verdict()))
    for r in (other_cell, other_head):
        assert owed.sync_from_record(conn, r)["settled"] == []
    assert len(owed.list_open(conn, SHA)) == 2
    out = owed.sync_from_record(conn, rr.record(run_id="r-4", grid=rr.grid(rr.binding_verdict())))
    assert len(out["settled"]) == 2
    assert owed.list_open(conn, SHA) == []
    row = conn.execute("SELECT state, closed_by, close_reason FROM owed WHERE what='magnitude'").fetchone()
    assert row[0] == "settled" and row[1] == "r-4" and "binding" in row[2]


def test_a_person_closes_with_a_reason(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-1"))
    item = owed.list_open(conn)[0]
    with pytest.raises(owed.OwedError, match="needs a reason"):
        owed.close(conn, item["id"], "  ")
    closed = owed.close(conn, item["id"], "measured on the operator's box, see #213")
    assert closed["state"] == "closed" and closed["close_reason"].startswith("measured")
    assert [i["id"] for i in owed.list_open(conn)] != [item["id"]] and len(owed.list_open(conn)) == 1
    with pytest.raises(owed.OwedError, match="already closed"):
        owed.close(conn, item["id"], "again")
    with pytest.raises(owed.OwedError, match="no such item"):
        owed.close(conn, 999, "x")


def test_sync_joins_the_result_transaction(conn):
    """db.finish stores the record and syncs the ledger in one transaction: all or nothing."""
    rec = rr.seed_record(run_id="r-tx", created_at=db.utc_now())
    db.insert_queued(conn, rec, "key")
    rec.update(state="PASSED", finished_at=db.utc_now())
    db.finish(conn, rec, sync=owed.sync_from_record)
    assert db.state_of(conn, "r-tx") == "PASSED" and len(owed.list_open(conn)) == 2

    rec2 = rr.seed_record(run_id="r-tx2", created_at=db.utc_now(), head={"rev": "y", "sha": OTHER})
    db.insert_queued(conn, rec2, "key2")
    rec2.update(state="PASSED", finished_at=db.utc_now(), grid={"cells": [{"cell": {"b": 1}, "verdict": 3}]})
    with pytest.raises(Exception, match="verdict: expected"):
        db.finish(conn, rec2, sync=owed.sync_from_record)
    assert db.state_of(conn, "r-tx2") == "QUEUED" and owed.list_open(conn, OTHER) == []


def test_no_grid_no_rows_and_missing_head_refused(conn):
    assert owed.sync_from_record(conn, rr.record()) == {"opened": [], "refreshed": [], "settled": []}
    with pytest.raises(owed.OwedError, match="head.sha"):
        owed.sync_from_record(conn, rr.record(head={"rev": "HEAD"}))


def test_a_ledger_without_the_label_column_is_upgraded(tmp_path):
    c = db.connect(tmp_path / "old.db")
    c.execute("CREATE TABLE owed (id INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT NOT NULL, head_sha TEXT NOT NULL,"
              " cell TEXT NOT NULL, reason TEXT NOT NULL, legs_needed INTEGER, opened_by TEXT NOT NULL,"
              " opened_at TEXT NOT NULL, last_seen_by TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'open',"
              " closed_by TEXT, closed_at TEXT, close_reason TEXT)")
    owed.sync_from_record(c, rr.seed_record(run_id="r-1"))
    assert len(owed.list_open(c)) == 2
    c.close()
