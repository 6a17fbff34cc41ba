"""Synthetic checkpoints (issue 51: a tool beside the engine core, not inside it): `checkpoint.py`
writes one from a seed and a preset (`presets.py`: the named shapes), `files.py` its safetensors shards
and configs (the quantization config's writers too), `cache.py` keeps one per set of parameters
(`cached_checkpoint`, what the suites, grids and the box's resolver ask for), `cli.py` is
`python -m tools.synth`. It reads the engine's tensor layout and naming (engine/presets.py,
engine/quant_config.py); the engine never imports it."""
