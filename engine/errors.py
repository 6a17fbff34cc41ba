"""The engine's error types. Bad input never surfaces as a raw KeyError or torch shape error."""


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded. The message names the file, the tensor or field, and what
    was expected against what was found."""


class CapacityError(Exception):
    """A request that cannot fit the KV cache / state slots, however long it waits."""


class AblationError(ValueError):
    """The option ablate names something unknown, or an ablated engine was asked for where tokens or
    numbers must be real (engine/ablate.py)."""
