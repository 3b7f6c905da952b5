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
                            the shift s <= N/2 that reaches them first, each once (``assigned``;
                            s = N/2, N even: shared out between the two for balance); UHF's
                            alpha-beta pairs (I alpha, J beta) over all N shifts of the beta blocks
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

from dfmp2 import linalg, memory
from dfmp2.df import integrals
from dfmp2.df.fitting import apply_metric
from dfmp2.df.outofcore import OccBlocks, combine, pair_view
from dfmp2.distributed import World, fault


def owned(count: int, world: World, rank: int | None = None) -> range:
    """The occupied blocks rank ``rank`` (default: this one) holds: a contiguous, balanced range."""
    r = world.rank if rank is None else rank
    return range(r * count // world.size, (r + 1) * count // world.size)


def my_aux_blocks(aux_blocks: list, world: World, rank: int | None = None) -> list:
    """The (μν|P) blocks rank ``rank`` computes: every size-th one, from its rank on."""
    r = world.rank if rank is None else rank
    return aux_blocks[r :: world.size]


def build_B(  # noqa: PLR0913
    mol, auxmol, C_occ, C_vir, backend, dtype, out_dtype, plan, timer, blocks: OccBlocks, engine, metric, world: World
) -> dict:
    """This rank's blocks of B: {k: (naux, nk*nvir) contiguous tensor in ``out_dtype``} for k in
    ``owned``. ``dtype``: the transform's and fit's; ``metric``: (M, kind, info) of metric_factor."""
    nao = C_occ.shape[0]
    M, kind, _info = metric
    co, cv = backend.to_device(C_occ, dtype), backend.to_device(C_vir, dtype)
    aux_blocks = integrals.aux_shell_blocks(auxmol, plan.aux_block)
    world.pia_rows = [sum(p1 - p0 for _, _, p0, p1 in my_aux_blocks(aux_blocks, world, r)) for r in range(world.size)]
    t_loop = t0 = time.perf_counter()
    rows, t_int, work = [], 0.0, memory.Buffers(dtype, backend.device)
    with engine.blocks(auxmol, my_aux_blocks(aux_blocks, world), dtype) as stream:
        for p0, p1, packed in stream:
            t1 = time.perf_counter()
            t_int += t1 - t0
            rows.append((p0, p1, integrals.pia_rows(packed, nao, co, cv, backend, work)))  # kept: not in work
            t0 = time.perf_counter()
    del work
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
            full[p0:p1] = recv[a : a + m].view(p1 - p0, c1 - c0)
            a += m
    out = {}
    for k in mine:
        k0, k1 = blocks.columns(k)
        out[k] = full[:, k0 - c0 : k1 - c0].contiguous()  # its own allocation, as one process has it
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
        out[k] = buf[a : a + n].view(shape).clone()  # its own allocation, as one process has it
        a += n
    return out


def _ring(own: dict, blocks: OccBlocks, world: World, shifts: int, visit, dtype, device) -> None:
    """The ring pass: ``visit(s, q, held)`` for s in 0..shifts-1 with ``held`` the blocks of rank
    q = r - s (s = 0: this rank's own). The blocks held go on to r + 1, and those of r - s - 1
    arrive, while ``visit`` computes (own, held and arriving: three shares of B at most)."""
    held = own
    for s in range(shifts):
        q = (world.rank - s) % world.size
        pending = None
        if s + 1 < shifts:
            nxt = (world.rank - s - 1) % world.size
            ks = list(owned(blocks.count, world, nxt))
            n = sum(blocks.shape(k)[0] * blocks.shape(k)[1] for k in ks)
            recv = torch.empty(n, dtype=dtype, device=world.wire_device) if n else None
            pending = world.post(
                _pack(held, world), recv, (world.rank + 1) % world.size, (world.rank - 1) % world.size, "pair"
            )
        visit(s, q, held)
        if pending is not None:
            pending.wait()
            held = _unpack(recv, ks, blocks, device)


def pair_cost(blocks: OccBlocks, i: int, j: int) -> float:
    """Relative cost of block pair (I, J): n_I n_J occupied pairs, half of them when I = J."""
    ni, nj = (lambda o: o[1] - o[0])(blocks.orbitals(i)), (lambda o: o[1] - o[0])(blocks.orbitals(j))
    return ni * (ni + 1) / 2 if i == j else ni * nj


def assigned(blocks: OccBlocks, size: int) -> dict:
    """{(I, J): the rank that computes it} for every block pair I >= J over ``size`` ranks (the
    same answer on every rank). A pair goes to the rank that holds both blocks at a shift
    s <= N/2 of the ring: its owners' rank when one owns both, else the owner of the block that
    reaches the other at the shorter shift; at s = N/2 (N even) both owners hold both, and each
    such pair goes to whichever of the two has less work so far (``pair_cost``), in pair order."""
    world = [World(rank=r, size=size) for r in range(size)]
    owner = {k: r for r in range(size) for k in owned(blocks.count, world[r])}
    load, out, shared = [0.0] * size, {}, []
    for i, j in blocks.pairs():
        oi, oj = owner[i], owner[j]
        d = (oi - oj) % size  # oi holds oj's blocks at shift d, oj holds oi's at N - d
        if oi == oj or 2 * d < size:
            r = oi
        elif 2 * d > size:
            r = oj
        else:
            shared.append((i, j))
            continue
        out[(i, j)] = r
        load[r] += pair_cost(blocks, i, j)
    for i, j in shared:
        a, b = sorted((owner[i], owner[j]))
        r = a if load[a] <= load[b] else b
        out[(i, j)] = r
        load[r] += pair_cost(blocks, i, j)
    return out


def resumed(session, mine: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, object, int]:
    """From a checkpoint's pair ``session`` ((done, stored sums), on_pair) or None: (which of the
    pairs this rank computes (``mine``, bool) are finished, their sums copied into ``sums``; the
    ``on_pair(p, e_os, e_ss)`` that saves each newly finished one, or None; how many were finished).
    A done flag on a pair another rank computes is not taken (it would be added twice)."""
    if session is None:
        return np.zeros(len(mine), dtype=bool), None, 0
    (done, stored), on_pair = session
    finished = np.asarray(done, dtype=bool) & mine
    sums[finished] = np.asarray(stored).reshape(sums.shape)[finished]
    return finished, on_pair, int(finished.sum())


def same_spin_sums(  # noqa: PLR0913
    own: dict, blocks: OccBlocks, eps_occ, eps_vir, backend, world: World, dtype, progress=None, session=None
) -> tuple[float, float, int]:
    """(E_OS, E_SS, pairs taken from the checkpoint on this rank) of one channel's block pairs
    I >= J (``OccBlocks.pairs``) over the ranks (each pair computed by the rank ``assigned`` names,
    when it holds both blocks), added in the single-process order (``combine``); every rank gets
    them. ``session``: this rank's checkpoint pair set (``Checkpoint.pair_session``): its finished
    pairs are not recomputed, each new one is saved."""
    pairs = blocks.pairs()
    index = {p: n for n, p in enumerate(pairs)}
    sums = np.zeros((len(pairs), 2), dtype=np.float64)
    nvir, r = blocks.nvir, world.rank
    who = assigned(blocks, world.size)
    finished, on_pair, reused = resumed(session, np.array([who[p] == r for p in pairs], dtype=bool), sums)
    todo = sum(1 for p in pairs if who[p] == r)
    done = [reused]

    def visit(s, q, held):
        for i in sorted(own):
            for j in sorted(held):
                hi, lo = (i, j) if i >= j else (j, i)
                if (s == 0 and j > i) or who[(hi, lo)] != r or finished[index[(hi, lo)]]:
                    continue
                bh, bl = (own[i], held[j]) if i >= j else (held[j], own[i])
                (i0, i1), (j0, j1) = blocks.orbitals(hi), blocks.orbitals(lo)
                fault("pair")
                bi = pair_view(bh, nvir)
                bj = bi if hi == lo else pair_view(bl, nvir)
                p = index[(hi, lo)]
                sums[p] = linalg.mp2_pair_energy(
                    bi, bj, eps_occ[i0:i1], eps_occ[j0:j1], eps_vir, symmetric=(hi == lo), backend=backend
                )
                if on_pair is not None:
                    on_pair(p, *sums[p].tolist())
                done[0] += 1
                if progress is not None and todo:
                    progress(done[0] * len(pairs) // todo, len(pairs))

    _ring(own, blocks, world, world.size // 2 + 1, visit, dtype, backend.device)
    total = world.all_reduce_sum(torch.from_numpy(sums), "pair").numpy()
    return (*combine(total, pairs), reused)


def cross_spin_sums(  # noqa: PLR0913
    own_a: dict,
    own_b: dict,
    blocks_a: OccBlocks,
    blocks_b: OccBlocks,
    eps_a,
    eps_b,
    backend,
    world: World,
    dtype,
    progress=None,
    session=None,
) -> tuple[float, int]:
    """(UMP2's E_ab, pairs taken from the checkpoint on this rank) over the ranks: pairs (I of
    alpha, this rank's; J of beta, passed round the ring over all N shifts), each in its slot of the
    I-major single-process order, summed there. ``session``: as ``same_spin_sums``'s."""
    total = blocks_a.count * blocks_b.count
    sums = np.zeros((total, 2), dtype=np.float64)
    mine = np.array([p // blocks_b.count in own_a for p in range(total)], dtype=bool)
    finished, on_pair, reused = resumed(session, mine, sums)
    done = [reused]
    todo = len(own_a) * blocks_b.count

    def visit(s, q, held):
        for i in sorted(own_a):
            i0, i1 = blocks_a.orbitals(i)
            bi = pair_view(own_a[i], blocks_a.nvir)
            for j in sorted(held):
                j0, j1 = blocks_b.orbitals(j)
                p = i * blocks_b.count + j
                if finished[p]:
                    continue
                fault("pair")
                sums[p] = linalg.mp2_pair_energy(
                    bi,
                    pair_view(held[j], blocks_b.nvir),
                    eps_a[0][i0:i1],
                    eps_b[0][j0:j1],
                    eps_a[1],
                    eps_vir_j=eps_b[1],
                    backend=backend,
                )
                if on_pair is not None:
                    on_pair(p, *sums[p].tolist())
                done[0] += 1
                if progress is not None and todo:
                    progress(done[0] * total // todo, total)

    _ring(own_b, blocks_b, world, world.size, visit, dtype, backend.device)
    out = world.all_reduce_sum(torch.from_numpy(np.ascontiguousarray(sums[:, 0])), "pair").numpy()
    return float(sum(out.tolist())), reused


RANKS_MAX = 65536  # the most ranks a refusal searches for the number that would fit


def rank_stages_mb(plan, world_size: int, rank: int | None = None) -> dict:
    """Peak MB of each MP2 stage on the rank with the largest share of B (or on ``rank``) over
    ``world_size`` ranks, with the blocks of ``plan`` (an in-memory single-process plan):

        transform  L, one (μν|P) block and its transforms (as one process), this rank's rows of
                   (P|ia) for every column and its own columns for every row (2 shares)
        fit        L, its (P|ia) columns becoming B, one block's trsm output
        pair       its own B, the blocks passing through (held and received: 2 shares), workspace

    A share is the rank's fraction of the occupied columns (contiguous blocks, ``owned``)."""
    from dfmp2.memory import MB, stage_estimates

    s = plan.shapes
    nocc, nvir, naux = s["nocc"], s["nvir"], s["naux"]
    blocks = OccBlocks(nocc, nvir, naux, plan.occ_block)
    shares = []
    for r in range(world_size):
        ks = range(r * blocks.count // world_size, (r + 1) * blocks.count // world_size)
        shares.append(sum(blocks.shape(k)[1] for k in ks) / max(1, nocc * nvir))
    f = shares[rank] if rank is not None else max(shares)
    one = stage_estimates(
        **{k: s[k] for k in ("nao", "nocc", "nvir", "naux", "itemsize", "fit_itemsize")},
        aux_block=plan.aux_block,
        occ_block=plan.occ_block,
        out_of_core=False,
    )
    pia, b = naux * nocc * nvir * s["fit_itemsize"] / MB, naux * nocc * nvir * s["itemsize"] / MB
    return {
        "metric": one["metric"],
        "transform": one["transform"] - pia + 2 * f * pia,
        "fit": one["fit"] - max(pia, b) + f * (pia + b),
        "pair": one["pair"] - b + 3 * f * b,
    }


def per_rank_plan(plan, world: World, limit_mb: float) -> None:
    """Make ``plan`` (in memory, blocks as one process without a limit) this run's per-rank plan
    against ``limit_mb``: its stages and peak those of the largest share (``rank_stages_mb``),
    ``shapes['ranks']``; MemoryLimitError (before any integral) when it does not fit, saying on
    how many ranks it would."""
    from dfmp2.errors import MemoryLimitError
    from dfmp2.memory import human

    stages = rank_stages_mb(plan, world.size)
    peak = max(stages.values())
    plan.limit_mb, plan.stages_mb, plan.peak_mb = limit_mb, stages, peak
    plan.shapes["ranks"] = world.size
    if peak <= limit_mb:
        return
    need = next((n for n in _doubling(world.size) if max(rank_stages_mb(plan, n).values()) <= limit_mb), None)
    where = (
        f"it would fit on {need} ranks"
        if need is not None
        else f"it does not fit on any number of ranks (one rank's fixed part is {human(stages['metric'])})"
    )
    raise MemoryLimitError(
        f"the MP2 stage needs {human(peak)} per rank on {world.size} ranks but the memory "
        f"limit is {human(limit_mb)} per rank; {where}",
        need_mb=peak,
        limit_mb=limit_mb,
    )


def _doubling(start: int):
    n = start + 1
    while n <= RANKS_MAX:
        yield n
        n = n + 1 if n < 2 * start else int(n * 1.25)


def plan_printer(world: World, inner, say):
    """``on_plan`` of a verbose run over several ranks: ``inner(plan)`` (rank 0's table, or None),
    then this rank's line (``plan_line``) through ``say``."""

    def on_plan(plan):
        if inner is not None:
            inner(plan)
        say(plan_line(plan, world))

    return on_plan


def plan_line(plan, world: World) -> str:
    """This rank's part of the plan, one line: its occupied blocks, its share of B and its peak (MB)."""
    s = plan.shapes
    blocks = OccBlocks(s["nocc"], s["nvir"], s["naux"], plan.occ_block)
    mine = owned(blocks.count, world)
    share = plan.b_mb * sum(blocks.shape(k)[1] for k in mine) / max(1, s["nocc"] * s["nvir"])
    peak = max(rank_stages_mb(plan, world.size, world.rank).values())
    return (
        f"rank {world.rank} of {world.size} ({world.device}): occupied blocks {mine.start}-{mine.stop - 1} of "
        f"{blocks.count}, B share {share:,.1f} of {plan.b_mb:,.1f} MB, MP2 stage peak {peak:,.1f} MB of "
        f"{plan.limit_mb:,.1f} MB"
    )
