"""Offline tuning of the CUDA tile GEMM: time every built config per (shape, M), each checked against
the reference first, so `kernels/table.py`'s TILE can be fixed by a person (`python -m tools.tune.bench
--tile-sweep [--shapes ...] [--ms ...]`). Prints every timing, the best per (shape, M), one JSON line.
"""
from __future__ import annotations

from kernels import table
from kernels.table import BUILT, WGMMA_BLOCK_M, WGMMA_MAX_BM_2_ROW_BLOCKS, Config, TileConfig, WgmmaConfig, config_from_dict
from tools.tune.sweep import run_sweep
from tools.tune.sweep import table_from_sweep as fastest_per_m


KINDS = ("sync", "wgmma")


def candidates(m: int, kinds=KINDS) -> list[Config]:
    """mma.sync: every built (rows_per_warp, warps), x in L1 or shared, at the m_tiles that cover M in
    one block and one smaller, minus the combinations that spill (4 row tiles at m_tiles >= 4).
    wgmma: 1 or 2 warpgroups, 1 or 2 row blocks (where built), at the block_m that covers M (at most
    256) and one smaller.
    The table's current config for M is always a candidate (the incumbent)."""
    need = min(8, 1 << max(0, (-(-m // 8) - 1).bit_length()))
    tiles = sorted({need, max(1, need // 2)})
    out = [table.config_for(m, table.TILE)]
    if "sync" in kinds:
        out += [TileConfig(mt, r, w, xs, b) for mt in tiles for r, w, b in BUILT for xs in (False, True)
                if not (r == 4 and mt >= 4)]
    cover = next((b for b in WGMMA_BLOCK_M if b >= m), WGMMA_BLOCK_M[-1])
    blocks = sorted({cover, max(WGMMA_BLOCK_M[0], cover // 2)})
    if "wgmma" in kinds:
        out += [WgmmaConfig(b, wg, rb) for b in blocks for wg in (1, 2) for rb in (1, 2)
                if rb == 1 or b <= WGMMA_MAX_BM_2_ROW_BLOCKS]
    return list(dict.fromkeys(out))


def label(c: Config) -> str:
    if isinstance(c, WgmmaConfig):
        return f"wgmma bm{c.block_m} wg{c.warpgroups} rb{c.row_blocks}"
    return f"tile mt{c.m_tiles} r{c.rows_per_warp} w{c.warps} b{c.min_ctas} {'xs' if c.x_shared else 'xl1'}"


def correct(cfg: Config, m: int) -> bool:
    import torch

    from kernels.nvfp4_gemm import random_weight, reference_gemm, relative_error
    from kernels.tile_gemm import tile_gemm
    from kernels.tile_layout import repack

    if not hasattr(correct, "op"):
        correct.w = random_weight(4096 + 8, 1024, "cuda", seed=int(torch.randint(0, 1 << 16, ())))
        correct.op = repack(correct.w[0], correct.w[1])
    packed, scale, gs = correct.w
    x = torch.randn(m, 1024, device="cuda").bfloat16()
    y = tile_gemm(x, correct.op, gs, config=cfg,
                  out=torch.full((m, packed.shape[0]), float("nan"), device="cuda", dtype=torch.bfloat16))
    return bool(torch.isfinite(y).all()) and relative_error(y, reference_gemm(x, packed, scale, gs)) <= 1e-2


def table_from_sweep(results: list[dict], shape: str = "lm_head") -> tuple:
    """The fastest tile config per swept M of `shape`, as a TILE table."""
    return fastest_per_m(results, shape, make=lambda **d: config_from_dict(d))


def sweep(shapes: dict, ms: list[int], out_path: str | None, time_fn, kinds=KINDS) -> None:
    """`time_fn`: the bench's `time_tile` (passed in: the sweep and the bench do not import each other)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"tile sweep kinds: expected a subset of {KINDS}, found {sorted(unknown)}")
    run_sweep("tile_gemm", shapes, ms, out_path, candidates=lambda m: candidates(m, kinds), correct=correct,
              time_fn=time_fn, label=label)


def by_shape_rows(results: list[dict], min_gain: float = 0.05) -> dict[tuple[int, int], tuple]:
    """table.TILE_BY_SHAPE from a tile sweep: per (N, K), a row for each of TILE's M bands where one
    config beats TILE's own by at least `min_gain` (summed over the band's swept M, among the configs
    timed at all of them). A band with no such config below one that has a row gets TILE's config
    spelled out (rows are read in order, the first that serves M wins); bands above the last row
    fall through to TILE."""
    bands: dict[tuple[int, int], dict[int, dict[int, list[dict]]]] = {}
    for r in results:
        band = next((mx for mx, _ in table.TILE if r["m"] <= mx), table.TILE[-1][0])
        bands.setdefault((r["n"], r["k"]), {}).setdefault(band, {}).setdefault(r["m"], []).append(r)
    out = {}
    for key, per_band in bands.items():
        rows = []
        for band in sorted(per_band):
            timed = {m: {config_from_dict(r["config"]): r["ms"] for r in rs} for m, rs in per_band[band].items()}
            incumbent = table.config_for(min(timed), table.TILE)
            common = set.intersection(*(set(t) for t in timed.values()))
            if incumbent not in common:
                continue  # TILE's own config was not timed at every M of the band: nothing to beat
            totals: dict[Config, float] = {c: sum(t[c] for t in timed.values()) for c in common}
            best = min(common, key=totals.__getitem__)
            rows.append((band, best if totals[best] <= (1 - min_gain) * totals[incumbent] else None))
        while rows and rows[-1][1] is None:
            rows.pop()
        if rows:
            out[key] = tuple((band, cfg or table.config_for(band, table.TILE)) for band, cfg in rows)
    return out
