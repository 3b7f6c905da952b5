"""``dfmp2 run`` as a straight sequence of named stages, like gpu4pyscf's DF-MP2 driver:

    prepare    options checked, backend, molecule, bases, integral engine, the orbital space
               (``Job``): everything cheap that can refuse the run, before any heavy work
    plan       the memory plan (the SCF's and the MP2 stage's), disk, the checkpoint opened
    reference  the SCF on the run's device (dfmp2.scf.driver), PySCF's (dfmp2.scf.pyscf_scf) or the checkpoint's
    mp2        the DF-MP2 stage over the reference's spin channels (dfmp2.mp2.stage)
    result     energies, shapes, timings and what ran (dfmp2.io.result, dfmp2.provenance)

The checkpoint's life cycle (open or create, keep or discard on failure, close) is one context
manager, ``CheckpointSession``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dfmp2 import distributed, linalg, memory
from dfmp2.df import basis, integrals
from dfmp2.distributed import RankLostError
from dfmp2.errors import DiskWriteError, InputError, MemoryLimitError, shown
from dfmp2.io import checkpoint, molecule, outputs, rank_checkpoint
from dfmp2.io.result import Result, geometry_record, software_versions
from dfmp2.io.xyz import Geometry, read_xyz
from dfmp2.linalg import DTYPES
from dfmp2.memory import MemoryPlan, plan_memory
from dfmp2.mp2 import dist as mp2_dist
from dfmp2.mp2 import double_hybrids
from dfmp2.mp2.stage import MP2Energies, mp2_stage
from dfmp2.options import SCF_SCREEN, RunOptions
from dfmp2.props import stage as props_stage
from dfmp2.provenance import RunRecord
from dfmp2.reference import Reference, freeze_lowest
from dfmp2.scf import driver, jk, jk_dist, pyscf_scf, stability
from dfmp2.scf.precision import resolve_precision
from dfmp2.scf.settings import SCFSettings
from dfmp2.timing import CycleLog, Timer


@dataclass(frozen=True)
class OrbitalSpace:
    """The orbitals of the run, fixed by the molecule before any SCF: ``nocc`` occupied per spin
    channel (one for RHF, alpha and beta for UHF), ``nmo`` kept by the SCF's canonical
    orthogonalisation (nmo < nbasis with linear dependence: ``molecule.linear_dependence``, the rule
    every SCF engine applies), ``nfrozen`` frozen core orbitals per channel."""

    nocc: tuple
    nmo: int
    nbasis: int
    nfrozen: int
    naux: int

    @property
    def nocc_active(self) -> int:
        """Active occupied orbitals of all channels together."""
        return sum(n - self.nfrozen for n in self.nocc)

    @property
    def nvir_max(self) -> int:
        """The widest channel's virtual count (beta's for UHF)."""
        return self.nmo - min(self.nocc)


@dataclass
class Job:
    """Everything resolved before the heavy work: what the stages read."""

    geom: Geometry
    options: RunOptions
    precision: str
    backend: object
    mol: object
    auxbasis: object
    auxmol: object
    engine: integrals.IntegralEngine  # the MP2 stage's (and the JK factor's unless jk_engine says)
    space: OrbitalSpace
    jk_auxbasis: object = None  # the JK-fit set (basis.default_auxbasis(mol, 'jk')) of a DF SCF, else None
    jk_auxmol: object = None  # its auxiliary molecule, built once for the plan, the SCF and the gradient
    world: distributed.World = field(default_factory=distributed.World)  # the process group of the run
    warnings: list = field(default_factory=list)
    jk_pairs: int | None = None  # our DF-SCF's JK factor: the pairs screening keeps (None: every pair)
    dh: object = None  # a double hybrid (double_hybrids.DoubleHybrid; RunOptions.method), else None: MP2
    ks: dict | None = None  # a double hybrid's KS-SCF record (pyscf_scf.run_ks), set by reference_stage
    jk_engine: integrals.IntegralEngine | None = None  # our DF-SCF's JK factor's (integrals.select_jk_engine)

    @property
    def unrestricted(self) -> bool:
        return len(self.space.nocc) == 2


@dataclass
class EnergyRun:
    """What an energy run hands on (``run_energy``): its Job (molecule, both fitting sets, backend,
    orbital space, process group), the converged Reference with its frozen core marked, and the
    Result. The gradient stage (``dfmp2.grad.run.gradient_stage``) and QCSchema's SCF parts read it."""

    job: Job
    ref: Reference
    result: Result

    @property
    def mol(self):
        return self.job.mol


def run(path, options: RunOptions, progress=None, log=None, on_plan=None) -> Result:
    """Read an XYZ file and run DF-MP2 on it."""
    return run_geometry(read_xyz(path), options, progress=progress, log=log, on_plan=on_plan)


def run_geometry(
    geom: Geometry,
    options: RunOptions,
    progress=None,
    log=None,
    on_plan=None,
    backend=None,
    on_reference=None,
    guess=None,
    world=None,
) -> Result:
    """Run DF-MP2 on a parsed geometry: prepare, plan, reference, MP2, result (``run_energy``'s
    Result). Everything cheap is checked before the heavy work (``on_plan(plan)`` sees the memory
    plan). ``backend``: one already made for ``options`` (several runs sharing a device, as
    ``dfmp2 interaction`` does); default a new one. ``log(msg)``: progress lines; ``progress(done,
    total)``: block pairs; ``on_reference(mol, ref)``, after the run: the PySCF Mole and the
    converged Reference (``run_energy`` returns both; kept for callers that only want a look);
    ``guess``: our DF-SCF's starting density (``Reference.density()`` of a previous geometry of
    the same molecule and basis, as the ASE calculator passes; default PySCF's 'minao'); ``world``:
    the process group (default ``distributed.current()``; a task of a task-parallel command: a
    one-process World, ``dfmp2.workflows.tasks``). PySCF's
    SCF (``pyscf-df``, ``exact``) starts from 'minao' whatever is given: on a small step PySCF took
    more cycles from the previous density than from 'minao', ours fewer
    (scripts/results/docstring-measurements.md). ``ran.scf.guess`` says which it started from."""
    done = energy_run(
        geom, options, progress=progress, log=log, on_plan=on_plan, backend=backend, guess=guess, world=world
    )
    if on_reference is not None:
        on_reference(done.job.mol, done.ref)
    return done.result


def energy_run(
    geom: Geometry, options: RunOptions, progress=None, log=None, on_plan=None, backend=None, guess=None, world=None
) -> EnergyRun:
    """``run_geometry``'s run, returning the whole EnergyRun (Job, Reference, Result) for a caller
    that goes on with its molecule and reference (QCSchema's SCF parts, the ASE calculator's next
    guess); the Result's wall_s counts the preparation too."""
    t_start = time.perf_counter()
    job = prepare_run(geom, options, backend, log, world=world)
    return run_energy(job, progress=progress, log=log, on_plan=on_plan, guess=guess, t_start=t_start)


def prepare_run(geom: Geometry, options: RunOptions, backend=None, log=None, world=None) -> Job:
    """``prepare`` as a run does it: the process group (``distributed.current()``, read here once
    and carried by the Job, or ``world``: a task of a task-parallel command runs in a one-process
    World) agreeing on the options, each rank with its own device."""
    world = world if world is not None else distributed.current()  # several ranks: every rank runs this
    with world.agreeing():
        distributed.check_options(options, world)
        return prepare(geom, distributed.rank_options(options, world), backend, log or (lambda msg: None), world=world)


def request_content(geom: Geometry, options: RunOptions) -> dict:
    """What the ranks must agree on, as read (``World.agree``; issue 43): the molecule (symbols,
    coordinates bit for bit, ghost atoms) and every RunOptions field (the device without its GPU
    index: NCCL gives each rank its own). Keys 'option <field>' are RunOptions fields."""
    import dataclasses

    content = {
        "the atoms": list(geom.symbols),
        "the coordinates (bit for bit)": np.asarray(geom.coords_angstrom, dtype=np.float64),
        "the ghost atoms": [geom.is_ghost(i) for i in range(geom.natm)],
        "the input's charge and multiplicity": [geom.charge, geom.multiplicity],
    }
    for f in dataclasses.fields(RunOptions):
        value = getattr(options, f.name)
        content[f"option {f.name}"] = value.split(":")[0] if f.name == "device" else value
    return content


def input_content(job: Job, scf_plan: dict | None = None) -> dict:
    """What the ranks must agree on before any integral (``World.agree``; issue 43):
    ``request_content``, then what was resolved from it: the charge and multiplicity, the basis
    sets as PySCF holds them (orbital, ECP, MP2-fit, JK-fit), the working precision and the cpu
    BLAS choice (probed now if need be: a rank with another table sums in another order) and, from
    ``scf_plan``, the measured SGEMM/DGEMM ratio that decides whether an 'auto' SCF runs fp32
    cycles (``_plan_scf``)."""
    mol = job.mol
    content = request_content(job.geom, job.options)
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
    if scf_plan is not None and scf_plan.get("fp32_speedup") is not None:
        content["the measured SGEMM/DGEMM ratio"] = round(scf_plan["fp32_speedup"], 6)
    return content


def run_energy(
    job: Job, progress=None, log=None, on_plan=None, guess=None, t_start=None, with_properties: bool = True
) -> EnergyRun:
    """The heavy part of the run of a prepared ``job`` (``prepare_run``): plan, reference, MP2,
    the properties ``options.properties`` asks for (``props.stage``; the density stage's memory
    checked with the plan, before any work), result; the EnergyRun (Job, Reference, Result) for
    whatever comes next (the gradient stage, QCSchema's SCF parts, the next geometry's guess).
    ``t_start``: when the run began (its ``wall_s``; default now); ``with_properties`` False: no
    property stage (a caller that makes them from its own densities: the gradient). The other
    arguments as ``run_geometry``'s."""
    say = log or (lambda msg: None)
    t_start = time.perf_counter() if t_start is None else t_start
    world, options = job.world, job.options
    timer = Timer(job.backend)
    want = options.properties if with_properties else ()
    props_plan = props_stage.density_plan(job, options.memory_mb) if want else None
    with CheckpointSession(job) as session:
        with world.agreeing():
            plan, scf_plan = plan_run(job, session, on_plan, say)
            distributed.check_plan(plan, world)
            session.start(plan)  # over several ranks: a rank that cannot create its file stops them all
        world.agree(None, input_content(job, scf_plan))  # the ranks' inputs the same, bit for bit
        ref = reference_stage(job, session.ck, timer, plan, scf_plan, say, guess)
        say("integrals, transforms, fit and pair energies ...")
        mp2 = mp2_stage(
            job.mol,
            job.auxmol,
            ref,
            backend=job.backend,
            precision=job.precision,
            plan=plan,
            timer=timer,
            engine=job.engine,
            progress=progress,
            scratch_dir=options.scratch_dir,
            checkpoint=session.ck,
            world=world,
        )
        session.finish(mp2.e_os, mp2.e_ss)
    world.summarize()
    properties = None
    if want:
        say(f"properties ({', '.join(want)}): MP2 densities and Z-vector ...")
        properties = props_stage.property_stage(
            job.mol, ref, job.auxmol, job.jk_auxmol, job.backend, want, plan=props_plan
        )
    disp = None
    if job.dh is not None:  # E_disp from the geometry alone (None: no dispersion in the functional)
        t0 = time.perf_counter()
        disp = double_hybrids.dispersion_energy(job.mol, job.dh)[1]
        timer.add("dispersion", t0, sync=False)
    result = make_result(job, ref, mp2, timer, plan, wall_s=time.perf_counter() - t_start)
    result.properties = properties
    if job.dh is not None:  # the parts of its energy and the total
        result.double_hybrid = double_hybrids.record(job.dh, ref.e_hf, mp2.e_os, mp2.e_ss, disp, job.ks)
    if world.distributed:
        result.ran["distributed"] = world.describe()
    return EnergyRun(job, ref, result)


# ---------------------------------------------------------------------------- prepare
def prepare(geom: Geometry, options: RunOptions, backend=None, say=lambda msg: None, world=None) -> Job:
    """Check the options, make the backend (DeviceUnavailableError before any work) and the
    molecule, choose the bases (the MP2-fit set, and the JK-fit set of a density-fitted SCF) and
    the integral engine, fix the orbital space. ``world``: the process group (default
    ``distributed.current()``)."""
    options.check_choices()
    _refuse_bracket(options)
    dh = check_double_hybrid(options)
    precision = options.resolved_precision()
    if options.checkpoint and options.resume and Path(options.checkpoint).resolve() != Path(options.resume).resolve():
        raise InputError(
            "the checkpoint to write and the checkpoint to resume are different files; "
            "a resumed run goes on writing to the file it resumes, so give only that one",
            option="resume",
        )
    if options.scratch_dir is not None:  # a given scratch directory must take files, used or not
        outputs.check_output_dir(options.scratch_dir, "scratch", option="scratch_dir")
    uhf = molecule.resolve_reference(options.reference, geom, options.charge, options.multiplicity) == "uhf"
    backend = backend if backend is not None else make_backend(options, unrestricted=uhf)
    mol = molecule.build_molecule(geom, options.basis, options.charge, options.multiplicity, ecp=options.ecp)
    engine = select_integrals(options, mol, backend)
    jk_engine = integrals.select_jk_engine(options.integrals, engine, mol, backend)
    say(f"integrals: {engine.name} ({engine.why})")
    if jk_engine is not engine and options.scf_mode == "df":
        say(f"integrals of the JK factor: {jk_engine.name} ({jk_engine.why})")
    auxbasis = basis.mp2_auxbasis(mol, options.auxbasis)
    auxmol = basis.make_auxmol(mol, auxbasis)
    space, notes = orbital_space(mol, auxmol, options.frozen_core, uhf, geom.source)
    props_stage.check_properties(options, uhf)
    jk_auxbasis = basis.default_auxbasis(mol, "jk") if options.scf_mode in pyscf_scf.SCF_DF_MODES else None
    jk_auxmol = basis.make_auxmol(mol, jk_auxbasis) if jk_auxbasis is not None else None
    jk_pairs = jk.significant_pairs(mol, options.scf_screen) if options.scf_mode == "df" and dh is None else None
    warnings = _input_warnings(mol, auxbasis, options, space.naux, jk_auxbasis) + notes
    if options.multiplicity is None and geom.multiplicity is None and mol.spin:
        warnings.append(
            f"no multiplicity given (as an option or in the XYZ comment): {mol.nelectron} "
            f"electrons taken as a doublet "
            f"(multiplicity {mol.spin + 1}, the lowest)"
        )
    return Job(
        geom,
        options,
        precision,
        backend,
        mol,
        auxbasis,
        auxmol,
        engine,
        space,
        jk_auxbasis,
        jk_auxmol,
        world if world is not None else distributed.current(),
        warnings,
        None if jk_pairs is None else len(jk_pairs),
        dh,
        jk_engine=jk_engine,
    )


def check_double_hybrid(options: RunOptions):
    """The DoubleHybrid ``options.method`` names (None for MP2), checked before any work: its
    dispersion package importable, and nothing asked for that a double hybrid does not have here
    (properties and gradients need the PT2 term's response with the XC kernel; a checkpoint holds
    an HF reference). One InputError each."""
    dh = double_hybrids.get(options.method)
    if dh is None:
        return None
    if options.properties:
        raise InputError(
            f"properties ({', '.join(options.properties)}) of a double hybrid ({dh.name}) need its relaxed "
            "density (the PT2 response with the XC kernel), which dfmp2 does not compute; run without them",
            option=("properties", "method"),
        )
    if options.checkpoint or options.resume:
        raise InputError(
            f"a double hybrid ({dh.name}) run is not checkpointed; run without a checkpoint",
            option=tuple(o for o in ("checkpoint", "resume") if getattr(options, o)),
        )
    double_hybrids.check_dispersion_package(dh)
    return dh


def _refuse_bracket(options: RunOptions) -> None:
    """One run is one basis: a bracket (cc-pv[dt]z) is a CBS extrapolation over several runs
    (dfmp2.workflows.cbs.run_cbs), and the CBS SCF scheme applies only to one."""
    if "[" in options.basis or "]" in options.basis:
        raise InputError(
            f"basis '{shown(options.basis)}' is a basis bracket (a CBS extrapolation over "
            "several runs): dfmp2 run and dfmp2 interaction take it, this command and a "
            "single run (run_geometry) do not",
            option="basis",
        )
    if options.cbs_scf != RunOptions.cbs_scf:
        raise InputError(
            f"the CBS SCF scheme {options.cbs_scf} applies to a basis bracket (e.g. cc-pv[dt]z), not to one basis",
            option="cbs_scf",
        )


def orbital_space(mol, auxmol, frozen_core: bool, uhf: bool, source: str) -> tuple[OrbitalSpace, list]:
    """The run's OrbitalSpace and its notes (linear dependence); InputError when nothing is left
    to correlate or the frozen core outnumbers the occupied beta orbitals."""
    nocc_a = (mol.nelectron + mol.spin) // 2
    nocc_b = nocc_a - mol.spin
    nfrozen = molecule.frozen_core_count(mol) if frozen_core else 0
    nao = mol.nao_nr()
    nmo, lindep_thr, _ = molecule.linear_dependence(mol)  # the orbitals every SCF engine keeps
    dropped = f", {nao - nmo} dropped as linearly dependent" if nmo < nao else ""
    if nocc_a >= nmo or nfrozen >= nocc_a:
        raise InputError(
            f"{source}: no MP2 correlation possible with {nocc_a - nfrozen} active "
            f"occupied and {nmo - nocc_a} virtual orbitals (nbasis {nao}{dropped})"
        )
    if nfrozen > nocc_b:
        raise InputError(
            f"{source}: the frozen core ({nfrozen} orbitals per spin) is more than the "
            f"{nocc_b} occupied beta orbitals; correlate all electrons",
            option="frozen_core",
        )
    notes = (
        [
            f"linear dependence: {nao - nmo} of {nao} basis functions dropped (overlap eigenvalues "
            f"below {lindep_thr:g}); nmo {nmo}"
        ]
        if nmo < nao
        else []
    )
    if frozen_core and nfrozen == 0:
        notes.append(
            "frozen core asked for, but these atoms have no core orbitals to freeze (PySCF's "
            "chemcore rule, outside any ECP core): every electron is correlated"
        )
    nocc = (nocc_a, nocc_b) if uhf else (nocc_a,)
    return OrbitalSpace(nocc, nmo, nao, nfrozen, auxmol.nao_nr()), notes


def make_backend(options: RunOptions, unrestricted: bool = False):
    """The backend ``options`` ask for (``linalg.get_backend``: DeviceUnavailableError when the
    device cannot run, before any work); ``unrestricted``: for a UHF reference (the CUDA pair
    path then takes the opposite-spin form into account)."""
    try:
        return linalg.get_backend(
            options.device,
            simulate=options.simulate,
            pair_kernel=options.pair_kernel,
            **({"unrestricted": True} if unrestricted else {}),
            **({"cpu_blas": options.cpu_blas} if options.cpu_blas != "auto" else {}),
        )
    except linalg.cpu_blas.CpuBlasChoiceError as e:
        raise InputError(str(e), option="cpu_blas") from None
    except ValueError as e:  # a pair kernel unknown or not for this device
        raise InputError(str(e), option="pair_kernel") from None


def select_integrals(options: RunOptions, mol, backend) -> integrals.IntegralEngine:
    """The integral engine for ``options.integrals``, decided before any work (an explicit engine
    that cannot run raises EngineUnavailableError; an unknown name is an InputError)."""
    try:
        return integrals.select_engine(options.integrals, mol, backend)
    except ValueError as e:
        raise InputError(str(e), option="integrals") from None


def _input_warnings(mol, auxbasis, options: RunOptions, naux: int, jk_auxbasis=None) -> list[str]:
    """What the user should know about the bases before trusting the energies: fallback fitting
    sets for elements the matched set lacks, a chosen auxiliary basis that is not a fitting set
    or has fewer functions than the orbital basis (the DF error then grows to %), no ECP for a
    basis made for one. ``jk_auxbasis``: the JK-fit set of a density-fitted SCF (None: none)."""
    out = []
    if options.ecp == "none-for-testing":
        out.append(molecule.ecp_off_warning(options.basis, [molecule.element(mol, i) for i in range(mol.natm)]))
    if options.auxbasis is None:
        out.append(basis.auxbasis_note(mol, auxbasis, "mp2"))
    else:
        given = basis.describe_auxbasis(auxbasis)
        names = auxbasis.values() if isinstance(auxbasis, dict) else [auxbasis]
        if any(isinstance(n, str) and not basis.is_fitting_set(n) for n in names):
            out.append(
                f"auxiliary basis {given} is not a density-fitting set; use an MP2-fit (RI) set such as the default"
            )
        if naux < mol.nao_nr():
            out.append(
                f"auxiliary basis {given} has fewer functions (naux {naux}) than the "
                f"orbital basis (nbasis {mol.nao_nr()}); the fitting error in E_corr may be large"
            )
    if jk_auxbasis is not None:
        out.append(basis.auxbasis_note(mol, jk_auxbasis, "jk"))
    return [w for w in out if w]


# ---------------------------------------------------------------------------- plan
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

    def __enter__(self) -> "CheckpointSession":
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


def plan_run(job: Job, session: CheckpointSession, on_plan, say) -> tuple[MemoryPlan, dict]:
    """The memory plan of the MP2 stage (and of our DF-SCF when it runs), checked against the
    limit and the disk before any integral. Returns (plan, the SCF's: {'block_mb': its exchange
    block in MB, 'fp32_copy': whether its mixed precision may keep the factor's fp32 copy})."""
    ck, space, options = session.ck, job.space, job.options
    # UHF: B^alpha and B^beta are both resident; the plan counts them as one B of all active
    # occupied orbitals by the widest channel's virtuals (an upper bound on both stores together,
    # and the widest pair workspace)
    ours = _our_scf(job) and not (ck is not None and ck.has_scf)
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
            mp2_dist.per_rank_plan(
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
    scf_plan = (
        _plan_scf(job, plan)
        if ours
        else {"block_mb": jk.JK_BLOCK_MB, "fp32_copy": False, "layout": "packed", "disk": 0.0, "fit_mb": 0.0}
    )
    scf_plan.setdefault("fp32_speedup", None)
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
        jk_factor_mb=scf_plan["disk"],
    )
    return plan, scf_plan


def stage_plan(
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
        aux_shell_max=_largest_shell(auxmol),
        occ_block=occ_block,
        occ_block_max=options.occ_block_max,
        j3c_block_mb=engine.block_mb(options.j3c_block_mb) if engine is not None else options.j3c_block_mb,
        engine=engine.name if engine is not None else "host",
        queue_depth=getattr(engine, "depth", memory.QUEUE_DEPTH),
    )


def _our_scf(job: Job) -> bool:
    """Whether our DF-SCF (dfmp2.scf.driver: DFRHF or DFUHF, on every device) makes the reference: SCF mode
    'df', for MP2 (a double hybrid's KS-SCF is PySCF's, pyscf_scf.run_ks)."""
    return job.options.scf_mode == "df" and job.dh is None


def _plan_scf(job: Job, plan: MemoryPlan) -> dict:
    """Our DF-SCF's memory in the plan (stage 'scf': its JK factor, and the fp32 copy a mixed-
    precision SCF keeps when it fits, resident during the cycles and freed before the MP2 stage);
    MemoryLimitError before any integral when the factor does not fit. Returns {'block_mb': the
    SCF's block size in MB (smaller when the limit needs it), 'fp32_copy': whether the copy fits,
    'layout': the factor's, 'unpacked' where it fits, else 'packed'}.
    Also refuses a backend that lacks an op the SCF needs (none does today)."""
    backend = job.backend
    missing = [op for op in driver.OPS if not backend.supports(op)]
    if missing:
        raise linalg.DeviceUnavailableError(
            f"device '{backend.name}' cannot run the DF-SCF: it lacks {', '.join(missing)}", alternatives=("cpu",)
        )
    # the measured SGEMM/DGEMM ratio decides auto; the ranks agree on it (input_content)
    speedup = backend.fp32_speedup() if job.options.scf_precision == "auto" else None
    mixed = resolve_precision(backend.caps, job.options.scf_precision, fp32_speedup=speedup)[0] == "mixed"
    need = _scf_memory(job, limit_mb=plan.limit_mb, fp32_copy=mixed, other_mb=plan.peak_mb)
    plan.stages_mb = {"scf": need["peak"], **plan.stages_mb}
    plan.peak_mb = max(plan.peak_mb, need["peak"])
    plan.shapes["naux_jk"] = need["naux_jk"]
    if need["layout"] == "disk":
        plan.shapes["jk_factor_disk_mb"] = need["disk"]
    return {
        "block_mb": need["block_mb"],
        "fp32_copy": need["fp32_copy"] > 0,
        "layout": need["layout"],
        "disk": need["disk"],
        "fit_mb": need["fit_mb"],
        "fp32_speedup": speedup,
    }


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
        need = driver.check_memory(*args, limit_mb, fp32_copy=fp32_copy, disk=disk, other_mb=other_mb, **kw)
    else:
        need = driver.memory_mb(*args, block_mb, fp32_copy=fp32_copy, **kw)
    return {**need, "naux_jk": naux_jk}


def _largest_shell(auxmol) -> int:
    loc = auxmol.ao_loc_nr()
    return int(max(loc[1:] - loc[:-1])) if auxmol.nbas else 1


def _check_disk(
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


# ---------------------------------------------------------------------------- reference
def reference_stage(job: Job, ck, timer: Timer, plan: MemoryPlan, scf_plan: dict, say, guess=None) -> Reference:
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
            memory_mb=plan.limit_mb,
            jk_auxbasis=job.jk_auxbasis,
        )
        timer.add("scf", t0)
    elif _our_scf(job):
        say(f"DF-{kind} on {job.backend.name} ...")
        ref = driver.run_scf(
            job.mol,
            job.backend,
            SCFSettings.from_options(options, unrestricted=job.unrestricted, plan=scf_plan),
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
            memory_mb=plan.limit_mb,
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


# ---------------------------------------------------------------------------- result
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
    blas_warning = (ran.get("cpu_blas") or {}).get("warning")  # a BLAS choice measured under load
    return Result(
        molecule=geom.source,
        natm=geom.natm,
        formula=_formula(geom.real_symbols) + _ghosts(geom),
        charge=mol.charge,
        multiplicity=mol.spin + 1,
        geometry=geometry_record(geom.symbols, mol.atom_coords(unit="Angstrom"), geom.ghost),
        basis=options.basis,
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
        e_hf=ref.e_hf,
        e_os=mp2.e_os,
        e_ss=mp2.e_ss,
        timings=timer.seconds,
        flops=timer.stage_flops(),
        peak_rss_mb=timer.stage_rss(),
        wall_s=wall_s,
        ran=ran,
        memory=plan.to_dict(),
        versions=software_versions(),
        warnings=job.warnings + reference_warnings(ref) + ([blas_warning] if blas_warning else []),
        ecp=molecule.ecp_info(mol),
        spin=spin,
    )


def time_mp2_stage(mol, auxmol, ref: Reference, options: RunOptions, backend=None, engine=None):
    """One run of the DF-MP2 stage after the SCF exactly as ``dfmp2 run`` runs it (its memory
    plan, precision, frozen core, storage and scratch from ``options``; no checkpoint), for the
    benchmarks and the Python API. ``backend``: an existing one for ``options.device`` (default:
    a new one); ``engine``: an integral engine for that backend (default: ``options.integrals``'s).
    Returns (seconds, e_os, e_ss, {stage: seconds}, ran), energies in Hartree."""
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
        precision,  # both spins, as run_geometry
        nocc=sum(c.nocc_active for c in ref.channels),
        nvir=max(c.nvir_active for c in ref.channels),
        engine=engine,
    )
    timer = Timer(backend)
    backend.synchronize()
    t0 = time.perf_counter()
    mp2 = mp2_stage(
        mol,
        auxmol,
        ref,
        backend=backend,
        precision=precision,
        plan=plan,
        timer=timer,
        engine=engine,
        scratch_dir=options.scratch_dir,
    )
    backend.synchronize()
    return (
        time.perf_counter() - t0,
        mp2.e_os,
        mp2.e_ss,
        dict(timer.seconds),
        run_record(backend, precision, mp2, ref).to_dict(),
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
