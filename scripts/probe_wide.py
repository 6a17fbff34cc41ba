# EXPERIMENT (not committed): wide kernel variants at the head shape beside the table's config.
import json, torch
from kernels.bench import time_tile
from kernels.tile_gemm import WideConfig, tile_gemm
from kernels.tile_layout import repack
from kernels.nvfp4_gemm import random_weight, reference_gemm, relative_error
packed, scale, gs = random_weight(4096 + 48, 1024, "cuda", 7)
op = repack(packed, scale)
for pf in ():
    for m in (1, 17, 64, 130):
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        for sms in (132, 1):
            y = tile_gemm(x, op, gs, config=WideConfig(pf), sms=sms)
            print("check", pf, m, sms, float(relative_error(y, reference_gemm(x, packed, scale, gs))), flush=True)
for rep in range(2):
    for m in (64, 32):
        for name, cfg in [("incumbent", None), ("ws", WideConfig(5)), ("ws no STS", WideConfig(6)),
                          ("ws no wgmma", WideConfig(7)), ("rs pf0", WideConfig(0))]:
            print(json.dumps({"m": m, "cfg": name, "ms": round(time_tile(248320, 5120, m, cfg, rep_ms=60), 4)}), flush=True)
