"""Live status: a running run's stored record follows the box's events (suites so far, current step),
its page polls the API until the run ends, and the index of runs counts what each run did not run and
left owed. The pages are checked in headless Chromium against the real HTTP server (no console
message, so no CSP violation) and opened from disk, where they must work without a server."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import shutil
import subprocess
import time
from contextlib import closing

import pytest

import report_records as rr
from orchestrator import db
from orchestrator.box.job import JobSpec
from orchestrator.driver import gate, live, placement
from orchestrator.driver.provenance import archive
from orchestrator.record import BoxResult, Live, Suite
from orchestrator.report import live as live_js
from orchestrator.report.render import html, index_html, render_run
from orchestrator.service import daemon
from orchestrator.service.http_api import CSP, ApiServer, serve_in_thread
from service_support import config_for, make_repo

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")


def suite(name: str, state: str = "GREEN") -> Suite:
    return Suite.from_json({"name": name, "state": state, "tests_passed": 1, "tests_total": 1, "checks_passed": 2,
                            "checks_total": 2, "census_tests": 1, "census_checks": 2, "duration_s": 1.5})


@pytest.fixture
def env(tmp_path):
    repo, sha = make_repo(tmp_path)
    config = config_for(tmp_path, repo)
    conn = daemon.connect(config)
    yield config, repo, conn
    conn.close()


def running(config, repo, conn):
    """A RUNNING run of the repo's head in the ledger, as the driver leaves it when the box starts."""
    arch = archive(str(repo), "main")
    record = gate.new_record(arch, "boxa", db.new_run_id(arch.sha))
    db.insert_queued(conn, record, record.run_id)
    db.mark_running(conn, record, "task-0")
    return arch, record


class Server:
    def __init__(self, backend):
        self.srv = ApiServer(backend, "127.0.0.1", 0)
        self.thread = serve_in_thread(self.srv)

    def get(self, path: str) -> tuple[int, dict, str]:
        conn = http.client.HTTPConnection(*self.srv.server_address[:2], timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read().decode()
        finally:
            conn.close()

    def record(self, run_id: str) -> dict:
        status, _, body = self.get(f"/api/runs/{run_id}")
        assert status == 200, body
        return json.loads(body)

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def served(env):
    config, repo, _ = env
    servers = []

    def start(backend_cls=daemon.Backend) -> Server:
        servers.append(Server(backend_cls(config, str(repo))))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


# ---- the stored record follows the run -------------------------------------------------------------

def test_a_progress_event_during_a_fake_run_updates_the_api_record_while_running(env, served, monkeypatch):
    config, repo, conn = env
    server = served()
    arch = archive(str(repo), "main")
    record = gate.new_record(arch, "boxa", db.new_run_id(arch.sha))
    db.insert_queued(conn, record, record.run_id)
    spec = JobSpec(record.run_id, arch.sha, arch.md5, config.box("boxa"), 60, 60, 0)
    quick, slow = suite("quick"), suite("slow", "RED")
    seen = {}

    def fake_stream(gen, where, resources, schedule_s, tick_s, tick, on_event, stale_s):  # the box's events, without Ray
        on_event({"event": "started", "name": "boxa", "node_id": "n0", "task_id": "t0", "pid": 1})
        on_event({"event": "step", "step": "build", "status": "done", "detail": "a marker"})
        seen["build"] = server.record(record.run_id)
        on_event({"event": "suite", "suite": "quick", "status": "start", "pid": 2})
        on_event({"event": "suite", "suite": "quick", "status": "GREEN", "detail": "1/1 tests",
                  "record": quick.to_json()})
        seen["suite"] = server.record(record.run_id)
        on_event({"event": "leg", "step": "grid leg", "status": "done", "detail": "cell c leg 1"})
        seen["leg"] = server.record(record.run_id)
        return BoxResult(box={"name": "boxa", "node_id": "n0", "backend": "cpu"}, md5_box=arch.md5,
                         suites=[quick, slow])
    monkeypatch.setattr(placement, "check_resources", lambda resources, where: None)
    monkeypatch.setattr(placement.ray, "put", lambda obj: "ref")
    monkeypatch.setattr(placement, "submit", lambda spec, ref, harness_ref, digest, members, task, heartbeat_s, avoid: "gen")
    monkeypatch.setattr(placement, "stream", fake_stream)
    events = []
    placement.place(config, conn, spec, arch, record, events.append)

    build, after_suite, leg = seen["build"], seen["suite"], seen["leg"]
    assert build["state"] == "RUNNING" and build["suites"] == []
    assert (build["live"]["step"], build["live"]["status"]) == ("build", "done")
    assert after_suite["state"] == "RUNNING"
    assert [(s["name"], s["state"], s["tests_passed"]) for s in after_suite["suites"]] == [("quick", "GREEN", 1)]
    assert (after_suite["live"]["step"], after_suite["live"]["status"]) == ("suite quick", "GREEN")
    assert leg["live"]["step"] == "grid leg" and [s["name"] for s in leg["suites"]] == ["quick"]
    assert len(events) == 5  # the caller's progress still sees every event
    assert record.live is None and record.suites == [quick, slow]  # the driver's own record: the box's result

    gate.finish_run(config, conn, record, time.monotonic())
    final = server.record(record.run_id)
    assert final["state"] == "FAILED" and "live" not in final
    assert [s["name"] for s in final["suites"]] == ["quick", "slow"]


def test_a_progress_write_after_the_final_store_does_not_overwrite_it(env):
    config, repo, conn = env
    _, record = running(config, repo, conn)
    assert live.write(conn, record.run_id, Live(step="suite quick", status="GREEN"), suite("quick"))
    record.suites = [suite("quick"), suite("slow")]
    record.state, record.finished_at = "PASSED", db.utc_now()
    db.finish(conn, record)
    stored = conn.execute("SELECT state, record FROM runs WHERE run_id = ?", (record.run_id,)).fetchone()

    assert not live.write(conn, record.run_id, Live(step="late", status="RED"), suite("late", "RED"))
    assert not live.note(conn, record.run_id, {"event": "suite", "suite": "late", "status": "RED",
                                                "record": suite("late", "RED").to_json()})
    assert conn.execute("SELECT state, record FROM runs WHERE run_id = ?", (record.run_id,)).fetchone() == stored
    assert "live" not in json.loads(stored[1])


def test_the_update_itself_is_guarded_by_the_state(env, monkeypatch):
    """Even a write that read the row while it ran stores nothing once the row is final."""
    config, repo, conn = env
    _, record = running(config, repo, conn)
    real_load = db.load

    def final_meanwhile(blob):  # the final state lands between the progress write's read and its update
        conn.execute("UPDATE runs SET state = 'PASSED' WHERE run_id = ?", (record.run_id,))
        return real_load(blob)
    monkeypatch.setattr(db, "load", final_meanwhile)
    assert not live.write(conn, record.run_id, Live(step="late"), suite("late"))
    monkeypatch.setattr(db, "load", real_load)
    assert db.get(conn, record.run_id).suites == [] and db.get(conn, record.run_id).live is None


def test_a_finished_run_keeps_no_current_step_and_a_failed_write_never_raises(env):
    config, repo, conn = env
    _, record = running(config, repo, conn)
    assert live.note(conn, record.run_id, {"event": "step", "step": "lock", "status": "waiting", "detail": "x"})
    assert db.get(conn, record.run_id).live.step == "lock"
    assert not live.note(conn, record.run_id, {"event": "reused", "run_id": "r", "state": "PASSED"})
    conn.execute("UPDATE runs SET heartbeat = heartbeat - 1000 WHERE run_id = ?", (record.run_id,))
    assert db.mark_stale_lost(conn, stale_s=60) == [record.run_id]
    assert "live" not in db.get(conn, record.run_id).to_json()  # LOST: no step is current any more
    closed = db.connect(config.db_path)
    closed.close()
    assert not live.note(closed, record.run_id, {"event": "step", "step": "build", "status": "start"})


# ---- the pages -----------------------------------------------------------------------------------------

def test_a_queued_or_running_page_carries_the_poller_and_a_finished_one_does_not(tmp_path):
    for state in ("QUEUED", "RUNNING"):
        page = html(rr.record(state=state, finished_at=None))
        assert f"<script>{live_js.SCRIPT}</script>" in page  # verbatim: the CSP hash holds
        assert 'id="live"' in page and 'data-api="/api/runs/r-0001"' in page
    for record in (rr.seed_record(), rr.record(state="FAILED"), rr.error_record()):
        page = html(record)
        assert "<script" not in page and 'id="live"' not in page
    on_disk = render_run(rr.seed_record(), tmp_path).read_text()
    assert "<script" not in on_disk


def test_the_csp_allows_the_poller_by_its_hash_and_nothing_else(env, served):
    config, repo, conn = env
    _, record = running(config, repo, conn)
    status, headers, page = served().get(f"/{record.run_id}.html")
    assert status == 200 and headers["Content-Security-Policy"] == CSP
    [script] = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in CSP and "unsafe-inline" not in CSP.split("script-src")[1].split(";")[0]
    assert "connect-src 'self'" in CSP and "default-src 'none'" in CSP


def test_the_index_shows_kind_not_run_and_owed_counts_per_run(tmp_path):
    # A CPU run: CUDA gates and a suite not run; a direction and a magnitude owed.
    seed = rr.seed_record(not_run=[{"what": "CUDA gates", "why": "no GPU"}])
    seed["suites"].append({"name": "packed_gemm", "state": "NOT_RUN", "why": "no GPU"})
    grid_run = rr.record(run_id="r-grid", kind="grid", created_at="2026-11-30T08:00:00Z")
    now = rr.record(run_id="r-now", state="RUNNING", finished_at=None, created_at="2026-11-30T09:00:00Z")
    ledger = [{"id": 1, "opened_by": "r-seed", "last_seen_by": "r-seed"},
              {"id": 2, "opened_by": "r-0", "last_seen_by": "r-seed"},
              {"id": 3, "opened_by": "r-other", "last_seen_by": "r-other"}]
    page = index_html([seed, grid_run, now], tmp_path, owed=ledger)
    assert "<th>kind</th>" in page and "<th>not run</th>" in page and "<th>owed</th>" in page
    rows = {re.search(r"(r-[a-z]+) <span", tr).group(1): tr for tr in page.split("<tr>")[2:]}
    cells = {run: re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for run, row in rows.items()}
    assert cells["r-seed"][2] == "gate"
    assert cells["r-seed"][5] == "2" and 'title="CUDA gates; suite packed_gemm"' in rows["r-seed"]
    assert cells["r-seed"][6] == '2 <span class="muted">(2 open)</span>'
    assert cells["r-grid"][2] == "grid"
    assert cells["r-now"][5:7] == ["—", "—"]  # a running run has no counts yet
    assert 'href="r-now.html"' not in page  # on disk: no page yet for a running run
    assert 'href="r-now.html"' in index_html([now], tmp_path, owed=[], served=True)  # served: its live page


# ---- in a real browser ---------------------------------------------------------------------------------

def chromium(tmp_path, url: str, budget_ms: int = 20000) -> tuple[str, list[str]]:
    """The DOM after `budget_ms` of virtual time, and every console message (CSP violations included)."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
                          f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True)
    return run.stdout, CONSOLE.findall(run.stderr)


def text_of(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:b|span|tbody|p)>', dom, re.S)
    return re.sub(r"<[^>]+>", " ", m.group(1)) if m else ""


@needs_chromium
def test_a_served_running_page_shows_the_suites_finished_after_it_loaded(env, served, tmp_path):
    config, repo, conn = env
    _, record = running(config, repo, conn)

    class ChangesAfterServing(daemon.Backend):  # the record changes once the page is in the browser
        def report_html(self, run_id):
            page = super().report_html(run_id)
            with closing(daemon.connect(self.config)) as c:
                live.write(c, run_id, Live(step="suite slow", status="running", detail="pid 7"), suite("quick"))
            return page
    server = served(ChangesAfterServing)
    dom, console = chromium(tmp_path, f"{server.srv.url}/{record.run_id}.html")
    assert console == [], "console messages (a script error or a CSP violation)"
    suites = " ".join(text_of(dom, "live-suites").split())
    assert suites.startswith("quick GREEN 1/1 2/2 1.5 s"), dom
    assert text_of(dom, "live-step") == "suite slow: running" and text_of(dom, "live-detail") == "pid 7"
    assert text_of(dom, "live-state") == "RUNNING" and 'id="live"' in dom


@needs_chromium
def test_a_served_page_stops_polling_and_shows_the_final_report_when_the_run_ends(env, served, tmp_path):
    config, repo, conn = env
    _, record = running(config, repo, conn)
    calls = []

    class EndsAfterFirstPoll(daemon.Backend):
        def run(self, run_id):
            calls.append(run_id)
            answer = super().run(run_id)
            if len(calls) == 1:
                with closing(daemon.connect(self.config)) as c:
                    rec = db.get(c, run_id)
                    rec.suites, rec.state, rec.finished_at = [suite("quick")], "PASSED", db.utc_now()
                    db.finish(c, rec)
            return answer
    server = served(EndsAfterFirstPoll)
    dom, console = chromium(tmp_path, f"{server.srv.url}/{record.run_id}.html")
    assert console == []
    assert 'id="live"' not in dom and "<script" not in dom  # the final report, reloaded once
    assert text_of(dom, "live-state") == "PASSED" and len(calls) == 2  # polled until final, then stopped


@needs_chromium
def test_a_running_page_opened_from_disk_works_without_a_server(tmp_path):
    page = render_run(rr.record(state="RUNNING", finished_at=None), tmp_path / "reports")
    dom, console = chromium(tmp_path, page.as_uri())
    assert console == []
    assert "live updates need the page served" in text_of(dom, "live-note")
