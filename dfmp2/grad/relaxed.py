"""The MP2 one-particle densities alone: the gradient stage's densities and Z-vector without its
derivative integrals (``density_stage``; RHF ``rhf_densities``, UHF ``uhf_densities``).

The same pieces as ``dfmp2.grad.mp2.mp2_gradient`` and ``dfmp2.grad.ump2.uhf_mp2_gradient``, run
as far as the relaxed density: B and the pair loop (P_ij, P_ab: the unrelaxed density), then, for
the relaxed one, Γ's 3-index orbital-response terms, the JK factor on the JK-fit set the SCF used
(``DFJK``), the frozen-active block and the Z-vector (``relaxed_density``). Nothing new is
computed here: the gradient's own code runs, and its densities are those the gradient takes
(``GradientParts.densities`` is the same record). The relaxed density is the derivative of
E_HF + c_os E_OS + c_ss E_SS with respect to a one-electron perturbation (a field: the dipole),
both fitting sets fixed; see ``dfmp2.grad.densities`` for the conventions (PySCF's).

Memory: the gradient's plan over the phases that run here (``DENSITY_PHASES``: the pair loop
and 3-index terms, the JK factor's fit, the Z-vector; ``choose_plan``, of
``dfmp2.grad.plan.uhf_shapes`` for a UHF). Timed as 'props_mp2_densities', 'props_jk_factor'
(enclosing the factor's scf_integrals and scf_fit), 'props_zvector'.
"""

from __future__ import annotations

import os
import time

from dfmp2 import distributed, linalg, memory
from dfmp2.grad import common as grad_common
from dfmp2.grad import jk_deriv, zvector
from dfmp2.grad import mp2 as grad_mp2
from dfmp2.grad import pairs as grad_pairs
from dfmp2.grad import ump2 as grad_ump2
from dfmp2.grad.densities import MP2Densities
from dfmp2.grad.mp2 import SCALES
from dfmp2.grad.plan import (
    DENSITY_PHASES,
    DISK_PLAN,
    GradientPlan,
    choose_plan,
    default_limit_mb,
    make_plan,
    rhf_shapes,
    uhf_shapes,
)
from dfmp2.scf import jk_dist
from dfmp2.timing import Timer

FORCE_SPLIT = "DFMP2_TEST_SPLIT_JK"  # tests only: "1" makes the gradient over ranks split its JK factor


def job_plan(job, memory_mb: float | None, phases: tuple | None = None, stage: str = "gradient") -> GradientPlan:
    """The plan of the gradient stage (or, with ``phases`` DENSITY_PHASES, of the density stage)
    for a prepared ``dfmp2.drivers.job.Job`` (its orbital space and both fitting sets) against the run's
    limit (``memory_mb``, else ``memory.default_limit_mb('cpu')``, over several ranks the smallest
    of the ranks' so that every rank runs the same plan: the same steps, the same bits), before any
    work: the fastest ``choose_plan`` that fits (RHF or UHF shapes; ``stage`` names it in the error
    line), with the run's --scratch. Over several ranks with the split SCF the gradient may also
    split its JK factor over them (after the whole-factor plans, before the disk; the test hook
    ``DFMP2_TEST_SPLIT_JK=1`` forces it, and in one process its forms over the whole factor: the
    same bits). MemoryLimitError (one line, human units) when nothing fits."""
    space = job.space
    limit = memory_mb if memory_mb is not None else memory.default_limit_mb("cpu")
    if memory_mb is None and job.world.distributed:  # free memory differs a little between the ranks
        limit = min(job.world.gather_objects(limit, "plan"))
    nocc = tuple(space.nocc) if job.unrestricted else space.nocc[0]
    per_spin = (lambda f: tuple(f(n) for n in nocc)) if job.unrestricted else (lambda f: f(nocc))
    shapes = dict(
        nao=space.nbasis,
        nocc=nocc,
        nact=per_spin(lambda n: n - space.nfrozen),
        nvir=per_spin(lambda n: space.nmo - n),
        naux_mp2=space.naux,
        naux_jk=job.jk_auxmol.nao_nr(),
    )
    split = 0  # the gradient over ranks with the split SCF: its JK factor may be split too
    if phases is None and distributed.split_scf(job.world):
        split = jk_dist.planned_rows(job.jk_auxmol, job.world, True)
    if phases is None and os.environ.get(FORCE_SPLIT) == "1":  # tests: the split plan's forms, whatever fits
        plan = make_plan(shapes, *DISK_PLAN, limit, "split" if split else "memory", jk_rows=split)
    else:
        plan = choose_plan(shapes, limit, phases=phases, stage=stage, split_rows=split)
    plan.scratch_dir = job.options.scratch_dir  # the run's --scratch, as the energy's files
    return plan


def default_plan(mol, ref, mp2_auxmol, jk_auxmol) -> GradientPlan:
    """The density stage's plan without a job's (``job_plan``): the fastest whose density phases
    fit memory.DEFAULT_FRACTION of the available memory, for ``ref``'s RHF or UHF shapes."""
    shapes = (rhf_shapes if ref.restricted else uhf_shapes)(mol, ref, mp2_auxmol, jk_auxmol)
    return choose_plan(shapes, default_limit_mb(), phases=DENSITY_PHASES, stage="density")


STAGES = ("props_mp2_densities", "props_jk_factor", "props_zvector")


def density_stage(  # noqa: PLR0913
    mol,
    ref,
    auxmol,
    jk_auxmol,
    backend,
    method: str = "mp2",
    relaxed: bool = True,
    timer: Timer | None = None,
    plan: GradientPlan | None = None,
) -> MP2Densities:
    """The unrelaxed and (``relaxed``) relaxed one-particle densities of E_HF + c_os E_OS + c_ss
    E_SS (``SCALES[method]``) for the converged ``ref`` (frozen core marked) on ``mol``: the MP2
    part fitted with ``auxmol``, the Z-vector's DF-HF response with ``jk_auxmol`` (the SCF's own
    fitting set; unused when not ``relaxed``), on ``backend``. RHF: ``rhf_densities``, UHF:
    ``uhf_densities``. ``plan``: the forms (default: the fastest whose density phases fit
    memory.DEFAULT_FRACTION of the available memory)."""
    c_os, c_ss = SCALES[method]
    fn = rhf_densities if ref.restricted else uhf_densities
    return fn(mol, ref, auxmol, jk_auxmol, backend, c_os=c_os, c_ss=c_ss, relaxed=relaxed, timer=timer, plan=plan)


def rhf_densities(  # noqa: PLR0913
    mol,
    ref,
    mp2_auxmol,
    jk_auxmol,
    backend,
    *,
    c_os: float = 1.0,
    c_ss: float = 1.0,
    relaxed: bool = True,
    timer: Timer | None = None,
    plan: GradientPlan | None = None,
) -> MP2Densities:
    """The RHF densities (``density_stage``). What the gradient refuses is refused here too
    (``grad_mp2.check_supported``), but for the unrelaxed density alone frozen virtual orbitals
    are taken (left out, as PySCF's unrelaxed MP2 density leaves them). A backend without fp64
    runs the pair loop there in fp32 and the rest on a host CPU backend in fp64, as the gradient."""
    if relaxed:
        grad_mp2.check_supported(ref, backend)
    elif not ref.restricted:
        raise grad_common.GradientError("rhf_densities takes an RHF reference", option="reference")
    host = backend if backend.has_fp64 else linalg.TorchBackend("cpu")
    timer = timer or Timer(backend)
    timer.watch(host)
    kernels0 = (dict(backend.kernels_used), dict(host.kernels_used))
    ch = ref.channels[0]
    orb = grad_common.Orbitals(ch, active_virtuals=not relaxed)
    if plan is None and relaxed:
        plan = default_plan(mol, ref, mp2_auxmol, jk_auxmol)
    t0 = time.perf_counter()
    corr = grad_pairs.corr_intermediates(
        mol, mp2_auxmol, orb, host, c_os, c_ss, pair_backend=backend, plan=plan, response=relaxed
    )
    corr.T_v = None  # the derivative weights' half back-transform: not needed for a density
    t0 = timer.add("props_mp2_densities", t0)
    P, zinfo = None, None
    if relaxed:
        f0 = timer.executed()
        jk = jk_deriv.DFJK(mol, jk_auxmol, host, timer, plan.factor, plan.fit_mb, plan.scratch_dir)
        try:
            t0 = timer.add("props_jk_factor", t0, flops0=f0)
            P, _, zinfo = zvector.relaxed_density(orb, corr, jk, host, plan.zvector)
            timer.add("props_zvector", t0)
        finally:
            jk.release()  # a factor on disk: its scratch directory goes, however the stage ends
    ran = grad_mp2.stage_ran(backend, host, kernels0)
    for k in ("on_device", "host"):  # the gradient's words: they name its derivative steps
        ran.pop(k, None)
    if plan is not None:  # the JK derivative's form is the gradient's, not run here
        ran["plan"] = {k: v for k, v in plan.record().items() if not k.startswith("jk_deriv")}
    return grad_mp2.rhf_record(orb, corr, P, c_os, c_ss, zinfo, ran, _timings(timer))


def uhf_densities(  # noqa: PLR0913
    mol,
    ref,
    mp2_auxmol,
    jk_auxmol,
    backend,
    *,
    c_os: float = 1.0,
    c_ss: float = 1.0,
    relaxed: bool = True,
    timer: Timer | None = None,
    plan=None,
) -> MP2Densities:
    """The UHF densities (``density_stage``), per spin: the UHF gradient's pair loops and, when
    ``relaxed``, its 3-index terms and coupled α/β Z-vector over the DF-UHF's orbital Hessian
    (fp64 only: GradientError on a device without it), with ``plan``'s blocks and JK factor (in
    memory or on disk)."""
    if ref.restricted:
        raise grad_common.GradientError("uhf_densities takes a UHF reference (two spin channels)", option="reference")
    if relaxed:
        grad_mp2.check_channels(ref, backend)
    elif not backend.has_fp64:
        raise grad_common.GradientError(
            f"the UHF MP2 densities need fp64 arithmetic, which device '{backend.name}' lacks; run them on the CPU",
            option="device",
        )
    timer = timer or Timer(backend)
    kernels0 = dict(backend.kernels_used)
    orbs = [grad_common.Orbitals(ch, active_virtuals=not relaxed) for ch in ref.channels]
    if plan is None and relaxed:
        plan = default_plan(mol, ref, mp2_auxmol, jk_auxmol)
    t0 = time.perf_counter()
    # T_v, the derivative weights' half back-transforms, not kept: not needed for a density
    _, P, Y, _, _ = grad_ump2.corr_uhf(mol, mp2_auxmol, orbs, backend, c_os, c_ss, response=relaxed, plan=plan)
    t0 = timer.add("props_mp2_densities", t0)
    P_unrelaxed, P_relaxed, zinfo = [p.copy() for p in P], None, None
    if relaxed:
        f0 = timer.executed()
        jk = jk_deriv.DFJK(mol, jk_auxmol, backend, timer, plan.factor, plan.fit_mb, plan.scratch_dir)
        try:
            resp = grad_ump2.response_operator(jk, orbs)
            t0 = timer.add("props_jk_factor", t0, flops0=f0)
            P_relaxed, _, zinfo = grad_ump2.relaxed_density(orbs, P, Y, resp)
            timer.add("props_zvector", t0)
        finally:
            jk.release()
    used = {k: n - kernels0.get(k, 0) for k, n in backend.kernels_used.items() if n != kernels0.get(k, 0)}
    ran = {"device": backend.name, "precision": "fp64", "reference": "uhf", "kernels": dict(sorted(used.items()))}
    if plan is not None:  # the JK derivative's form is the gradient's, not run here
        ran["plan"] = {k: v for k, v in plan.record().items() if not k.startswith("jk_deriv")}
    return grad_ump2.uhf_record(orbs, P_unrelaxed, P_relaxed, c_os, c_ss, zinfo, ran, _timings(timer))


def _timings(timer: Timer) -> dict:
    """The density stage's seconds (its STAGES only; the JK factor's scf_* are inside props_jk_factor)."""
    return {k: v for k, v in timer.seconds.items() if k in STAGES}
