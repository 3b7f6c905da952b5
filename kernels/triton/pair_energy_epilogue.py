"""Triton MP2 pair-energy epilogue: the OS and SS sums from K blocks that a GEMM (cuBLAS through
torch.matmul) has already written to GPU memory. One read of K, no temporaries.

This is the labelled alternative to kernels/triton/fused_pair_energy.py for a GPU where Triton's
own dot is slower than the vendor GEMM (fp64 on some parts): K costs one extra write and read of
nvir^2 elements per pair, against 2 nvir^2 naux flops to form it.

K for a chunk of pairs is addressed through strides: K_ij[a, b] sits at
    k_ptr + ii * s_i + jj * s_j + a * s_a + b * s_b
with (ii, jj) local to the chunk. The tile scheme and the per-program fp64 partials are those of
the fused kernel: a program owns a pair and a tile pair A <= B, loads X = K[A, B] and
Y = K[B, A]^T, and adds sum (X^2 + Y^2)/D, sum (X - Y)^2/D (A < B) or sum X^2/D, sum X (X - X^T)/D
(A = B). K in fp32 is converted to fp64 before the division.

Opposite spins (RECT, UMP2's alpha-beta block): K_ij is (nvir, nvir_b) with b over j's own
virtuals (energies at eps_vir_b_ptr); it has no mirror, so a program owns one tile (A, B) of the
whole rectangle and adds only OS = sum X^2/D (the SS partial is written as 0).
"""

from __future__ import annotations

import torch
import triton.language as tl

from .tile_sums import jit_kernel

BLOCK = 64  # virtual orbitals per square tile
NUM_WARPS = 4
GEMM_MAX_ELEMS = 1 << 26  # elements of K formed per GEMM (512 MiB in fp64)


def _pair_energy_epilogue_kernel(  # noqa: PLR0913
    k_ptr,
    s_i,
    s_j,
    s_a,
    s_b,
    pair_i_ptr,
    pair_j_ptr,  # (npairs,) int64 local indices into the K chunk
    eps_i_ptr,
    eps_j_ptr,
    eps_vir_ptr,  # fp64, indexed by the same local indices
    eps_vir_b_ptr,  # fp64: j's virtuals (RECT), else eps_vir_ptr again
    tile_a_ptr,
    tile_b_ptr,
    os_ptr,
    ss_ptr,  # (npairs, ntile_pairs) fp64 partial sums
    nvir,
    nvir_b,
    ntile_pairs,
    DIAG: tl.constexpr,
    BLOCK: tl.constexpr,
    RECT: tl.constexpr = False,
):
    i, j, offs_a, offs_b, mask_a, mask_b, out = tile_prologue(  # noqa: F821
        pair_i_ptr, pair_j_ptr, tile_a_ptr, tile_b_ptr, nvir, nvir_b, ntile_pairs, BLOCK
    )
    mask = mask_a[:, None] & mask_b[None, :]
    base = k_ptr + i * s_i + j * s_j
    x = tl.load(base + offs_a[:, None] * s_a + offs_b[None, :] * s_b, mask=mask, other=0.0).to(tl.float64)
    eij = tl.load(eps_i_ptr + i) + tl.load(eps_j_ptr + j)
    if RECT:
        ea = tl.load(eps_vir_ptr + offs_a, mask=mask_a, other=0.0)
        eb = tl.load(eps_vir_b_ptr + offs_b, mask=mask_b, other=0.0)
        d = tl.where(mask, eij - (ea[:, None] + eb[None, :]), 1.0)  # padding: X = 0 there
        tl.store(os_ptr + out, tl.sum(tl.sum(x * (x / d), axis=1), axis=0))
        tl.store(ss_ptr + out, tl.zeros((), dtype=tl.float64))
        return
    if DIAG:
        y = tl.trans(x)
    else:
        y = tl.load(base + offs_b[None, :] * s_a + offs_a[:, None] * s_b, mask=mask, other=0.0).to(tl.float64)
    e_os, e_ss = pair_tile_sums(x, y, eij, eps_vir_ptr, offs_a, offs_b, mask_a, mask_b, DIAG)  # noqa: F821
    tl.store(os_ptr + out, e_os)
    tl.store(ss_ptr + out, e_ss)


def kernel():
    """The jitted kernel for the current TRITON_INTERPRET setting (built once per setting)."""
    return jit_kernel(_pair_energy_epilogue_kernel)


def _as_rows(B: torch.Tensor) -> torch.Tensor:
    """(n, nvir, naux) -> (n*nvir, naux); a view for both the contiguous layout and the pipeline's
    permuted view of Bt (naux, nocc*nvir)."""
    n, nvir, naux = B.shape
    return B.reshape(n * nvir, naux)


def _rect_tiles(nvir: int, nvir_b: int, block: int, device):
    """(tile_a, tile_b) int64 over the whole (nvir, nvir_b) rectangle, A-major."""
    ta, tb = -(-nvir // block), -(-nvir_b // block)
    a = torch.arange(ta).repeat_interleave(tb)
    b = torch.arange(tb).repeat(ta)
    return a.to(device), b.to(device)


def gemm_epilogue_pair_energy(  # noqa: PLR0913
    Bi,
    Bj,
    eps_i,
    eps_j,
    eps_vir,
    *,
    symmetric=False,
    eps_vir_j=None,
    block=BLOCK,
    num_warps=NUM_WARPS,
    max_elems=GEMM_MAX_ELEMS,
):
    """MP2 (e_os, e_ss) in Hartree over all pairs in I x J (the mp2_pair_energy contract): K for a
    chunk of occupied rows i and columns j is one GEMM, M = Bi[i-chunk] Bj[j-chunk]^T of shape
    (ni_c nvir, nj_c nvir) through torch.matmul (cuBLAS), then the Triton epilogue reduces it.
    With symmetric=True the columns of a row chunk stop at its last i (only the chunk's own
    triangle is formed twice). Returns Python floats, reduced in fp64 in a fixed order.
    ``eps_vir_j``: opposite spins (Bj over its own nvir_j virtuals, rectangular K, the RECT
    kernel): returns (e_os, NaN).
    """
    from .launch import check_device, check_pair_args, tile_pairs

    op = "gemm_epilogue_pair_energy"
    rect = eps_vir_j is not None
    ni, nj, nvir, _naux = check_pair_args(op, Bi, Bj, eps_i, eps_j, eps_vir, symmetric, eps_vir_j)
    nvj = Bj.shape[1]
    dev = check_device(op, Bi, Bj)
    f64 = torch.float64
    ei = eps_i.to(device=dev, dtype=f64).contiguous()
    ej = eps_j.to(device=dev, dtype=f64).contiguous()
    ev = eps_vir.to(device=dev, dtype=f64).contiguous()
    evj = eps_vir_j.to(device=dev, dtype=f64).contiguous() if rect else ev
    ri, rj = _as_rows(Bi), _as_rows(Bj)
    tiles = (
        [(False, *_rect_tiles(nvir, nvj, block, dev))]
        if rect
        else [(d, *tile_pairs(nvir, block, d, dev)) for d in (True, False)]
    )
    # Row chunk: ci occupied orbitals; columns: all of J (or up to the chunk's end if symmetric).
    ci = max(1, min(ni, max_elems // max(1, nvir * nvj * (nj if not symmetric else ni))))
    k = kernel()
    os_parts, ss_parts = [], []
    for i0 in range(0, ni, ci):
        i1 = min(ni, i0 + ci)
        jend = i1 if symmetric else nj
        M = torch.matmul(ri[i0 * nvir : i1 * nvir], rj[: jend * nvj].mT)  # (ci nvir, jend nvj)
        pi, pj, w = _chunk_pairs(i0, i1, jend, symmetric, dev)
        s_i, s_a = nvir * M.stride(0), M.stride(0)
        s_j, s_b = nvj * M.stride(1), M.stride(1)
        eps = (ei[i0:], ej, ev, evj)
        for diag, ta, tb in tiles:
            if ta.numel() == 0:
                continue
            meta = {"DIAG": diag, "BLOCK": block, "RECT": rect, "num_warps": num_warps}
            os_buf, ss_buf = _launch(k, M, (s_i, s_j, s_a, s_b), pi, pj, eps, ta, tb, (nvir, nvj), meta)
            os_parts.append((os_buf, w))
            ss_parts.append(ss_buf)
        del M
    return _reduce(os_parts, ss_parts, rect, dev)


def _chunk_pairs(i0: int, i1: int, jend: int, symmetric: bool, dev):
    """(pair_i, pair_j, weight) of a row chunk i0:i1 against columns 0:jend, with pair_i local to
    the chunk; symmetric: only i >= j (global indices), weight 2 off the diagonal."""
    from .launch import pair_lists

    pi, pj, w = pair_lists(i1 - i0, jend, False, dev)
    if symmetric:  # keep i >= j (global indices), weight 2 off the diagonal
        keep = (pi + i0) >= pj
        pi, pj = pi[keep], pj[keep]
        w = torch.where(pi + i0 == pj, 1.0, 2.0).to(torch.float64)
    return pi, pj, w


def _launch(k, M, strides, pi, pj, eps, ta, tb, nvirs, meta):  # noqa: PLR0913
    """The epilogue kernel over one K chunk ``M`` and one tile kind, in launches of at most
    MAX_GRID_Y pairs; returns its (npairs, ntile_pairs) fp64 OS and SS partials. ``strides``:
    (s_i, s_j, s_a, s_b) of K_ij[a, b] in M; ``eps``: (eps_i from the chunk's first row, eps_j,
    eps_vir, eps_vir_b), fp64; ``nvirs``: (nvir, nvir_b); ``meta``: the constexprs and launch
    options (DIAG, BLOCK, RECT, num_warps)."""
    from .launch import MAX_GRID_Y

    ntp = ta.numel()
    os_buf = torch.empty((pi.numel(), ntp), dtype=torch.float64, device=M.device)
    ss_buf = torch.empty_like(os_buf)
    for p0 in range(0, pi.numel(), MAX_GRID_Y):
        p1 = min(pi.numel(), p0 + MAX_GRID_Y)
        k[(ntp, p1 - p0)](
            M, *strides, pi[p0:p1], pj[p0:p1], *eps, ta, tb, os_buf[p0:p1], ss_buf[p0:p1], *nvirs, ntp, **meta
        )
    return os_buf, ss_buf


def _reduce(os_parts: list, ss_parts: list, rect: bool, dev) -> tuple[float, float]:
    """(e_os, e_ss) Python floats: per chunk and tile kind, tiles then weighted pairs, in fp64 in
    a fixed order; e_ss NaN for opposite spins (RECT)."""
    f64 = torch.float64
    tot_os = torch.zeros((), dtype=f64, device=dev)
    tot_ss = torch.zeros((), dtype=f64, device=dev)
    for (o, w), s in zip(os_parts, ss_parts):
        tot_os += (o.sum(dim=1) * w).sum()
        tot_ss += (s.sum(dim=1) * w).sum()
    return float(tot_os), (float("nan") if rect else float(tot_ss))
