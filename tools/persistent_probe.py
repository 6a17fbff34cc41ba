"""What a dependency between two weight streams costs: a kernel boundary under PDL, or a grid barrier
inside one persistent kernel, with and without the next phase's first bytes prefetched into L2 before
the barrier (issue 54's first question; the kernels and their why are in tools/persistent_probe.cu).

The phases are the NVFP4 bytes (packed codes and block scales) of the 27b's Gated DeltaNet layer's four
GEMMs, in order, for --layers layers, each in a buffer of its own (no phase reads what another left in
L2). Every variant's 4 x layers results are checked against torch before it is timed. Prints a table
and one JSON line:

    python -m tools.persistent_probe --layers 16 --iters 10

`over_floor_us_per_boundary`: the variant's time less the bytes' time at the read rate of one long
stream (`read_GBps`, one phase_kernel launch over a single buffer of --floor-gb), over the boundaries
(phases - 1). The engine's layer today is the `kernels+early` row's shape: a launch a GEMM, under PDL,
its first loads issued before the wait. `persistent+early`: the same loads issued before each barrier.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

HIDDEN, FFN, V_HEADS, K_DIM, V_DIM = 5120, 17_408, 48, 2048, 6144
# (N, K) of the 27b GDN layer's GEMMs in decode order (tools/tune/bench.py SHAPES): in_proj, out_proj, gate_up, down
GDN_LAYER = ((2 * K_DIM + 2 * V_DIM + 2 * V_HEADS, HIDDEN), (HIDDEN, V_DIM), (2 * FFN, HIDDEN), (HIDDEN, FFN))
SEED = 0x9E3779B9


def nvfp4_bytes(n: int, k: int) -> int:
    """Packed E2M1 codes (half a byte a weight) and E4M3 block scales (one per 16 weights), 16-aligned."""
    return (n * k // 2 + n * k // 16 + 15) // 16 * 16


def build():
    from torch.utils.cpp_extension import load
    src = Path(__file__).with_suffix(".cu")
    return load(name="regate_persistent_probe", sources=[str(src)], verbose=False,
                extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])


def reference(bufs: list[torch.Tensor], seed: int = SEED) -> list[int]:
    """out[p] = sum of (word ^ s_p) mod 2^32 over phase p's 32-bit words, s_0 = seed, s_p = out[p - 1]."""
    out, s = [], seed
    for b in bufs:
        signed = s - (1 << 32) if s >= 1 << 31 else s
        s = int((b.view(torch.int32) ^ signed).to(torch.int64).sum()) & 0xFFFFFFFF
        out.append(s)
    return out


def results(out: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in out.cpu().tolist()]


class Variants:
    """Each variant as a callable that runs every phase once into `self.out` (zeroed first)."""

    def __init__(self, ext, bufs: list[torch.Tensor], threads: int, per_sm: int):
        self.ext, self.bufs, self.threads = ext, bufs, threads
        self.ctas = ext.persistent_ctas(threads, per_sm)  # the same grid for every variant
        self.out = torch.zeros(len(bufs), dtype=torch.int32, device="cuda")
        self.ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
        self.n16 = torch.tensor([b.numel() * b.element_size() // 16 for b in bufs], dtype=torch.int64, device="cuda")

    def kernels(self, early: int):
        def run():
            self.out.zero_()
            for p, b in enumerate(self.bufs):
                self.ext.launch_phase(b, self.out, p, SEED, early, self.ctas, self.threads)
        return run

    def persistent(self, prefetch_bytes: int, early: int):
        def run():
            self.out.zero_()
            self.ext.launch_persistent(self.ptrs, self.n16, self.out, SEED, prefetch_bytes, early, self.ctas,
                                       self.threads)
        return run


def graphed(fn):
    """`fn` captured once in a CUDA graph (the engine's decode step is one), replayed after."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def time_ms(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every variant; the median is kept")
    ap.add_argument("--threads", type=int, default=512)
    ap.add_argument("--per-sm", type=int, default=2, help="CTAs an SM (every variant; all resident at once)")
    ap.add_argument("--prefetch-kb", default="64,256", help="L2 prefetch a CTA before each barrier, KiB, comma-separated")
    ap.add_argument("--early", type=int, default=4, help="16-byte loads a thread issued before each wait (0 to 4)")
    ap.add_argument("--floor-gb", type=float, default=2.0)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("persistent_probe: needs a CUDA GPU (sm_90)")
    ext = build()
    shapes = [s for _ in range(a.layers) for s in GDN_LAYER]
    bufs = [torch.randint(-2**31, 2**31 - 1, (nvfp4_bytes(n, k) // 4,), dtype=torch.int32, device="cuda")
            for n, k in shapes]
    total = sum(b.numel() * 4 for b in bufs)
    v = Variants(ext, bufs, a.threads, a.per_sm)
    runs = {"kernels": graphed(v.kernels(0)), f"kernels+early{a.early}": graphed(v.kernels(a.early)),
            "persistent": v.persistent(0, 0), f"persistent+early{a.early}": v.persistent(0, a.early)}
    runs.update({f"persistent+prefetch{kb}K": v.persistent(int(kb) * 1024, 0) for kb in a.prefetch_kb.split(",") if kb})
    want = reference(bufs)
    for name, fn in runs.items():
        fn()
        torch.cuda.synchronize()
        got = results(v.out)
        if got != want:
            bad = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
            raise SystemExit(f"persistent_probe: {name}: phase {bad} = {got[bad]:#x}, expected {want[bad]:#x}")
    one = torch.randint(-2**31, 2**31 - 1, (int(a.floor_gb * 1e9) // 16 * 4,), dtype=torch.int32, device="cuda")
    floor_out = torch.zeros(1, dtype=torch.int32, device="cuda")
    floor_ms = time_ms(graphed(lambda: ext.launch_phase(one, floor_out, 0, SEED, 0, v.ctas, a.threads)), a.iters)
    read_gbps = one.numel() * 4 / floor_ms / 1e6
    ms = {name: [] for name in runs}
    for _ in range(a.rounds):
        for name, fn in runs.items():
            ms[name].append(time_ms(fn, a.iters))
    floor = total / read_gbps / 1e6
    boundaries = len(bufs) - 1
    rows = {name: {"ms": statistics.median(t), "rounds_ms": t,
                   "over_floor_us_per_boundary": (statistics.median(t) - floor) * 1e3 / boundaries}
            for name, t in ms.items()}
    print(f"{'variant':28} {'ms':>8} {'GB/s':>7} {'us over floor a boundary':>25}")
    for name, r in rows.items():
        print(f"{name:28} {r['ms']:8.3f} {total / r['ms'] / 1e6:7.0f} {r['over_floor_us_per_boundary']:25.2f}")
    print(json.dumps({"probe": "persistent", "device": torch.cuda.get_device_name(), "phases": len(bufs),
                      "bytes": total, "ctas": v.ctas, "threads": a.threads, "read_GBps": read_gbps,
                      "floor_ms": floor, "variants": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
