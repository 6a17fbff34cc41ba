"""The last-JSON-line protocol: a tool prints a table for people and ONE JSON object line for
machines, last; its caller takes the last line that parses as a JSON object."""
from __future__ import annotations

import json


def last_json_object(stdout: str) -> dict | None:
    """The last line of `stdout` that starts with `{` and parses as JSON (None if there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.strip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            return record if isinstance(record, dict) else None
    return None
