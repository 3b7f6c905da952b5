"""Fused Triton MP2 pair-energy kernel: K = B_i B_j^T tile by tile in registers, divided by the
denominators and reduced, without writing any nvir x nvir block to GPU memory.

For a pair (i, j), with K_ab = sum_P B_ia^P B_jb^P and D_ab = e_i + e_j - e_a - e_b:

    OS_ij = sum_ab K_ab^2 / D_ab,      SS_ij = sum_ab K_ab (K_ab - K_ba) / D_ab

The virtual range is cut into square tiles of BLOCK; one program owns a pair (i, j) and a tile
pair (A, B) with A <= B. It forms, over chunks of BLOCK_P auxiliary functions,

    X[a, b] = sum_P B_ia^P B_jb^P = K_ab          Y[a, b] = sum_P B_ja^P B_ib^P = K_ba

so the (a, b) tile and the transposed (b, a) tile sit element-aligned in registers. D is
symmetric in (a, b), so an off-diagonal tile pair (A < B) stands for itself and its mirror:

    OS += sum (X^2 + Y^2) / D,        SS += sum (X - Y)^2 / D

and a diagonal tile (A = B) needs only X (Y = X^T there, taken by a register transpose):

    OS += sum X^2 / D,                SS += sum X (X - X^T) / D

Every element of K is therefore formed exactly once: nvir^2 naux multiply-adds per pair.

Each program writes one fp64 partial sum per term into a (npairs, ntile_pairs) buffer; the
caller reduces it in a fixed order (no atomics), so a launch is bit-identical run to run.

Precision: every dot has input_precision="ieee" and out_dtype set to the accumulator's dtype.
fp64 inputs: an fp64 dot (mma.sync f64 tensor-core instructions on sm80/sm90, read from the PTX of
tests/kernels/test_triton_compile.py: m8n8k4 under Triton 3.9, m16n8k16 on sm90 under 3.6; FMA elsewhere;
scripts/bench_cuda.py measures this against the cuBLAS path) and an fp64 epilogue. fp32 inputs:
true fp32 products with fp32 accumulation (not TF32), then X and Y are
converted to fp64 for the division and the sums.

The kernel is built from the plain Python function at first launch, not at import (no environment
is read when this module is imported). Triton itself fixes at its own import whether a process
interprets (TRITON_INTERPRET=1: CPU tensors through Triton's interpreter) or compiles for the GPU;
launch.interpreting() checks that the two agree.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .tile_sums import jit_kernel

BLOCK = 64  # virtual orbitals per square K tile (rows a and columns b)
BLOCK_P = {"fp64": 16, "fp32": 32}  # auxiliary functions per dot step (contraction chunk): four
# BLOCK x BLOCK_P operand tiles x NUM_STAGES = 96 KiB of shared
# memory in both precisions (fits A100's 164 KiB and H100's 227 KiB)
NUM_WARPS = 8  # two BLOCK x BLOCK accumulators per program
NUM_STAGES = 3  # software-pipelining depth of the operand loads


def _fused_pair_energy_kernel(  # noqa: PLR0913
    bi_ptr,
    bj_ptr,  # B_i, B_j with element (i, a, P) at i*s_i + a*s_a + P*s_p
    s_bi_i,
    s_bi_a,
    s_bi_p,
    s_bj_i,
    s_bj_a,
    s_bj_p,
    pair_i_ptr,
    pair_j_ptr,  # (npairs,) int64 occupied indices into Bi, Bj
    tile_a_ptr,
    tile_b_ptr,  # (ntile_pairs,) int64 tile indices, A <= B
    eps_i_ptr,
    eps_j_ptr,
    eps_vir_ptr,  # fp64 orbital energies (Hartree)
    os_ptr,
    ss_ptr,  # (npairs, ntile_pairs) fp64 partial sums
    nvir,
    naux,
    ntile_pairs,
    DIAG: tl.constexpr,
    FP32: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # Tile pairs on the fastest grid axis: programs that run together share (i, j), so B_i and
    # B_j (2 nvir naux elements) stay in L2 while all their tiles are formed.
    i, j, offs_a, offs_b, mask_a, mask_b, out = tile_prologue(  # noqa: F821
        pair_i_ptr, pair_j_ptr, tile_a_ptr, tile_b_ptr, nvir, nvir, ntile_pairs, BLOCK
    )
    offs_p = tl.arange(0, BLOCK_P).to(tl.int64)

    # Row operands (BLOCK, BLOCK_P): B[a, P]; column operands (BLOCK_P, BLOCK): B[b, P]^T.
    bi_a = bi_ptr + i * s_bi_i + offs_a[:, None] * s_bi_a + offs_p[None, :] * s_bi_p
    bj_b = bj_ptr + j * s_bj_i + offs_b[None, :] * s_bj_a + offs_p[:, None] * s_bj_p
    bj_a = bj_ptr + j * s_bj_i + offs_a[:, None] * s_bj_a + offs_p[None, :] * s_bj_p
    bi_b = bi_ptr + i * s_bi_i + offs_b[None, :] * s_bi_a + offs_p[:, None] * s_bi_p

    acc_dtype = tl.float32 if FP32 else tl.float64
    x = tl.zeros((BLOCK, BLOCK), dtype=acc_dtype)
    y = tl.zeros((BLOCK, BLOCK), dtype=acc_dtype)
    for p0 in range(0, naux, BLOCK_P):
        mp = (p0 + offs_p) < naux
        u = tl.load(bi_a, mask=mask_a[:, None] & mp[None, :], other=0.0)
        v = tl.load(bj_b, mask=mp[:, None] & mask_b[None, :], other=0.0)
        # out_dtype must name the accumulator's dtype: Triton >= 3.6 asserts acc dtype == out_dtype,
        # whose default is fp32, so an fp64 accumulator without it does not compile there.
        x = tl.dot(u, v, x, input_precision="ieee", out_dtype=acc_dtype)  # fp32: true fp32, not TF32
        if not DIAG:
            u2 = tl.load(bj_a, mask=mask_a[:, None] & mp[None, :], other=0.0)
            v2 = tl.load(bi_b, mask=mp[:, None] & mask_b[None, :], other=0.0)
            y = tl.dot(u2, v2, y, input_precision="ieee", out_dtype=acc_dtype)
            bj_a += BLOCK_P * s_bj_p
            bi_b += BLOCK_P * s_bi_p
        bi_a += BLOCK_P * s_bi_p
        bj_b += BLOCK_P * s_bj_p

    x = x.to(tl.float64)
    if DIAG:
        y = tl.trans(x)
    else:
        y = y.to(tl.float64)
    eij = tl.load(eps_i_ptr + i) + tl.load(eps_j_ptr + j)
    e_os, e_ss = pair_tile_sums(x, y, eij, eps_vir_ptr, offs_a, offs_b, mask_a, mask_b, DIAG)  # noqa: F821
    tl.store(os_ptr + out, e_os)
    tl.store(ss_ptr + out, e_ss)


def kernel():
    """The jitted kernel for the current TRITON_INTERPRET setting (built once per setting)."""
    return jit_kernel(_fused_pair_energy_kernel)


def default_config(dtype) -> dict:
    """Launch configuration (tile sizes and Triton launch options) for a working dtype."""
    prec = "fp32" if dtype == torch.float32 else "fp64"
    return {"BLOCK": BLOCK, "BLOCK_P": BLOCK_P[prec], "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}


def fused_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, config=None):
    """MP2 (e_os, e_ss) in Hartree over all pairs in I x J, the contract of
    linalg.Backend.mp2_pair_energy, in one fused Triton pass per tile kind.

    Bi: (ni, nvir, naux), Bj: (nj, nvir, naux), both fp32 or both fp64, any strides (the pipeline's
    views of Bt (naux, nocc*nvir) have the virtual index contiguous and naux as the outer stride);
    eps_i (ni,), eps_j (nj,), eps_vir (nvir,) in Hartree (cast to fp64). symmetric=True: Bj is Bi,
    only i >= j is formed, i > j weighted 2. config overrides default_config() keys.
    Returns Python floats, reduced in fp64 in a fixed order.
    """
    from .launch import check_device, check_pair_args, pair_chunks, pair_lists, reduce_partials, tile_pairs

    op = "fused_pair_energy"
    ni, nj, nvir, naux = check_pair_args(op, Bi, Bj, eps_i, eps_j, eps_vir, symmetric)
    dev = check_device(op, Bi, Bj)
    cfg = {**default_config(Bi.dtype), **(config or {})}
    f64 = torch.float64
    ei = eps_i.to(device=dev, dtype=f64).contiguous()
    ej = eps_j.to(device=dev, dtype=f64).contiguous()
    ev = eps_vir.to(device=dev, dtype=f64).contiguous()
    pi, pj, w = pair_lists(ni, nj, symmetric, dev)
    k = kernel()
    os_parts, ss_parts = [], []
    for diag in (True, False):
        ta, tb = tile_pairs(nvir, cfg["BLOCK"], diag, dev)
        ntp = ta.numel()
        if ntp == 0:
            continue
        os_buf = torch.empty((pi.numel(), ntp), dtype=f64, device=dev)
        ss_buf = torch.empty_like(os_buf)
        for p0, p1 in pair_chunks(pi.numel()):
            k[(ntp, p1 - p0)](
                Bi,
                Bj,
                *Bi.stride(),
                *Bj.stride(),
                pi[p0:p1],
                pj[p0:p1],
                ta,
                tb,
                ei,
                ej,
                ev,
                os_buf[p0:p1],
                ss_buf[p0:p1],
                nvir,
                naux,
                ntp,
                DIAG=diag,
                FP32=(Bi.dtype == torch.float32),
                BLOCK=cfg["BLOCK"],
                BLOCK_P=cfg["BLOCK_P"],
                num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"],
            )
        os_parts.append(os_buf)
        ss_parts.append(ss_buf)
    return reduce_partials(os_parts, ss_parts, w)
