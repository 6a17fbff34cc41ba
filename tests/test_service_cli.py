"""`orchestrator serve` refuses to start, exit 2 with a message naming the problem, on bad input."""
from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from orchestrator import cli
from service_support import make_repo, write_config


@pytest.fixture(scope="module")
def app():
    cli._register_all()
    return cli.app


def serve(app, *args):
    return CliRunner().invoke(app, ["serve", *args])


def test_a_bad_schedule_names_the_key(app, tmp_path):
    repo, _ = make_repo(tmp_path)
    cfg = write_config(tmp_path, repo, schedules=[{"id": "n", "cron": "0 2 * * *", "rev": "main",
                                                    "grid": "smoke", "box": "boxz"}])
    result = serve(app, "--port", "0", "--config", str(cfg), "--repo", str(repo))
    assert result.exit_code == 2
    assert "schedules[0].box: unknown box 'boxz'" in result.output


def test_a_malformed_config_and_a_non_repo_are_refused(app, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("boxes: {name: 3}\n")
    result = serve(app, "--port", "0", "--config", str(bad))
    assert result.exit_code == 2 and "boxes" in result.output
    repo, _ = make_repo(tmp_path)
    cfg = write_config(tmp_path, repo)
    result = serve(app, "--port", "0", "--config", str(cfg), "--repo", str(tmp_path / "nothing"))
    assert result.exit_code == 2 and "not a git repository" in result.output


def test_a_port_in_use_is_refused(app, tmp_path):
    repo, _ = make_repo(tmp_path)
    cfg = write_config(tmp_path, repo)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = serve(app, "--port", str(port), "--config", str(cfg), "--repo", str(repo))
    assert result.exit_code == 2 and "in use" in result.output


@pytest.mark.timeout(120)  # before the token, serve started here and served until killed
@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_no_usable_token_refuses_to_serve(app, tmp_path, host):
    repo, _ = make_repo(tmp_path)
    cfg = write_config(tmp_path, repo)
    (tmp_path / "api-token").write_text("a-token-others-can-read-0123456789\n")
    (tmp_path / "api-token").chmod(0o644)
    result = serve(app, "--host", host, "--port", "0", "--config", str(cfg), "--repo", str(repo))
    assert result.exit_code == 2 and "lets others read it" in result.output
    if host == "0.0.0.0":
        assert "refusing to serve on 0.0.0.0 (not loopback) without a token" in result.output
