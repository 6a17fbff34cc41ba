"""`engine build`: compile and warm the packed NVFP4 GEMM and print its build marker.

The marker is what the orchestrator's build step looks for; a CUDA box whose build lacks the
ENABLED line is not gated:
    packed NVFP4 W4A16 GEMM: ENABLED for sm_90
    packed NVFP4 W4A16 GEMM: DISABLED (<reason>)
DISABLED because the machine cannot run the kernel (no GPU, no Triton, another arch) exits 0: the
build is what that machine can build. DISABLED because the kernel failed to compile or to match
its reference on an sm_90 GPU exits 1: that build is degraded.
"""
from __future__ import annotations

import typer

MARKER = "packed NVFP4 W4A16 GEMM"
WARM_K = 512  # a multiple of every table BLOCK_K, so the warm-up takes the unmasked kernels
WARM_N = 1000  # not a multiple of any BLOCK_N: the masked N tail is compiled and checked too
MAX_REL_ERR = 1e-2


def enabled_line(arch: str) -> str:
    return f"{MARKER}: ENABLED for {arch}"


def disabled_line(reason: str) -> str:
    return f"{MARKER}: DISABLED ({reason})"


def warm_and_check() -> str | None:
    """Build the CUDA tile GEMM and run every table row of both kernels once against the
    reference; None when all pass, else why not. An sm_90 box must build both."""
    from kernels import table
    from kernels.nvfp4_gemm import check, tile_available

    ok, why = tile_available()
    if not ok:
        return why
    for kernel, rows in (("tile", table.TILE), ("triton", table.TRITON)):
        ms = sorted({min(max_m, 256) for max_m, _ in rows} | {1})
        try:
            errs = check(ms=tuple(ms), n=WARM_N, k=WARM_K, kernel=kernel)
        except Exception as e:  # a compile or launch failure is a degraded build, reported in the marker
            return f"{kernel} kernel failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        bad = {m: e for m, e in errs.items() if not e <= MAX_REL_ERR}
        if bad:
            return f"{kernel} kernel wrong: relative error {bad} above {MAX_REL_ERR}"
    return None


def build() -> tuple[str, int]:
    """(marker line, exit code)."""
    from kernels.nvfp4_gemm import available

    ok, why = available()
    if not ok:
        return disabled_line(why), 0
    failure = warm_and_check()
    if failure:
        return disabled_line(failure), 1
    return enabled_line(why), 0


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build_cmd() -> None:
        """Compile and warm the packed NVFP4 GEMM; print its ENABLED/DISABLED marker."""
        line, code = build()
        typer.echo(line)
        raise typer.Exit(code)
