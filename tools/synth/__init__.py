"""Synthetic checkpoints (issue 51: a tool beside the engine core, not inside it): `checkpoint.py`
writes one from a seed, `files.py` its safetensors shards and configs, `cache.py` keeps one per set of
parameters (`cached_checkpoint`, what the suites, grids and the box's resolver ask for), `cli.py` is
`python -m tools.synth`. It reads the engine's shapes and naming (engine/presets.py) and its fast
quantizer; the engine never imports it."""
