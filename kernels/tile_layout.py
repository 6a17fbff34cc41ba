"""The tile layout: NVFP4 weights repacked once at load for the CUDA tile GEMM (csrc/nvfp4_tile_gemm.cu).

Contract (bytes, not a view): the first N_main = 16*floor(N/16) rows; K a multiple of 256.
- `words` int32 [N_main/16, K/64, 32 lanes, 4]: for row tile rt, K chunk c, lane (g = lane//4,
  t = lane%4) and MMA i (0..3), one word holds the 8 nibbles of output r in 0..3 (the m16n8k16 A
  registers a0..a3): row 16rt + g + 8*(r%2), K = 64c + 16t + 4i + 2*(r//2) + {0, 1}. Where each
  nibble bit sits in the word is whatever `decode_word` routes to the right bf16 bit (found by probing
  it, see `_ROUTE`), so the decoder below and the kernel's `decode_word` are the only definition.
- `codes` uint8 [N_main/16, K/256, 32 lanes, 4 chunks, 2]: the scale code of (row 16rt + g + 8*h,
  block 4*(4*cg + cc) + t) at [rt, cg, lane, cc, h]. Code = (e + 10) << 3 | mantissa for an E4M3
  scale 2^e * 1.mantissa (subnormals normalized, e in -9..8), 0 for a zero scale; decoded by the kernel
  into a bf16 with exponent field 224 + (e + 10), i.e. the scale times 2^107.
- Negative scales fold their sign into the block's nibbles; zero scales zero the block's nibbles (the
  decoded code of 0 is not 0, so the nibbles must be). NaN scales are refused.
- The N % 16 tail rows stay in the checkpoint layout (`tail_packed`, `tail_scale`).
Total bytes = the checkpoint's packed + scale bytes, exactly.

`emulate_dequant` reproduces the kernel's integer decode and bf16 products in torch, so the layout,
the decoder and the exponent bookkeeping are tested on the CPU against `nvfp4.dequantize_raw`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4 import BLOCK

ROW_TILE = 16
K_GROUP = 256  # K per scale-code load (4 chunks of 64)
OUT_SHIFT = 2.0**19  # nibble (x 2^-126) times decoded scale (x 2^107) = value x 2^-19
_MASK = 0x81C081C0
_LEFT_BITS, _LEFT_MUL = 0x001B001B, 0x1084
_BF16_ROLE = {15: 3, 8: 2, 7: 1, 6: 0}  # bf16 bit within a half -> the E2M1 nibble bit it carries


def decode_word(q: torch.Tensor) -> list[torch.Tensor]:
    """The kernel's decode, int64 arithmetic on uint32 values: word -> 4 bf16x2 bit patterns."""
    q = q.to(torch.int64) & 0xFFFFFFFF

    def rotr(v, s):
        return ((v >> s) | (v << (32 - s))) & 0xFFFFFFFF

    return [q & _MASK, rotr(q, 3) & _MASK, rotr(q, 6) & _MASK, (((q & _LEFT_BITS) * _LEFT_MUL) & 0xFFFFFFFF) & _MASK]


def _probe_route() -> list[tuple[int, int, int]]:
    """For word bit b: (output r, half h, nibble bit) that `decode_word` routes it to."""
    route = []
    for b in range(32):
        outs = decode_word(torch.tensor([1 << b]))
        hits = [(r, int(o)) for r, o in enumerate(outs) if int(o)]
        if len(hits) != 1 or hits[0][1] & (hits[0][1] - 1):
            raise AssertionError(f"decode_word routes bit {b} to {hits}: not a bit permutation")
        r, bit = hits[0][0], hits[0][1].bit_length() - 1
        route.append((r, bit // 16, _BF16_ROLE[bit % 16]))
    if len(set(route)) != 32:
        raise AssertionError("decode_word is not a bijection of the word's 32 bits")
    return route


_ROUTE = _probe_route()


@dataclass
class TileOperand:
    words: torch.Tensor  # int32 [N_main/16, K/64, 32, 4]
    codes: torch.Tensor  # uint8 [N_main/16, K/256, 32, 4, 2]
    tail_packed: torch.Tensor  # uint8 [N % 16, K/2]
    tail_scale: torch.Tensor  # uint8 [N % 16, K/16] (E4M3 bytes)
    n: int
    k: int

    @property
    def n_main(self) -> int:
        return self.words.shape[0] * ROW_TILE

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.words, self.codes, self.tail_packed, self.tail_scale))

    def checkpoint_layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight back in the checkpoint layout (see `checkpoint_layout`)."""
        return checkpoint_layout(self)


def supported(n: int, k: int) -> str | None:
    """None when the tile layout can hold an [N, K] weight, else why not."""
    if k % K_GROUP:
        return f"K={k} is not a multiple of {K_GROUP}"
    if n < ROW_TILE:
        return f"N={n} is below one {ROW_TILE}-row tile"
    return None


def _code_table() -> torch.Tensor:
    """E4M3 magnitude byte (0..127) -> scale code; -1 for NaN (0x7F)."""
    table = []
    for mag in range(128):
        e_field, mant = mag >> 3, mag & 7
        if mag == 0x7F:
            table.append(-1)
        elif e_field == 0 and mant == 0:
            table.append(0)
        elif e_field == 0:  # subnormal: mant * 2^-9, renormalized to 2^e * 1.m
            h = mant.bit_length() - 1
            table.append((h - 9 + 10) << 3 | ((mant << (3 - h)) & 7))
        else:
            table.append((e_field - 7 + 10) << 3 | mant)
    return torch.tensor(table, dtype=torch.int32)


_CODES = _code_table()


def _magnitude_table() -> torch.Tensor:
    """Scale code -> E4M3 magnitude byte: `_code_table` inverted (every finite magnitude has its own code)."""
    inv = torch.full((256,), -1, dtype=torch.int32)
    for mag, code in enumerate(_CODES.tolist()):
        if code >= 0:
            inv[code] = mag
    return inv


_MAGNITUDES = _magnitude_table()


def scale_codes(scale_bytes: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 bytes -> (codes uint8, sign-or-zero flags: 1 negate the block, 0 keep, -1 zero it)."""
    b = scale_bytes.to(torch.int32)
    codes = _CODES.to(b.device)[b & 0x7F]
    if (codes < 0).any():
        row, blk = (codes < 0).nonzero()[0].tolist()
        raise ValueError(f"{name}: block_scale[{row}, {blk}] is NaN (E4M3 0x7F/0xFF); expected a finite scale")
    action = torch.where(codes == 0, -1, (b >> 7) & 1)
    return codes.to(torch.uint8), action


def _nibbles(packed: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """u8 [N, K/2] -> int32 [N, K] nibbles with the blocks' sign folded in and zero blocks zeroed."""
    p = packed.to(torch.int32)
    nib = torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)
    act = action.repeat_interleave(BLOCK, dim=1)
    nib = torch.where(act == 1, nib ^ 0x8, nib)
    return torch.where(act == -1, torch.zeros_like(nib), nib)


def _pack_words(nib: torch.Tensor) -> torch.Tensor:
    """int32 nibbles [N_main, K] -> int32 words [RT, K/64, 32, 4]."""
    n, k = nib.shape
    v = nib.view(n // 16, 2, 8, k // 64, 4, 4, 2, 2)  # rt, rh, g, c, t, i, kh, half
    v = v.permute(0, 3, 2, 4, 5, 6, 1, 7)  # rt, c, g, t, i, kh, rh, half -> r = 2*kh + rh
    v = v.reshape(n // 16, k // 64, 32, 4, 4, 2)
    word = torch.zeros(v.shape[:4], dtype=torch.int64, device=nib.device)
    for b, (r, h, bit) in enumerate(_ROUTE):
        word |= ((v[..., r, h] >> bit) & 1).to(torch.int64) << b
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N_main, K/16] -> [RT, K/256, 32, 4, 2]."""
    n, kb = codes.shape
    v = codes.view(n // 16, 2, 8, kb // 16, 4, 4)  # rt, h, g, cg, cc, t
    return v.permute(0, 3, 2, 5, 4, 1).reshape(n // 16, kb // 16, 32, 4, 2).contiguous()


def repack(packed: torch.Tensor, block_scale: torch.Tensor, name: str = "weight",
           rows_per_step: int = 4096) -> TileOperand:
    """Checkpoint layout -> TileOperand on the same device, `rows_per_step` rows at a time."""
    n, k = packed.shape[0], packed.shape[1] * 2
    why = supported(n, k)
    if why:
        raise ValueError(f"{name}: tile layout unsupported: {why}")
    sb = block_scale.view(torch.uint8)
    n_main = n - n % ROW_TILE
    words = torch.empty(n_main // 16, k // 64, 32, 4, dtype=torch.int32, device=packed.device)
    codes = torch.empty(n_main // 16, k // K_GROUP, 32, 4, 2, dtype=torch.uint8, device=packed.device)
    step = max(ROW_TILE, rows_per_step - rows_per_step % ROW_TILE)
    for r0 in range(0, n_main, step):
        r1 = min(n_main, r0 + step)
        c, action = scale_codes(sb[r0:r1], name)
        words[r0 // 16:r1 // 16] = _pack_words(_nibbles(packed[r0:r1], action))
        codes[r0 // 16:r1 // 16] = _pack_codes(c)
    return TileOperand(words, codes, packed[n_main:].clone(), sb[n_main:].clone(), n, k)


def _unpack_words(words: torch.Tensor) -> torch.Tensor:
    """`_pack_words` inverted: int32 words [RT, K/64, 32, 4] -> int32 nibbles [N_main, K]."""
    rt, nc = words.shape[:2]
    w = words.to(torch.int64) & 0xFFFFFFFF
    v = torch.zeros(rt, nc, 32, 4, 4, 2, dtype=torch.int32, device=words.device)  # ..., r, half
    for b, (r, h, bit) in enumerate(_ROUTE):
        v[..., r, h] |= (((w >> b) & 1) << bit).to(torch.int32)
    v = v.view(rt, nc, 8, 4, 4, 2, 2, 2)  # rt, c, g, t, i, kh, rh, half
    return v.permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(rt * 16, nc * 64)  # rt, rh, g, c, t, i, kh, half


def _unpack_codes(codes: torch.Tensor) -> torch.Tensor:
    """`_pack_codes` inverted: [RT, K/256, 32, 4, 2] -> uint8 codes [N_main, K/16]."""
    rt, ng = codes.shape[:2]
    v = codes.view(rt, ng, 8, 4, 4, 2)  # rt, cg, g, t, cc, h
    return v.permute(0, 5, 2, 1, 4, 3).reshape(rt * 16, ng * 16)  # rt, h, g, cg, cc, t


def checkpoint_layout(op: TileOperand, rows_per_step: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """`repack` inverted, on the operand's device: (packed u8 [N, K/2], block_scale E4M3 [N, K/16]).

    Exact up to what repack folds: a negative scale comes back positive with its block's nibbles
    negated, a zero scale with its block's nibbles zeroed. `dequantize_raw` of the result equals that
    of the original bit for bit (a zero may change sign), and repacking it gives the same operand.
    """
    n_main, k = op.n_main, op.k
    packed = torch.empty(op.n, k // 2, dtype=torch.uint8, device=op.words.device)
    scale = torch.empty(op.n, k // BLOCK, dtype=torch.uint8, device=op.words.device)
    step = max(1, rows_per_step // ROW_TILE)
    mags = _MAGNITUDES.to(op.words.device)
    for t0 in range(0, op.words.shape[0], step):
        t1 = min(op.words.shape[0], t0 + step)
        nib = _unpack_words(op.words[t0:t1]).view(-1, k // 2, 2)
        packed[16 * t0:16 * t1] = (nib[..., 0] | (nib[..., 1] << 4)).to(torch.uint8)
        scale[16 * t0:16 * t1] = mags[_unpack_codes(op.codes[t0:t1]).long()].to(torch.uint8)
    packed[n_main:] = op.tail_packed
    scale[n_main:] = op.tail_scale
    return packed, scale.view(torch.float8_e4m3fn)


def _bf16_bits_to_f64(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32).double()


def emulate_fragments(op: TileOperand, global_scale: float) -> torch.Tensor:
    """What the kernels' registers hold, in FP64: [RT, K/64, 32 lanes, 4 steps i, 4 registers r, 2 halves]
    = decoded word times decoded scale (each product checked to be a bf16, as the kernel's
    mul.rn.bf16x2 makes it) times global_scale * 2^19."""
    rt, nc = op.words.shape[:2]
    outs = decode_word(op.words)  # 4 x [RT, C, 32, 4] of bf16x2 bit patterns
    halves = torch.stack([torch.stack((o & 0xFFFF, o >> 16), -1) for o in outs], dim=-2)  # [...,4 i, 4 r, 2]
    vals = _bf16_bits_to_f64(halves)
    code = op.codes.to(torch.int64).view(rt, nc // 4, 32, 4, 2)  # rt, cg, lane, cc, h
    scale_bits = (code << 4) + 0x7000
    s = _bf16_bits_to_f64(scale_bits).view(rt, nc // 4, 32, 4, 2).permute(0, 1, 3, 2, 4).reshape(rt, nc, 32, 2)
    r_half = torch.tensor([0, 1, 0, 1])  # output r -> row half (r % 2)
    prod = vals * s[:, :, :, None, r_half, None]  # [RT, C, 32, 4 i, 4 r, 2]
    if not torch.equal(prod, prod.float().to(torch.bfloat16).double()):
        raise AssertionError("a nibble x scale product is not exact in bf16")
    return prod * (global_scale * OUT_SHIFT)


def emulate_dequant(op: TileOperand, global_scale: float) -> torch.Tensor:
    """The kernel's view of W [N_main, K] in FP64, in the checkpoint's K order (the word contract)."""
    prod = emulate_fragments(op, global_scale)
    rt, nc = prod.shape[:2]
    # rt, c, g, t, i, kh, rh, half -> rt, rh, g, c, t, i, kh, half
    return prod.reshape(rt, nc, 8, 4, 4, 2, 2, 2).permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(rt * 16, nc * 64)
