"""The HTTP front's trust boundary: the bearer token, the Host check, the bounded archive queue, a body
that stalls short of its Content-Length; a real server on loopback with a fake backend."""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time

import pytest

from orchestrator.service import auth
from orchestrator.service.http_api import BODY_TIMEOUT_S, ApiServer, serve_in_thread
from test_http_api import TOKEN, FakeBackend, request


def raw(server, data: bytes, timeout_s: float = 30) -> tuple[int, bytes]:
    """Send `data` as is on a fresh connection; (status, whole answer)."""
    with socket.create_connection(server.server_address[:2], timeout=timeout_s) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


@pytest.fixture
def serving():
    started = []

    def start(backend=None, host="127.0.0.1", **kw):
        server = ApiServer(backend or FakeBackend(), host, 0, **kw)
        started.append((server, serve_in_thread(server)))
        return server
    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_every_post_needs_the_token_and_loopback_gets_need_none(serving):
    server = serving(token=TOKEN)
    body = json.dumps({"head": "main"})
    for token in (None, "wrong-token", TOKEN + "x"):
        status, answer = request(server, "POST", "/api/gate", body, token=token)
        assert status == 401 and "Bearer" in answer["error"]
    assert request(server, "POST", "/api/gate", body, headers={"Authorization": TOKEN}, token=None)[0] == 401
    assert server.backend.queued == []
    assert request(server, "GET", "/api/runs", token=None)[0] == 200
    assert request(server, "POST", "/api/gate", body)[0] == 202


def test_a_server_without_a_token_takes_no_post(serving):
    server = serving(token=None)
    status, answer = request(server, "POST", "/api/gate", json.dumps({"head": "main"}), token="anything")
    assert status == 403 and "no token" in answer["error"]
    assert server.backend.queued == []


def test_off_loopback_every_request_needs_the_token_and_no_token_refuses_to_serve(serving):
    with pytest.raises(ValueError, match="not loopback"):
        ApiServer(FakeBackend(), "0.0.0.0", 0, token=None)
    server = serving(host="0.0.0.0", token=TOKEN)
    port = server.server_address[1]
    get = f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n".encode()
    assert raw(server, get + b"\r\n")[0] == 401
    assert raw(server, get + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())[0] == 200


@pytest.mark.parametrize("host, status", [
    ("evil.example:{port}", 421),  # a rebound DNS name pointing at loopback
    ("evil.example", 421),
    ("127.0.0.1.evil.example:{port}", 421),
    ("localhost:{port}", 200),
    ("127.0.0.1:{port}", 200),
    ("[::1]:{port}", 200),
    ("gate-box:{port}", 200),  # named with names=("gate-box",)
])
def test_the_host_header_must_name_the_server(serving, host, status):
    server = serving(token=TOKEN, names=("gate-box",))
    host = host.format(port=server.server_address[1])
    got, answer = raw(server, f"GET /api/runs HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    assert got == status, answer
    body = json.dumps({"head": "main"}).encode()
    post = (f"POST /api/gate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    assert raw(server, post)[0] == (202 if status == 200 else status)
    assert len(server.backend.queued) == (1 if status == 200 else 0)


def test_a_request_without_host_is_refused(serving):
    server = serving(token=TOKEN)
    status, answer = raw(server, b"GET /api/runs HTTP/1.0\r\n\r\n")
    assert status == 400 and b"Host header is required" in answer


class SlowBackend(FakeBackend):
    """queue_gate (the archive step) blocks until released; records the threads it ran on."""

    def __init__(self):
        super().__init__()
        self.release, self.started, self.threads = threading.Event(), threading.Event(), []

    def queue_gate(self, head, box, grid, force):
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(30)
        return super().queue_gate(head, box, grid, force)


def test_the_archive_step_runs_off_the_request_thread_and_a_full_queue_is_429(serving):
    backend = SlowBackend()
    server = serving(backend, token=TOKEN, intake_depth=1)
    body, answers = json.dumps({"head": "main"}), []
    post = lambda: answers.append(request(server, "POST", "/api/gate", body))  # noqa: E731
    first = threading.Thread(target=post)
    first.start()
    assert backend.started.wait(10)  # the first is archiving
    second = threading.Thread(target=post)
    second.start()
    deadline = time.monotonic() + 10
    while server.intake.calls.qsize() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the second waits in the queue
    host, port = server.server_address[:2]
    status, answer = raw(server, (f"POST /api/gate HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                                  f"Content-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    assert status == 429 and b"Retry-After: " in answer and b"already waiting" in answer
    backend.release.set()
    first.join(10)
    second.join(10)
    assert sorted(a[0] for a in answers) == [202, 202] and len(backend.queued) == 2
    assert backend.threads == ["regate-intake", "regate-intake"]


def test_a_body_shorter_than_its_content_length_is_408_within_the_body_timeout(serving):
    server = serving(token=TOKEN)
    host, port = server.server_address[:2]
    t = time.monotonic()
    status, answer = raw(server, (f"POST /api/gate HTTP/1.1\r\nHost: {host}:{port}\r\n"
                                  f"Content-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  "Content-Length: 100\r\n\r\n" '{"head": "main"}').encode(),
                         timeout_s=BODY_TIMEOUT_S + 10)
    assert status == 408 and b"Content-Length is 100 but 16 byte(s) arrived" in answer
    assert time.monotonic() - t < BODY_TIMEOUT_S + 5
    assert server.backend.queued == []


def test_the_token_file_is_made_private_and_a_loose_one_is_refused(tmp_path):
    path = auth.token_path(tmp_path / "state" / "regate.db")
    token = auth.ensure_token(path)
    assert path == tmp_path / "state" / "api-token" and len(token) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert auth.ensure_token(path) == token  # read, not replaced, on the next start
    os.chmod(path, 0o644)
    with pytest.raises(auth.TokenError, match="lets others read it"):
        auth.ensure_token(path)
    os.chmod(path, 0o600)
    path.write_text("\n")
    with pytest.raises(auth.TokenError, match="at least 16"):
        auth.ensure_token(path)
