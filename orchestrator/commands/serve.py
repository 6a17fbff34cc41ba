"""`orchestrator serve`: run the schedules, a job worker per box, and the HTTP front, until SIGTERM.

Exit codes: 0 a clean shutdown; 2 a bad config, a port that cannot be bound, a repo that is not one,
or no usable bearer token (`<state dir>/api-token`, created 0600 when absent; required off loopback).
Ray's own output goes to `<state dir>/logs/ray-serve-<start>.log` (named in the first log line), never
to the terminal; the service's log lines stay on stderr.
"""
from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import typer

from orchestrator.config import ConfigError, load_config
from orchestrator.errors import fail
from orchestrator.ray_log import ray_output_to_log
from orchestrator.state_dir import CONFIG_HELP, logs_dir
from orchestrator.service.auth import TokenError, ensure_token, is_loopback, token_path
from orchestrator.service.http_api import DEFAULT_HOST, DEFAULT_PORT
from orchestrator.box.idle import gpus
from orchestrator.driver.provenance import ProvenanceError
from orchestrator.service.schedule import ScheduleError
from orchestrator.service.daemon import load_service

log = logging.getLogger("regate.service")


def serve(
    host: str = typer.Option(DEFAULT_HOST, "--host", help="address to bind (loopback by default)"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="port to bind (0: any free port)"),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
    repo: str = typer.Option(".", "--repo", help="repository whose revisions are gated"),
    allow_host: Optional[list[str]] = typer.Option(
        None, "--allow-host", help="a Host name clients use beside loopback's and --host (repeatable)"),
) -> None:
    """Serve runs, reports and a JSON API; run the configured schedules."""
    with ExitStack() as stack:
        try:
            cfg = load_config(config, gpus=len(gpus()))
            ray_log = stack.enter_context(ray_output_to_log(path=_ray_log_path(cfg.db_path)))
            _log_to_stderr()
            log.info("Ray's own output (its warnings, its processes' lines) goes to %s", ray_log.path)
            _check_repo(repo)
            token_file = token_path(cfg.db_path)
            token = _token(token_file, host)
            service = load_service(cfg, config, repo, host, port, token, tuple(allow_host or ()))
            url = service.start()
            service.install_signal_handlers()
        except (ConfigError, ScheduleError, ProvenanceError, TokenError, OSError, sqlite3.Error) as e:
            fail(e)
        # One line on stdout for people and for scripts that started us with --port 0.
        print(f"serving {url} (token {token_file}, db {cfg.db_path}, {len(service.schedules)} schedule(s), "
              f"boxes {', '.join(b.name for b in cfg.boxes)})", flush=True)
        service.run()
        log.info("stopped cleanly")


def _ray_log_path(db_path) -> Path:
    """One log of Ray's output for the service's lifetime, named by when it started (UTC)."""
    return logs_dir(db_path) / f"ray-serve-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"


def _log_to_stderr() -> None:
    """Our loggers (regate.service, regate.http) on the terminal's stderr: configured after Ray's
    capture has moved fd 2 to its log, so the handler holds the real stderr's copy (`sys.stderr`)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _token(path, host: str) -> str:
    try:
        return ensure_token(path)
    except TokenError as e:
        if is_loopback(host):
            raise
        raise TokenError(f"refusing to serve on {host} (not loopback) without a token: {e}") from None


def _check_repo(repo: str) -> None:
    """Fail at start, not at the first request, when --repo is not a git repository."""
    r = subprocess.run(["git", "-C", repo, "rev-parse", "--git-dir"], capture_output=True, timeout=60)
    if r.returncode != 0:
        raise ProvenanceError(f"--repo {repo}: not a git repository")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
