"""Signed run records: the MAC itself, the record key file, and the identical-gate shortcut refusing a
row that a head rewrote in the SQLite file (`orchestrator/signing.py`, `db.reusable`)."""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading

import pytest

from orchestrator import db, signing
from orchestrator.record import Record
from orchestrator.service import queue as q
from service_support import config_for, make_repo

KEY = bytes(range(32))
RECORD = {"run_id": "r1", "state": "FAILED", "suites": [{"name": "unit", "state": "RED"}]}

# The ledger as regate wrote it before records were signed: no `mac` column.
OLD_SCHEMA = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, idem_key TEXT NOT NULL, sha TEXT NOT NULL, box TEXT NOT NULL,
  state TEXT NOT NULL, task_id TEXT, heartbeat REAL, created_at TEXT NOT NULL, finished_at TEXT,
  record TEXT NOT NULL);
CREATE INDEX runs_idem ON runs (idem_key, state);
"""


# ---- sign / verify ------------------------------------------------------------------------------

def test_a_signature_verifies_whatever_the_key_order():
    mac = signing.sign(RECORD, KEY)
    assert mac.startswith("hmac-sha256:") and len(mac) == len("hmac-sha256:") + 64
    assert signing.verify(dict(reversed(list(RECORD.items()))), mac, KEY)


@pytest.mark.parametrize("record, key", [
    ({**RECORD, "state": "PASSED"}, KEY),  # the record changed
    ({**RECORD, "run_id": "r2"}, KEY),
    ({**RECORD, "suites": [{"name": "unit", "state": "GREEN"}]}, KEY),
    (RECORD, bytes(32)),  # another key
])
def test_a_changed_record_or_another_key_fails(record, key):
    assert not signing.verify(record, signing.sign(RECORD, KEY), key)


@pytest.mark.parametrize("mac", [None, "", "deadbeef", "hmac-sha1:" + "0" * 40, "hmac-sha256:" + "0" * 64,
                                 "hmac-sha256:zz", "hmac-sha256:\u00e9", 42])
def test_a_mac_of_the_wrong_form_fails(mac):
    assert not signing.verify(RECORD, mac, KEY)


# ---- the key file -------------------------------------------------------------------------------

def test_the_key_is_made_private_at_first_use_and_read_after(tmp_path):
    path = signing.key_path(tmp_path / "state" / "regate.db")
    assert path == tmp_path / "state" / "record-key"
    key = signing.ensure_key(path)
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert signing.ensure_key(path) == key  # read, not replaced
    assert sorted(p.name for p in path.parent.iterdir()) == ["record-key"]  # no temp file left


def test_processes_racing_at_first_use_end_with_one_whole_key(tmp_path):
    path, keys, start = tmp_path / "record-key", [], threading.Barrier(8)

    def first_use():
        start.wait()
        keys.append(signing.ensure_key(path))
    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and keys[0] == signing.read_key(path)
    assert [p.name for p in tmp_path.iterdir()] == ["record-key"]


def _key_file(text: str, mode: int):
    """A key file with `text` and `mode`, written where the test puts it."""
    def write(path):
        path.write_text(text)
        os.chmod(path, mode)
    return write


def _directory(path):
    path.mkdir()


@pytest.mark.parametrize("make, expected", [
    (_key_file("ab" * 32 + "\n", 0o640), "mode 0640 lets others read it"),
    (_key_file("ab" * 32 + "\n", 0o620), "mode 0620"),
    (_key_file("", 0o600), "expected one line"),
    (_key_file("ab" * 16 + "\n", 0o600), "expected 64 hex digits"),
    (_key_file("zz" * 32 + "\n", 0o600), "expected 64 hex digits"),
    (_directory, "not a regular file"),
])
def test_an_unusable_key_file_is_refused_naming_it(tmp_path, make, expected):
    path = tmp_path / "record-key"
    make(path)
    with pytest.raises(signing.RecordKeyError, match=expected) as e:
        signing.ensure_key(path)
    assert str(e.value).startswith(f"record key file {path}: ")
    assert "token" not in str(e.value)


# ---- the identical-gate shortcut ------------------------------------------------------------------

def _finished(conn, state="FAILED", run_id="r1", idem_key="key1") -> Record:
    rec = Record.from_json({"run_id": run_id, "state": "QUEUED", "head": {"sha": "a" * 40}, "box": {"name": "b"},
                            "created_at": db.utc_now()})
    db.insert_queued(conn, rec, idem_key)
    db.mark_running(conn, rec, "task-1")
    rec.state, rec.finished_at = state, db.utc_now()
    db.finish(conn, rec)
    return rec


def _as_a_head(path, sql, *args):
    """Write the ledger the way code under gate could: the sqlite3 module on the file, no regate."""
    with sqlite3.connect(path) as raw:
        raw.execute(sql, args)
    raw.close()


def _passed_json(path, run_id="r1") -> str:
    with sqlite3.connect(path) as raw:
        blob = raw.execute("SELECT record FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]
    raw.close()
    return json.dumps({**json.loads(blob), "state": "PASSED", "shown_state": "PASSED"})


@pytest.mark.parametrize("state", ["PASSED", "FAILED"])
def test_an_untouched_record_is_reused(tmp_path, state):
    conn = db.connect(tmp_path / "r.db")
    _finished(conn, state)
    reuse = db.reusable(conn, "key1")
    assert reuse.record.state == state and reuse.refused is None
    assert db.reusable(conn, "key1").record.run_id == "r1"
    assert (tmp_path / "record-key").is_file()  # each ledger its own key, beside it


def test_unfinished_rows_are_stored_unsigned_and_final_ones_signed(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    rec = Record.from_json({"run_id": "r1", "state": "QUEUED", "head": {"sha": "a" * 40}, "box": {"name": "b"},
                            "created_at": db.utc_now()})
    db.insert_queued(conn, rec, "k")
    db.mark_running(conn, rec, "t")
    assert conn.execute("SELECT mac FROM runs").fetchone()[0] is None
    rec.state = "ERROR"
    db.finish(conn, rec)
    assert conn.execute("SELECT mac FROM runs").fetchone()[0].startswith("hmac-sha256:")


FORGERIES = {
    "state column": ("UPDATE runs SET state='PASSED' WHERE run_id='r1'",),
    "json": ("UPDATE runs SET record=? WHERE run_id='r1'", "passed_json"),
    "column and json": ("UPDATE runs SET state='PASSED', record=? WHERE run_id='r1'", "passed_json"),
    "column, json, mac dropped": ("UPDATE runs SET state='PASSED', record=?, mac=NULL WHERE run_id='r1'",
                                  "passed_json"),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_failed_run_rewritten_to_passed_by_the_head_is_refused(tmp_path, forgery):
    path = tmp_path / "r.db"
    conn = db.connect(path)
    _finished(conn, "FAILED")
    sql, *args = FORGERIES[forgery]
    _as_a_head(path, sql, *[_passed_json(path) for _ in args])
    assert db.reusable(conn, "key1").record is None
    reuse = db.reusable(conn, "key1")
    assert reuse.record is None and reuse.refused is not None
    assert "run r1 (" in reuse.refused.why and "does not verify" in reuse.refused.why
    assert str(tmp_path / "record-key") in reuse.refused.why


def test_a_genuine_record_moved_under_another_gate_is_refused(tmp_path):
    path = tmp_path / "r.db"
    conn = db.connect(path)
    _finished(conn, "PASSED", "r1", "other-gate")
    _finished(conn, "FAILED", "r2", "key1")
    _as_a_head(path, "UPDATE runs SET idem_key='key1' WHERE run_id='r1'")  # replay a genuine pass
    _as_a_head(path, "DELETE FROM runs WHERE run_id='r2'")
    reuse = db.reusable(conn, "key1")
    assert reuse.record is None and "signature does not match" in reuse.refused.why


def test_a_record_signed_under_another_key_is_refused(tmp_path):
    path = tmp_path / "r.db"
    conn = db.connect(path)
    _finished(conn, "PASSED")
    (tmp_path / "record-key").write_text("cd" * 32 + "\n")  # the key rotated (or the row came from elsewhere)
    reuse = db.reusable(conn, "key1")
    assert reuse.record is None and "signed under another key" in reuse.refused.why


def test_an_older_ledger_gains_the_column_and_its_rows_are_not_reused(tmp_path):
    path = tmp_path / "r.db"
    with sqlite3.connect(path) as old:
        old.executescript(OLD_SCHEMA)
        blob = json.dumps({"run_id": "r0", "state": "PASSED", "head": {"sha": "a" * 40}, "box": {"name": "b"}})
        old.execute("INSERT INTO runs (run_id, idem_key, sha, box, state, created_at, record)"
                    " VALUES ('r0', 'key1', ?, 'b', 'PASSED', ?, ?)", ("a" * 40, db.utc_now(), blob))
    old.close()
    conn = db.connect(path)
    assert "mac" in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    db.connect(path).close()  # a second connect finds it migrated
    reuse = db.reusable(conn, "key1")
    assert reuse.record is None and "no signature" in reuse.refused.why
    assert db.get(conn, "r0").state == "PASSED"  # still listed and shown, only not reused
    _finished(conn, "FAILED", "r1", "key1")  # a new run of that gate is signed and reused
    assert db.reusable(conn, "key1").record.run_id == "r1"


def test_a_bad_key_file_stops_the_lookup_naming_it(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    (tmp_path / "record-key").write_text("")
    with pytest.raises(signing.RecordKeyError, match="record-key"):
        db.reusable(conn, "key1")


def test_the_service_queues_a_forged_gate_again_and_its_record_says_why(tmp_path):
    repo, _ = make_repo(tmp_path)
    config = config_for(tmp_path, repo)
    conn = db.connect(config.db_path)
    q.ensure_schema(conn)
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    done = db.get(conn, rec.run_id)
    done.state, done.finished_at = "FAILED", db.utc_now()
    db.finish(conn, done)
    _as_a_head(config.db_path, "UPDATE runs SET state='PASSED', record=? WHERE run_id=?",
               _passed_json(config.db_path, rec.run_id), rec.run_id)
    again, queued = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    assert queued and again.run_id != rec.run_id
    (note,) = db.get(conn, again.run_id).not_run
    assert note.what == "reuse of an identical run" and f"run {rec.run_id} (PASSED)" in note.why
    conn.close()
