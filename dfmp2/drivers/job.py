"""``prepare``: everything cheap that can refuse a run, before any heavy work -> ``Job``.

    prepare    the process group (``distributed.current()``, read once and carried by the Job),
               the ranks agreeing on the options; the options checked, the backend, the molecule,
               the bases (MP2-fit, and JK-fit of a density-fitted SCF), the integral engines and
               the orbital space

The checks a run makes before any work run here once (``check_choices``, the reference, the
backend); a caller with checks of its own (the gradient) passes them as ``check``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pyscf import gto

from dfmp2 import distributed, linalg
from dfmp2.df import basis, integrals
from dfmp2.errors import InputError, shown
from dfmp2.functionals import DoubleHybrid
from dfmp2.io import molecule, outputs
from dfmp2.io.xyz import Geometry
from dfmp2.linalg.base import Backend
from dfmp2.mp2 import double_hybrids
from dfmp2.options import SCF_SCREEN_QUIET, RunOptions
from dfmp2.props import stage as props_stage
from dfmp2.scf import jk, pyscf_scf


@dataclass(frozen=True)
class OrbitalSpace:
    """The orbitals of the run, fixed by the molecule before any SCF: ``nocc`` occupied per spin
    channel (one for RHF, alpha and beta for UHF), ``nmo`` kept by the SCF's canonical
    orthogonalisation (nmo < nbasis with linear dependence: ``molecule.linear_dependence``, the rule
    every SCF engine applies), ``nfrozen`` frozen core orbitals per channel."""

    nocc: tuple[int, ...]
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
    backend: Backend
    mol: gto.Mole
    auxbasis: str | dict  # the MP2-fit set as PySCF takes it (a name, or one per element)
    auxmol: gto.Mole
    engine: integrals.IntegralEngine  # the MP2 stage's (and the JK factor's unless jk_engine says)
    space: OrbitalSpace
    jk_auxbasis: str | dict | None = None  # the JK-fit set (basis.default_auxbasis(mol, 'jk')) of a DF SCF
    jk_auxmol: gto.Mole | None = None  # its auxiliary molecule, built once for the plan, the SCF and the gradient
    world: distributed.World = field(default_factory=distributed.World)  # the process group of the run
    warnings: list[str] = field(default_factory=list)
    jk_pairs: int | None = None  # our DF-SCF's JK factor: the pairs screening keeps (None: every pair)
    dh: DoubleHybrid | None = None  # a double hybrid (RunOptions.method), else None: MP2
    ks: dict | None = None  # a double hybrid's KS-SCF record (pyscf_scf.run_ks), set by reference_stage
    jk_engine: integrals.IntegralEngine | None = None  # our DF-SCF's JK factor's (integrals.select_jk_engine)
    t_start: float = field(default_factory=time.perf_counter)  # when prepare began (the Result's wall_s)
    # the caller's own parameters that change a number (a gradient's method), agreed with the input
    # (``input_content``): {'option <parameter>': value}, the key naming its flag as RunOptions' do
    agreed: dict = field(default_factory=dict)

    @property
    def unrestricted(self) -> bool:
        return len(self.space.nocc) == 2


def request_content(geom: Geometry, options: RunOptions) -> dict:
    """What the ranks must agree on, as read (``World.agree``): the molecule (symbols,
    coordinates bit for bit, ghost atoms) and every RunOptions field (the device without its GPU
    index: NCCL gives each rank its own). Keys 'option <field>' are RunOptions fields."""
    content = {
        "the atoms": list(geom.symbols),
        "the coordinates (bit for bit)": np.asarray(geom.coords_angstrom, dtype=np.float64),
        "the ghost atoms": [geom.is_ghost(i) for i in range(geom.natm)],
        "the input's charge and multiplicity": [geom.charge, geom.multiplicity],
    }
    for f in RunOptions.__dataclass_fields__.values():
        value = getattr(options, f.name)
        content[f"option {f.name}"] = value.split(":")[0] if f.name == "device" else value
    return content


def prepare(
    geom: Geometry,
    options: RunOptions,
    backend: Backend | None = None,
    log: Callable[[str], None] | None = None,
    world: distributed.World | None = None,
    check: Callable[[bool], None] | None = None,
) -> Job:
    """The Job of a run: the process group (``world``, default ``distributed.current()``: a task of
    a task-parallel command runs in a one-process World) agreeing on the options, each rank with its
    own device; then ``_prepare``. ``backend``: one already made for ``options`` (several runs
    sharing a device); ``log(msg)``: progress lines; ``check(unrestricted)``: the caller's own
    refusals, after the options' choices and the reference are resolved, before the backend."""
    t_start = time.perf_counter()
    world = world if world is not None else distributed.current()  # several ranks: every rank runs this
    with world.agreeing():
        distributed.check_options(options, world)
        job = _prepare(geom, distributed.rank_options(options, world), backend, log or (lambda msg: None), world, check)
    job.t_start = t_start
    return job


def _prepare(geom: Geometry, options: RunOptions, backend, say, world: distributed.World, check) -> Job:
    """Check the options, make the backend (DeviceUnavailableError before any work) and the
    molecule, choose the bases (the MP2-fit set, and the JK-fit set of a density-fitted SCF) and
    the integral engine, fix the orbital space."""
    options.check_choices()
    uhf = molecule.resolve_reference(options.reference, geom, options.charge, options.multiplicity) == "uhf"
    if check is not None:
        check(uhf)
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
        world,
        warnings,
        None if jk_pairs is None else len(jk_pairs),
        dh,
        jk_engine=jk_engine,
    )


def check_double_hybrid(options: RunOptions) -> DoubleHybrid | None:
    """The DoubleHybrid ``options.method`` names (None for MP2), checked before any work: its
    dispersion package importable, and nothing asked for that a double hybrid does not have here
    (a checkpoint holds an HF reference). One InputError each; its properties are checked with
    MP2's (``props.stage.check_properties``)."""
    dh = double_hybrids.get(options.method)
    if dh is None:
        return None
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
    if isinstance(options.basis, str) and ("[" in options.basis or "]" in options.basis):
        raise InputError(
            f"basis '{shown(options.basis)}' is a basis bracket (a CBS extrapolation over "
            "several runs): dfmp2 run and dfmp2 interaction take it, this command and a "
            "single run does not",
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


def make_backend(options: RunOptions, unrestricted: bool = False) -> Backend:
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
    if options.scf_mode == "df" and options.scf_screen > SCF_SCREEN_QUIET:
        out.append(
            f"scf_screen {options.scf_screen:g} is above {SCF_SCREEN_QUIET:g}: E(HF) is that of a screened JK "
            "factor, up to 6e-7 Eh from every pair's on (H2O)8 and the water dimer at 1e-7 to 1e-6 "
            "(scripts/results/scf_screen.md; 2e-10 Eh at 1e-8)"
        )
    return [w for w in out if w]
