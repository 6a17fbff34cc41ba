"""Where regate keeps its state (the database, reports/, the API token, logs/): found the way git finds its repository.

`REGATE_HOME`, when set, is that directory (absolute: a relative one would change with the cwd).
Otherwise, from the working directory up, the first directory that is a repository's root (it holds
`.git`, a directory or, in a worktree or submodule, a file) or that already holds a `.regate/`
directory: its `.regate/`. So every command, from any subfolder of the repository, reads and writes
the same database as the gate that wrote it, and none starts an empty one beside the caller.
Outside any repository, with no REGATE_HOME, there is no state directory: `StateDirError` says where
it looked and how to set one (a command turns it into exit 2). An explicit `--config` that names its
own `db_path` never asks (`orchestrator.config`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

HOME_ENV = "REGATE_HOME"
DIR_NAME = ".regate"
DB_NAME = "regate.db"
REPORTS = "reports"
LOGS = "logs"
# Every command's --config help: where the state is when no config says otherwise.
CONFIG_HELP = "orchestrator.yaml (default: built-in; state in .regate/ at the repository root, or $REGATE_HOME)"


class StateDirError(ValueError):
    """No state directory: not inside a repository and no REGATE_HOME (or a bad REGATE_HOME)."""


def find(start: Path | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The state directory (which may not exist yet), or None when there is none."""
    env = os.environ if env is None else env
    home = env.get(HOME_ENV, "")
    if home:
        if not os.path.isabs(home):
            raise StateDirError(f"{HOME_ENV}={home!r}: expected an absolute directory path (it holds "
                                f"{DB_NAME} and {REPORTS}/)")
        return Path(home)
    here = Path(start or os.getcwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / ".git").exists() or (folder / DIR_NAME).is_dir():
            return folder / DIR_NAME
    return None


def state_dir(start: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """`find`, or StateDirError saying where it looked and what to do."""
    found = find(start, env)
    if found is None:
        here = Path(start or os.getcwd()).absolute()
        raise StateDirError(
            f"no regate state directory: {here} is not a git repository (nor inside one), and no {DIR_NAME}/ "
            f"was found from there up to {here.anchor}. Run orchestrator inside the repository it gates, or set "
            f"{HOME_ENV} to an absolute directory for regate's database and reports "
            f"(e.g. export {HOME_ENV}=$HOME/.regate)")
    return found


def logs_dir(db_path: Path) -> Path:
    """Where a run's logs go: `logs/` beside the database (the state directory's, or a config's)."""
    return Path(db_path).parent / LOGS
