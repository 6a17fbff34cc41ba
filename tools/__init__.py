"""Tools beside the engine core (issue 51): code that measures or tunes the engine and its kernels
but that no product module imports (tests/test_import_layers.py FLOORS; the one exception: the
suites build their checkpoints with tools/synth). tools/tune: the kernels' benchmark and offline
sweeps, whose results are written into kernels/table.py by hand; tools/attribution: where a decode
step's time goes; tools/synth: synthetic checkpoints and their cache."""
