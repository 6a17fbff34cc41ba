"""The HTTP front's trust boundary: the bearer token file, loopback, and the Host names a request may use.

The token is a random secret in a file under the state directory (`api-token` beside the database),
created with mode 0600 on first start and read on every later one. A client proves it may queue gates
by sending `Authorization: Bearer <token>`; whoever can read that file is trusted (see docs/SERVICE.md,
"Security"). The Host header is checked against the names the server is bound to, so a web page whose
DNS name is re-pointed at 127.0.0.1 (DNS rebinding) cannot talk to a loopback instance through a browser.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from pathlib import Path

TOKEN_FILE = "api-token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class TokenError(ValueError):
    """The token file cannot serve as one: unreadable, empty, not a regular file, or readable by others."""


def token_path(db_path: Path) -> Path:
    """Where the token lives: the state directory, beside the database."""
    return Path(db_path).parent / TOKEN_FILE


def ensure_token(path: Path) -> str:
    """The token in `path`, created (random, mode 0600) when the file does not exist."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise TokenError(f"token file {path}: cannot create: {e}") from None
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return read_token(path)


def read_token(path: Path) -> str:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"token file {path}: not a regular file")
        if st.st_mode & 0o077:
            raise TokenError(f"token file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it; "
                             f"`chmod 600 {path}`")
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenError(f"token file {path}: cannot read: {e}") from None
    if len(token) < 16 or not token.isprintable() or " " in token:
        raise TokenError(f"token file {path}: expected one line of at least 16 printable characters")
    return token


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bound_names(host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a request's Host header may carry: loopback's, the bound address, and `extra`."""
    return frozenset({*LOOPBACK_NAMES, host.strip("[]").lower(), *(n.lower() for n in extra)})


def host_name(header: str) -> str:
    """`name:port`, `[v6]:port` or a bare name -> the name, lowercased, without brackets or port."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def bearer_ok(header: str | None, token: str) -> bool:
    scheme, _, given = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
