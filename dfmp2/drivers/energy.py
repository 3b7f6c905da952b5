"""One energy run as a straight sequence of named stages, like gpu4pyscf's DF-MP2 driver:

    prepare    options checked, backend, molecule, bases, integral engine, the orbital space
               (``dfmp2.drivers.job``: ``Job``): everything cheap that can refuse the run
    plan       the run's plan (``dfmp2.drivers.plan``: SCF, MP2, densities), disk, the checkpoint
    reference  the SCF on the run's device (dfmp2.scf.driver), PySCF's (dfmp2.scf.pyscf_scf) or the checkpoint's
    mp2        the DF-MP2 stage over the reference's spin channels (``mp2_energies``: dfmp2.mp2.stage)
    result     energies, shapes, timings and what ran (dfmp2.io.result, dfmp2.provenance)

One way in: ``run_energy(prepare(geom, options))`` -> ``EnergyRun``. The one-call forms are in
dfmp2.interfaces.api; the PySCF drop-in runs the MP2 stage after its own SCF through
``mp2_after_scf``, which calls the same ``mp2_energies``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dfmp2 import distributed, memory
from dfmp2.df import basis
from dfmp2.drivers.job import Job, OrbitalSpace, make_backend, prepare, request_content, select_integrals
from dfmp2.drivers.plan import (
    CheckpointSession,
    RunPlan,
    ScfPlan,
    density_plan,
    input_content,
    our_scf,
    plan_run,
    stage_plan,
)
from dfmp2.io import molecule
from dfmp2.io.result import Result, geometry_record, software_versions
from dfmp2.io.xyz import Geometry
from dfmp2.linalg.base import Backend
from dfmp2.memory import MemoryPlan
from dfmp2.mp2 import double_hybrids
from dfmp2.mp2.stage import MP2Energies, mp2_stage
from dfmp2.options import RunOptions, basis_text
from dfmp2.props import stage as props_stage
from dfmp2.provenance import RunRecord
from dfmp2.reference import Reference, freeze_lowest
from dfmp2.scf import driver, pyscf_scf, stability
from dfmp2.scf.precision import resolve_precision
from dfmp2.scf.settings import SCFSettings
from dfmp2.timing import CycleLog, Profile, Timer

__all__ = [  # the one way in (prepare -> run_energy) and the names its callers read from here
    "CheckpointSession",
    "EnergyRun",
    "Job",
    "MP2Run",
    "OrbitalSpace",
    "RunPlan",
    "ScfPlan",
    "make_backend",
    "mp2_after_scf",
    "mp2_energies",
    "prepare",
    "request_content",
    "run_energy",
    "select_integrals",
    "stage_plan",
]


@dataclass
class EnergyRun:
    """What an energy run hands on (``run_energy``): its Job (molecule, both fitting sets, backend,
    orbital space, process group), the converged Reference with its frozen core marked, the Result
    and the run's plan (its ``densities``: the gradient stage's, for ``run_energy(gradient=True)``).
    The gradient stage (``dfmp2.drivers.gradient.gradient_stage``) and QCSchema's SCF parts read it."""

    job: Job
    ref: Reference
    result: Result
    plan: RunPlan | None = None

    @property
    def mol(self):
        return self.job.mol


def run_energy(
    job: Job,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
    guess=None,
    gradient: bool = False,
    profile: bool = False,
) -> EnergyRun:
    """The heavy part of the run of a prepared ``job`` (``prepare``): plan, reference, MP2, the
    properties ``options.properties`` asks for (``props.stage``; the density stage's memory checked
    with the plan, before any work), result; the EnergyRun for whatever comes next (the gradient
    stage, QCSchema's SCF parts, the next geometry's guess). ``log(msg)``: progress lines;
    ``progress(done, total)``: block pairs; ``on_plan(plan)``: sees the memory plan; ``guess``: our
    DF-SCF's starting density (``Reference.density()`` of a previous geometry of the same molecule
    and basis; default PySCF's 'minao'; PySCF's SCF starts from 'minao' whatever is given);
    ``gradient``: the plan's densities part is the gradient stage's, and no property stage runs
    (the gradient makes them from its own densities); ``profile``: the Result's ``profile`` holds
    where the time and bytes went (``dfmp2.timing.Profile``: per stage, per part of the SCF's
    cycles, the top kernels). The Result's wall_s counts from ``prepare``."""
    say = log or (lambda msg: None)
    world, options = job.world, job.options
    prof = Profile(job.backend) if profile else None  # dfmp2 run --profile
    timer = Timer(job.backend, profile=prof)
    with prof or contextlib.nullcontext():
        want = () if gradient else options.properties
        densities = density_plan(job, gradient)
        with CheckpointSession(job) as session:
            with world.agreeing():
                plan = plan_run(job, session, on_plan, say, densities)
                distributed.check_plan(plan.mp2, world)
                session.start(plan.mp2)  # over several ranks: a rank that cannot create its file stops them all
            world.agree(None, input_content(job, plan.scf))  # the ranks' inputs the same, bit for bit
            ref = reference_stage(job, session.ck, timer, plan, say, guess)
            say("integrals, transforms, fit and pair energies ...")
            mp2 = mp2_energies(
                job.mol,
                job.auxmol,
                ref,
                options,
                job.backend,
                job.precision,
                plan.mp2,
                timer,
                job.engine,
                progress=progress,
                checkpoint=session.ck,
                world=world,
            )
            session.finish(mp2.e_os, mp2.e_ss)
        world.summarize()
        properties = None
        if want:
            method = options.method if job.dh is not None else "mp2"  # the energy the densities differentiate
            say(f"properties ({', '.join(want)}): {'PT2' if job.dh is not None else 'MP2'} densities and Z-vector ...")
            properties = props_stage.property_stage(
                job.mol, ref, job.auxmol, job.jk_auxmol, job.backend, want, method, plan=densities
            )
        disp = None
        if job.dh is not None:  # E_disp from the geometry alone (None: no dispersion in the functional)
            t0 = time.perf_counter()
            disp = double_hybrids.dispersion_energy(job.mol, job.dh)[1]
            timer.add("dispersion", t0, sync=False)
    result = make_result(job, ref, mp2, timer, plan.mp2, wall_s=time.perf_counter() - job.t_start)
    result.properties = properties
    if prof is not None:
        result.profile = prof.report(
            timer.seconds, result.wall_s, ref.scf.iterations if ref.scf is not None else None, job.t_start
        )
    if job.dh is not None:  # the parts of its energy and the total
        result.double_hybrid = double_hybrids.record(job.dh, ref.e_hf, mp2.e_os, mp2.e_ss, disp, job.ks)
    if world.distributed:
        result.ran["distributed"] = world.describe()
    return EnergyRun(job, ref, result, plan)


def mp2_energies(  # noqa: PLR0913
    mol,
    auxmol,
    ref: Reference,
    options: RunOptions,
    backend: Backend,
    precision: str,
    plan: MemoryPlan,
    timer: Timer,
    engine,
    *,
    progress=None,
    checkpoint=None,
    world: distributed.World | None = None,
) -> MP2Energies:
    """The DF-MP2 stage (``mp2_stage``) as every energy runs it: on ``backend`` in ``precision``
    with ``plan``'s blocks, ``engine``'s integrals and ``options.scratch_dir`` for what goes to
    disk; ``checkpoint``, ``world``: a run's (None: none, one process)."""
    return mp2_stage(
        mol,
        auxmol,
        ref,
        backend=backend,
        precision=precision,
        plan=plan,
        timer=timer,
        engine=engine,
        progress=progress,
        scratch_dir=options.scratch_dir,
        checkpoint=checkpoint,
        world=world,
    )


@dataclass
class MP2Run:
    """The MP2 stage run after an SCF made elsewhere (``mp2_after_scf``): its energies, the
    stage's seconds (device synchronised before and after), the seconds per stage and what ran
    (``RunRecord.to_dict()``)."""

    mp2: MP2Energies
    seconds: float
    timings: dict = field(default_factory=dict)
    ran: dict = field(default_factory=dict)


def mp2_after_scf(
    mol, auxmol, ref: Reference, options: RunOptions, backend: Backend | None = None, engine=None
) -> MP2Run:
    """The DF-MP2 stage after a converged SCF exactly as ``run_energy`` runs it (``mp2_energies``
    with its memory plan, precision, frozen core, storage and scratch from ``options``; no
    checkpoint), for the PySCF drop-in and the benchmarks. ``backend``: an existing one for
    ``options.device`` (default: a new one); ``engine``: an integral engine for that backend
    (default: ``options.integrals``'s)."""
    precision = options.resolved_precision()
    if backend is None:
        backend = make_backend(options, unrestricted=not ref.restricted)
    if options.frozen_core:
        ref = ref.freeze(freeze_lowest(ref.nmo, molecule.frozen_core_count(mol)))
    engine = engine or select_integrals(options, mol, backend)
    plan = stage_plan(
        mol,
        auxmol,
        options,
        backend,
        precision,  # both spins, as run_energy
        nocc=sum(c.nocc_active for c in ref.channels),
        nvir=max(c.nvir_active for c in ref.channels),
        engine=engine,
    )
    timer = Timer(backend)
    backend.synchronize()
    t0 = time.perf_counter()
    mp2 = mp2_energies(mol, auxmol, ref, options, backend, precision, plan, timer, engine)
    backend.synchronize()
    seconds = time.perf_counter() - t0
    return MP2Run(mp2, seconds, dict(timer.seconds), run_record(backend, precision, mp2, ref).to_dict())


def reference_stage(job: Job, ck, timer: Timer, plan: RunPlan, say, guess=None) -> Reference:
    """The converged reference with the frozen core marked: the checkpoint's when it holds one,
    else the SCF engine ``options.scf_mode`` picks (written to the checkpoint when there is one).
    PySCF's SCF gets the plan's memory limit and writes its files under the run's scratch
    directory (``pyscf_scf.pyscf_scratch``)."""
    options, t0 = job.options, time.perf_counter()
    kind = "UHF" if job.unrestricted else "RHF"
    cycles = CycleLog(say, kind)
    distributed.fault("scf")
    ref = _checkpoint_reference(job, ck, say, kind)
    if ref is not None:
        timer.add("checkpoint", t0)
    elif job.dh is not None:  # a double hybrid: PySCF's DF-KS on the host with the functional's hybrid part
        say(f"DF-{'UKS' if job.unrestricted else 'RKS'} ({job.dh.name}, PySCF on the host) ...")
        ref, job.ks = pyscf_scf.run_ks(
            job.mol,
            job.dh,
            options.scf_mode,
            SCFSettings.from_options(options, unrestricted=job.unrestricted),
            grid_level=options.dft_grid,
            progress=cycles,
            memory_mb=plan.mp2.limit_mb,
            jk_auxbasis=job.jk_auxbasis,
        )
        timer.add("scf", t0)
    elif our_scf(job):
        say(f"DF-{kind} on {job.backend.name} ...")
        ref = driver.run_scf(
            job.mol,
            job.backend,
            SCFSettings.from_options(options, unrestricted=job.unrestricted, plan=plan.scf),
            timer=timer,
            engine=job.jk_engine or job.engine,
            progress=cycles,
            world=job.world,
            dm0=guess,
            jk_auxbasis=job.jk_auxbasis,
        )
    else:
        say(f"{kind} (PySCF) ...")
        run_pyscf = pyscf_scf.run_uhf if job.unrestricted else pyscf_scf.run_rhf
        ref = run_pyscf(
            job.mol,
            options.scf_mode,
            max_cycle=options.scf_max_cycle,
            progress=cycles,
            conv_tol_grad=options.scf_conv_tol_grad,
            memory_mb=plan.mp2.limit_mb,
            scratch_dir=options.scratch_dir,
            jk_auxbasis=job.jk_auxbasis,
        )
        t1 = timer.add("scf", t0)
        if job.unrestricted and options.scf_stability:  # PySCF's UHF: its own Hessian products
            ref.scf.stability = stability.uhf_internal_pyscf(ref.mf).to_dict()
            timer.add("stability", t1)
    if ck is not None and ref.source != "checkpoint":
        ck.save_scf(ref, options.scf_mode, job.mol)  # over several ranks: rank 0's file alone holds it
        if job.world.distributed:
            ck.share_scf(job.world)
    # every SCF engine keeps the orbitals of molecule.linear_dependence (the contract OrbitalSpace states)
    assert ref.nmo == job.space.nmo and tuple(c.nocc for c in ref.channels) == job.space.nocc, (ref.nmo, job.space)
    return ref.freeze(freeze_lowest(ref.nmo, job.space.nfrozen))


def _checkpoint_reference(job: Job, ck, say, kind: str) -> Reference | None:
    """The checkpoint's reference, or None when it holds none; over several ranks rank 0's file's
    on every rank (read there, sent to the others: rank_checkpoint.shared_reference)."""
    if ck is None:
        return None
    if job.world.distributed:
        ref = ck.shared_reference(job.world)
    else:
        ref = ck.load_scf() if ck.has_scf else None
    if ref is not None:
        say(f"{kind} from checkpoint {ref.scf.checkpoint}")
    return ref


def reference_warnings(ref: Reference) -> list[str]:
    """What the converged reference says about itself: spin contamination, a small gap, an
    unstable UHF (appended to the Job's warnings in the Result)."""
    return [
        w
        for w in (
            ref.contamination_warning(),
            ref.gap_warning(),
            stability.warning(ref.scf.stability),
            pyscf_scf.stall_warning(ref.scf.stalled),
            slow_disk_warning(ref.scf),
        )
        if w
    ]


SLOW_DISK_SHARE = 0.25  # of the SCF's seconds waiting for the JK factor's reads: worth a warning


def slow_disk_warning(scf) -> str | None:
    """One line when our DF-SCF streamed its JK factor from the scratch disk (layout 'disk') and
    waited for the reads more than SLOW_DISK_SHARE of the SCF's time: the disk, not the
    arithmetic, set its pace (measured, not predicted: the first read may come from the page
    cache, the next from the disk)."""
    jf = (scf.jk_factor or {}) if scf is not None else {}
    total = (scf.times or {}).get("scf", 0.0) if scf is not None else 0.0
    wait = jf.get("read_wait_s") or 0.0
    if jf.get("layout") != "disk" or total <= 0 or wait <= SLOW_DISK_SHARE * total:
        return None
    rate = jf.get("read_gb_per_s")
    return (
        f"the DF-SCF waited {wait:.1f} s of its {total:.1f} s for its JK factor's reads from the scratch "
        f"disk ({rate if rate is not None else '?'} GB/s): a faster --scratch disk, or a memory limit "
        f"that holds the factor ({memory.human(jf.get('disk_mb', 0))}), would save most of that"
    )


def run_record(backend, precision: str, mp2: MP2Energies, ref: Reference) -> RunRecord:
    """What ran, for the result (``Result.ran`` is its ``to_dict()``)."""
    return RunRecord(
        backend=backend.describe(),
        precision=precision,
        # A Trainium number measured on a CPU is the worst bug we can ship: say it on every result.
        simulated=backend.caps.simulable and backend.engine != "neuron-hardware",
        stage_precision=mp2.stage_precision,
        metric=mp2.metric,
        storage=mp2.storage,
        integrals=mp2.integrals,
        scf=ref.scf,
    )


def blas_warnings(ran: dict, caps) -> list[str]:
    """The result's warning about a cpu BLAS table not to be trusted (measured on a loaded or noisy
    machine), only where that table changed the run. Which library runs a GEMM changes its speed
    and rounding, not what is computed, so the choice itself never does: that is a notice on
    stderr (linalg.cpu_blas.take_notices). It changed the run where its SGEMM/DGEMM ratio chose
    the SCF's precision (--scf-precision auto) and that choice differs from the one made without
    a measurement (the device's capabilities: fp64 cycles on a CPU)."""
    blas = ran.get("cpu_blas") or {}
    cycles = (ran.get("scf") or {}).get("cycle_precision") or {}
    if not blas.get("warning") or blas.get("status") in (None, "clean") or cycles.get("requested") != "auto":
        return []
    if "measured" not in (cycles.get("why") or "") or cycles.get("mode") == resolve_precision(caps, "auto")[0]:
        return []
    return [
        f"the SCF's precision ({cycles['mode']}) was chosen from a cpu BLAS table measured on a "
        f"{blas['status']} machine ({blas['status_why']}); --scf-precision fp64 or mixed sets it"
    ]


def make_result(job: Job, ref: Reference, mp2: MP2Energies, timer: Timer, plan: MemoryPlan, wall_s: float) -> Result:
    """The Result of the run: energies (Hartree), the geometry as run (PySCF's molecule, Å),
    charge and multiplicity, shapes (alpha's for UHF, with the per-spin shapes and energies in
    ``spin``), timings and ``wall_s`` (s), what ran, the plan and the warnings."""
    geom, options, space, mol = job.geom, job.options, job.space, job.mol
    first = ref.channels[0]
    spin = None
    if not ref.restricted:
        a, b = ref.channels
        spin = {
            "reference": "UHF",
            "multiplicity": mol.spin + 1,
            "s2": ref.s2,
            "s2_exact": ref.s2_exact,
            "s2_warn_above": pyscf_scf.S2_WARN,
            "nocc_alpha": a.nocc_active,
            "nocc_beta": b.nocc_active,
            "nvir_alpha": a.nvir_active,
            "nvir_beta": b.nvir_active,
            **mp2.spin_blocks,
        }
    ran = run_record(job.backend, job.precision, mp2, ref).to_dict()
    return Result(
        molecule=geom.source,
        natm=geom.natm,
        formula=_formula(geom.real_symbols) + _ghosts(geom),
        charge=mol.charge,
        multiplicity=mol.spin + 1,
        geometry=geometry_record(geom.symbols, mol.atom_coords(unit="Angstrom"), geom.ghost),
        basis=basis_text(options.basis),
        auxbasis=basis.describe_auxbasis(job.auxbasis),
        scf_mode=options.scf_mode,
        jk_auxbasis=ref.jk_auxbasis,
        frozen_core=options.frozen_core,
        nbasis=space.nbasis,
        nmo=ref.nmo,
        nocc=first.nocc_active,
        nfrozen=space.nfrozen,
        nvir=first.nvir_active,
        naux=space.naux,
        e_scf=ref.e_hf,
        e_os=mp2.e_os,
        e_ss=mp2.e_ss,
        timings=timer.seconds,
        flops=timer.stage_flops(),
        peak_rss_mb=timer.stage_rss(),
        wall_s=wall_s,
        ran=ran,
        memory=plan.to_dict(),
        versions=software_versions(),
        warnings=job.warnings + reference_warnings(ref) + blas_warnings(ran, job.backend.caps),
        ecp=molecule.ecp_info(mol),
        spin=spin,
    )


def _ghosts(geom: Geometry) -> str:
    """' + 3 ghost atoms' after the formula of the real atoms; '' without ghosts."""
    n = geom.natm - len(geom.real_symbols)
    return f" + {n} ghost atom{'s' if n > 1 else ''}" if n else ""


def _formula(symbols) -> str:
    """Hill formula: C, then H, then the rest alphabetically (all alphabetical without C)."""
    counts = {}
    for sym in symbols:
        counts[sym] = counts.get(sym, 0) + 1
    first = [k for k in ("C", "H") if k in counts] if "C" in counts else []
    order = first + sorted(k for k in counts if k not in first)
    return "".join(f"{k}{counts[k] if counts[k] > 1 else ''}" for k in order)
