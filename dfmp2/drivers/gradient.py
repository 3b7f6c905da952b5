"""``dfmp2 gradient``: the energy run (``dfmp2.drivers.energy.run_energy`` of the one
``dfmp2.drivers.job.prepare``, the gradient's checks made there once), then the gradient stage
(``gradient_stage``: dfmp2.grad.mp2 or dfmp2.grad.ump2) on the same molecule, reference, fitting
sets and backend, all read from the energy run's ``EnergyRun``.
``gradient_stage`` is the one way into the stage: ``run_gradient`` (``dfmp2 gradient``,
``dfmp2 optimize``, ``dfmp2.gradient``, QCSchema, ASE) and ``DFMP2(mf).nuc_grad_method()`` call it.

RHF references run ``dfmp2.grad.mp2.mp2_gradient``, UHF ones (open shells, or reference uhf)
``dfmp2.grad.ump2.uhf_mp2_gradient``. What it refuses, before any work (one InputError each, naming
the option): an ROHF reference, the exact-integral SCF (scf_mode 'exact': its response would
need exact J/K), a UHF reference on a device without fp64, precision fp32 on a device with fp64,
a basis bracket, and a memory limit below the gradient stage's smallest plan
(``gradient_plan``). The gradient is that of
E_HF + c_os E_OS + c_ss E_SS for ``method`` (MP2, SCS-MP2, SOS-MP2: ``dfmp2.grad.mp2.SCALES``), or a
double hybrid's E_KS + c_os E_OS + c_ss E_SS + E_disp (``method`` a key of the table,
dfmp2.functionals: ``dfmp2.grad.dh.dh_gradient`` on PySCF's DF-RKS or DF-UKS). On a
device without fp64 (trn1/trn2; on this machine
only simulated) the energy run is ``dfmp2 run``'s there, and the RHF stage runs its densities'
pair loop on the device in fp32 and the rest on a host CPU backend in fp64 (``dfmp2.grad.mp2.mp2_gradient``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace

import numpy as np

from dfmp2 import linalg
from dfmp2.drivers.energy import EnergyRun, run_energy
from dfmp2.drivers.job import Job, check_double_hybrid, prepare
from dfmp2.errors import InputError
from dfmp2.grad import dh as grad_dh
from dfmp2.grad import relaxed
from dfmp2.grad import ump2 as grad_ump2
from dfmp2.grad.mp2 import SCALES, GradientParts, mp2_gradient
from dfmp2.grad.plan import GradientPlan
from dfmp2.io import molecule
from dfmp2.io.result import Result
from dfmp2.io.xyz import Geometry
from dfmp2.mp2 import double_hybrids
from dfmp2.options import RunOptions
from dfmp2.props import stage as props_stage
from dfmp2.scf import pyscf_scf
from dfmp2.timing import Profile, Timer


@dataclass
class GradientResult:
    """The energy run's Result, the method ('mp2', 'scs-mp2', 'sos-mp2'), its energy (Hartree)
    and the gradient stage's GradientParts (gradient (natm, 3) Eh/bohr); wall_s of the gradient
    stage alone (s); ``energy_run``: the dfmp2.drivers.energy.EnergyRun it differentiates (Job: molecule and
    fitting sets; Reference)."""

    result: Result
    method: str
    energy: float
    parts: GradientParts
    wall_s: float
    energy_run: EnergyRun | None = None
    profile: dict | None = None  # the gradient stage's (run_gradient(profile=True): dfmp2.timing.Profile)

    @property
    def gradient(self) -> np.ndarray:
        return self.parts.gradient

    def to_dict(self) -> dict:
        """The energy run's JSON with 'gradient': the method, its energy, the gradient (natm lists
        of 3, Eh/bohr), its HF and correlation parts and the stage's record."""
        d = self.result.to_dict()
        d["gradient"] = {"method": self.method, "energy": self.energy, "wall_s": self.wall_s, **self.parts.to_dict()}
        d["gradient"]["profile"] = self.profile
        d["units"] = {**d["units"], "gradient": "hartree/bohr"}
        d["warnings"] = list(d["warnings"]) + list(self.parts.warnings)
        return d

    def write_json(self, path) -> None:

        from dfmp2.io.outputs import write_json

        write_json(path, self.to_dict(), indent=2)


def check_gradient_options(geom: Geometry, options: RunOptions, method: str) -> tuple[RunOptions, str]:
    """Every check of a gradient run, for a caller before its runs (a workflow: optimize,
    frequencies, QCSchema's hessian): InputError (one line, naming the option) for what the
    gradient does not do, the same checks ``run_gradient`` makes in its one ``prepare``. Returns
    ``gradient_options``' (options, method): a double hybrid named once, by its table key."""
    options, method = gradient_options(options, method)
    check_gradient_method(options, method)
    options.check_choices()
    check_double_hybrid(options)  # its properties, checkpoint and dispersion package
    uhf = molecule.resolve_reference(options.reference, geom, options.charge, options.multiplicity) == "uhf"
    check_gradient_reference(options, uhf)
    check_double_hybrid_reference(options, uhf)
    return options, method


def check_gradient_method(options: RunOptions, method: str) -> None:
    """InputError for a method the gradient does not differentiate: a name outside ``SCALES``
    that is not a double hybrid of the table (``options.method``, after ``gradient_options``)."""
    if double_hybrids.get(options.method) is not None and method == options.method:
        return
    if method not in SCALES:
        raise InputError(
            f"unknown method '{method}'; use one of {', '.join(SCALES)} or a double hybrid of the table "
            "(docs/double_hybrids.md)",
            option="method",
        )


def gradient_options(options: RunOptions, method: str) -> tuple[RunOptions, str]:
    """(options, method) of a gradient run: a double hybrid named by ``method`` (any of its names)
    or by ``options.method`` becomes both (its table key); MP2's methods are left as they are. One
    InputError when the two name different methods (an SCS-MP2 gradient of a double hybrid's run)."""
    try:
        dh = None if method in SCALES else double_hybrids.get(method)
    except InputError:  # an unknown name: check_gradient_method's line
        return options, method
    key = None if dh is None else double_hybrids.canonical(method)
    if options.method != "mp2" and method != "mp2" and options.method != key:
        raise InputError(
            f"method {method} and the run's method {options.method} differ; name the double hybrid once",
            option="method",
        )
    if key is None:
        return options, (method if options.method == "mp2" else options.method)
    return replace(options, method=key), key


def check_double_hybrid_reference(options: RunOptions, unrestricted: bool) -> None:
    """InputError for a double hybrid's gradient on a device without fp64 (its PT2 part runs in
    fp64 only), for a closed (RKS) or open (UKS, ``unrestricted``) shell alike."""
    dh = double_hybrids.get(options.method)
    if dh is not None and not linalg.device_capabilities(options.device).has_fp64:
        raise InputError(
            f"the double-hybrid gradient ({dh.name}) needs fp64 arithmetic, which device '{options.device}' "
            "lacks; run it on cpu (or cuda)",
            option="device",
        )


def check_gradient_reference(options: RunOptions, unrestricted: bool) -> None:
    """InputError for what the gradient of this reference (``unrestricted``: UHF) does not do: an
    SCF that is not density-fitted, a UHF reference without fp64, an fp32 energy on a device with
    fp64."""
    if options.scf_mode not in pyscf_scf.SCF_DF_MODES:
        raise InputError(
            f"the gradient needs a density-fitted SCF (scf mode {' or '.join(pyscf_scf.SCF_DF_MODES)}); "
            f"'{options.scf_mode}' has no DF-HF response here",
            option="scf_mode",
        )
    fp64 = linalg.device_capabilities(options.device).has_fp64
    if not fp64 and unrestricted:
        raise InputError(
            f"the UHF DF-MP2 gradient needs fp64 arithmetic, which device '{options.device}' lacks "
            "(there only the RHF gradient runs, its pair loop in fp32); run it on cpu (or cuda)",
            option="device",
        )
    if options.resolved_precision() != "fp64" and fp64:
        raise InputError(
            "the gradient is computed in fp64, the derivative of the fp64 energy; an fp32 "
            "energy run would not be the energy it differentiates: use precision fp64",
            option="precision",
        )


# the gradient stage's timer stages as its progress lines name them
_STAGE_NAMES = {
    "grad_mp2_densities": "MP2 densities (pair loop)",
    "grad_derivative_integrals": "derivative integrals",
    "grad_jk_factor": "JK factor",
    "grad_zvector": "Z-vector",
    "scf_integrals": "JK factor's 3-center integrals",
    "scf_fit": "JK factor's fit",
}


def check_gradient_memory(geom: Geometry, options: RunOptions, backend) -> float:
    """``gradient_memory`` of a standalone preparation (``prepare``), for a caller without a Job;
    a run checks its own Job instead (``run_gradient``)."""
    return gradient_memory(prepare(geom, options, backend), options.memory_mb)


def gradient_memory(job: Job, memory_mb: float | None = None) -> float:
    """The gradient stage's peak memory (MB) for the prepared ``job`` with the plan it would run
    (``gradient_plan``): MemoryLimitError (one line) before any work when no plan fits."""
    return gradient_plan(job, memory_mb).peak_mb


def gradient_plan(job: Job, memory_mb: float | None = None) -> GradientPlan:
    """The gradient stage's plan for the prepared ``job`` (``relaxed.job_plan``): the fastest
    ``dfmp2.grad.plan.choose_plan`` that fits (RHF or UHF). MemoryLimitError (one line, human units)
    before any work when nothing fits."""
    return relaxed.job_plan(job, memory_mb)


def gradient_stage(  # noqa: PLR0913
    mol, ref, auxmol, jk_auxmol, backend, method: str = "mp2", timer=None, plan: GradientPlan | None = None, world=None
) -> GradientParts:
    """The nuclear gradient of E_HF + c_os E_OS + c_ss E_SS (``SCALES[method]``; a double hybrid's
    ``method``: ``dfmp2.grad.dh.dh_gradient`` of its RKS or UKS reference, whose ``mf`` it reads) for the converged
    ``ref`` (frozen core marked) on ``mol``: the MP2 part fitted with ``auxmol``, the DF-HF response
    with ``jk_auxmol`` (the SCF's own fitting set), on ``backend``. An RHF reference runs
    ``dfmp2.grad.mp2.mp2_gradient``, a UHF one ``dfmp2.grad.ump2.uhf_mp2_gradient``. The one entry point into
    the stage (``run_gradient``, ``DFMP2.nuc_grad_method``). ``plan``: the stage's forms
    (``gradient_plan``; default the fastest that fits memory.DEFAULT_FRACTION of the available
    memory). ``world``: the ranks the stage splits its pair loops and derivative integrals over
    (``ran['ranks']`` says which parts); None or one process: all of it here."""
    timer = timer or Timer(backend)
    dh = None if method in SCALES else double_hybrids.get(method)
    if dh is not None:  # a double hybrid: the KS gradient, the PT2 part with the KS response, E_disp's
        parts = grad_dh.dh_gradient(mol, ref, auxmol, dh, backend, timer=timer, plan=plan, world=world)
        return _ranks_record(parts, ref, world)
    c_os, c_ss = SCALES[method]
    if ref.restricted:
        parts = mp2_gradient(
            mol, ref, auxmol, jk_auxmol, backend, c_os=c_os, c_ss=c_ss, timer=timer, plan=plan, world=world
        )
    else:
        parts = grad_ump2.uhf_mp2_gradient(
            mol, ref, auxmol, jk_auxmol, backend, c_os=c_os, c_ss=c_ss, timer=timer, plan=plan, world=world
        )
    parts.ran.setdefault("reference", "rhf" if ref.restricted else "uhf")
    return _ranks_record(parts, ref, world)


def _ranks_record(parts: GradientParts, ref, world) -> GradientParts:
    """``parts`` with ``ran['ranks']`` (what was split over the ranks) when ``world`` has several."""
    if world is not None and world.distributed:
        split_jk = (parts.ran.get("plan") or {}).get("jk_rows_per_rank") is not None
        parts.ran["ranks"] = {
            "world_size": world.size,
            "split": [
                "the pair loop's blocks of j (Γ's rows, P_oo and P_vv's shares)" + ("" if ref.restricted else ", each"),
                "the 3-center derivative integrals' aux groups (correlation and JK parts)",
            ]
            + (
                ["the JK factor's fixed groups of rows: its fit, the Z-vector's J/K and the JK derivative's first pass"]
                if split_jk
                else []
            ),
            "on_every_rank": "B, "
            + ("" if split_jk else "the JK factor, ")
            + "the Z-vector's solve, Γ's back-transforms, the one-electron derivatives",
            "added_in_order": "every rank's shares in block order: the same bits as one process (equal threads)",
            "comm_rank": dict(world.comm.get("gradient", {})),
        }
    return parts


def run_gradient(  # noqa: PLR0913
    geom: Geometry,
    options: RunOptions,
    method: str = "mp2",
    progress=None,
    log=None,
    backend=None,
    on_plan=None,
    guess=None,
    world=None,
    agreed: dict | None = None,
    profile: bool = False,
) -> GradientResult:
    """The energy (``dfmp2.drivers.energy.run_energy``, whose ``progress``, ``log``, ``on_plan``
    and ``guess`` these are) and its nuclear gradient for ``method`` (``gradient_stage``). One
    preparation (``prepare``, with the gradient's checks): its Job's gradient plan is checked
    against the memory limit with the energy's plan, before any work (``RunPlan.densities``), and
    gives the gradient stage its molecule, fitting sets and backend. The properties
    ``options.properties`` asks for come from the gradient's own densities (the ``method``'s
    energy; ``props.stage.record``), not from a second Z-vector. ``world``: the process group
    (default ``distributed.current()``; a one-process World for a task of a task-parallel
    command). Over several ranks they agree on ``method`` with their input before the SCF (as
    'option method': the commands' ``--method``) and on ``agreed``, a workflow's own parameters
    ({'option <parameter>': value}). A double hybrid named by ``method`` or ``options.method``
    (``gradient_options``) runs its KS-SCF (RKS or UKS) and ``dfmp2.grad.dh``. Its checks are
    ``check_gradient_options``' (made here in ``prepare``, before any work). ``profile``: the
    energy run's Result.profile and the gradient stage's ``profile`` (dfmp2.timing.Profile)."""
    options, method = gradient_options(options, method)
    check_gradient_method(options, method)

    def check(uhf):
        check_gradient_reference(options, uhf)
        check_double_hybrid_reference(options, uhf)

    job = prepare(geom, options, backend, log, world, check=check)
    job.agreed.update({"option method": method, **(agreed or {})})
    done = run_energy(job, progress=progress, log=log, on_plan=on_plan, guess=guess, gradient=True, profile=profile)
    say = log or (lambda msg: None)
    say("nuclear gradient: densities, Z-vector, derivative integrals ...")
    t0 = time.perf_counter()
    prof = Profile(job.backend) if profile else None
    timer = Timer(
        job.backend,
        on_stage=lambda stage, s: say(f"  gradient: {_STAGE_NAMES.get(stage, stage)} {s:.2f} s"),
        profile=prof,
    )
    with prof or contextlib.nullcontext():
        parts = gradient_stage(
            job.mol, done.ref, job.auxmol, job.jk_auxmol, job.backend, method, timer, done.plan.densities, job.world
        )
    result = done.result
    if options.properties:  # from the gradient's own relaxed densities: no second Z-vector
        result.properties = props_stage.record(job.mol, parts.densities, options.properties, method)
    if job.dh is not None:  # E_KS + the scaled PT2 + E_disp, as dfmp2 run prints it
        energy = result.double_hybrid["e_total"]
    else:
        c_os, c_ss = SCALES[method]
        energy = result.e_hf + c_os * result.e_os + c_ss * result.e_ss
    wall = time.perf_counter() - t0
    record = prof.report(timer.seconds, wall, None, t0) if prof is not None else None
    return GradientResult(result, method, energy, parts, wall, energy_run=done, profile=record)
