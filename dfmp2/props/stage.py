"""The property stage: what ``RunOptions.properties`` asks for, after the energy, from the MP2
one-particle densities of the gradient's machinery (``dfmp2.grad.relaxed.density_stage``: the
pair loop, the 3-index response terms, the JK factor and the Z-vector, no derivative integrals).

    check_properties  before any work: what the densities cannot be made for (one InputError)
    density_plan      before any work: the density stage's memory against the run's limit
    property_stage    after the energy: the densities, then each property -> the result's record
    record            a property record from densities already made (the gradient's, for free)

Properties (``dfmp2.options.PROPERTY_CHOICES``): 'dipole', the HF, unrelaxed and relaxed MP2
dipole moments (``dfmp2.props.dipole``). The record (the result JSON's ``properties``): one key per
property and ``densities`` (the method they differentiate, the Z-vector's iterations and residual,
seconds per stage, what ran, and which stage made them).
"""

from __future__ import annotations

from dfmp2 import linalg
from dfmp2.errors import InputError
from dfmp2.grad import plan as grad_plan
from dfmp2.grad import relaxed
from dfmp2.io.result import kernel_records
from dfmp2.options import SCF_DF_MODES
from dfmp2.props.dipole import dipoles
from dfmp2.timing import Timer


def check_properties(options, unrestricted: bool) -> None:
    """InputError (one line, naming the options) before any work for properties that cannot be
    computed: the relaxed density needs the DF-HF's orbital response (a density-fitted SCF), and
    a UHF one fp64 arithmetic; on a device with fp64 the densities are made in fp64, so precision
    fp32 is refused (it ran in fp64 silently before). Nothing asked for: nothing checked."""
    if not options.properties:
        return
    what = ", ".join(options.properties)
    if options.scf_mode not in SCF_DF_MODES:
        raise InputError(
            f"properties ({what}) come from the relaxed MP2 density, whose orbital response is the "
            f"DF-HF's: they need a density-fitted SCF (scf mode {' or '.join(SCF_DF_MODES)}), not "
            f"'{options.scf_mode}'",
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
    if unrestricted and not caps.has_fp64:
        raise InputError(
            f"properties ({what}) of a UHF reference need fp64 arithmetic (its Z-vector), which device "
            f"'{options.device}' lacks; run them on cpu (or cuda)",
            option=("properties", "device"),
        )


def density_plan(job, memory_mb: float | None = None):
    """The density stage's plan for a prepared ``dfmp2.drivers.job.Job`` (``relaxed.job_plan`` over
    ``DENSITY_PHASES``), checked before any work: the fastest gradient plan whose density phases
    fit. MemoryLimitError (one line, human units) when nothing fits."""
    return relaxed.job_plan(job, memory_mb, phases=grad_plan.DENSITY_PHASES, stage="density (properties)")


def property_stage(  # noqa: PLR0913
    mol, ref, auxmol, jk_auxmol, backend, properties, method: str = "mp2", plan=None, timer: Timer | None = None
) -> dict:
    """The ``properties`` of the converged ``ref`` on ``mol`` (fitting sets ``auxmol``, MP2, and
    ``jk_auxmol``, the SCF's), on ``backend``: the relaxed densities of ``method``'s energy
    (``relaxed.density_stage``, with ``plan``: ``density_plan``'s), then ``record``."""
    dens = relaxed.density_stage(
        mol, ref, auxmol, jk_auxmol, backend, method, relaxed=True, timer=timer or Timer(backend), plan=plan
    )
    return record(mol, dens, properties, method, source="the density stage (dfmp2.grad.relaxed)")


def record(mol, densities, properties, method: str = "mp2", source: str = "the gradient stage") -> dict:
    """The result's ``properties`` record of ``densities`` (an ``MP2Densities`` with its relaxed
    density) on ``mol``: one entry per property asked for, and ``densities`` (module docstring)."""
    out = {}
    if "dipole" in properties:
        out["dipole"] = dipoles(mol, densities, method).to_dict()
    ran = {k: kernel_records(v) if k in ("kernels", "host_kernels") else v for k, v in densities.ran.items()}
    out["densities"] = {
        "method": method,
        "made_by": source,
        "zvector": densities.zvector,
        "timings": dict(densities.timings),
        "ran": ran,
    }
    return out
