"""Signed run records: a final record carries an HMAC under a secret the head under gate cannot read.

The head is arbitrary code on the driver's machine; if it can write the job ledger it can turn its own
row into a PASSED one, and the identical-gate shortcut (`db.reusable`) would hand that forgery back.
So every final record is stored with `sign(...)`'s MAC, and a record is reused only when `verify`
holds. The key is `record-key` in the state directory, beside the database: 32 random bytes (hex),
made 0600 at first use and refused, naming the file, when it is not one (the rules of the service's
`api-token`, `service/auth.py`). Keeping the head away from that directory is the sandbox's job;
this is the second line: without the key, writing the database forges nothing that is reused.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path

from orchestrator.config import ConfigError
from orchestrator.service.auth import TokenError, read_token

KEY_FILE = "record-key"
SCHEME = "hmac-sha256:"
KEY_BYTES = 32


class RecordKeyError(ConfigError):
    """The record key file cannot serve as one: unreadable, empty, not a regular file, readable by
    others, or not 64 hex digits. A ConfigError, so every command exits 2 on it, naming the file."""


def key_path(db_path: str | Path) -> Path:
    """Where the key lives: the state directory, beside the database."""
    return Path(db_path).parent / KEY_FILE


def ensure_key(path: Path) -> bytes:
    """The key in `path`, created (random, mode 0600) when the file does not exist."""
    if not os.path.lexists(path):
        _create(path)
    return read_key(path)


def _create(path: Path) -> None:
    """Write a fresh key whole under a temp name, then link it into place: a process racing us at
    first use reads either no file or a whole key, and whichever link lands first is the one key."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{KEY_FILE}.")  # mode 0600
    except OSError as e:
        raise RecordKeyError(f"record key file {path}: cannot create: {e}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: theirs is the key
    except OSError as e:
        raise RecordKeyError(f"record key file {path}: cannot create: {e}") from None
    finally:
        os.unlink(tmp)


def read_key(path: Path) -> bytes:
    try:
        text = read_token(path)  # the api-token's rules: a regular file, 0600, one printable line
    except TokenError as e:
        # auth words it for its token file; say which file this is, keep what was wrong with it.
        raise RecordKeyError(f"record key file {path}: {str(e).removeprefix(f'token file {path}: ')}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise RecordKeyError(f"record key file {path}: expected {2 * KEY_BYTES} hex digits ({KEY_BYTES} random "
                             "bytes) on one line")
    return key


def canonical(record_json: dict) -> bytes:
    """One byte string per JSON value, whatever its key order or spacing."""
    return json.dumps(record_json, sort_keys=True, separators=(",", ":")).encode()


def sign(record_json: dict, key: bytes) -> str:
    return SCHEME + hmac.new(key, canonical(record_json), hashlib.sha256).hexdigest()


def verify(record_json: dict, mac: str | None, key: bytes) -> bool:
    """`mac` is `sign(record_json, key)`; False for anything else (None, another scheme or key)."""
    if not isinstance(mac, str) or not mac.startswith(SCHEME):
        return False
    return hmac.compare_digest(sign(record_json, key).encode(), mac.encode("utf-8", "replace"))
