"""The run page's poller: the one script a report may carry, and the hash that lets it run.

A QUEUED or RUNNING run's page embeds `SCRIPT` (templates/live.js) inline, so the page stays one
self-contained file with no external asset. The HTTP front's Content-Security-Policy allows exactly
this script by its hash (`SCRIPT_SOURCE`) and no other: an injected script, even inline, never runs.
A finished run's page carries no script at all. Standard library only: the HTTP front imports it.
"""
from __future__ import annotations

import base64
import hashlib
from pathlib import Path

SCRIPT = (Path(__file__).with_name("templates") / "live.js").read_text(encoding="utf-8")
# The CSP source expression for the script, as the template writes it: <script>SCRIPT</script>.
SCRIPT_SOURCE = "'sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode() + "'"
POLL_MS = 2000  # how often the page asks for the run record
LIVE_STATES = ("QUEUED", "RUNNING")  # the states whose page follows the run
