"""Experiment probe (not a product file): the wgmma kernel with REGATE_PROBE bits on the head shape.
bit 1: no x traffic after the first stages; bit 2: weights re-read from the first K group (L2 hits);
bit 4: three weight buffers; bit 8: no x pipeline (barrier, mbarrier wait, copy) after stage 0;
bit 16: no weight loads after the first groups. One JSON line at the end."""
import json
import os
import time

import torch

from kernels.bench import time_tile
from kernels.tile_gemm import WgmmaConfig


def with_probe(bits, fn):
    os.environ["REGATE_PROBE"] = str(bits)
    try:
        return fn()
    finally:
        os.environ.pop("REGATE_PROBE", None)


rows = []
cfgs = {16: [WgmmaConfig(16, 1, 2)], 64: [WgmmaConfig(64, 2, 1)]}
for rep in range(2):
    for m, cs in cfgs.items():
        for cfg in cs:
            for bits in (0, 3, 11, 19, 27, 24, 8, 16):
                ms = with_probe(bits, lambda: time_tile(248320, 5120, m, cfg))
                t = time.strftime("%H:%M:%S")
                print(f"{t} M={m:3d} {cfg} probe={bits} {ms:.4f} ms", flush=True)
                rows.append({"t": t, "m": m, "cfg": cfg.__dict__, "probe": bits, "ms": round(ms, 4)})
print(json.dumps(rows))
