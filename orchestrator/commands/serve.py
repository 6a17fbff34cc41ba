"""`orchestrator serve`: run the schedules, a job worker per box, and the HTTP front, until SIGTERM.

Exit codes: 0 a clean shutdown; 2 a bad config, a port that cannot be bound, a repo that is not one,
or no usable bearer token (`<state dir>/api-token`, created 0600 when absent; required off loopback).
"""
from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from typing import Optional

import typer

from orchestrator.config import ConfigError, load_config
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP
from orchestrator.service.auth import TokenError, ensure_token, is_loopback, token_path
from orchestrator.service.http_api import DEFAULT_HOST, DEFAULT_PORT
from orchestrator.box.idle import gpus
from orchestrator.driver.provenance import ProvenanceError
from orchestrator.service.schedule import ScheduleError
from orchestrator.service.daemon import load_service


def serve(
    host: str = typer.Option(DEFAULT_HOST, "--host", help="address to bind (loopback by default)"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="port to bind (0: any free port)"),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
    repo: str = typer.Option(".", "--repo", help="repository whose revisions are gated"),
    allow_host: Optional[list[str]] = typer.Option(
        None, "--allow-host", help="a Host name clients use beside loopback's and --host (repeatable)"),
) -> None:
    """Serve runs, reports and a JSON API; run the configured schedules."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_config(config, gpus=len(gpus()))
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
    logging.getLogger("regate.service").info("stopped cleanly")


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
