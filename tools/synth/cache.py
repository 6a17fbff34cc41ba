"""A cache of synthetic checkpoints, keyed by their generation parameters.

`cached_checkpoint(**params)` returns `$REGATE_CACHE/<key>` (default `~/.cache/regate/checkpoints`),
synthesizing it on a miss. Safe when processes race: each builds in its own temp dir and renames;
the loser discards its copy and uses the winner's (a published entry is always complete).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tools.synth.checkpoint import SYNTH_VERSION, make_checkpoint

DEFAULTS = {"preset": "tiny", "naming": "modelopt", "head": "nvfp4", "seed": 0, "layers": None,
            "quant_config": "legacy", "prefix": "model.", "max_shard_bytes": 2 * 1024**3}


def cache_root() -> Path:
    env = os.environ.get("REGATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "regate" / "checkpoints"


def cache_key(**params) -> str:
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"cached_checkpoint: unknown parameter(s) {sorted(unknown)}")
    full = {**DEFAULTS, **params, "synth_version": SYNTH_VERSION}
    digest = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:16]
    return f"{full['preset']}-{full['naming']}-{full['head']}-s{full['seed']}-{digest}"


def cached_checkpoint(**params) -> Path:
    """The checkpoint for these `make_checkpoint` parameters (minus `out`), built once per key."""
    path = cache_root() / cache_key(**params)
    if (path / "config.json").is_file():
        return path
    try:
        return make_checkpoint(path, **{**DEFAULTS, **params})
    except FileExistsError:
        if (path / "config.json").is_file():  # another process won the race
            return path
        raise
