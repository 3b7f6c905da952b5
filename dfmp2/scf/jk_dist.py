"""The DF-SCF's JK factor split by auxiliary index over the ranks (dfmp2.distributed).

    rank r     (μν|P) for its aux-shell blocks (every N-th, from r): raw_r (naux_r, npair)
    metric     j2c and its factor on every rank (naux², small); W = L^-1 (or j2c^-1/2)
    fit        B_r = W[rows_r, :] raw = Σ_q W[rows_r, rows_q] raw_q: the raw blocks pass round the
               ring (N - 1 shifts of about 1/N of the factor each), each rank adding its GEMM
    cycles     J and K are sums over P: each rank's partial J, K from B_r, all-reduced
               (nbasis² per cycle, dfmp2.scf.rhf.DFRHF.coulomb / exchange); the dense algebra replicated

J and K are summed in a different order than on one process: E(HF) agrees to about 1e-12 Eh, not
bitwise. The orbitals that the MP2 stage reads are rank 0's, sent to every rank
(``same_orbitals``), so the MP2 stage sees one set of orbitals on all ranks.
"""

from __future__ import annotations

import time

import torch

from dfmp2 import linalg
from dfmp2.df import integrals
from dfmp2.df.fitting import fit_metric
from dfmp2.distributed import World


def factor_rows(
    mol, auxmol, backend, engine, block_mb: float, world: World, timer, pairs=None
) -> tuple[torch.Tensor, str, dict, list]:
    """This rank's rows of the fp64 JK factor B = W (P|μν) (naux_r, npair) on ``backend``, the
    metric's (kind, info), and the rows' aux indices. ``pairs``: the kept packed columns
    (``jk.significant_pairs``; None: all): B is then (naux_r, len(pairs))."""
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    npair = nao * (nao + 1) // 2
    per_block = max(1, int(block_mb * 1e6 // max(1, npair * 8)))
    blocks = integrals.aux_shell_blocks(auxmol, min(per_block, -(-naux // world.size)))  # >= N blocks
    t0 = time.perf_counter()
    mine = blocks[world.rank :: world.size]
    rows = [p for _, _, p0, p1 in mine for p in range(p0, p1)]
    width = npair if pairs is None else len(pairs)
    raw = backend.to_device(torch.empty((len(rows), width), dtype=torch.float64))
    keep = None if pairs is None else torch.as_tensor(pairs, dtype=torch.long).to(raw.device)
    a = 0
    with engine.blocks(auxmol, mine, torch.float64) as stream:
        for p0, p1, packed in stream:
            packed = packed.to(raw.device)
            raw[a : a + p1 - p0] = packed if keep is None else packed[:, keep]
            a += p1 - p0
    j2c = engine.metric(auxmol).to(raw.device)
    t0 = timer.add("scf_integrals", t0)
    M, kind, info = fit_metric(j2c, backend)
    del j2c
    if kind == "cholesky":
        eye = torch.eye(naux, dtype=torch.float64, device=raw.device)
        W = linalg.trsm(M, eye, side="left", uplo="lower", backend=backend)
    else:
        W = M
    idx = torch.tensor(rows, dtype=torch.long, device=raw.device)
    B = torch.zeros((len(rows), width), dtype=torch.float64, device=raw.device)
    held, held_rows = raw, idx
    for s in range(world.size):
        if len(rows) and len(held_rows):
            B += linalg.gemm(W[idx][:, held_rows].contiguous(), held, backend=backend)
        if s + 1 < world.size:
            frm = (world.rank - s - 1) % world.size
            theirs = blocks[frm :: world.size]
            their_rows = [p for _, _, p0, p1 in theirs for p in range(p0, p1)]
            recv = torch.empty((len(their_rows), width), dtype=torch.float64, device=world.wire_device)
            world.shift(
                held.to(world.wire_device).contiguous(),
                recv,
                (world.rank + 1) % world.size,
                (world.rank - 1) % world.size,
                "scf",
            )
            held = recv.to(raw.device)
            held_rows = torch.tensor(their_rows, dtype=torch.long, device=raw.device)
    timer.add("scf_fit", t0)
    return B, kind, info, rows


def same_orbitals(C: torch.Tensor, mo_e: torch.Tensor, world: World) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank 0's orbitals and energies on every rank (a broadcast as a sum: zeros elsewhere)."""
    if not world.distributed:
        return C, mo_e
    both = torch.cat([C.reshape(-1), mo_e.reshape(-1)]).to(torch.float64)
    if world.rank:
        both = torch.zeros_like(both)
    both = world.all_reduce_sum(both, "scf").to(C.device)
    return both[: C.numel()].view(C.shape).to(C.dtype), both[C.numel() :].view(mo_e.shape).to(mo_e.dtype)
