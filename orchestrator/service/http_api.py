"""The HTTP front of `orchestrator serve`: the reports, and a small JSON API over the job ledger.

    GET  /                   the reports index (newest first)
    GET  /<run_id>.html      one run's report (the index links here); while the run is QUEUED or
                             RUNNING, a page that polls /api/runs/<id> and shows its progress
    GET  /api/runs           {"runs": [summary...]}   ?limit=N (1..1000, default 50)
    GET  /api/runs/<id>      the stored run record
    GET  /api/owed           {"owed": [item...]}      ?head=SHA
    POST /api/gate           {"head": REV, "box": NAME, "grid": SPEC?, "force": false?} -> the run id
                             ("pool": NAME instead of "box": any idle box of the pool)

Errors are JSON `{"error": message}` with a 4xx status, and a rejected request queues nothing: 400 bad
input (malformed or too deeply nested JSON, a missing or mistyped field, a control character, an
unknown revision or box), 401 no or wrong bearer token, 404 unknown route or run, 405 wrong method, 408
a body shorter than its Content-Length, 411 no Content-Length, 413 a body over MAX_BODY, 415 a POST that
is not JSON, 421 a Host header that is not one of the bound names, 429 the archive queue is full.

Trust (`auth.py`): every POST needs `Authorization: Bearer <token>`, and so does every request when the
server is bound to a non-loopback address (it refuses to be built there without a token). POST
/api/gate's `git archive` runs on one intake thread behind a bounded queue, never on the request thread,
so a flood of POSTs queues work instead of loading the machine, and is told 429 when the queue is full.

Standard library only. The server knows nothing of git, Ray or SQLite: every answer comes from a
`Backend` the service passes in, so this file is tested against a fake one.
"""
from __future__ import annotations

import json
import logging
import queue
import re
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from orchestrator.service import auth
from orchestrator.record import Record
from orchestrator.report.live import SCRIPT_SOURCE

log = logging.getLogger("regate.http")

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8470
MAX_BODY = 64 * 1024
_DRAIN_MAX = 4 * 2**20  # an oversize body up to this is read and dropped, so the 413 reaches the client
BODY_TIMEOUT_S = 5.0  # a body that stalls short of its Content-Length frees the thread this soon
INTAKE_DEPTH = 8  # POSTs whose archive step may wait behind the one running; one more is told 429
INTAKE_WAIT_S = 600.0  # a request waits this long for its archive step, then is told to retry (503)
RETRY_AFTER_S = 10
_DIGITS = re.compile(r"[0-9]+")  # str.isdigit() also takes "²", which int() refuses
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_GATE_KEYS = {"head": str, "box": str, "grid": str, "force": bool, "pool": str}
_RUN_PAGE = re.compile(r"^/([A-Za-z0-9._-]+)\.html$")
_RUN_API = re.compile(r"^/api/runs/([A-Za-z0-9._-]+)$")
# Every answer: no script runs but a running run's poller, allowed by its hash (a script injected into
# a page, inline or not, never runs); it may fetch from this server only (the run's JSON); styles are
# inline, plots inline SVG, the raw-data link a data: URI; nothing else loads, no form posts, no framing.
CSP = (f"default-src 'none'; script-src {SCRIPT_SOURCE}; connect-src 'self'; style-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class HttpError(Exception):
    """A request the API refuses; the status is 4xx (503: its archive step outlasted INTAKE_WAIT_S) and the
    message says what was wrong."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


class BadRequest(HttpError):
    def __init__(self, message: str):
        super().__init__(HTTPStatus.BAD_REQUEST, message)


class NotFound(HttpError):
    def __init__(self, message: str):
        super().__init__(HTTPStatus.NOT_FOUND, message)


class Backend(Protocol):
    def runs(self, limit: int) -> list[dict]: ...
    def run(self, run_id: str) -> dict: ...  # NotFound when unknown
    def owed(self, head: str | None) -> list[dict]: ...
    def queue_gate(self, head: str, box: str | None, grid: str | None, force: bool,
                   pool: str | None = None) -> tuple[dict, bool]:
        """(the run record, whether it was newly queued); BadRequest for an unknown revision, box or
        pool, or both a box and a pool."""
    def index_html(self) -> str: ...
    def report_html(self, run_id: str) -> str: ...  # NotFound when unknown


def summary(record: Record | dict) -> dict:
    """The part of a run record a list shows; the whole record is one GET /api/runs/<id> away."""
    r = Record.of(record)
    return {"run_id": r.run_id, "state": r.state, "kind": r.kind, "head": {"rev": r.head.rev, "sha": r.head.sha},
            "box": r.box.name, "grid": (r.grid or {}).get("spec"), "created_at": r.created_at,
            "finished_at": r.finished_at, "error": r.error, "report": f"/{r.run_id}.html",
            "api": f"/api/runs/{r.run_id}"}


def parse_gate_request(body: bytes) -> dict:
    """The POST /api/gate body -> {"head", "box", "grid", "force", "pool"}; BadRequest naming the field."""
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"body: malformed JSON ({e})") from None
    except RecursionError:
        raise BadRequest("body: JSON nested too deeply") from None
    if not isinstance(req, dict):
        raise BadRequest(f"body: expected a JSON object, found {type(req).__name__}")
    unknown = sorted(set(req) - set(_GATE_KEYS))
    if unknown:
        raise BadRequest(f"body: unknown field {unknown[0]!r} (expected {', '.join(_GATE_KEYS)})")
    if req.get("head") is None:
        raise BadRequest("body: missing field 'head' (a git revision)")
    for key, typ in _GATE_KEYS.items():
        v = req.get(key)
        if v is not None and (not isinstance(v, typ) or (typ is str and not v.strip())):
            raise BadRequest(f"body: field {key!r}: expected a non-empty {typ.__name__}, found {v!r}")
        if typ is str and v is not None and _CONTROL.search(v):
            raise BadRequest(f"body: field {key!r}: contains a control character ({v!r})")
    if req.get("box") is not None and req.get("pool") is not None:
        raise BadRequest("body: fields 'box' and 'pool': give one (a named box, or any idle box of a pool)")
    return {"head": req["head"], "box": req.get("box"), "grid": req.get("grid"),
            "force": bool(req.get("force", False)), "pool": req.get("pool")}


def _limit(query: dict) -> int:
    raw = query.get("limit", ["50"])[-1]
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= 1000:
        raise BadRequest(f"limit: expected a whole number 1..1000, found {raw!r}")
    return int(raw)


class Handler(BaseHTTPRequestHandler):
    server_version = "regate"
    timeout = 30  # a client that stalls mid-request frees its thread instead of holding it forever

    @property
    def backend(self) -> Backend:
        return self.server.backend  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._answer(self._get)

    do_HEAD = do_GET  # same status and headers, no body (`_send`)

    def do_POST(self) -> None:
        self._answer(self._post)

    def do_PUT(self) -> None:
        self._answer(self._wrong_method)

    do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = do_PUT  # 405, not the 501 of a method unknown

    def _answer(self, route) -> None:
        headers: dict[str, str] = {}
        try:
            self._check_trust()
            status, body, ctype = route(urlsplit(self.path))
        except HttpError as e:
            status, body, ctype, headers = e.status, {"error": str(e)}, "json", e.headers
            self.close_connection = True  # a body left unread must not be taken for the next request
        except Exception as e:  # a bug behind the API: say so in JSON, keep serving
            log.exception("%s %s", self.command, self.path)
            status, body, ctype = 500, {"error": f"internal error: {type(e).__name__}: {e}"}, "json"
        self._send(status, body, ctype, headers)

    def _check_trust(self) -> None:
        """Host is one of the bound names; the bearer token comes with every POST, and with every
        request when the server listens beyond loopback."""
        host = self.headers.get("Host")
        if not host:
            raise BadRequest("Host header is required")
        if auth.host_name(host) not in self.server.allowed_hosts:  # type: ignore[attr-defined]
            raise HttpError(HTTPStatus.MISDIRECTED_REQUEST, f"Host {host!r} is not a name this server is bound to")
        if self.command == "POST" or not self.server.loopback:  # type: ignore[attr-defined]
            token = self.server.token  # type: ignore[attr-defined]
            if token is None:
                raise HttpError(HTTPStatus.FORBIDDEN, "this server has no token: POST is disabled")
            if not auth.bearer_ok(self.headers.get("Authorization"), token):
                raise HttpError(HTTPStatus.UNAUTHORIZED, "Authorization: expected 'Bearer <token>' with the "
                                "token of this server's state directory (api-token)", {"WWW-Authenticate": "Bearer"})

    def _get(self, url) -> tuple[int, Any, str]:
        query, path = parse_qs(url.query), url.path
        if path in ("/", "/index.html"):
            return 200, self.backend.index_html(), "html"
        if path == "/api/runs":
            return 200, {"runs": [summary(r) for r in self.backend.runs(_limit(query))]}, "json"
        if path == "/api/owed":
            return 200, {"owed": self.backend.owed(query.get("head", [None])[-1])}, "json"
        if m := _RUN_API.match(path):
            return 200, self.backend.run(m.group(1)), "json"
        if (m := _RUN_PAGE.match(path)) and m.group(1) != "index":
            return 200, self.backend.report_html(m.group(1)), "html"
        if path == "/api/gate":
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "/api/gate: use POST")
        raise NotFound(f"no route {path!r}")

    def _post(self, url) -> tuple[int, Any, str]:
        if url.path != "/api/gate":
            if url.path in ("/", "/api/runs", "/api/owed") or _RUN_API.match(url.path):
                raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{url.path}: use GET")
            raise NotFound(f"no route {url.path!r}")
        req = parse_gate_request(self._read_body())
        pool = (req["pool"],) if req["pool"] is not None else ()  # a backend without pools is asked as before
        pending = self.server.intake.submit(  # type: ignore[attr-defined]
            self.backend.queue_gate, req["head"], req["box"], req["grid"], req["force"], *pool)
        try:
            record, created = pending.result(timeout=INTAKE_WAIT_S)
        except FutureTimeout:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"the archive step took over {INTAKE_WAIT_S:.0f} s; "
                            "retry (an identical gate is returned, not queued twice)",
                            {"Retry-After": str(RETRY_AFTER_S)}) from None
        return (202 if created else 200), {**summary(record), "queued": created}, "json"

    def _wrong_method(self, url) -> tuple[int, Any, str]:
        raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not supported")

    def _read_body(self) -> bytes:
        # A JSON content type also keeps a cross-site form post out: it needs a CORS preflight we refuse.
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Type: expected application/json, found {ctype or 'none'!r}")
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise HttpError(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise HttpError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        if not _DIGITS.fullmatch(raw.strip()):
            raise BadRequest(f"Content-Length: expected a whole number, found {raw!r}")
        n = int(raw)
        self.connection.settimeout(BODY_TIMEOUT_S)  # a stalled body frees the thread soon, not in 30 s
        try:
            if n > MAX_BODY:
                self._drain(n)
                raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body: {n} bytes, at most {MAX_BODY}")
            return self._read_exactly(n)
        finally:
            self.connection.settimeout(self.timeout)

    def _read_exactly(self, n: int) -> bytes:
        """The body, or 408 when it stalls short of Content-Length (the socket's timeout)."""
        data = b""
        with suppress(OSError):  # the socket timed out (or the client left)
            while len(data) < n and (chunk := self.rfile.read1(n - len(data))):
                data += chunk
        if len(data) < n:
            self.close_connection = True
            raise HttpError(HTTPStatus.REQUEST_TIMEOUT, f"body: Content-Length is {n} but {len(data)} byte(s) "
                            f"arrived (within {BODY_TIMEOUT_S:.0f} s of the last)")
        return data

    def _drain(self, n: int) -> None:
        """Drop an oversize body so closing the socket does not reset it before the client reads the 413.
        A body past _DRAIN_MAX is not worth reading: answer at once and close."""
        self.close_connection = True
        if n > _DRAIN_MAX:
            return
        left = n
        with suppress(OSError):  # the client stalled (socket timeout) or left: the 413 is all it gets
            while left > 0 and (chunk := self.rfile.read(min(left, 65536))):
                left -= len(chunk)

    def _send(self, status: int, body: Any, ctype: str, headers: dict[str, str] | None = None) -> None:
        if ctype == "json":
            data, mime = (json.dumps(body, indent=1) + "\n").encode(), "application/json; charset=utf-8"
        else:
            data, mime = body.encode("utf-8"), "text/html; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", mime)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", CSP)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, fmt: str, *args) -> None:
        log.info("%s " + fmt, self.address_string(), *args)


class Intake:
    """One thread that runs queued calls in order (POST /api/gate's archive step), at most `depth` waiting."""

    def __init__(self, depth: int = INTAKE_DEPTH):
        self.calls: queue.Queue = queue.Queue(maxsize=depth)
        threading.Thread(target=self._work, name="regate-intake", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        done: Future = Future()
        try:
            self.calls.put_nowait((done, fn, args))
        except queue.Full:
            raise HttpError(HTTPStatus.TOO_MANY_REQUESTS, f"{self.calls.maxsize} gate requests are already "
                            f"waiting to be archived; retry later", {"Retry-After": str(RETRY_AFTER_S)}) from None
        return done

    def close(self) -> None:
        with suppress(queue.Full):  # a daemon thread: it ends with the process
            self.calls.put_nowait(None)

    def _work(self) -> None:
        while (item := self.calls.get()) is not None:
            done, fn, args = item
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args))
                except BaseException as e:  # the request thread raises it as its own
                    done.set_exception(e)


class ApiServer(ThreadingHTTPServer):
    """The API on (host, port). `token`: the bearer token POSTs (and, off loopback, every request) need;
    `names`: Host names accepted beside loopback's and the bound address."""
    daemon_threads = True  # a stuck client never keeps the process alive at shutdown
    block_on_close = False

    def __init__(self, backend: Backend, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 token: str | None = None, names: tuple[str, ...] = (), intake_depth: int = INTAKE_DEPTH):
        self.loopback = auth.is_loopback(host)
        if token is None and not self.loopback:
            raise ValueError(f"refusing to serve on {host} (not loopback) without a token")
        self.backend, self.token, self.allowed_hosts = backend, token, auth.bound_names(host, names)
        self.intake = Intake(intake_depth)  # first: a failed bind calls server_close
        super().__init__((host, port), Handler)

    def server_close(self) -> None:
        super().server_close()
        self.intake.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def serve_in_thread(server: ApiServer) -> threading.Thread:
    """Serve on a background thread; stop with `server.shutdown(); server.server_close()`."""
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         name="regate-http", daemon=True)
    t.start()
    return t
