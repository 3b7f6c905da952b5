"""The property stage: what ``RunOptions.properties`` asks for, after the energy, from the MP2
one-particle densities of the gradient's machinery (``dfmp2.grad.relaxed.density_stage``: the
pair loop, the 3-index response terms, the JK factor and the Z-vector, no derivative integrals).

    check_properties  before any work: what the densities cannot be made for (one InputError)
    density_plan      before any work: the density stage's memory against the run's limit
    property_stage    after the energy: the densities, then each property -> the result's record
    record            a property record from densities already made (the gradient's, for free)

Properties (``dfmp2.options.PROPERTY_CHOICES``): 'dipole', the HF, unrelaxed and relaxed MP2
dipole moments (``dfmp2.props.dipole``); of a double hybrid (RKS or UKS) its KS determinant's and its
relaxed one, from ``dfmp2.grad.dh.dh_densities`` (the gradient's Z-vector with the KS response).
The record (the result JSON's ``properties``): one key per property and ``densities`` (the method
they differentiate, the Z-vector's iterations and residual, seconds per stage, what ran, which
stage made them; a double hybrid's functional and what its densities are).
"""

from __future__ import annotations

from dfmp2 import functionals, linalg
from dfmp2.errors import InputError
from dfmp2.grad import dh as grad_dh
from dfmp2.grad import plan as grad_plan
from dfmp2.grad import relaxed
from dfmp2.io.result import kernel_records
from dfmp2.options import SCF_DF_MODES
from dfmp2.props.dipole import dipoles
from dfmp2.timing import Timer


def check_properties(options, unrestricted: bool) -> None:
    """InputError (one line, naming the options) before any work for properties that cannot be
    computed: the relaxed density needs the SCF's orbital response (a density-fitted SCF: DF-HF's,
    a double hybrid's DF-KS), and a UHF one (or a double hybrid's) fp64 arithmetic; on a device
    with fp64 the densities are made in fp64, so precision fp32 is refused (it ran in fp64 silently
    before). Nothing asked for: nothing checked."""
    if not options.properties:
        return
    what = ", ".join(options.properties)
    dh = double_hybrid(options.method)
    density = (
        "MP2 density, whose orbital response is the DF-HF's"
        if dh is None
        else f"{dh.name} density, whose orbital response is the DF-KS's"
    )
    if options.scf_mode not in SCF_DF_MODES:
        raise InputError(
            f"properties ({what}) come from the relaxed {density}: they need a density-fitted SCF "
            f"(scf mode {' or '.join(SCF_DF_MODES)}), not '{options.scf_mode}'",
            option=("properties", "scf_mode"),
        )
    caps = linalg.device_capabilities(options.device)
    if caps.has_fp64 and options.resolved_precision() != "fp64":
        raise InputError(
            f"properties ({what}) are computed in fp64 (the densities, like the gradient, in fp64 on a "
            f"device that has it); with precision {options.resolved_precision()} they would not be in the "
            "precision asked for: use precision fp64, or leave the properties out",
            option=("properties", "precision"),
        )
    if (unrestricted or dh is not None) and not caps.has_fp64:
        whose = "a UHF reference" if dh is None else f"a double hybrid ({dh.name})"
        raise InputError(
            f"properties ({what}) of {whose} need fp64 arithmetic (its Z-vector), which device "
            f"'{options.device}' lacks; run them on cpu (or cuda)",
            option=("properties", "device"),
        )


def double_hybrid(method: str):
    """The DoubleHybrid ``method`` names (a table key or any of its names), None for MP2's methods
    ('mp2', 'scs-mp2', 'sos-mp2')."""
    return None if method in relaxed.SCALES else functionals.get(method)


def density_plan(job, memory_mb: float | None = None):
    """The density stage's plan for a prepared ``dfmp2.drivers.job.Job`` (``relaxed.job_plan`` over
    ``DENSITY_PHASES``), checked before any work: the fastest gradient plan whose density phases
    fit. MemoryLimitError (one line, human units) when nothing fits."""
    return relaxed.job_plan(job, memory_mb, phases=grad_plan.DENSITY_PHASES, stage="density (properties)")


def property_stage(  # noqa: PLR0913
    mol, ref, auxmol, jk_auxmol, backend, properties, method: str = "mp2", plan=None, timer: Timer | None = None
) -> dict:
    """The ``properties`` of the converged ``ref`` on ``mol`` (fitting sets ``auxmol``, MP2, and
    ``jk_auxmol``, the SCF's), on ``backend``: the relaxed densities of ``method``'s energy, then
    ``record``. MP2's methods: ``relaxed.density_stage`` (with ``plan``: ``density_plan``'s); a
    double hybrid (``method`` its table key, ``ref`` its DF-RKS or DF-UKS): ``dfmp2.grad.dh.dh_densities``,
    the gradient's Z-vector with the KS response (``jk_auxmol`` unused: the KS-SCF's own fit)."""
    timer = timer or Timer(backend)
    dh = double_hybrid(method)
    if dh is not None:
        dens = grad_dh.dh_densities(mol, ref, auxmol, dh, backend, timer=timer, plan=plan)
        return record(mol, dens, properties, method, source="the density stage (dfmp2.grad.dh.dh_densities)")
    dens = relaxed.density_stage(mol, ref, auxmol, jk_auxmol, backend, method, relaxed=True, timer=timer, plan=plan)
    return record(mol, dens, properties, method, source="the density stage (dfmp2.grad.relaxed)")


def record(mol, densities, properties, method: str = "mp2", source: str = "the gradient stage") -> dict:
    """The result's ``properties`` record of ``densities`` (an ``MP2Densities`` with its relaxed
    density, of ``method``'s energy: MP2's, or a double hybrid's whose 'hf' kind is its KS
    determinant's) on ``mol``: one entry per property asked for, and ``densities`` (module
    docstring; a double hybrid's also names the functional and what its densities differentiate)."""
    dh = double_hybrid(method)
    out = {}
    if "dipole" in properties:
        out["dipole"] = dipoles(mol, densities, method, double_hybrid=dh is not None).to_dict()
    ran = {k: kernel_records(v) if k in ("kernels", "host_kernels") else v for k, v in densities.ran.items()}
    out["densities"] = {
        "method": method,
        "made_by": source,
        "zvector": densities.zvector,
        "timings": dict(densities.timings),
        "ran": ran,
    }
    if dh is not None:
        out["densities"]["double_hybrid"] = {
            "functional": dh.name,
            "xc": dh.xc,
            "c_os": dh.c_os,
            "c_ss": dh.c_ss,
            "differentiates": "E_KS + c_os E_OS + c_ss E_SS + E_disp (E_disp has no field dependence)",
            "ks": "the KS determinant's density 2 C_o C_o^T (PySCF's DF-RKS of the functional's hybrid part)",
            "relaxed": "D_KS + P: P the relaxed PT2 density, its Z-vector with the KS orbital Hessian "
            "(J, a_x K on the JK-fit set, f_xc on the SCF's grid)",
        }
    return out
