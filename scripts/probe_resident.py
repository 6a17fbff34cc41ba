"""Probe of the resident wgmma kernel (csrc/nvfp4_wgmma_resident.cu) on the H200: its built configs at
M 1 and 16 on the head shape, L2 prefetch distance 0-8 groups, beside the table's config. One JSON line."""
import json
from kernels import tile_gemm
from kernels.bench import time_tile
from kernels.tile_gemm import WgmmaConfig

rows = []
for m in (1, 16):
    for cfg in [tile_gemm.config_for(m)] + [WgmmaConfig(16, wg, rb, resident=True) for wg, rb in ((2, 2), (3, 1), (4, 1))]:
        for pf in ((0, 1, 2, 4, 8) if cfg.__dict__.get("resident") else (None,)):
            if pf is not None:
                tile_gemm.RESIDENT_PREFETCH = pf
            ms = time_tile(248320, 5120, m, cfg)
            rows.append({"m": m, "cfg": cfg.__dict__, "prefetch": pf, "ms": round(ms, 4)})
            print(f"M={m:3d} {cfg} pf={pf} {ms:.4f} ms", flush=True)
print(json.dumps(rows))
