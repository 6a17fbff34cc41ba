"""The engine's error types. Bad input never surfaces as a raw KeyError or torch shape error."""


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded. The message names the file, the tensor or field, and what
    was expected against what was found."""


class CapacityError(Exception):
    """A request that cannot fit the KV cache / state slots, however long it waits."""

