"""The owed ledger: opened by a run's owed claims, settled by a later binding run, closed by a person."""
from __future__ import annotations

import pytest

import report_records as rr
from orchestrator import db, owed
from orchestrator.record import Record

SHA = rr.BASE["head"]["sha"]
OTHER = "c0ffee" + SHA[6:]
H200 = {"name": "h200-a", "node_id": "n1", "gpu": "NVIDIA H200", "backend": "cuda"}
CPU = {"name": "laptop", "node_id": "n2", "gpu": None, "backend": "cpu"}


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


def test_a_head_prefix_is_literal_not_a_like_pattern(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-1"))
    assert len(owed.list_open(conn, SHA[:6])) == 2
    for pattern in ("_", SHA[:5] + "_", "%", "_" * 40):
        assert owed.list_open(conn, pattern) == [], pattern  # `_` matched every head


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
    rec = Record.from_json(rr.seed_record(run_id="r-tx", created_at=db.utc_now()))
    db.insert_queued(conn, rec, "key")
    rec.state, rec.finished_at = "PASSED", db.utc_now()
    db.finish(conn, rec, sync=owed.sync_from_record)
    assert db.state_of(conn, "r-tx") == "PASSED" and len(owed.list_open(conn)) == 2

    rec2 = Record.from_json(rr.seed_record(run_id="r-tx2", created_at=db.utc_now(), head={"rev": "y", "sha": OTHER}))
    db.insert_queued(conn, rec2, "key2")
    rec2.state, rec2.finished_at = "PASSED", db.utc_now()
    rec2.grid = {"cells": [{"cell": {"b": 1}, "verdict": 3}]}
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


def test_case1_a_cpu_run_does_not_settle_what_a_cuda_run_left_owed(conn):
    """Issue 25 case 1: the seed's legs on CUDA open direction and magnitude; a binding CPU run of the
    same head and cell settled both. Now it opens its own rows and the CUDA ones stay open."""
    owed.sync_from_record(conn, rr.seed_record(run_id="r-cuda", box=H200))
    out = owed.sync_from_record(conn, rr.record(run_id="r-cpu", box=CPU, grid=rr.grid(rr.binding_verdict())))
    assert out["settled"] == [] and out["opened"] == []
    items = owed.list_open(conn, SHA)
    assert {(i["what"], i["backend"], i["gpu"]) for i in items} == {("magnitude", "cuda", "NVIDIA H200"),
                                                                   ("direction", "cuda", "NVIDIA H200")}


def test_case1_another_gpu_model_does_not_settle_either_the_same_one_does(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-h200", box=H200))
    rtx = {**H200, "name": "rtx", "gpu": "NVIDIA GeForce RTX 4090"}
    assert owed.sync_from_record(conn, rr.record(run_id="r-rtx", box=rtx,
                                                 grid=rr.grid(rr.binding_verdict())))["settled"] == []
    assert len(owed.list_open(conn, SHA)) == 2
    out = owed.sync_from_record(conn, rr.record(run_id="r-h200b", box={**H200, "name": "h200-b"},
                                                grid=rr.grid(rr.binding_verdict())))
    assert len(out["settled"]) == 2 and owed.list_open(conn, SHA) == []
    reason = conn.execute("SELECT close_reason FROM owed WHERE what='magnitude'").fetchone()[0]
    assert "in run r-h200b on cuda NVIDIA H200" in reason


def test_case1_the_same_cell_owed_on_two_backends_is_two_rows(conn):
    owed.sync_from_record(conn, rr.seed_record(run_id="r-cpu", box=CPU))
    owed.sync_from_record(conn, rr.seed_record(run_id="r-cuda", box=H200))
    assert sorted((i["what"], i["backend"]) for i in owed.list_open(conn, SHA)) == [
        ("direction", "cpu"), ("direction", "cuda"), ("magnitude", "cpu"), ("magnitude", "cuda")]


def test_a_cpu_grid_on_a_gpu_box_is_keyed_by_the_backend_its_legs_ran_on(conn):
    grid = rr.grid(rr.seed_verdict())
    for arm in grid["cells"][0]["arms"].values():
        arm["options"] = {"backend": "cpu", "lm_head": "packed"}
    owed.sync_from_record(conn, rr.record(run_id="r-1", box=H200, grid=grid))
    assert {(i["backend"], i["gpu"]) for i in owed.list_open(conn)} == {("cpu", "none")}


def test_gates_a_box_could_not_run_are_owed_until_a_box_of_their_backend_runs_them(conn):
    cpu_run = rr.record(run_id="r-cpu", box=CPU)
    cpu_run["suites"].append({"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "state": "NOT_RUN",
                              "why": "no CUDA gate was run: this box has no GPU"})
    out = owed.sync_from_record(conn, cpu_run)
    [item] = owed.list_open(conn, SHA)
    assert out["opened"] == [item["id"]]
    assert (item["what"], item["cell"], item["backend"], item["gpu"]) == ("gate", "suite packed_gemm", "cuda", "any")
    assert item["reason"].startswith(f"CUDA gates not run on {SHA[:12]}: packed_gemm needs cuda")
    assert owed.sync_from_record(conn, {**cpu_run, "run_id": "r-cpu2"})["settled"] == []
    cuda_run = rr.record(run_id="r-cuda", box=H200)
    cuda_run["suites"].append({"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "state": "GREEN"})
    other_head = {**cuda_run, "run_id": "r-other", "head": {"rev": "x", "sha": OTHER}}
    assert owed.sync_from_record(conn, other_head)["settled"] == []
    assert owed.sync_from_record(conn, cuda_run)["settled"] == [item["id"]]
    assert owed.list_open(conn) == []


def test_rows_of_a_ledger_without_backends_migrate_from_their_runs(tmp_path):
    c = db.connect(tmp_path / "old.db")
    c.execute("CREATE TABLE owed (id INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT NOT NULL, head_sha TEXT NOT NULL,"
              " cell TEXT NOT NULL, label TEXT, reason TEXT NOT NULL, legs_needed INTEGER, opened_by TEXT NOT NULL,"
              " opened_at TEXT NOT NULL, last_seen_by TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'open',"
              " closed_by TEXT, closed_at TEXT, close_reason TEXT)")
    c.execute("CREATE UNIQUE INDEX owed_one_open ON owed (head_sha, cell, what) WHERE state = 'open'")
    cuda_run = Record.from_json(rr.seed_record(run_id="r-cuda", box=H200, created_at=db.utc_now()))
    db.insert_queued(c, cuda_run, "k")
    cell = "batch=1 gen_len=32 preset=27b prompt_len=128"
    for what, opener in (("magnitude", "r-cuda"), ("direction", "r-gone")):
        c.execute("INSERT INTO owed (what, head_sha, cell, label, reason, opened_by, opened_at, last_seen_by)"
                  " VALUES (?, ?, ?, ?, 'old', ?, 'then', ?)", (what, SHA, cell, cell, opener, opener))
    items = {i["what"]: i for i in owed.list_open(c)}
    assert (items["magnitude"]["backend"], items["magnitude"]["gpu"]) == ("cuda", "NVIDIA H200")
    assert (items["direction"]["backend"], items["direction"]["gpu"]) == ("unknown", "unknown")
    out = owed.sync_from_record(c, rr.record(run_id="r-cpu", box=CPU, grid=rr.grid(rr.binding_verdict())))
    assert out["settled"] == [], "a migrated CUDA row is not settled by a CPU run, an unknown one by none"
    owed.sync_from_record(c, rr.seed_record(run_id="r-cpu2", box=CPU))  # the old one-row-per-cell index is gone
    assert len(owed.list_open(c)) == 4
    c.close()


@pytest.mark.parametrize("state", ["ERROR", "LOST"])
def test_a_run_that_did_not_end_settles_no_gate_it_ran(conn, state):
    cpu_run = rr.record(run_id="r-cpu", box=CPU)
    cpu_run["suites"].append({"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "state": "NOT_RUN"})
    owed.sync_from_record(conn, cpu_run)
    cuda_run = rr.record(run_id="r-cuda", box=H200, state=state)
    cuda_run["suites"].append({"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "state": "GREEN"})
    assert owed.sync_from_record(conn, cuda_run)["settled"] == []
    assert [i["cell"] for i in owed.list_open(conn, SHA)] == ["suite packed_gemm"]
    interrupted = {**cuda_run, "run_id": "r-int", "state": "PASSED",
                   "interrupted": {"at": "2026-12-01T00:00:00Z", "why": "the service stopped (SIGTERM)"}}
    assert owed.sync_from_record(conn, interrupted)["settled"] == []
