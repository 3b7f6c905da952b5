"""The DF-MP2 stage: integrals, metric, transforms, fit and pair energies over the spin channels
of a ``reference.Reference`` (one for RHF, two for UHF). Everything runs through ``linalg`` on
the run's backend; the energy sums are carried in fp64 in both precisions.

    B_ia^P = sum_Q (ia|Q) [L^-T]_QP,   L L^T = (P|Q)                       per channel
    K_ab   = sum_P B_ia^P B_jb^P,      D = e_i + e_j - e_a - e_b
    same spin (i, j of one channel):   sum_ij sum_ab K_ab (K_ab - K_ba) / D
    opposite spin:                     sum_ij sum_ab K_ab^2 / D   (RHF: i, j of the one channel,
                                       from the same K; UHF: i of alpha, j of beta)

RHF: E_OS and E_SS come from one pass over the block pairs I >= J. UHF: E_SS = E_aa + E_bb
(each channel's same-spin sum, halved), E_OS = E_ab (``outofcore.cross_block_sums``). For a
closed shell the two agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dfmp2 import memory
from dfmp2.df import integrals, outofcore
from dfmp2.df.fitting import describe_metric, metric_factor
from dfmp2.linalg import DTYPES
from dfmp2.memory import MemoryPlan
from dfmp2.mp2 import dist
from dfmp2.provenance import FromCheckpoint, StorageRecord
from dfmp2.timing import Timer


@dataclass
class MP2Energies:
    """The stage's result. e_os, e_ss in Hartree (E_corr = e_os + e_ss); ``spin_blocks``
    (UHF only): {'e_corr_aa', 'e_corr_bb', 'e_corr_ab'} Hartree; what ran: ``storage``, ``metric``,
    ``integrals`` (the engine's record) and ``stage_precision``."""

    e_os: float
    e_ss: float
    spin_blocks: dict | None
    storage: StorageRecord
    metric: str
    integrals: dict
    stage_precision: dict


def build_B(  # noqa: PLR0913
    mol,
    auxmol,
    C_occ,
    C_vir,
    backend,
    dtype,
    plan: MemoryPlan,
    timer: Timer,
    B,
    engine: integrals.IntegralEngine | None = None,
    metric=None,
) -> None:
    """Fit B into the store ``B`` (``outofcore.open_b_store``): block k holds
    B[P, i*nvir + a] = B_ia^P for the block's i as a (naux, nk*nvir) array in ``B.dtype``; then
    ``B.mark_complete`` (a checkpoint records B and its metric, ``B.metric``).

    (μν|P) is streamed from the integral ``engine`` (dfmp2.df.integrals; default: the host engine,
    libcint) in aux-shell blocks, packed, and unpacked on the device; each block is half-transformed
    with C_occ then C_vir (gemm) into rows of (P|ia) in ``dtype``; then, one occupied block of columns
    at a time, B_k = L^-1 (P|ia)_k (trsm, left). The auxiliary index stays outermost (the
    partition axis on Trainium, the contraction of the pair step). (P|ia) lives where the store
    puts it (``B.open_pia``: out of core, in place in B's file when the dtypes match).
    ``metric``: the factored metric ``metric_factor`` made, when it is shared (UHF: both spins).
    """
    nao = C_occ.shape[0]
    engine = engine or integrals.HostEngine(mol, backend)
    M, metric_kind, metric_info = metric if metric is not None else metric_factor(auxmol, backend, timer, engine)
    t0 = time.perf_counter()
    co = backend.to_device(C_occ, dtype)
    cv = backend.to_device(C_vir, dtype)
    pia = B.open_pia(dtype)
    try:
        aux_blocks = integrals.aux_shell_blocks(auxmol, plan.aux_block)
        t_loop, t_int, work = t0, 0.0, memory.Buffers(dtype, backend.device)
        with engine.blocks(auxmol, aux_blocks, dtype) as stream:
            for p0, p1, packed in stream:
                t1 = time.perf_counter()
                t_int += t1 - t0  # waiting for the engine; device work may still run
                pia.write_rows(p0, p1, integrals.pia_rows(packed, nao, co, cv, backend, work))
                t0 = time.perf_counter()
        pia.flush()
        del work
        t0 = timer.add("transform", t_loop)
        timer.seconds["transform"] -= t_int
        timer.seconds["integrals"] += t_int
        fit_M = M.to(dtype)
        outofcore.fit_blocks(fit_M, metric_kind, pia, B, backend, B.dtype)
        del fit_M, M
    finally:
        B.close_pia(pia)
    t0 = timer.add("fit", t0)
    B.mark_complete(metric_kind, metric_info)
    if B.checkpoint is not None:
        timer.add("checkpoint", t0)


def mp2_stage(  # noqa: PLR0913
    mol,
    auxmol,
    ref,
    *,
    backend,
    precision: str,
    plan: MemoryPlan,
    timer: Timer,
    engine: integrals.IntegralEngine,
    progress=None,
    scratch_dir=None,
    checkpoint=None,
    world=None,
) -> MP2Energies:
    """The DF-MP2 stage after the SCF for ``ref`` (dfmp2.reference.Reference, frozen orbitals
    already marked). B of each channel stays in memory or goes to HDF5 as ``plan.out_of_core``
    says (the same arithmetic either way, so the same bits); out-of-core files without a
    checkpoint go to a private directory under ``scratch_dir``, removed however this returns.
    ``checkpoint``: B (each channel's) and each finished block pair (of each pair set) are
    written to it, and what it already holds is reused. ``progress(done, total)`` after each
    block pair. ``world`` (dfmp2.distributed.World) over several ranks: ``distributed_stage``."""
    if world is not None and world.distributed:
        assert not plan.out_of_core
        return distributed_stage(
            mol,
            auxmol,
            ref,
            backend=backend,
            precision=precision,
            plan=plan,
            timer=timer,
            engine=engine,
            progress=progress,
            world=world,
            checkpoint=checkpoint,
        )
    # fp32 rounding of (P|ia) is amplified by L^-1 (the metric's condition number): on (H2O)4 an
    # fp32 fit costs over ten times the energy error of an fp64 fit
    # (scripts/results/docstring-measurements.md). The transforms and the fit are
    # O(N^4) next to the O(N^5) pair step, so they stay fp64 wherever the device has fp64.
    fit_dtype, b_dtype = backend.fit_dtype(precision), DTYPES[precision]
    naux = auxmol.nao_nr()
    blocks = [outofcore.OccBlocks(ch.nocc_active, ch.nvir_active, naux, plan.occ_block) for ch in ref.channels]
    used = FromCheckpoint(scf=ref.source == "checkpoint")
    stores = []
    try:
        metric, reused = _b_stores(
            stores, mol, auxmol, ref, blocks, backend, fit_dtype, b_dtype, plan, timer, engine, checkpoint, scratch_dir
        )
        used.B = bool(reused) and all(reused)  # every channel's B read back, none built
        e_os, e_ss, npairs, spin_blocks = _pair_step(stores, ref, blocks, backend, timer, checkpoint, used, progress)
        b_file = None
        if plan.out_of_core:
            b_file = stores[0].path if checkpoint is not None else "temporary (removed at the end)"
    finally:
        for B in stores:
            if B is not None:
                B.close()
    storage = StorageRecord(
        B="disk (HDF5)" if plan.out_of_core else "memory",
        occ_blocks=[b.count for b in blocks],
        block_pairs=npairs,
        checkpoint=str(checkpoint.path) if checkpoint is not None else None,
        B_file=b_file,
        from_checkpoint=used,
    )
    return _energies(e_os, e_ss, spin_blocks, storage, metric, engine, fit_dtype, precision)


def _pair_step(stores, ref, blocks, backend, timer: Timer, checkpoint, used: FromCheckpoint, progress):
    """(e_os, e_ss, block pairs, spin_blocks) of the pair step over the channels' B ``stores``
    (one for a closed shell, spin_blocks None then), timed as the 'pair' stage."""
    eps = [
        (backend.to_device(ch.eps_occ, torch.float64), backend.to_device(ch.eps_vir, torch.float64))
        for ch in ref.channels
    ]
    t0 = time.perf_counter()
    if ref.restricted:
        e_os, e_ss, npairs = _closed_shell_pairs(stores[0], eps[0], backend, checkpoint, used, progress)
        spin_blocks = None
    else:
        e_os, e_ss, npairs, spin_blocks = _open_shell_pairs(stores, eps, blocks, backend, progress, checkpoint, used)
    timer.add("pair", t0)
    return e_os, e_ss, npairs, spin_blocks


def _energies(e_os, e_ss, spin_blocks, storage, metric, engine, fit_dtype, precision: str) -> MP2Energies:
    """The stage's MP2Energies from its sums (Hartree) and records: where B was kept, the
    metric's factorisation, the integral engine (not run when B came from the checkpoint), the
    precision of each step."""
    record = engine.describe()
    if storage.from_checkpoint.B:
        record["note"] = "not run: B came from the checkpoint"
    return MP2Energies(
        e_os=e_os,
        e_ss=e_ss,
        spin_blocks=spin_blocks,
        storage=storage,
        metric=describe_metric(*metric),
        integrals=record,
        stage_precision={
            "transform_fit": str(fit_dtype).replace("torch.float", "fp"),
            "pair": precision,
            "energy_sums": "fp64",
        },
    )


def _b_stores(stores, mol, auxmol, ref, blocks, backend, fit_dtype, b_dtype, plan, timer, engine, checkpoint, scratch):  # noqa: PLR0913
    """Open each channel's B store into ``stores`` (None for a channel with nothing to correlate,
    e.g. the H atom's beta spin; the caller closes them), building B where the store does not
    already hold it (one metric factor shared by both channels). Returns (the metric's (kind,
    info), for each channel with a store whether it was complete)."""
    factor, metric, reused = None, ("cholesky", {}), []
    for c, (ch, blk) in enumerate(zip(ref.channels, blocks)):
        if blk.nocc == 0:
            stores.append(None)
            continue
        t0 = time.perf_counter()
        B = outofcore.open_b_store(plan, blk, b_dtype, backend, checkpoint=checkpoint, scratch=scratch, channel=c)
        stores.append(B)
        reused.append(B.complete)
        if B.complete:
            timer.add("checkpoint", t0)
        else:
            factor = factor or metric_factor(auxmol, backend, timer, engine)
            build_B(mol, auxmol, ch.C_occ, ch.C_vir, backend, fit_dtype, plan, timer, B, engine=engine, metric=factor)
        metric = B.metric
    return metric, reused


def _closed_shell_pairs(B, eps, backend, checkpoint, used: FromCheckpoint, progress):
    """(E_OS, E_SS, block pairs) of one closed-shell channel over block pairs I >= J; finished
    pairs come from and go to ``checkpoint``."""
    pairs = B.blocks.pairs()
    done, on_pair = _resumed_pairs(checkpoint, len(pairs), "pairs", used)
    sums = outofcore.pair_block_sums(B, *eps, backend, done=done, on_pair=on_pair, progress=progress)
    e_os, e_ss = outofcore.combine(sums, pairs)
    return e_os, e_ss, len(pairs)


def _resumed_pairs(checkpoint, npairs: int, group: str, used: FromCheckpoint):
    """(done, on_pair) of the checkpoint's pair set ``group`` for the pair loops (None, None without
    a checkpoint); the finished pairs are counted in ``used.pairs``."""
    if checkpoint is None:
        return None, None
    done, on_pair = checkpoint.pair_session(npairs, group)
    used.pairs += int(done[0].sum())
    return done, on_pair


def _open_shell_pairs(stores, eps, blocks, backend, progress, checkpoint=None, used=None):
    """UMP2's three spin blocks (Hartree):

        E_aa = 1/2 sum_{ij in a} sum_ab K_ab (K_ab - K_ba) / D   (pair_block_sums on B^a: e_ss / 2)
        E_bb likewise on B^b,   E_ab = sum_{i in a, j in b} sum_ab K_ab^2 / D   (cross_block_sums)

    With a ``checkpoint`` each set's finished pairs come from and go to its pair set (pairs_aa,
    pairs_bb, pairs_ab; counted in ``used``). Returns (E_OS = E_ab, E_SS = E_aa + E_bb, block
    pairs, {'e_corr_aa', 'e_corr_bb', 'e_corr_ab'})."""
    npairs = [len(b.pairs()) if st is not None else 0 for b, st in zip(blocks, stores)]
    ncross = blocks[0].count * blocks[1].count if None not in stores else 0
    total = sum(npairs) + ncross

    def offset(base):
        return None if progress is None else (lambda done, _n: progress(base + done, total))

    e_same = []
    for s, group in enumerate(("pairs_aa", "pairs_bb")):
        if stores[s] is None:
            e_same.append(0.0)
            continue
        done, on_pair = _resumed_pairs(checkpoint, npairs[s], group, used)
        sums = outofcore.pair_block_sums(
            stores[s], *eps[s], backend, done=done, on_pair=on_pair, progress=offset(sum(npairs[:s]))
        )
        e_same.append(0.5 * outofcore.combine(sums, blocks[s].pairs())[1])
    e_ab = 0.0
    if ncross:
        done, on_pair = _resumed_pairs(checkpoint, ncross, "pairs_ab", used)
        sums = outofcore.cross_block_sums(
            stores[0], stores[1], *eps[0], *eps[1], backend, done=done, on_pair=on_pair, progress=offset(sum(npairs))
        )
        e_ab = float(sum(sums[:, 0].tolist()))
    return e_ab, e_same[0] + e_same[1], total, {"e_corr_aa": e_same[0], "e_corr_bb": e_same[1], "e_corr_ab": e_ab}


def distributed_stage(  # noqa: PLR0913
    mol,
    auxmol,
    ref,
    *,
    backend,
    precision: str,
    plan: MemoryPlan,
    timer: Timer,
    engine: integrals.IntegralEngine,
    progress,
    world,
    checkpoint=None,
) -> MP2Energies:
    """The stage over several ranks (dfmp2.mp2.dist): each rank builds and holds its occupied
    blocks of B in memory; the energies are bitwise the single-process ones and every rank gets
    them. Records each rank's B bytes in ``world.b_bytes`` (gathered on every rank).
    ``checkpoint``: this rank's file of a checkpoint over ranks (dfmp2.io.rank_checkpoint): its B
    and finished pairs are written there, and what the ranks' files hold is reused."""
    fit_dtype, b_dtype = backend.fit_dtype(precision), DTYPES[precision]
    naux = auxmol.nao_nr()
    blocks = [outofcore.OccBlocks(ch.nocc_active, ch.nvir_active, naux, plan.occ_block) for ch in ref.channels]
    t0 = time.perf_counter()
    own, metric, b_reused = _distributed_b(
        mol, auxmol, ref, blocks, backend, fit_dtype, b_dtype, plan, timer, engine, world, checkpoint
    )
    if b_reused:
        timer.add("checkpoint", t0)
    mine = sum(t.numel() * t.element_size() for d in own for t in d.values())
    counts = torch.zeros(world.size, dtype=torch.float64)
    counts[world.rank] = mine
    world.b_bytes = [int(x) for x in world.all_reduce_sum(counts, "transform").tolist()]
    eps = [
        (backend.to_device(ch.eps_occ, torch.float64), backend.to_device(ch.eps_vir, torch.float64))
        for ch in ref.channels
    ]

    def session(npairs, group):
        return checkpoint.pair_session(npairs, group) if checkpoint is not None else None

    t0 = time.perf_counter()
    if ref.restricted:
        e_os, e_ss, reused = dist.same_spin_sums(
            own[0], blocks[0], *eps[0], backend, world, b_dtype, progress, session(len(blocks[0].pairs()), "pairs")
        )
        npairs, spin_blocks = len(blocks[0].pairs()), None
    else:
        e_os, e_ss, spin_blocks, npairs, reused = _distributed_uhf_pairs(
            own, blocks, eps, backend, world, b_dtype, session
        )
    timer.add("pair", t0)
    if checkpoint is not None:  # the finished pairs taken from every rank's file
        reused = int(world.all_reduce_sum(torch.tensor([float(reused)], dtype=torch.float64), "pair").item())
    storage = StorageRecord(
        B=f"memory (distributed over {world.size} ranks)",
        occ_blocks=[b.count for b in blocks],
        block_pairs=npairs,
        checkpoint=str(checkpoint.path) if checkpoint is not None else None,
        B_file=None,
        from_checkpoint=FromCheckpoint(scf=ref.source == "checkpoint", B=b_reused, pairs=reused),
    )
    record = engine.describe()
    if b_reused:
        record["note"] = "not run: B came from the checkpoint"
    return MP2Energies(
        e_os=e_os,
        e_ss=e_ss,
        spin_blocks=spin_blocks,
        storage=storage,
        metric=describe_metric(*metric),
        integrals=record,
        stage_precision={
            "transform_fit": str(fit_dtype).replace("torch.float", "fp"),
            "pair": precision,
            "energy_sums": "fp64",
        },
    )


def _distributed_b(mol, auxmol, ref, blocks, backend, fit_dtype, b_dtype, plan, timer, engine, world, ck):  # noqa: PLR0913
    """This rank's blocks of B per channel ({k: block}), the metric's (kind, info) and whether B
    came from the checkpoint: read back from each rank's file when every rank's holds a complete B
    (the ranks agree first: a build passes blocks between all of them), else built over the ranks
    (and written to the files that lack it)."""
    done = [1.0 if ck is not None and ck.b_done(c) else 0.0 for c in range(len(blocks))]
    ndone = world.all_reduce_sum(torch.tensor(done, dtype=torch.float64), "transform").tolist()
    reuse = [ck is not None and n == world.size for n in ndone]
    factor, metric, own = None, ("cholesky", {}), []
    for c, (ch, blk) in enumerate(zip(ref.channels, blocks)):
        if not blk.nocc:
            own.append({})
            continue
        if reuse[c]:
            own.append(ck.load_own_b(blk, list(dist.owned(blk.count, world)), b_dtype, backend.device, c))
            metric = ck.metric(c)
            continue
        factor = factor or metric_factor(auxmol, backend, timer, engine)
        own.append(
            dist.build_B(
                mol, auxmol, ch.C_occ, ch.C_vir, backend, fit_dtype, b_dtype, plan, timer, blk, engine, factor, world
            )
        )
        metric = factor[1:]
        if ck is not None and not ck.b_done(c):
            t0 = time.perf_counter()
            ck.save_own_b(own[-1], *metric, channel=c)
            timer.add("checkpoint", t0)
    return own, metric, all(r for r, b in zip(reuse, blocks) if b.nocc)


def _distributed_uhf_pairs(own, blocks, eps, backend, world, b_dtype, session):
    """UMP2's spin blocks over the ranks (``_open_shell_pairs``' sums): (E_OS, E_SS, spin blocks,
    block pairs, pairs taken from this rank's checkpoint file); ``session(npairs, group)``: the
    checkpoint's pair set or None."""
    e_same, reused = [0.0, 0.0], 0
    for s, group in enumerate(("pairs_aa", "pairs_bb")):
        if blocks[s].nocc:
            _os, ss, n = dist.same_spin_sums(
                own[s], blocks[s], *eps[s], backend, world, b_dtype, None, session(len(blocks[s].pairs()), group)
            )
            e_same[s], reused = 0.5 * ss, reused + n
    e_ab = 0.0
    if blocks[0].nocc and blocks[1].nocc:
        e_ab, n = dist.cross_spin_sums(
            own[0],
            own[1],
            blocks[0],
            blocks[1],
            eps[0],
            eps[1],
            backend,
            world,
            b_dtype,
            session=session(blocks[0].count * blocks[1].count, "pairs_ab"),
        )
        reused += n
    npairs = sum(len(b.pairs()) for b in blocks if b.nocc) + blocks[0].count * blocks[1].count
    spin_blocks = {"e_corr_aa": e_same[0], "e_corr_bb": e_same[1], "e_corr_ab": e_ab}
    return e_ab, e_same[0] + e_same[1], spin_blocks, npairs, reused
