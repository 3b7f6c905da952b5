"""The run's plan, made before any integral (``plan_run`` -> ``RunPlan``): the SCF part
(``ScfPlan``: our DF-SCF's JK factor), the MP2 part (``MemoryPlan``: the MP2 stage's blocks and
B's home, the SCF's peak counted in it) and the densities part (the gradient's or the property
stage's ``GradientPlan``), checked against the memory limit and the disk; and the checkpoint's
life cycle (``CheckpointSession``), one context manager.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dfmp2 import distributed, linalg, memory
from dfmp2.df import basis, integrals
from dfmp2.distributed import RankLostError
from dfmp2.drivers.job import Job, request_content
from dfmp2.errors import DiskWriteError, InputError, MemoryLimitError
from dfmp2.grad import relaxed
from dfmp2.io import checkpoint, molecule, outputs, rank_checkpoint
from dfmp2.linalg import DTYPES
from dfmp2.memory import MemoryPlan, plan_memory
from dfmp2.mp2.dist import per_rank_plan
from dfmp2.options import SCF_SCREEN, RunOptions
from dfmp2.props import stage as props_stage
from dfmp2.scf import driver, jk, jk_dist, pyscf_scf
from dfmp2.scf.precision import resolve_precision
from dfmp2.scf.settings import ScfPlan

if TYPE_CHECKING:
    from dfmp2.grad.plan import GradientPlan


@dataclass(frozen=True)
class RunPlan:
    """The plan of one run: ``scf`` (ScfPlan; its defaults when our DF-SCF does not run), ``mp2``
    (the MemoryPlan the MP2 stage runs with and the Result records, its ``stages_mb['scf']`` the
    SCF's peak), ``densities`` (the gradient's or the property stage's GradientPlan; None when
    neither runs)."""

    scf: ScfPlan
    mp2: MemoryPlan
    densities: GradientPlan | None = None


def density_plan(job: Job, gradient: bool = False) -> GradientPlan | None:
    """The densities part, before any work: the gradient stage's plan (``gradient``; the fastest
    that fits, ``relaxed.job_plan``), or the density stage's of the properties
    ``options.properties`` asks for, or None. MemoryLimitError (one line) when nothing fits."""
    if gradient:
        return relaxed.job_plan(job, job.options.memory_mb)
    if job.options.properties:
        return props_stage.density_plan(job, job.options.memory_mb)
    return None


def input_content(job: Job, scf: ScfPlan | None = None) -> dict:
    """What the ranks must agree on before any integral (``World.agree``: a rank that read other
    inputs must not mix into the result):
    ``request_content`` with the caller's own parameters (``job.agreed``: a gradient's method),
    then what was resolved from it: the charge and multiplicity, the basis
    sets as PySCF holds them (orbital, ECP, MP2-fit, JK-fit), the working precision and the cpu
    BLAS choice (probed now if need be: a rank with another table sums in another order) and, from
    ``scf``, what its measured SGEMM/DGEMM ratio decided: whether an 'auto' SCF runs fp32 cycles
    (``_plan_scf``; the decision, not the ratio: each GPU measures its own, a few % apart)."""
    mol = job.mol
    content = {**request_content(job.geom, job.options), **job.agreed}
    content.update(
        {
            "the charge": int(mol.charge),
            "the multiplicity": int(mol.spin) + 1,
            "the orbital basis set": mol._basis,
            "the ECP": mol._ecp,
            "the MP2 fitting set": job.auxmol._basis,
            "the JK fitting set": job.jk_auxmol._basis if job.jk_auxmol is not None else None,
            "the working precision": job.precision,
        }
    )
    blas = getattr(job.backend, "blas", None)
    if blas is not None:
        table = blas.table().table
        content["the cpu BLAS choice"] = {"mode": blas.mode, "choice": table["choice"] if table else None}
    if scf is not None and scf.fp32_speedup is not None:
        mode, _ = resolve_precision(job.backend.caps, job.options.scf_precision, scf.fp32_copy, scf.fp32_speedup)
        content["the SCF precision the measured SGEMM/DGEMM ratio chose"] = mode
    return content


class CheckpointSession:
    """The checkpoint's life cycle. Opening resumes ``options.resume`` (its fingerprint checked)
    or refuses an existing ``options.checkpoint``; ``start(plan)`` creates the new file once the
    plan is known; ``finish`` marks it complete. On a failure a checkpoint this run created stays
    only when it holds work to resume (the SCF at least) and the failure is not a refusal the same
    command would meet again (a write the disk refused is one); otherwise it is removed, so the
    same command can run again. A resumed checkpoint is kept, after a refused write as it was last
    flushed (``Checkpoint.abandon``)."""

    def __init__(self, job: Job):
        o, space, world = job.options, job.space, job.world
        self.path = o.resume or o.checkpoint
        self.options, self.ck, self.created, self.fp = o, None, False, None
        # over several ranks each rank has its own file (rank 0's is the path given: rank_checkpoint)
        self.cls = rank_checkpoint.RankCheckpoint if world.distributed else checkpoint.Checkpoint
        self.mine = (lambda p: rank_checkpoint.rank_path(p, world.rank)) if world.distributed else Path
        if not self.path:
            return
        self.fp = checkpoint.fingerprint(
            mol=job.mol,
            basis=o.basis,
            auxbasis=basis.describe_auxbasis(job.auxbasis),
            scf_mode=o.scf_mode,
            frozen_core=o.frozen_core,
            precision=job.precision,
            device=o.device,
            simulate=o.simulate,
            nfrozen=space.nfrozen,
            nocc=space.nocc[0] - space.nfrozen,
            nvir=space.nmo - space.nocc[0],
            naux=space.naux,
            ecp=molecule.ecp_info(job.mol),
            scf_conv_tol_grad=o.scf_conv_tol_grad if o.scf_conv_tol_grad != pyscf_scf.SCF_CONV_TOL_GRAD else None,
            nocc_beta=space.nocc[1] - space.nfrozen if job.unrestricted else None,
            scf_screen=o.scf_screen if o.scf_screen != SCF_SCREEN else None,
        )
        if world.distributed:
            self.fp.update(ranks=world.size, rank=world.rank)

    def __enter__(self) -> CheckpointSession:
        o = self.options
        if o.resume:
            self.ck = self.cls.resume(self.mine(o.resume), self.fp)
        elif o.checkpoint and self.mine(o.checkpoint).exists():
            mine = self.mine(o.checkpoint)
            checkpoint.check_regular(mine, "checkpoint")
            raise checkpoint.CheckpointError(
                f"checkpoint {mine} already exists; resume it, or remove it to start afresh", option="checkpoint"
            )
        return self

    def start(self, plan: MemoryPlan) -> None:
        if self.ck is None and self.options.checkpoint:
            self.ck = self.cls.create(self.mine(self.options.checkpoint), self.fp, occ_block=plan.occ_block)
            self.created = True

    def finish(self, e_os: float, e_ss: float) -> None:
        if self.ck is not None:
            self.ck.mark_complete(e_os, e_ss)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.created:
                try:  # a rank lost over several ranks is no refusal: the work so far is kept to resume
                    keep = self.ck.has_scf and (not isinstance(exc, InputError) or isinstance(exc, RankLostError))
                except Exception:  # unreadable after the failure: nothing to resume
                    keep = False
                if not keep:
                    self.ck.discard()
        finally:
            if self.ck is not None:  # after a refused write: closed as flushed, nothing more written
                self.ck.abandon() if isinstance(exc, DiskWriteError) else self.ck.close()


def plan_run(job: Job, session: CheckpointSession, on_plan, say, densities: GradientPlan | None = None) -> RunPlan:
    """The run's plan: the MP2 stage's memory (and our DF-SCF's when it runs), checked against the
    limit and the disk before any integral; ``densities``: its densities part (``density_plan``).
    ``on_plan(plan)`` sees the MP2 part."""
    ck, space, options = session.ck, job.space, job.options
    # UHF: B^alpha and B^beta are both resident; the plan counts them as one B of all active
    # occupied orbitals by the widest channel's virtuals (an upper bound on both stores together,
    # and the widest pair workspace)
    ours = our_scf(job) and not (ck is not None and ck.has_scf)
    world = job.world
    try:
        plan = stage_plan(
            job.mol,
            job.auxmol,
            distributed.plan_options(options, world),
            job.backend,
            job.precision,
            nocc=space.nocc_active,
            nvir=space.nvir_max,
            occ_block=ck.occ_block if ck is not None else None,
            engine=job.engine,
        )
        if world.distributed:  # each rank's share of B against the limit, before any integral
            per_rank_plan(
                plan,
                world,
                options.memory_mb if options.memory_mb is not None else memory.default_limit_mb(options.device),
            )
    except MemoryLimitError as e:  # the whole run's minimum, not the first stage's that refused
        scf_mb = _scf_memory(job, minimum=True)["peak"] if ours else 0.0
        if e.need_mb is None or scf_mb <= e.need_mb:
            raise
        raise MemoryLimitError(
            f"this run needs at least {memory.human(scf_mb)} (the DF-SCF; the MP2 stage after it "
            f"{memory.human(e.need_mb)}) but the memory limit is {memory.human(e.limit_mb)}; raise the "
            "memory limit",
            need_mb=scf_mb,
            limit_mb=e.limit_mb,
        ) from None
    scf, plan = _plan_scf(job, plan) if ours else (ScfPlan(), plan)
    if on_plan is not None:
        on_plan(plan)
    say(
        f"{job.geom.natm} atoms, {job.mol.nelectron} electrons, nbasis {space.nbasis}, naux {space.naux}; "
        f"memory plan {plan.peak_mb:.0f} MB of {plan.limit_mb:.0f} MB, B "
        f"{'on disk' if plan.out_of_core else 'in memory'}"
    )
    nblocks = [-(-(n - space.nfrozen) // plan.occ_block) for n in space.nocc]  # per spin channel
    ck_mb = checkpoint.size_mb(
        b_mb=plan.b_mb,
        nbasis=space.nbasis,
        nmo=space.nmo,
        nblocks=nblocks[0],
        nblocks_beta=nblocks[1] if job.unrestricted else None,
    )
    pyscf_df = options.scf_mode in pyscf_scf.SCF_DF_MODES and not ours and not (ck is not None and ck.has_scf)
    _check_disk(
        plan,
        options,
        session.path,
        b_done=ck is not None and ck.b_complete,
        b_mb=plan.b_mb,
        ck_mb=ck_mb,
        pia_mb=plan.disk_mb - plan.b_mb if plan.out_of_core else 0.0,
        pyscf_df_mb=pyscf_scf.pyscf_df_disk_mb(job.mol, plan.limit_mb, job.jk_auxbasis) if pyscf_df else 0.0,
        jk_factor_mb=scf.disk,
    )
    return RunPlan(scf, plan, densities)


def stage_plan(  # noqa: PLR0913
    mol,
    auxmol,
    options: RunOptions,
    backend,
    precision: str,
    *,
    nocc: int,
    nvir: int,
    occ_block: int | None = None,
    engine: integrals.IntegralEngine | None = None,
) -> MemoryPlan:
    """The memory plan ``dfmp2 run`` makes for ``nocc`` active occupied and ``nvir`` virtual
    orbitals with these options (``occ_block``: a resumed checkpoint's fixed block; ``engine``:
    whose working memory the transform holds, default the host engine)."""
    return plan_memory(
        nao=mol.nao_nr(),
        nocc=nocc,
        nvir=nvir,
        naux=auxmol.nao_nr(),
        itemsize=torch.finfo(DTYPES[precision]).bits // 8,
        limit_mb=options.memory_mb,
        device=options.device,
        fit_itemsize=torch.finfo(backend.fit_dtype(precision)).bits // 8,
        storage=options.storage,
        aux_shell_max=largest_shell(auxmol),
        occ_block=occ_block,
        occ_block_max=memory.occ_block_max(options.occ_block_max, backend.caps),
        j3c_block_mb=engine.block_mb(options.j3c_block_mb) if engine is not None else options.j3c_block_mb,
        engine=engine.name if engine is not None else "host",
        queue_depth=getattr(engine, "depth", memory.QUEUE_DEPTH),
    )


def our_scf(job: Job) -> bool:
    """Whether our DF-SCF (dfmp2.scf.driver: DFRHF or DFUHF, on every device) makes the reference: SCF mode
    'df', for MP2 (a double hybrid's KS-SCF is PySCF's, pyscf_scf.run_ks)."""
    return job.options.scf_mode == "df" and job.dh is None


def _plan_scf(job: Job, plan: MemoryPlan) -> tuple[ScfPlan, MemoryPlan]:
    """Our DF-SCF's part (stage 'scf': its JK factor, and the fp32 copy a mixed-precision SCF
    keeps when it fits, resident during the cycles and freed before the MP2 stage) and the MP2
    part with the SCF's peak counted (a new MemoryPlan: ``stages_mb['scf']``, ``peak_mb``,
    ``shapes['naux_jk']``); MemoryLimitError before any integral when the factor does not fit.
    Also refuses a backend that lacks an op the SCF needs (none does today)."""
    backend = job.backend
    missing = [op for op in driver.OPS if not backend.supports(op)]
    if missing:
        raise linalg.DeviceUnavailableError(
            f"device '{backend.name}' cannot run the DF-SCF: it lacks {', '.join(missing)}", alternatives=("cpu",)
        )
    # the measured SGEMM/DGEMM ratio decides auto; the ranks agree on what it decided (input_content)
    speedup = backend.fp32_speedup() if job.options.scf_precision == "auto" else None
    mixed = resolve_precision(backend.caps, job.options.scf_precision, fp32_speedup=speedup)[0] == "mixed"
    need = _scf_memory(job, limit_mb=plan.limit_mb, fp32_copy=mixed, other_mb=plan.peak_mb)
    shapes = {**plan.shapes, "naux_jk": need["naux_jk"]}
    if need["layout"] == "disk":
        shapes["jk_factor_disk_mb"] = need["disk"]
    plan = dataclasses.replace(
        plan, stages_mb={"scf": need["peak"], **plan.stages_mb}, peak_mb=max(plan.peak_mb, need["peak"]), shapes=shapes
    )
    fp32_ok = need["fp32_copy"] > 0 or need["layout"] == "disk"  # on disk: fp32 blocks from the file, no copy
    scf = ScfPlan(need["block_mb"], fp32_ok, need["layout"], need["disk"], need["fit_mb"], speedup)
    return scf, plan


def _scf_memory(
    job: Job,
    block_mb: float | None = None,
    *,
    limit_mb: float | None = None,
    fp32_copy: bool = False,
    minimum: bool = False,
    other_mb: float = 0.0,
) -> dict:
    """Our DF-SCF's memory (driver.memory_mb: 'peak' MB, with 'naux_jk'): for exchange blocks of
    ``block_mb``, or, given ``limit_mb``, the first plan that fits (driver.check_memory, the JK
    factor on disk last: MemoryLimitError when none does), with the factor's fp32 copy
    (``fp32_copy``) if it fits (``other_mb``: the MP2 stage's peak, which bounds a disk fit's
    block: ``driver.check_memory``); with ``minimum``, the least any plan needs ('peak' only). A UHF
    job: the DF-UHF's (two spins' dense matrices, the wider spin's occupied set). The JK-fit set is
    the job's (``Job.jk_auxmol``), its rows split over the job's process group; the factor goes to
    disk only in one process (or a replicated SCF) on a device with fp64."""
    mol, backend = job.mol, job.backend
    naux_jk = job.jk_auxmol.nao_nr()
    itemsize = torch.finfo(backend.fit_dtype(backend.default_precision)).bits // 8
    split = distributed.split_scf(job.world)
    args = (mol.nao_nr(), jk_dist.planned_rows(job.jk_auxmol, job.world, split), max(mol.nelec), itemsize)
    spins = 2 if job.unrestricted else 1
    disk = backend.has_fp64 and not split
    kw = dict(spins=spins, pairs=job.jk_pairs, held=jk_dist.held_partials(job.jk_auxmol, job.world, split, spins))
    if minimum:
        need = {"peak": driver.min_memory_mb(*args, disk=disk, **kw)}
    elif limit_mb is not None:
        block = jk.exchange_block_mb(backend.caps)
        need = driver.check_memory(
            *args, limit_mb, fp32_copy=fp32_copy, disk=disk, other_mb=other_mb, block_mb=block, **kw
        )
    else:
        need = driver.memory_mb(*args, block_mb, fp32_copy=fp32_copy, **kw)
    return {**need, "naux_jk": naux_jk}


def largest_shell(auxmol) -> int:
    loc = auxmol.ao_loc_nr()
    return int(max(loc[1:] - loc[:-1])) if auxmol.nbas else 1


def _check_disk(  # noqa: PLR0913
    plan: MemoryPlan,
    options: RunOptions,
    ck_path,
    *,
    b_done: bool,
    b_mb: float,
    ck_mb: float,
    pia_mb: float,
    pyscf_df_mb: float = 0.0,
    jk_factor_mb: float = 0.0,
) -> None:
    """Before any heavy work: is there disk for what goes to disk (``outputs.check_disk``)? A
    checkpoint holds B (in memory or not), the SCF and the pair sums (``ck_mb``,
    ``checkpoint.size_mb``); out of core without a checkpoint, B goes to the scratch directory,
    and (P|ia) does when its dtype differs from B's; PySCF's DF-SCF tensor (``pyscf_df_mb``) goes
    there too when it does not fit in memory (``pyscf_scf.pyscf_df_disk_mb``), and so does our
    DF-SCF's JK factor when the plan put it on disk (``jk_factor_mb``; removed before the MP2
    stage writes anything, counted all the same)."""
    scratch = Path(options.scratch_dir) if options.scratch_dir else Path(tempfile.gettempdir())
    needs = []
    if ck_path and not b_done:
        needs.append((Path(ck_path).resolve().parent, ck_mb, "checkpoint"))
    if plan.out_of_core:
        if not ck_path:
            needs.append((scratch, b_mb, "scratch_dir"))
        if pia_mb > 0:
            needs.append((scratch, pia_mb, "scratch_dir"))
    for mb in (pyscf_df_mb, jk_factor_mb):  # gone before the MP2 stage writes anything: counted all the same
        if mb > 0:
            needs.append((scratch, mb, "scratch_dir"))
    outputs.check_disk(needs)
