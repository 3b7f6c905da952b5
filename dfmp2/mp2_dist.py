"""The DF-MP2 stage over several ranks (dfmp2.distributed), bitwise the single-process arithmetic.

    integrals + transform   the (μν|P) aux-shell blocks of the single-process run, dealt round-robin:
                            rank r computes rows p0:p1 of (P|ia) for every occupied column, the same
                            GEMMs on the same operands as one process (so the same bits)
    redistribution          all-to-all by shifts: each rank sends the columns of rank q's occupied
                            blocks to q; a rank owns a contiguous range of occupied blocks
                            (``owned``), ~1/N of (P|ia) and then of B
    fit                     B_k = L^-1 (P|ia)_k for the rank's own blocks (the same columns solved
                            together as one process)
    pair step               ring pass: at shift s a rank holds its own blocks and those of rank
                            r - s; same-spin block pairs (I >= J) between two ranks are computed at
                            the shift s <= N/2 that reaches them first (s = N/2, N even: by the lower
                            rank), so each pair is computed once; UHF's alpha-beta pairs (I alpha,
                            J beta) over all N shifts of the beta blocks
    sums                    each pair's (e_os, e_ss) in its slot of the single-process order, zero
                            elsewhere, summed over the ranks (x + 0 is exact) and added on every rank
                            by ``outofcore.combine`` in the single-process order

Every pair's operands are bitwise those of one process (received blocks are copied into their own
allocations), so E_OS and E_SS are bit-identical to a 1-rank run on the same device, precision,
blocking and thread count.
"""
from __future__ import annotations

import time

import numpy as np
import torch

import linalg

from . import integrals
from .distributed import World, fault
from .fitting import apply_metric
from .outofcore import OccBlocks, combine, pair_view


def owned(count: int, world: World, rank: int | None = None) -> range:
    """The occupied blocks rank ``rank`` (default: this one) holds: a contiguous, balanced range."""
    r = world.rank if rank is None else rank
    return range(r * count // world.size, (r + 1) * count // world.size)


def my_aux_blocks(aux_blocks: list, world: World, rank: int | None = None) -> list:
    """The (μν|P) blocks rank ``rank`` computes: every size-th one, from its rank on."""
    r = world.rank if rank is None else rank
    return aux_blocks[r::world.size]


def build_B(mol, auxmol, C_occ, C_vir, backend, dtype, out_dtype, plan, timer, blocks: OccBlocks,
            engine, metric, world: World) -> dict:
    """This rank's blocks of B: {k: (naux, nk*nvir) contiguous tensor in ``out_dtype``} for k in
    ``owned``. ``dtype``: the transform's and fit's; ``metric``: (M, kind, info) of metric_factor."""
    nao, nocc = C_occ.shape
    nvir = C_vir.shape[1]
    M, kind, _info = metric
    co, cv = backend.to_device(C_occ, dtype), backend.to_device(C_vir, dtype)
    aux_blocks = integrals.aux_shell_blocks(auxmol, plan.aux_block)
    t_loop = t0 = time.perf_counter()
    rows, t_int = [], 0.0
    with engine.blocks(auxmol, my_aux_blocks(aux_blocks, world), dtype) as stream:
        for p0, p1, packed in stream:
            t1 = time.perf_counter()
            t_int += t1 - t0
            nb = p1 - p0
            x = integrals.unpack(packed, nao).reshape(nb * nao, nao)      # as mp2.build_B, per block
            half = linalg.gemm(x, co, backend=backend)
            half = half.reshape(nb, nao, nocc).transpose(1, 2).reshape(nb * nocc, nao)
            rows.append((p0, p1, linalg.gemm(half, cv, backend=backend).reshape(nb, nocc * nvir)))
            t0 = time.perf_counter()
    t0 = timer.add("transform", t_loop)
    timer.seconds["integrals"] = timer.seconds.get("integrals", 0.0) + t_int
    timer.seconds["transform"] -= t_int
    pia = _redistribute(rows, aux_blocks, blocks, world, backend, dtype)
    del rows
    t0 = timer.add("redistribute", t0)
    fit_M = M.to(dtype)
    out = {}
    for k in owned(blocks.count, world):
        cols = pia.pop(k).contiguous()
        out[k] = apply_metric(fit_M, kind, cols, backend).to(out_dtype).contiguous()
        del cols
    timer.add("fit", t0)
    return out


def _redistribute(rows: list, aux_blocks: list, blocks: OccBlocks, world: World, backend, dtype) -> dict:
    """{k: (naux, nk*nvir) (P|ia) block} for this rank's blocks, from every rank's rows: at shift s
    this rank sends the columns of rank r+s's blocks of its rows, and receives from rank r-s."""
    naux = blocks.naux
    mine = owned(blocks.count, world)
    c0 = blocks.columns(mine[0])[0] if len(mine) else 0
    c1 = blocks.columns(mine[-1])[1] if len(mine) else 0
    full = torch.empty((naux, c1 - c0), dtype=dtype, device=backend.device)
    for p0, p1, r in rows:
        full[p0:p1] = r[:, c0:c1]
    for s in range(1, world.size):
        to, frm = (world.rank + s) % world.size, (world.rank - s) % world.size
        dest = owned(blocks.count, world, to)
        send = None
        if len(dest):
            d0, d1 = blocks.columns(dest[0])[0], blocks.columns(dest[-1])[1]
            send = torch.cat([r[:, d0:d1].reshape(-1) for _, _, r in rows]) if rows else None
            send = send.to(world.wire_device) if send is not None else None
        theirs = my_aux_blocks(aux_blocks, world, frm)
        n = sum(p1 - p0 for _, _, p0, p1 in theirs) * (c1 - c0)
        recv = torch.empty(n, dtype=dtype, device=world.wire_device) if n else None
        world.shift(send, recv, to, frm, "transform")
        if recv is None:
            continue
        recv, a = recv.to(backend.device), 0
        for _, _, p0, p1 in theirs:
            m = (p1 - p0) * (c1 - c0)
            full[p0:p1] = recv[a:a + m].view(p1 - p0, c1 - c0)
            a += m
    out = {}
    for k in mine:
        k0, k1 = blocks.columns(k)
        out[k] = full[:, k0 - c0:k1 - c0].contiguous()     # its own allocation, as one process has it
    return out


def _pack(held: dict, world: World) -> torch.Tensor | None:
    if not held:
        return None
    return torch.cat([held[k].reshape(-1) for k in sorted(held)]).to(world.wire_device)


def _unpack(buf: torch.Tensor | None, ks, blocks: OccBlocks, device) -> dict:
    out, a = {}, 0
    if buf is None:
        return out
    buf = buf.to(device)
    for k in ks:
        shape = blocks.shape(k)
        n = shape[0] * shape[1]
        out[k] = buf[a:a + n].view(shape).clone()       # its own allocation, as one process has it
        a += n
    return out


def _ring(own: dict, blocks: OccBlocks, world: World, shifts: int, visit, dtype, device) -> None:
    """The ring pass: ``visit(s, q, held)`` for s in 0..shifts-1 with ``held`` the blocks of rank
    q = r - s (s = 0: this rank's own), passing them on to r + 1 after each shift."""
    held = own
    for s in range(shifts):
        q = (world.rank - s) % world.size
        visit(s, q, held)
        if s + 1 < shifts:
            nxt = (world.rank - s - 1) % world.size
            ks = list(owned(blocks.count, world, nxt))
            n = sum(blocks.shape(k)[0] * blocks.shape(k)[1] for k in ks)
            recv = torch.empty(n, dtype=dtype, device=world.wire_device) if n else None
            world.shift(_pack(held, world), recv, (world.rank + 1) % world.size, (world.rank - 1) % world.size,
                        "pair")
            held = _unpack(recv, ks, blocks, device)


def same_spin_sums(own: dict, blocks: OccBlocks, eps_occ, eps_vir, backend, world: World, dtype,
                   progress=None) -> tuple[float, float]:
    """(E_OS, E_SS) of one channel's block pairs I >= J (``OccBlocks.pairs``) over the ranks,
    added in the single-process order (``combine``); every rank gets them."""
    pairs = blocks.pairs()
    index = {p: n for n, p in enumerate(pairs)}
    sums = np.zeros((len(pairs), 2), dtype=np.float64)
    nvir, size, r = blocks.nvir, world.size, world.rank
    todo = _my_pair_count(blocks, world)
    done = [0]

    def visit(s, q, held):
        if s and s * 2 == size and r > q:           # shift N/2: the lower rank of the two computes
            return
        for i in sorted(own):
            for j in sorted(held):
                if s == 0 and j > i:
                    continue
                hi, lo = (i, j) if i >= j else (j, i)
                bh, bl = (own[i], held[j]) if i >= j else (held[j], own[i])
                (i0, i1), (j0, j1) = blocks.orbitals(hi), blocks.orbitals(lo)
                fault("pair")
                bi = pair_view(bh, nvir)
                bj = bi if hi == lo else pair_view(bl, nvir)
                sums[index[(hi, lo)]] = linalg.mp2_pair_energy(
                    bi, bj, eps_occ[i0:i1], eps_occ[j0:j1], eps_vir, symmetric=(hi == lo), backend=backend)
                done[0] += 1
                if progress is not None and todo:
                    progress(done[0] * len(pairs) // todo, len(pairs))
    _ring(own, blocks, world, size // 2 + 1, visit, dtype, backend.device)
    total = world.all_reduce_sum(torch.from_numpy(sums), "pair").numpy()
    return combine(total, pairs)


def _my_pair_count(blocks: OccBlocks, world: World) -> int:
    n, size, r = 0, world.size, world.rank
    mine = len(owned(blocks.count, world))
    n += mine * (mine + 1) // 2
    for s in range(1, size // 2 + 1):
        q = (r - s) % size
        if s * 2 == size and r > q:
            continue
        n += mine * len(owned(blocks.count, world, q))
    return n


def cross_spin_sums(own_a: dict, own_b: dict, blocks_a: OccBlocks, blocks_b: OccBlocks, eps_a, eps_b,
                    backend, world: World, dtype, progress=None) -> float:
    """UMP2's E_ab over the ranks: pairs (I of alpha, this rank's; J of beta, passed round the ring
    over all N shifts), each in its slot of the I-major single-process order, summed there."""
    total = blocks_a.count * blocks_b.count
    sums = np.zeros(total, dtype=np.float64)
    done = [0]
    todo = len(own_a) * blocks_b.count

    def visit(s, q, held):
        for i in sorted(own_a):
            i0, i1 = blocks_a.orbitals(i)
            bi = pair_view(own_a[i], blocks_a.nvir)
            for j in sorted(held):
                j0, j1 = blocks_b.orbitals(j)
                fault("pair")
                sums[i * blocks_b.count + j], _ss = linalg.mp2_pair_energy(
                    bi, pair_view(held[j], blocks_b.nvir), eps_a[0][i0:i1], eps_b[0][j0:j1], eps_a[1],
                    eps_vir_j=eps_b[1], backend=backend)
                done[0] += 1
                if progress is not None and todo:
                    progress(done[0] * total // todo, total)
    _ring(own_b, blocks_b, world, world.size, visit, dtype, backend.device)
    out = world.all_reduce_sum(torch.from_numpy(sums), "pair").numpy()
    return float(sum(out.tolist()))
