"""KernelPolicy: the kernel-level switches of one engine (issue 51), passed to each kernel call.

They were REGATE_* environment variables read at import or per call; now the engine's options
(engine/options.py, which nests this) carry them and the engine binds them to the kernels it picks
(engine/fused.py, engine/backends.py). A kernel called without one runs the defaults below, which
are what the engine runs. It lives in kernels/ so no kernel imports the engine's options.

Each field's why sits where it is read: kernels/table.py (tile_by_shape,
dequant_min_m), kernels/tile_gemm.py (split_waves), kernels/gdn_decode.py (delta_target),
kernels/nvfp4_gemm.py (tile_gemm).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelPolicy:
    tile_gemm: bool = True  # the CUDA tile GEMM where it builds; False: the Triton GEMM only
    tile_by_shape: bool = True  # table.TILE_BY_SHAPE's rows ahead of TILE's
    dequant_min_m: int | None = None  # None: table.DEQUANT_BY_SHAPE; 0: never; M: from M rows, every shape
    split_waves: int = 2  # split K until the CTAs fill the SMs this many times over
    delta_target: int = 1024  # Gated DeltaNet decode: a value head split over programs until a step has about this many

    def __post_init__(self):
        for name, ok, expected in (
            ("dequant_min_m", self.dequant_min_m is None or self.dequant_min_m >= 0, "None or an M >= 0"),
            ("split_waves", self.split_waves >= 1, "a count of waves >= 1"),
            ("delta_target", self.delta_target >= 1, "a positive number of programs"),
        ):
            if not ok:
                raise ValueError(f"option {name}: expected {expected}, found {getattr(self, name)!r}")


DEFAULT = KernelPolicy()
