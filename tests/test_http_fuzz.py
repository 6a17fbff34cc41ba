"""Fuzz the HTTP API over a real socket, wired to the real ledger and a real repository: whatever the
method, path, headers and body, the answer is never a 5xx, and the server keeps serving."""
from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.service.daemon import Backend
from orchestrator.service.http_api import ApiServer, serve_in_thread
from service_support import config_for, make_repo

# One fuzz run and the check that the server survived it (and that the fuzz reached the backend): a
# pair, slow together (the second reads what the first did).
pytestmark = pytest.mark.slow
TOKEN = "fuzz-token-0123456789abcdef"
ROUTES = ["/api/gate", "/", "/index.html", "/api/runs", "/api/runs?limit=", "/api/runs/", "/api/owed", "/api/owed?head=",
          "/api/gate", "/x.html", "/api/gate?x="]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                    max_leaves=12)
GATE = st.fixed_dictionaries(
    {"head": st.sampled_from(["main", "main", "HEAD", "-x", "main\x00", "", "^^", "main..", "a" * 40]) | JSON},
    optional={"box": st.sampled_from(["boxa", "boxz"]) | JSON, "grid": st.sampled_from(["smoke", "../x", "/etc/passwd"])
              | JSON, "force": st.booleans() | JSON})
ODD = (st.dictionaries(st.text(max_size=6), JSON, max_size=4).map(lambda d: json.dumps(d).encode())
       | JSON.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64) | st.just(b"[" * 5000 + b"]" * 5000))
BODY = st.integers(0, 3).flatmap(lambda i: ODD if i == 2 else GATE.map(lambda d: json.dumps(d).encode()))
VISIBLE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)
HEADER = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)


class CountingBackend(Backend):
    """The real backend; counts the requests that got as far as queueing (the fuzz must reach it)."""
    reached = 0

    def queue_gate(self, *args):
        CountingBackend.reached += 1
        return super().queue_gate(*args)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    repo, _ = make_repo(root)
    srv = ApiServer(CountingBackend(config_for(root, repo), str(repo)), "127.0.0.1", 0, token=TOKEN)
    thread = serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def send(srv, data: bytes) -> int:
    with socket.create_connection(srv.server_address[:2], timeout=30) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def mostly(good, bad: st.SearchStrategy) -> st.SearchStrategy:
    """`good` four times in five, else `bad`: each field is broken alone often enough for the request
    to reach the body parser and the backend."""
    return st.integers(0, 4).flatmap(lambda i: bad if i == 3 else st.just(good))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(method=mostly("POST", st.sampled_from(["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE",
                                              "CONNECT"])),
       path=mostly("/api/gate", st.sampled_from(ROUTES) | st.tuples(st.sampled_from(ROUTES), VISIBLE).map("".join)),
       ctype=mostly("application/json", st.sampled_from(["application/json; charset=utf-8", "text/plain", None])
                    | HEADER),
       length=mostly("exact", st.sampled_from(["short", None]) | HEADER),
       authz=mostly(f"Bearer {TOKEN}", st.sampled_from([f"bearer {TOKEN}", "Bearer", "Basic eDp5", None]) | HEADER),
       host=mostly("{addr}", st.sampled_from(["localhost:{port}", "evil.example", None]) | VISIBLE),
       body=BODY)
def test_no_request_gets_a_5xx(server, method, path, ctype, length, authz, host, body):
    addr, port = server.server_address[:2]
    lines = [f"{method} {path} HTTP/1.1", "Connection: close"]
    if host is not None:
        lines.append("Host: " + host.replace("{addr}", f"{addr}:{port}").replace("{port}", str(port)))
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    if authz is not None:
        lines.append(f"Authorization: {authz}")
    if length is not None:  # never longer than the body: that is a 408 after BODY_TIMEOUT_S (test_http_trust)
        lines.append("Content-Length: " + {"exact": str(len(body)), "short": str(len(body) // 2)}.get(length, length))
    status = send(server, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    assert 200 <= status < 500, (status, lines, body[:200])


def test_the_server_still_serves_after_the_fuzz_which_reached_the_backend(server):
    assert CountingBackend.reached >= 5  # the fuzz got past the trust checks to git and the ledger
    addr, port = server.server_address[:2]
    assert send(server, f"GET /api/runs HTTP/1.1\r\nHost: {addr}:{port}\r\nConnection: close\r\n\r\n".encode()) == 200
