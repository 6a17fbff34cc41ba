"""The Triton kernels of the packed NVFP4 W4A16 GEMM (imported only where Triton is installed).

Data layout (the checkpoint's own bytes; nothing is repacked):
  x      bf16 [M, K]      row-major; the MMA kernel takes it with each 8 columns permuted (below)
  w      i32  [N, K/8]    the packed u8 [N, K/2] viewed as little-endian words: nibble j of word c
                          (bits 4j..4j+3) is W[n, 8c + j] (element 0 in the LOW nibble of byte 0)
  scale  u8   [N, K/16]   the E4M3 block scales, viewed as raw bytes
  y      bf16 [M, N]      or, with split-K, FP32 partials [SPLIT, M, N] summed by `reduce_splits_kernel`

Dequantization happens in registers by bit tricks, exactly (nothing is rounded before the FP32
accumulator), two 16-bit lanes per 32-bit instruction: nibbles j and j+4 of a word sit 16 bits
apart, so one shift + mask places both.
  GEMV: nibble s|eem -> FP16 bits (s << 15) | (eem << 9) = e2m1 * 2^-14 (FP16's subnormal covers
      E2M1's 0.5), widened to FP32; FMA with x; the block scale multiplies each 16-value partial sum.
  MMA: nibble -> BF16 bits (s << 15) | (eem << 6) = e2m1 * 2^-126 (0.5 lands on a BF16 subnormal,
      which mul.bf16x2 keeps), times the block scale in one mul.rn.bf16x2: e2m1 * e4m3 has at most 6
      significant bits, so the BF16 operand is exact.
  E4M3 byte s|eeeemmm -> FP16 bits (s << 15) | (eeeemmm << 7) = e4m3 * 2^-8, same reasoning.
  The powers of two are folded into one FP32 `out_scale = global_scale * 2^22` on the accumulator.

`gemv_kernel`: M = 1 (any M works: one pass of the decoded tile per row). `mma_kernel`: larger M,
"swap AB": the dequantized weight tile is the A operand [BLOCK_N, BLOCK_K] and x^T the B operand,
so the tensor-core tile's narrow side is M. Both take a split-K grid axis for shapes whose N alone
cannot fill the SMs. `USE_ASM` is set on the GPU; under Triton's CPU interpreter (no PTX there)
plain-Triton twins decode the same bits and the dot runs in FP32 (the interpreter's BF16 tl.dot is
broken; the values are exact in either).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _e2m1_word_asm(q):
    """int32 word of 8 nibbles -> its 8 values (element j = nibble j) as FP32, each e2m1 * 2^-14.

    Two FP16 lanes per 32-bit op: nibbles j and j+4 sit 16 bits apart, so one shift-and-mask
    places both (magnitude at bits 9..11, sign at 15 of each half); cvt.f32.f16 widens each half.
    """
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, w0, w1, w2, w3;
        .reg .b16 l0, h0, l1, h1, l2, h2, l3, h3;
        shl.b32 a, $8, 9;  and.b32 a, a, 0x0E000E00; shl.b32 b, $8, 12; and.b32 b, b, 0x80008000; or.b32 w0, a, b;
        shl.b32 a, $8, 5;  and.b32 a, a, 0x0E000E00; shl.b32 b, $8, 8;  and.b32 b, b, 0x80008000; or.b32 w1, a, b;
        shl.b32 a, $8, 1;  and.b32 a, a, 0x0E000E00; shl.b32 b, $8, 4;  and.b32 b, b, 0x80008000; or.b32 w2, a, b;
        shr.b32 a, $8, 3;  and.b32 a, a, 0x0E000E00; and.b32 b, $8, 0x80008000; or.b32 w3, a, b;
        mov.b32 {l0, h0}, w0; mov.b32 {l1, h1}, w1; mov.b32 {l2, h2}, w2; mov.b32 {l3, h3}, w3;
        cvt.f32.f16 $0, l0; cvt.f32.f16 $1, l1; cvt.f32.f16 $2, l2; cvt.f32.f16 $3, l3;
        cvt.f32.f16 $4, h0; cvt.f32.f16 $5, h1; cvt.f32.f16 $6, h2; cvt.f32.f16 $7, h3;
        }""",
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,r",
        args=[q], dtype=(tl.float32,) * 8, is_pure=True, pack=1)


@triton.jit
def _e2m1_word_ref(q):
    """The same decode in plain Triton (the CPU interpreter cannot run PTX)."""
    out0 = _nibble_f32(q, 0)
    out1 = _nibble_f32(q, 4)
    out2 = _nibble_f32(q, 8)
    out3 = _nibble_f32(q, 12)
    out4 = _nibble_f32(q, 16)
    out5 = _nibble_f32(q, 20)
    out6 = _nibble_f32(q, 24)
    out7 = _nibble_f32(q, 28)
    return out0, out1, out2, out3, out4, out5, out6, out7


@triton.jit
def _nibble_f32(q, shift: tl.constexpr):
    n = (q >> shift) & 0xF
    bits = ((n & 0x7) << 9) | ((n & 0x8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _split8(x):
    """[R, 8] -> its 8 columns, each [R]."""
    c0, c1 = tl.split(tl.reshape(x, [x.shape[0], 2, 2, 2]))
    b00, b01 = tl.split(c0)
    b10, b11 = tl.split(c1)
    x0, x4 = tl.split(b00)
    x2, x6 = tl.split(b01)
    x1, x5 = tl.split(b10)
    x3, x7 = tl.split(b11)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _e2m1_word_bf16_asm(q, mult):
    """int32 word of 8 nibbles and an FP32 multiplier -> 8 BF16 values e2m1 * 2^-126 * mult.

    Nibbles j and j+4 go to the two BF16 lanes of one register (magnitude at bits 6..8, the low
    exponent bits and top mantissa bit; sign at 15), a BF16 of value e2m1 * 2^-126 (0.5 lands on a
    BF16 subnormal, which mul.bf16x2 handles); one mul.rn.bf16x2 applies the block scale to both.
    The product e2m1 * e4m3 has at most 6 significant bits, so the BF16 result is exact.
    """
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, s2, w0, w1, w2, w3;
        cvt.rn.bf16x2.f32 s2, $9, $9;
        shl.b32 a, $8, 6;  and.b32 a, a, 0x01C001C0; shl.b32 b, $8, 12; and.b32 b, b, 0x80008000; or.b32 w0, a, b;
        shl.b32 a, $8, 2;  and.b32 a, a, 0x01C001C0; shl.b32 b, $8, 8;  and.b32 b, b, 0x80008000; or.b32 w1, a, b;
        shr.b32 a, $8, 2;  and.b32 a, a, 0x01C001C0; shl.b32 b, $8, 4;  and.b32 b, b, 0x80008000; or.b32 w2, a, b;
        shr.b32 a, $8, 6;  and.b32 a, a, 0x01C001C0; and.b32 b, $8, 0x80008000; or.b32 w3, a, b;
        mul.rn.bf16x2 w0, w0, s2; mul.rn.bf16x2 w1, w1, s2; mul.rn.bf16x2 w2, w2, s2; mul.rn.bf16x2 w3, w3, s2;
        mov.b32 {$0, $4}, w0; mov.b32 {$1, $5}, w1; mov.b32 {$2, $6}, w2; mov.b32 {$3, $7}, w3;
        }""",
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r,r",
        args=[q, mult], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)


@triton.jit
def _interleave8(t0, t1, t2, t3, t4, t5, t6, t7):
    """8 tensors [R, C] (element j of each word) -> [R, 8C] with word c's elements at 8c..8c+7 in the
    order t0 t4 t1 t5 t2 t6 t3 t7: the pairs the decode made share a 32-bit register already, so the
    MMA operand needs no byte permutes. The launcher permutes x's columns the same way (the sum over
    K does not care about order; permuting pointers in-kernel instead made x's loads scalar)."""
    a0 = tl.join(tl.join(tl.join(t0, t2), tl.join(t1, t3)), tl.join(tl.join(t4, t6), tl.join(t5, t7)))
    return tl.reshape(a0, [t0.shape[0], t0.shape[1] * 8])


@triton.jit
def _e4m3(b):
    """u8 tile of E4M3 bytes -> FP32, each e4m3 * 2^-8 (exact)."""
    b = b.to(tl.uint16)
    h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _store(y_ptr, acc_mn, offs_m, offs_n, M, N, stride_ym, pid_k, stride_ys, out_scale,
           SPLIT: tl.constexpr):
    """acc_mn [BLOCK_M, BLOCK_N] -> y (BF16) or this split's FP32 partial."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = offs_m[:, None] * stride_ym + offs_n[None, :]
    out = acc_mn * out_scale
    if SPLIT == 1:
        tl.store(y_ptr + ptrs, out.to(tl.bfloat16), mask=mask)
    else:
        tl.store(y_ptr + pid_k * stride_ys + ptrs, out, mask=mask)


# M (and M*N) vary call to call; not specializing them on divisibility keeps one compiled variant
# per config, so prepare()'s warm-up covers every M and nothing compiles inside a CUDA-graph capture.
_VARYING = ["M", "stride_ys"]


@triton.jit(do_not_specialize=_VARYING)
def gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, k_per_split,
                stride_xm, stride_wn, stride_sn, stride_ym, stride_ys, out_scale,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
                USE_ASM: tl.constexpr):
    """w_ptr: the packed bytes viewed as int32 words [N, K/8] (stride_wn in words)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    WORDS: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_lo = pid_k * k_per_split  # the launcher splits K into equal whole tiles
    for kk in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        k0 = tl.multiple_of(k_lo + kk, BLOCK_K)
        kw = k0 // 8 + tl.arange(0, WORDS)
        ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        if EVEN_K:  # no K mask: keeps the word loads 16 bytes wide
            q = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :], mask=n_mask[:, None], other=0)
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + ks[None, :], mask=n_mask[:, None], other=0)
        else:
            q = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :],
                        mask=n_mask[:, None] & (kw < K // 8)[None, :], other=0)
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + ks[None, :],
                        mask=n_mask[:, None] & (ks < K // 16)[None, :], other=0)
        if USE_ASM:
            w0, w1, w2, w3, w4, w5, w6, w7 = _e2m1_word_asm(q)
        else:
            w0, w1, w2, w3, w4, w5, w6, w7 = _e2m1_word_ref(q)
        scale = _e4m3(s)
        offs_x = k0 + tl.arange(0, BLOCK_K)
        for i in tl.static_range(BLOCK_M):
            m = pid_m * BLOCK_M + i
            x = tl.load(x_ptr + m * stride_xm + offs_x, mask=(m < M) & (offs_x < K), other=0.0)
            x0, x1, x2, x3, x4, x5, x6, x7 = _split8(tl.reshape(x.to(tl.float32), [WORDS, 8]))
            part = w0 * x0[None, :] + w1 * x1[None, :] + w2 * x2[None, :] + w3 * x3[None, :]
            part += w4 * x4[None, :] + w5 * x5[None, :] + w6 * x6[None, :] + w7 * x7[None, :]
            block_dot = tl.sum(tl.reshape(part, [BLOCK_N, BLOCK_K // 16, 2]), axis=2)
            row = tl.sum(block_dot * scale, axis=1)  # [BLOCK_N]
            acc += tl.where((tl.arange(0, BLOCK_M) == i)[:, None], row[None, :], 0.0)
    _store(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, pid_k, stride_ys, out_scale, SPLIT)


@triton.jit(do_not_specialize=_VARYING)
def mma_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, k_per_split,
               stride_xm, stride_wn, stride_sn, stride_ym, stride_ys, out_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
               USE_ASM: tl.constexpr):
    """w_ptr: the packed bytes viewed as int32 words [N, K/8] (stride_wn in words); x_ptr: x with
    each group of 8 columns in _interleave8's order (`permute_x_for_mma`)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    WORDS: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T tile: swap AB
    k_lo = pid_k * k_per_split
    for kk in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        k0 = tl.multiple_of(k_lo + kk, BLOCK_K)
        kw = k0 // 8 + tl.arange(0, WORDS)
        ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            q = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :], mask=n_mask[:, None], other=0)
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + ks[None, :], mask=n_mask[:, None], other=0)
        else:
            q = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :],
                        mask=n_mask[:, None] & (kw < K // 8)[None, :], other=0)
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + ks[None, :],
                        mask=n_mask[:, None] & (ks < K // 16)[None, :], other=0)
        xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None],
                     mask=(offs_m < M)[None, :] & (offs_k < K)[:, None], other=0.0)  # x^T [BLOCK_K, BLOCK_M]
        # one multiplier per word (two words per 16-value block): e4m3 * 2^-8 * 2^112, see _store's scale
        mult = _e4m3(s) * 5.192296858534828e+33
        mult = tl.reshape(tl.join(mult, mult), [BLOCK_N, WORDS])
        if USE_ASM:
            t0, t1, t2, t3, t4, t5, t6, t7 = _e2m1_word_bf16_asm(q, mult)
        else:
            t0, t1, t2, t3, t4, t5, t6, t7 = _e2m1_word_ref(q)
            t0, t1, t2, t3 = t0 * mult * 2.0**-112, t1 * mult * 2.0**-112, t2 * mult * 2.0**-112, t3 * mult * 2.0**-112
            t4, t5, t6, t7 = t4 * mult * 2.0**-112, t5 * mult * 2.0**-112, t6 * mult * 2.0**-112, t7 * mult * 2.0**-112
        w = _interleave8(t0, t1, t2, t3, t4, t5, t6, t7)
        if USE_ASM:
            acc = tl.dot(w, xt, acc)
        else:  # the CPU interpreter's BF16 tl.dot is broken; the values are exact in FP32 too
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc)
    _store(y_ptr, tl.trans(acc), offs_m, offs_n, M, N, stride_ym, pid_k, stride_ys, out_scale, SPLIT)


@triton.jit(do_not_specialize=["numel"])
def reduce_splits_kernel(ws_ptr, y_ptr, numel, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """y = sum over splits of the FP32 partials (already scaled), cast to BF16 once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + i * numel + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(tl.bfloat16), mask=mask)
