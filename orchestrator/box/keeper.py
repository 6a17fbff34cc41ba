"""The keeper: holds the box lock until no process of a run is alive, even when the job that took it dies.

`python keeper.py FD TOKEN [SCRATCH]`, started by `tree.Tree.start_keeper` and run by path: it imports nothing
of regate, only the standard library and psutil. It detaches first (fork, then a new session), since a
box worker is killed together with its direct children (Ray does that when the driver dies) and the
keeper must outlive exactly that. Then it serves the job over the socket FD:

- `hold` + a file descriptor (SCM_RIGHTS): keep the box lock's open file. flock(2) belongs to the open
  file, so the lock stays held while the keeper lives, whoever else closed it.
- `reap`: kill every process carrying REGATE_RUN=TOKEN and answer once none is alive (the job asks
  before it unlocks, so a process that escaped its group cannot outlive the lock either).
- end of file (the job finished, or died): the same reaping, then the run's scratch directory (its
  unpacked tree and every temp dir of the run) is removed, then exit, which drops the lock.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import time

import psutil

TOKEN_ENV = "REGATE_RUN"
POLL_S = 0.1


def members(token: str) -> list[psutil.Process]:
    """The live processes of the run: those whose environment carries its token (zombies are dead)."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile, or not ours to read
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TOKEN_ENV) == token:
                found.append(p)
    return found


def reap(token: str) -> None:
    """SIGKILL the run's processes until none is left (a process forked meanwhile is found next round)."""
    while alive := members(token):
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        time.sleep(POLL_S)


def serve(sock: socket.socket, token: str, scratch: str | None = None) -> None:
    held = []  # the lock's descriptors: closed only when this process exits
    sock.sendall(b"ready\n")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 4)
        held.extend(fds)
        if not msg:
            break  # the job is gone
        if msg.startswith(b"reap"):
            reap(token)
        sock.sendall(b"ok\n")
    reap(token)
    if scratch:  # nothing of the run is alive to write there any more
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> None:
    fd, token, scratch = int(argv[0]), argv[1], (argv[2] if len(argv) > 2 else None)
    if os.fork():  # the parent returns at once to the job, which waits for it; the child lives on
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the driver's terminal is not for the keeper
    serve(socket.socket(fileno=fd), token, scratch)


if __name__ == "__main__":
    main(sys.argv[1:])
