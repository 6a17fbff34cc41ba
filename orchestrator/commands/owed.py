"""`orchestrator owed [--head REV] [--close ID --reason TEXT] [--json]`: the open owed-ledger items.

`--head` takes a sha (or a prefix of one) or any revision of `--repo`; `--close` closes one item with
a person's reason. Exit 2 on a bad revision, an unknown item, or a close without a reason.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Optional

import typer

from orchestrator import owed
from orchestrator.commands.report import CommandError, open_db
from orchestrator.config import ConfigError
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP


def head_sha(rev: str, repo: Path) -> str:
    """A hex revision is taken as a sha prefix as is; anything else is resolved in `repo`."""
    if re.fullmatch(r"[0-9a-fA-F]{4,40}", rev):
        return rev.lower()
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options",
                        f"{rev}^{{commit}}"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise CommandError(f"{repo}: unknown revision {rev!r}")
    return r.stdout.strip()


def _line(item: dict) -> str:
    needed = f", ~{item['legs_needed']} legs/arm" if item["legs_needed"] else ""
    where = item["backend"] + ("" if item["gpu"] == "none" else f" ({'any GPU' if item['gpu'] == 'any' else item['gpu']})")
    return (f"#{item['id']:<4} {item['head_sha'][:12]}  {item['what']:<9} {item['label'] or item['cell']}  on {where}\n"
            f"      {item['reason']}{needed}  (opened by {item['opened_by']})")


def register(app: typer.Typer) -> None:
    @app.command("owed")
    def owed_cmd(
        head: Optional[str] = typer.Option(None, "--head", metavar="REV",
                                           help="only this head (sha prefix or revision)"),
        close_id: Optional[int] = typer.Option(None, "--close", help="close this item id"),
        reason: Optional[str] = typer.Option(None, "--reason", help="why it is closed (required with --close)"),
        repo: Path = typer.Option(Path("."), "--repo", metavar="DIR", help="git repository to resolve --head in"),
        config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
        db_path: Optional[Path] = typer.Option(None, "--db", metavar="FILE",
                                               help="the regate database (default: from the config)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON line"),
    ) -> None:
        """List what is owed (open items), or close one with a reason."""
        if reason is not None and close_id is None:
            fail("--reason goes with --close ID")
        try:
            conn, _ = open_db(config, db_path)
            try:
                if close_id is not None:
                    item = owed.close(conn, close_id, reason or "")
                    done = f"closed #{close_id}: {item['close_reason']}"
                    typer.echo(json.dumps(item, sort_keys=True) if as_json else done)
                    return
                items = owed.list_open(conn, head_sha(head, repo) if head else None)
            finally:
                conn.close()
        except (CommandError, ConfigError, owed.OwedError) as e:
            fail(e)
        if as_json:
            typer.echo(json.dumps({"owed": items}, sort_keys=True))
        else:
            typer.echo("\n".join(map(_line, items)) if items else "nothing owed")
