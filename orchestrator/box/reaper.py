"""The reaper: run one command of a head as an unprivileged user, and let nothing it started outlive it.

`python -I -S reaper.py UID GID -- ARGV...`, built by `sandbox.Jail.command` where bubblewrap is not
usable (`isolation: reaper`) and run by path as root: it imports only the standard library.

- It makes itself a child subreaper (PR_SET_CHILD_SUBREAPER): a process below it whose parent dies is
  re-parented to the reaper, not to init, so a double fork, a setsid() or a cleared environment does
  not take a process out of its reach (the keeper finds processes by their environment; this does not).
- It forks the command in a session of its own, as UID/GID with no supplementary groups and
  no_new_privs (a setuid binary cannot win root back), waits for it, then kills every remaining
  descendant and reaps until it has no child left, and exits with the command's status (128+N when a
  signal N ended it, as a shell and bubblewrap report it).
- SIGTERM, SIGINT, SIGHUP (the tree runner's kill, a timeout or cancel) and the death of its own
  parent (the job killed: PR_SET_PDEATHSIG) do the same at once and exit 128+N.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02


def prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def descendants(root: int) -> list[int]:
    """Every live process below `root`, from /proc (a snapshot: one forked meanwhile is found next round)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # after the command name, which may hold spaces
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def kill_all() -> None:
    """SIGKILL every descendant and reap until none is left. A killed process's children re-parent to
    this subreaper, so once all are killed every survivor is our child and `waitpid` sees it."""
    me = os.getpid()
    while True:
        for pid in descendants(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no child at all: nothing of the command is alive
        time.sleep(POLL_S)


def exit_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def run(uid: int, gid: int, argv: list[str]) -> int:
    prctl(PR_SET_CHILD_SUBREAPER, 1)

    def stop(signum, _frame):
        kill_all()
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the job that started us died: stop as on SIGTERM
    if os.getppid() != parent:  # it died before the line above: nothing to run for
        return 128 + signal.SIGTERM
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            os.setgroups([])
            os.setgid(gid)  # group first: after setuid we could not change it any more
            os.setuid(uid)
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.execvp(argv[0], argv)
        except BaseException as e:  # noqa: BLE001 - report anything, never return into the reaper's code
            os.write(2, f"reaper: cannot run {argv[0]!r} as uid {uid}: {e}\n".encode())
        os._exit(127)
    while True:
        done, status = os.waitpid(-1, 0)  # orphans re-parented to us are reaped here too
        if done == pid:
            break
    kill_all()
    return exit_code(status)


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write("usage: reaper.py UID GID -- ARGV...\n")
        return 2
    return run(int(args[0]), int(args[1]), args[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
