"""The DF-SCF's JK factor in fixed groups of auxiliary rows, one process or split over the ranks.

Bit-identical at any rank count. Every floating-point operation on the factor has the same shapes,
operands (byte alignment included) and association order on 1, 2, ..., N ranks:

    groups     the auxiliary shells in FIXED groups of consecutive rows (``fit_groups``: at least
               GROUPS_MIN groups, at most GROUP_ROWS_MAX rows each), a function of the JK-fit set
               alone. Rank r owns a contiguous range of groups (``owners``, balanced by rows); one
               process owns them all. The integrals of a group are made in the same engine blocks
    metric     j2c and its factor on every rank (naux², small): L (Cholesky) or j2c^-1/2 (eigh)
    fit        Cholesky: a blocked forward substitution over the groups, B_g = L_gg^-1 (raw_g -
               Σ_{h<g} L_gh B_h), the updates of group g in the order h = 0, 1, ..., g-1, one GEMM
               per (g, h) and one TRSM per g; a rank receives B_h of the groups before its own from
               their owners (each rank sends its B_g to the later ranks, once). eigh: B_g = Σ_h
               W_gh raw_h in h order, every raw_h sent to every rank once
    cycles     J and K are sums over P: each group's partial J_g, K_g computed afresh
               (JKFactor.group_blocks), added in group order (``World.ordered_sum``: rank 0 adds
               its groups, passes the running sum to rank 1, which adds its own, ...; the last rank
               broadcasts the total). One process adds the same partials in the same order.

Bitwise means: the same JK-fit set, device, precision, factor layout (the memory plan's), BLAS
choice (``--cpu-blas``; every rank's the same, see dfmp2.distributed's agreement) and threads per
process. The rows of each group sit at the same address modulo ALIGN_BYTES in every rank count
(``aligned_rows``): a BLAS (MKL) may peel its loops by the operands' alignment. The orbitals that
the MP2 stage reads are rank 0's, sent to every rank (``same_orbitals``), so the MP2 stage sees one
set of orbitals on all ranks (the same bits as every rank's own).
"""

from __future__ import annotations

import time

import torch

from dfmp2 import linalg
from dfmp2.df import integrals
from dfmp2.df.fitting import fit_metric
from dfmp2.distributed import World

GROUPS_MIN = 16  # the factor's auxiliary rows in at least this many fixed groups (more ranks: idle in the SCF)
GROUP_ROWS_MAX = 256  # rows of one group at most: larger factors get more groups (one GEMM per (g, h) pair)
ALIGN_BYTES = 64  # a row's address modulo this is the same in every rank count (the allocators' alignment)


def fit_groups(auxmol) -> list[tuple[int, int, int, int]]:
    """The fixed groups (shl0, shl1, p0, p1) of the auxiliary shells: consecutive shells of at most
    min(GROUP_ROWS_MAX, ceil(naux / GROUPS_MIN)) functions (a larger shell: a group of its own)."""
    naux = auxmol.nao_nr()
    return integrals.aux_shell_blocks(auxmol, max(1, min(GROUP_ROWS_MAX, -(-naux // GROUPS_MIN))))


def owners(groups, size: int) -> list[int]:
    """The rank owning each group: contiguous ranges balanced by rows (a group goes to the rank
    whose 1/size of the rows holds its middle row)."""
    naux = groups[-1][3] if groups else 0
    return [min(size - 1, (p0 + p1) * size // (2 * max(1, naux))) for _, _, p0, p1 in groups]


def planned_rows(auxmol, world: World, split: bool) -> int:
    """JK-factor rows the memory plan counts on this run's busiest rank: all naux on one process or
    with the SCF replicated; split, the largest share plus two groups (the fit's receive buffers:
    one in use, the next arriving)."""
    groups = fit_groups(auxmol)
    if not split or world.size == 1:
        return auxmol.nao_nr()
    own = owners(groups, world.size)
    share = max(sum(g[3] - g[2] for g, o in zip(groups, own) if o == r) for r in range(world.size))
    return min(auxmol.nao_nr(), share + 2 * max(g[3] - g[2] for g in groups))


def held_partials(auxmol, world: World, split: bool, spins: int) -> int:
    """The (nao, nao) fp64 matrices of J and K (1 + spins of them) that the cycles' ordered sum
    (``World.ordered_sum``) holds at once on the busiest rank: one process (or rank 0), the running
    sum and the group being built; a rank after the first, its groups' partials until the running
    sum arrives, with that sum and the broadcast's copy."""
    if not split or world.size == 1:
        return 2 * (1 + spins)
    own = owners(fit_groups(auxmol), world.size)
    return (1 + spins) * (max(own.count(r) for r in range(1, world.size)) + 2)


def aligned_rows(rows: int, width: int, row0: int, dtype, device, fill=None) -> torch.Tensor:
    """An empty (rows, width) tensor whose first element sits at the address, modulo ALIGN_BYTES,
    of row ``row0`` of a whole (naux, width) tensor (allocations start at a multiple of it)."""
    per = max(1, ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())
    shift = (row0 * width) % per
    flat = torch.empty(rows * width + shift, dtype=dtype, device=device)
    out = flat[shift:].view(rows, width)
    return out if fill is None else out.fill_(fill)


def aligned_pair(rows: int, width: int, row0: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views of one buffer of about ``rows`` x ``width`` fp64: (rows, width) fp64 and, over its
    first half, (rows, width) fp32, each row at the address ``aligned_rows`` gives it in its dtype
    (the two overlap: the fp32 view is dead once the fp64 one is written)."""
    n, per64, per32 = rows * width, ALIGN_BYTES // 8, ALIGN_BYTES // 4
    flat = torch.empty(n + per64, dtype=torch.float64, device=device)
    s64, s32 = (row0 * width) % per64, (row0 * width) % per32
    return flat[s64 : s64 + n].view(rows, width), flat.view(torch.float32)[s32 : s32 + n].view(rows, width)


def factor_rows(
    mol, auxmol, backend, engine, block_mb: float, world: World, timer, pairs=None
) -> tuple[torch.Tensor, str, dict, list, int]:
    """This rank's rows of the fp64 JK factor B = W (P|μν) (naux_r, npair) on ``backend`` (one
    process: all of them), the metric's (kind, info), the rank's groups as local row ranges
    [(p0, p1)] in group order, and its first row's global index. ``pairs``: the kept packed columns
    (``jk.significant_pairs``; None: all): B is then (naux_r, len(pairs))."""
    nao = mol.nao_nr()
    npair = nao * (nao + 1) // 2
    per_block = max(1, int(engine.block_mb(block_mb) * 1e6 // max(1, npair * 8)))  # gpu4pyscf: one call a group
    groups = fit_groups(auxmol)
    own = owners(groups, world.size)
    mine = [g for g in range(len(groups)) if own[g] == world.rank]
    row0 = groups[mine[0]][2] if mine else 0
    nrows = sum(groups[g][3] - groups[g][2] for g in mine)
    t0 = time.perf_counter()
    width = npair if pairs is None else len(pairs)
    raw = aligned_rows(nrows, width, row0, torch.float64, backend.device)
    keep = None if pairs is None else torch.as_tensor(pairs, dtype=torch.long).to(raw.device)
    blocks = [b for g in mine for b in _engine_blocks(auxmol, groups[g], per_block)]
    with engine.blocks(auxmol, blocks, torch.float64) as stream:
        for p0, p1, packed in stream:
            packed = packed.to(raw.device)
            raw[p0 - row0 : p1 - row0] = packed if keep is None else packed[:, keep]
    j2c = engine.metric(auxmol).to(raw.device)
    t0 = timer.add("scf_integrals", t0)
    M, kind, info = fit_metric(j2c, backend)
    del j2c
    fit = Fit(M, groups, own, row0, world, backend)
    B = fit.forward(raw) if kind == "cholesky" else fit.apply(raw)
    timer.add("scf_fit", t0)
    local = [(groups[g][2] - row0, groups[g][3] - row0) for g in mine]
    return B, kind, info, local, row0


def _engine_blocks(auxmol, group, per_block: int) -> list[tuple[int, int, int, int]]:
    """A group's integral blocks: its shells in runs of at most ``per_block`` functions (a larger
    shell alone), the same in every rank count."""
    loc = auxmol.ao_loc_nr()
    s0, s1 = group[0], group[1]
    out, a = [], s0
    for s in range(s0 + 1, s1 + 1):
        if s == s1 or loc[s + 1] - loc[a] > per_block:
            out.append((a, s, int(loc[a]), int(loc[s])))
            a = s
    return out


class Fit:
    """The fit of a rank's raw rows over the fixed groups (module docstring): ``forward``
    (Cholesky, M = L) or ``apply`` (eigh, M = j2c^-1/2). ``own[g]``: the rank of group g; the
    rank's rows start at global row ``row0``."""

    def __init__(self, M, groups, own, row0: int, world: World, backend):
        self.M, self.groups, self.own, self.row0 = M, groups, own, row0
        self.world, self.backend = world, backend
        self.mine = [g for g in range(len(groups)) if own[g] == world.rank]

    def rows(self, X, g):
        return X[self.groups[g][2] - self.row0 : self.groups[g][3] - self.row0]

    def block(self, g, h):
        """M's block (rows of group g, columns of group h), a view (the same strides everywhere)."""
        return self.M[self.groups[g][2] : self.groups[g][3], self.groups[h][2] : self.groups[h][3]]

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """B = L^-1 raw in place of X (this rank's rows): the groups before the rank's own arrive
        solved from their owners (each applied to every own group), then the own groups are solved
        in order, each sent to the later ranks and applied to the own groups after it."""
        if not self.mine:  # more ranks than groups: nothing of the factor here, nobody sends to it
            return X
        be, first = self.backend, self.mine[0]
        for h, Bh in self.arrivals(range(first), X):
            for g in self.mine:
                linalg.gemm(self.block(g, h), Bh, alpha=-1.0, beta=1.0, out=self.rows(X, g), backend=be)
        later = sorted({r for r in self.own if r > self.world.rank})
        sent = []
        for i, g in enumerate(self.mine):
            Xg = self.rows(X, g)
            linalg.trsm(self.block(g, g), Xg.mT, side="right", uplo="lower", trans=True, backend=be, overwrite_b=True)
            sent += [self.world.post(Xg.to(self.world.wire_device), None, r, r, "scf") for r in later]
            for g2 in self.mine[i + 1 :]:
                linalg.gemm(self.block(g2, g), Xg, alpha=-1.0, beta=1.0, out=self.rows(X, g2), backend=be)
        for s in sent:
            s.wait()
        return X

    def apply(self, X: torch.Tensor) -> torch.Tensor:
        """B = W raw (W symmetric, every column block): B_g = Σ_h W_gh raw_h in h order, every raw
        group sent to every other rank once."""
        if not self.mine:
            return X
        B = aligned_rows(X.shape[0], X.shape[1], self.row0, X.dtype, X.device, fill=0.0)
        others = [r for r in sorted(set(self.own)) if r != self.world.rank]
        wire = self.world.wire_device
        sent = [self.world.post(self.rows(X, g).to(wire), None, r, r, "scf") for g in self.mine for r in others]
        for h, Xh in self.arrivals(range(len(self.groups)), X):
            for g in self.mine:
                linalg.gemm(self.block(g, h), Xh, beta=1.0, out=self.rows(B, g), backend=self.backend)
        for s in sent:
            s.wait()
        return B

    def arrivals(self, hs, X):
        """(h, rows of group h) for h in ``hs`` in order: this rank's own from X, the others
        received from their owners (the next one's receive posted before the current is used)."""
        hs, world = list(hs), self.world

        def post(h):
            p0, p1 = self.groups[h][2], self.groups[h][3]
            buf = aligned_rows(p1 - p0, X.shape[1], p0, X.dtype, world.wire_device)
            return buf, world.post(None, buf, self.own[h], self.own[h], "scf")

        foreign = [h for h in hs if self.own[h] != world.rank]
        pending = {foreign[0]: post(foreign[0])} if foreign else {}
        for h in hs:
            if self.own[h] == world.rank:
                yield h, self.rows(X, h)
                continue
            buf, req = pending.pop(h)
            req.wait()
            nxt = foreign.index(h) + 1
            if nxt < len(foreign):
                pending[foreign[nxt]] = post(foreign[nxt])
            yield h, buf.to(X.device)


def same_orbitals(C: torch.Tensor, mo_e: torch.Tensor, world: World) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank 0's orbitals and energies on every rank (a broadcast as a sum: zeros elsewhere)."""
    if not world.distributed:
        return C, mo_e
    both = torch.cat([C.reshape(-1), mo_e.reshape(-1)]).to(torch.float64)
    if world.rank:
        both = torch.zeros_like(both)
    both = world.all_reduce_sum(both, "scf").to(C.device)
    return both[: C.numel()].view(C.shape).to(C.dtype), both[C.numel() :].view(mo_e.shape).to(mo_e.dtype)
