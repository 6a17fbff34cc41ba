"""The HTTP front against a real server on loopback (ephemeral port), with a fake backend."""
from __future__ import annotations

import http.client
import json

import pytest

from orchestrator.service.http_api import MAX_BODY, ApiServer, BadRequest, NotFound, serve_in_thread

SHA = "a" * 40
TOKEN = "test-token-" + "t" * 24


def record(run_id, state="PASSED", sha=SHA, box="boxa"):
    return {"run_id": run_id, "kind": "gate", "state": state, "head": {"rev": "main", "sha": sha},
            "box": {"name": box}, "created_at": "2026-11-30T06:00:00Z", "grid": None, "error": None}


class FakeBackend:
    def __init__(self):
        self.records = [record("r2"), record("r1", "FAILED")]
        self.queued: list[dict] = []

    def runs(self, limit):
        return self.records[:limit]

    def run(self, run_id):
        for r in self.records:
            if r["run_id"] == run_id:
                return r
        raise NotFound(f"no run {run_id!r}")

    def owed(self, head):
        items = [{"what": "magnitude", "head": SHA, "cell": {"batch": 1}, "reason": "legs disagree"}]
        return [i for i in items if head in (None, i["head"])]

    def queue_gate(self, head, box, grid, force):
        if head not in ("main", SHA):
            raise BadRequest(f"unknown revision {head!r}")
        if box not in (None, "boxa"):
            raise BadRequest(f"unknown box {box!r}")
        if grid == "boom":
            raise RuntimeError("a bug")
        rec = record(f"q{len(self.queued)}", "QUEUED")
        self.queued.append(rec)
        return rec, True

    def index_html(self):
        return "<!doctype html><title>regate runs</title><a href='r2.html'>r2</a>"

    def report_html(self, run_id):
        return f"<!doctype html><title>{self.run(run_id)['run_id']}</title>"


@pytest.fixture(scope="module")
def live_server():
    server = ApiServer(FakeBackend(), "127.0.0.1", 0, token=TOKEN)
    thread = serve_in_thread(server)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        assert not thread.is_alive()


@pytest.fixture
def api(live_server):
    live_server.backend = FakeBackend()  # fresh state per test, one server per module
    return live_server, live_server.backend


def request(server, method, path, body=None, headers=None, token=TOKEN):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs |= {"Authorization": f"Bearer {token}"} if token else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, (json.loads(data) if ctype.startswith("application/json") else data.decode())
    finally:
        conn.close()


def test_list_and_show_runs(api):
    server, _ = api
    status, body = request(server, "GET", "/api/runs")
    assert status == 200
    assert [r["run_id"] for r in body["runs"]] == ["r2", "r1"]
    assert body["runs"][1] == {"run_id": "r1", "state": "FAILED", "kind": "gate",
                               "head": {"rev": "main", "sha": SHA}, "box": "boxa", "grid": None,
                               "created_at": "2026-11-30T06:00:00Z", "finished_at": None, "error": None,
                               "report": "/r1.html", "api": "/api/runs/r1"}
    assert [r["run_id"] for r in request(server, "GET", "/api/runs?limit=1")[1]["runs"]] == ["r2"]
    status, body = request(server, "GET", "/api/runs/r1")
    assert status == 200 and body["state"] == "FAILED" and body["head"]["sha"] == SHA


def test_owed_and_pages(api):
    server, _ = api
    assert request(server, "GET", "/api/owed")[1]["owed"][0]["reason"] == "legs disagree"
    assert request(server, "GET", f"/api/owed?head={'b' * 40}") == (200, {"owed": []})
    status, page = request(server, "GET", "/")
    assert status == 200 and "regate runs" in page
    assert request(server, "GET", "/r2.html") == (200, "<!doctype html><title>r2</title>")
    assert request(server, "HEAD", "/r2.html") == (200, "")


def test_queue_a_gate(api):
    server, backend = api
    status, body = request(server, "POST", "/api/gate", json.dumps({"head": "main", "box": "boxa"}))
    assert status == 202 and body["run_id"] == "q0" and body["queued"] is True and body["state"] == "QUEUED"
    assert request(server, "POST", "/api/gate", json.dumps({"head": SHA}))[0] == 202
    assert len(backend.queued) == 2


@pytest.mark.parametrize("body, headers, status, message", [
    ("{not json", None, 400, "malformed JSON"),
    ('["main"]', None, 400, "expected a JSON object"),
    ("{}", None, 400, "missing field 'head'"),
    ('{"head": null}', None, 400, "missing field 'head'"),  # found by the fuzz: was a 500
    ('{"head": 7}', None, 400, "field 'head'"),
    ('{"head": "  "}', None, 400, "field 'head'"),
    ('{"head": "main", "force": "yes"}', None, 400, "field 'force'"),
    ('{"head": "main", "bxo": "boxa"}', None, 400, "unknown field 'bxo'"),
    ('{"head": "nope"}', None, 400, "unknown revision 'nope'"),
    ('{"head": "main", "box": "boxz"}', None, 400, "unknown box 'boxz'"),
    (b"\xff\xfe", None, 400, "malformed JSON"),
    ('{"head": "main\\u0000"}', None, 400, "field 'head': contains a control character"),
    ('{"head": "main", "box": "boxa\\n"}', None, 400, "field 'box': contains a control character"),
    ("[" * 20_000 + "]" * 20_000, None, 400, "nested too deeply"),  # 40 KB: RecursionError was a 500
    ('{"head": ' + '{"a": ' * 5_000 + "1" + "}" * 5_001, None, 400, "nested too deeply"),
    ('{"head": "main"}', {"Content-Type": "text/plain"}, 415, "application/json"),
    ('{"head": "main", "pad": "' + "x" * MAX_BODY + '"}', None, 413, "at most 65536"),
    ('{"head": "main", "pad": "' + "x" * (20 * MAX_BODY) + '"}', None, 413, "at most 65536"),
])
def test_bad_gate_requests_are_4xx_and_queue_nothing(api, body, headers, status, message):
    server, backend = api
    got, answer = request(server, "POST", "/api/gate", body, headers)
    assert got == status and message in answer["error"]
    assert backend.queued == []


def test_missing_length_and_chunked_bodies_are_refused(api):
    server, backend = api
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.putrequest("POST", "/api/gate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()
    status, answer = request(server, "POST", "/api/gate", iter([b'{"head": "main"}']),
                             {"Transfer-Encoding": "chunked"})
    assert status == 411 and "chunked" in answer["error"]
    conn = http.client.HTTPConnection(host, port, timeout=10)  # a terabyte announced: refused unread
    conn.putrequest("POST", "/api/gate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(10**12))
    conn.endheaders(b'{"head": "main"}')
    resp = conn.getresponse()
    assert resp.status == 413 and "at most 65536" in json.loads(resp.read())["error"]
    conn.close()
    assert backend.queued == []


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/api/nothing", 404),
    ("GET", "/api/runs/zzz", 404),
    ("GET", "/zzz.html", 404),
    ("GET", "/../etc/passwd", 404),
    ("GET", "/api/runs?limit=0", 400),
    ("GET", "/api/runs?limit=abc", 400),
    ("GET", "/api/runs?limit=%C2%B2", 400),  # "²": isdigit() but not int(): was a 500
    ("GET", "/api/gate", 405),
    ("POST", "/api/runs", 405),
    ("POST", "/api/elsewhere", 404),
    ("DELETE", "/api/runs/r1", 405),
])
def test_bad_routes_are_4xx_json(api, method, path, status):
    server, backend = api
    got, answer = request(server, method, path, "{}" if method == "POST" else None)
    assert got == status and answer["error"]
    assert backend.queued == []


def test_a_backend_bug_is_a_json_500_and_the_server_keeps_serving(api):
    server, backend = api
    status, answer = request(server, "POST", "/api/gate", '{"head": "main", "grid": "boom"}')
    assert status == 500 and "RuntimeError: a bug" in answer["error"]
    assert request(server, "GET", "/api/runs")[0] == 200


def test_a_body_of_exactly_the_limit_is_accepted(api):
    server, backend = api
    body = '{"head": "main"}'
    body += " " * (MAX_BODY - len(body))
    assert request(server, "POST", "/api/gate", body)[0] == 202
    assert request(server, "POST", "/api/gate", body + " ")[0] == 413
    assert len(backend.queued) == 1
