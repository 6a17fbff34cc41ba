"""Pools of boxes (issue 53): config, queue, schedule and API fields, what a job asks Ray for, and the
requeue of a pool job whose box died (no Ray here but in the one-job-per-box test)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import ray

from orchestrator import db
from orchestrator.config import BoxConfig, ConfigError, parse_config
from orchestrator.driver import placement
from orchestrator.service import queue as q
from orchestrator.service import run as service_run
from orchestrator.service.daemon import Service
from orchestrator.service.http_api import BadRequest, parse_gate_request
from orchestrator.service.schedule import ScheduleError, parse_schedules
from service_support import config_for, make_repo


def fleet(root) -> list[dict]:
    return [{"name": n, "lock_path": str(root / f"{n}.lock"), "pool": p}
            for n, p in (("a1", "h100"), ("a2", "h100"), ("b1", "h200"), ("solo", None))]


@pytest.fixture
def env(tmp_path):
    repo, sha = make_repo(tmp_path)
    config = config_for(tmp_path, repo, boxes=fleet(tmp_path))
    conn = db.connect(config.db_path)
    q.ensure_schema(conn)
    yield config, repo, sha, conn
    conn.close()


def test_config_pools_and_their_errors(tmp_path):
    config = parse_config({"boxes": fleet(tmp_path), "requeue": 2}, "f.yaml", tmp_path)
    assert [b.name for b in config.pool("h100")] == ["a1", "a2"] and config.requeue == 2
    assert config.box("solo").pool is None
    with pytest.raises(ConfigError, match=r"unknown pool 'a100': f.yaml configures pools: h100, h200"):
        config.pool("a100")
    with pytest.raises(ConfigError, match=r"boxes\[1\].gpus: expected 0, as box 'a1' of pool 'h100' has, found 1"):
        parse_config({"boxes": [{"name": "a1", "pool": "h100"}, {"name": "a2", "pool": "h100", "gpus": 1}]},
                     "f.yaml", tmp_path)
    with pytest.raises(ConfigError, match=r"boxes\[0\].pool: expected a non-empty name without spaces"):
        parse_config({"boxes": [{"name": "a1", "pool": "h:100"}]}, "f.yaml", tmp_path)
    with pytest.raises(ConfigError, match=r"requeue: expected a whole number >= 0, found -1"):
        parse_config({"boxes": fleet(tmp_path), "requeue": -1}, "f.yaml", tmp_path)


def test_a_pool_does_not_change_a_box_digest(tmp_path):
    """The identical-gate key of a named box stays what it was before pools existed."""
    plain = parse_config({"boxes": [{"name": "a1", "lock_path": "/l"}]}, "f.yaml", tmp_path)
    pooled = parse_config({"boxes": [{"name": "a1", "lock_path": "/l", "pool": "h100"}]}, "f.yaml", tmp_path)
    assert plain.digest(plain.box("a1")) == pooled.digest(pooled.box("a1"))
    assert pooled.pool_digest("h100") != pooled.digest(pooled.box("a1"))


def test_what_a_job_asks_ray_for(tmp_path):
    config = parse_config({"boxes": fleet(tmp_path)}, "f.yaml", tmp_path)
    assert placement.job_resources(config.box("a1"), None) == {"box:a1": 1, "pool:h100": 1}
    assert placement.job_resources(config.box("solo"), None) == {"box:solo": 1}
    assert placement.job_resources(config.box("a1"), "h100") == {"pool:h100": 1}
    assert placement.node_labels(config.box("b1")) == {"box": "b1", "pool": "h200"}


def test_a_pool_job_takes_the_settings_of_the_box_it_landed_on():
    members = {"a1": {"name": "a1", "lock_path": "/a1"}, "a2": {"name": "a2", "lock_path": "/a2"}}
    spec, why = placement.box_spec({"run_id": "r", "box": {"name": "a1"}}, "a2", members)
    assert why is None and spec["box"]["lock_path"] == "/a2"
    _, why = placement.box_spec({"run_id": "r", "box": {"name": "a1"}}, "b1", members)
    assert why == "placed on 'b1', which is not a configured box of the pool (a1, a2)"


def test_enqueue_on_a_pool_and_claims_oldest_first(env):
    config, repo, sha, conn = env
    named, _ = q.enqueue(conn, config, repo, "main", "a2", None, False, "api")
    pooled, queued = q.enqueue(conn, config, repo, "main", None, None, False, "api", pool="h100")
    assert queued and pooled.box.name == "pool:h100" and pooled.run_id != named.run_id  # another gate: any box
    again, queued = q.enqueue(conn, config, repo, sha, None, None, True, "api", pool="h100")
    assert (again.run_id, queued) == (pooled.run_id, False)  # identical pool gate pending: not twice
    assert q.claim_next(conn, "b1", "h200") is None  # another pool's worker takes none of them
    first = q.claim_next(conn, "a1", "h100")  # a1's worker: the oldest of a1's and h100's jobs
    assert (first.run_id, first.pool, first.attempt) == (pooled.run_id, "h100", 1)
    assert q.claim_next(conn, "a2", "h100").run_id == named.run_id


@pytest.mark.parametrize("box, pool, message", [
    ("a1", "h100", "give a box or a pool, not both"),
    (None, "a100", "unknown pool 'a100'.*pools: h100, h200"),
])
def test_enqueue_refuses_a_bad_target(env, box, pool, message):
    config, repo, _, conn = env
    with pytest.raises(ConfigError, match=message):
        q.enqueue(conn, config, repo, "main", box, None, False, "api", pool=pool)
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


@pytest.mark.parametrize("command, extra", [("gate", ["--head", "main"]),
                                            ("compare", ["--base", "main", "--head", "main"])])
def test_the_cli_names_an_unknown_pool(env, tmp_path, command, extra):
    from typer.testing import CliRunner

    from orchestrator import cli
    if not cli.app.registered_commands:
        cli._register_all()
    config, repo, _, _ = env
    out = CliRunner().invoke(cli.app, [command, *extra, "--repo", str(repo), "--config", config.source,
                                       "--pool", "a100", "--json"])
    assert out.exit_code == 2, out.output
    assert "unknown pool 'a100'" in out.output and "pools: h100, h200" in out.output


def test_the_api_and_schedules_take_a_pool():
    assert parse_gate_request(b'{"head": "main", "pool": "h100"}')["pool"] == "h100"
    with pytest.raises(BadRequest, match="fields 'box' and 'pool': give one"):
        parse_gate_request(b'{"head": "main", "pool": "h100", "box": "a1"}')
    base = {"id": "n", "cron": "0 3 * * *", "rev": "main", "grid": "smoke"}
    (s,) = parse_schedules([{**base, "pool": "h100"}], "f.yaml", ("a1",), ("h100",))
    assert (s.pool, s.box) == ("h100", "pool:h100")
    with pytest.raises(ScheduleError, match=r"schedules\[0\].pool: unknown pool 'a100' \(configured: h100\)"):
        parse_schedules([{**base, "pool": "a100"}], "f.yaml", ("a1",), ("h100",))
    with pytest.raises(ScheduleError, match="box 'a1' and pool 'h100': give one"):
        parse_schedules([{**base, "pool": "h100", "box": "a1"}], "f.yaml", ("a1",), ("h100",))


def test_a_pool_schedule_reads_the_ledger_of_every_box_of_its_pool(env):
    """`last-green` and the binding-grid check of a pool schedule look at the runs of all its boxes."""
    config, repo, sha, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", None, None, False, "api", pool="h100")
    rec.box.name = "a2"
    db.mark_running(conn, rec, "t")
    rec.state, rec.finished_at = "PASSED", db.utc_now()
    db.finish(conn, rec)
    svc = Service(config, str(repo))
    assert svc._boxes_of("pool:h100") == ("a1", "a2") and svc._boxes_of("a1") == ("a1",)
    assert db.last_green(conn, svc._boxes_of("pool:h100")) == sha and db.last_green(conn, "a1") is None


def lose_the_box(monkeypatch) -> list:
    """`place` as when the box dies under the job: it started on a1, then came back LOST. Returns the
    boxes each call was told to avoid."""
    avoided = []

    def place(config, conn, spec, arch, record, progress, on_started, stop, harness=None, pool=None, task=None,
              avoid=()):
        avoided.append(avoid)
        record.box.name = "a1"
        db.mark_running(conn, record, "t")
        on_started()
        placement.note_placement_failure(record, placement.JobLost("the box died under the job: NodeDiedError"))
    monkeypatch.setattr(service_run, "place", place)
    return avoided


def test_a_lost_pool_job_is_requeued_once_as_a_run_of_its_own(env, monkeypatch):
    config, repo, sha, conn = env
    avoided = lose_the_box(monkeypatch)
    first, _ = q.enqueue(conn, config, repo, "main", None, None, False, "api", pool="h100")
    handle = service_run.RayHandle(None)
    monkeypatch.setattr(handle, "ensure", lambda box: None)
    lost = service_run.run_queued(config, conn, q.claim_next(conn, "a1", "h100"), handle, threading.Event())
    retry = q.claim_next(conn, "a2", "h100")
    assert lost.state == "LOST" and lost.box.name == "a1"
    assert f"requeued on pool h100 as run {retry.run_id} (attempt 2)" in lost.error
    assert (retry.attempt, retry.retry_of, retry.pool) == (2, first.run_id, "h100")
    again = service_run.run_queued(config, conn, retry, handle, threading.Event())
    assert again.state == "LOST" and "requeued" not in again.error  # requeue: 1 spent
    assert avoided == [(), ("a1",)]  # the retry is placed off the box it was lost on
    assert q.claim_next(conn, "a1", "h100") is None
    assert q.orphans(conn) == set()  # each attempt settled by its worker: a restart retries neither again
    rows = conn.execute("SELECT run_id, box, state FROM runs ORDER BY created_at").fetchall()
    assert sorted(rows) == sorted([(first.run_id, "a1", "LOST"), (retry.run_id, "a1", "LOST")])


def test_a_lost_named_box_job_is_not_requeued(env, monkeypatch):
    config, repo, _, conn = env
    lose_the_box(monkeypatch)
    q.enqueue(conn, config, repo, "main", "a1", None, False, "api")
    handle = service_run.RayHandle(None)
    monkeypatch.setattr(handle, "ensure", lambda box: None)
    lost = service_run.run_queued(config, conn, q.claim_next(conn, "a1", "h100"), handle, threading.Event())
    assert lost.state == "LOST" and "requeued" not in lost.error
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


@ray.remote(num_cpus=0)
def hold(s: float) -> tuple[float, float]:
    t = time.time()
    time.sleep(s)
    return t, time.time()


def test_a_named_job_waits_for_a_pool_job_on_its_box(tmp_path):
    """One job per box: a pool job placed on a1 takes a1's pool slot, so a job named for a1 (which
    asks for a1's slot and its pool slot) starts only after it; `_busy` says queueing meanwhile."""
    config = parse_config({"boxes": fleet(tmp_path)}, "f.yaml", tmp_path)
    a1 = config.box("a1")
    ray.init(num_cpus=2, resources=placement.node_resources(a1), include_dashboard=False, log_to_driver=False)
    try:
        first = hold.options(resources=placement.job_resources(a1, "h100")).remote(3.0)
        while ray.available_resources().get("pool:h100", 0) >= 1:
            time.sleep(0.05)
        named = placement.job_resources(a1, None)
        second = hold.options(resources=named).remote(0.1)
        assert placement._busy(second, "box 'a1'", named, waited=0.0, schedule_s=60.0)
        (_, end1), (start2, _) = ray.get([first, second])
        assert start2 >= end1
        with pytest.raises(placement.PlacementError, match=r"pool 'h200' is not in the Ray cluster .*pools: h100"):
            placement.check_resources(placement.job_resources(a1, "h200"), "pool 'h200'")
    finally:
        ray.shutdown()


class Box:
    """A box's task as `stream` sees it, on a fake clock: `script` is (second, event) in order; the
    fake `ray.wait` says ready when the next event is due within its timeout, else lets the time pass."""

    def __init__(self, script: list[tuple[float, dict]]):
        self.script, self.now, self.cancelled = list(script), 0.0, []

    def monotonic(self) -> float:
        return self.now

    def wait(self, refs, timeout):
        assert self.now < 100, "the driver is still waiting on a box silent for 100 s"
        if self.script and self.script[0][0] <= self.now + timeout:
            self.now = max(self.now, self.script[0][0])
            return refs, []
        self.now += timeout
        return [], refs

    def __next__(self) -> dict:
        return self.script.pop(0)[1]


def stream_on(box: Box, monkeypatch, seen: list) -> placement.BoxResult:
    monkeypatch.setattr(placement, "time", box)  # the module's clock only: `stream` reads time.monotonic()
    monkeypatch.setattr(placement.ray, "wait", box.wait)
    monkeypatch.setattr(placement.ray, "get", lambda ev: ev)  # `next(gen)` is the event itself here
    monkeypatch.setattr(placement.ray, "cancel", lambda gen, force=False: box.cancelled.append(force))
    return placement.stream(box, "pool 'h100'", {"pool:h100": 1}, 60.0, 0.5, lambda: None, seen.append, stale_s=3.0)


STARTED = {"event": "started", "name": "b03", "node_id": "n3", "task_id": "t", "pid": 1}


def test_a_box_silent_past_stale_s_is_lost_naming_the_box(monkeypatch):
    box, seen = Box([(0.0, STARTED), (1.0, {"event": "step", "step": "build", "status": "done"})]), []
    with pytest.raises(placement.JobLost, match=r"^box 'b03' stopped answering: no event for 3 s$"):
        stream_on(box, monkeypatch, seen)
    assert box.cancelled == [True]  # the wedged task is cancelled (forced), not waited on
    assert 4.0 < box.now <= 4.5  # declared one tick after the silence passed stale_s, not before
    assert [e["event"] for e in seen] == ["started", "step"]


def test_alive_events_keep_a_quiet_box_running_and_are_no_progress(monkeypatch):
    alive = [(float(s), {"event": "alive"}) for s in range(2, 20, 2)]
    result = {"event": "result", "parts": {"box": {"name": "b03"}}}
    box, seen = Box([(0.0, STARTED), *alive, (21.0, result)]), []
    parts = stream_on(box, monkeypatch, seen)
    assert parts.box["name"] == "b03" and box.cancelled == []
    assert seen == [STARTED]  # `alive` reaches neither the record's steps, the row's live step, nor the display


def test_a_retry_asks_ray_for_any_box_but_the_lost_one():
    """`avoid` becomes Ray's label selector on the `box` label every box's node carries."""
    got = {}

    class Task:
        def options(self, **opts):
            got.update(opts)
            return self

        def remote(self, *args):
            return "gen"
    spec = SimpleNamespace(box=BoxConfig("a1", lock_path="/l", pool="h100"), run_id="r", kind="gate")
    members = (spec.box, BoxConfig("a2", lock_path="/l2", pool="h100"))
    with patch.object(placement, "spec_json", lambda spec: {"run_id": spec.run_id}):
        placement.submit(spec, ["ref"], "h", "d", members, Task(), avoid=("a1",))
        assert got["label_selector"] == {"box": "!in(a1)"} and got["resources"] == {"pool:h100": 1}
        got.clear()
        placement.submit(spec, ["ref"], "h", "d", members, Task())
        assert "label_selector" not in got
