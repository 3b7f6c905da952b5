"""QCSchema's ``hessian`` and ``properties`` drivers (``dfmp2.interfaces.qcschema`` runs them and
builds the AtomicResult from what these return).

hessian: the 3N x 3N Hessian of the method's DF-MP2 energy (Eh/bohr², the order of the input's
atoms, symmetrised), as ``dfmp2 frequencies`` builds it: central differences of analytic gradients
(``dfmp2.workflows.frequencies``, 6N + 1 gradient runs at its step). ``return_result`` and
``properties.return_hessian`` the Hessian (QCSchema: a (3N, 3N) array, its JSON a flat list),
``return_gradient`` and ``return_energy`` those of the reference geometry; the harmonic analysis
(frequencies, thermochemistry) in ``extras["dfmp2"]``. RHF or UHF, or a double hybrid
(qcvars DFT TOTAL HESSIAN; the gradient's checks: ``check_gradient_options``); a molecule ``dfmp2
frequencies`` refuses (one atom, ghost atoms) is refused here in the same line.

properties: the energy and the dipole moments, as Psi4's harness returns them: ``return_result``
``{"dipole": [x, y, z]}`` the method's (MP2's relaxed) dipole in e·a0 about the input's origin;
``properties.scf_dipole_moment`` and ``mp2_dipole_moment``; Psi4's qcvars SCF DIPOLE, MP2 DIPOLE,
CURRENT DIPOLE. What is computed: keywords.properties, or Psi4's ``model.properties``, or dipole.
The dipole of SCS- and SOS-MP2 is their own energy's relaxed dipole (``extras``' qcvars SCS-MP2
DIPOLE; QCSchema's ``mp2_dipole_moment`` is MP2's only). A double hybrid's (RKS or UKS) is its relaxed
dipole (-dE/dF of E_KS + E_PT2 + E_disp): qcvars <NAME> DIPOLE and CURRENT DIPOLE, its KS
determinant's ``scf_dipole_moment`` and SCF DIPOLE, as ``dfmp2 run --method --properties``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from dfmp2.errors import InputError, shown

DRIVERS = ("energy", "gradient", "hessian", "properties")


@dataclass
class DriverOutput:
    """What a driver adds to the energy's AtomicResult: ``return_result``, AtomicProperties fields
    (``properties``), Psi4's qcvars, ``extras["dfmp2"]`` (``document``) and the report's lines."""

    return_result: object
    properties: dict = field(default_factory=dict)
    qcvars: dict = field(default_factory=dict)
    document: dict | None = None
    report: str = ""


def driver_of(inp) -> str:
    """The v2 AtomicInput's driver as a string."""
    return getattr(inp.specification.driver, "value", inp.specification.driver)


def properties_options(inp, options, where: str):
    """RunOptions of driver 'properties': the properties asked for (keywords.properties, else
    Psi4's model.properties, else the dipole)."""
    from dfmp2.options import PROPERTY_CHOICES, property_names

    extra = getattr(inp.specification.model, "model_extra", None) or {}
    psi4 = extra.get("properties")
    if psi4 is not None:
        names = [str(x).strip().lower() for x in psi4] if isinstance(psi4, (list, tuple)) else None
        if not names or any(n not in PROPERTY_CHOICES for n in names):
            raise InputError(
                f"{where}: model.properties {shown(json.dumps(psi4, default=str), 40)} is not supported; "
                f"dfmp2 computes {', '.join(PROPERTY_CHOICES)}"
            )
        if options.properties and set(options.properties) != set(names):
            raise InputError(
                f"{where}: keywords.properties and model.properties differ; give the properties once",
                option="properties",
            )
        options = dataclasses.replace(options, properties=property_names(names))
    if not options.properties:
        options = dataclasses.replace(options, properties=("dipole",))
    return options


def run_properties(geom, options, method: str, progress=None, log=None, on_plan=None):
    """The EnergyRun of driver 'properties': the energy, then the properties of ``method``'s
    relaxed density (its Result's ``properties``). Every check (and the densities' memory plan)
    before the SCF, as ``dfmp2 run --properties``; for SCS- and SOS-MP2 the density stage runs
    after the energy on the method's own density (as the ASE calculator's dipole); a double
    hybrid's in the energy run (its own densities, ``dfmp2.grad.dh.dh_densities``)."""
    from dfmp2.drivers.energy import prepare, run_energy
    from dfmp2.props import stage as props_stage

    job = prepare(geom, options, log=log)  # the properties' checks and memory plan: before any work
    want = options.properties
    if method != "mp2" and job.dh is None:  # the energy run's density stage is MP2's (or the double hybrid's)
        job.options = dataclasses.replace(job.options, properties=())
    done = run_energy(job, progress=progress, log=log, on_plan=on_plan)
    if method != "mp2" and job.dh is None:
        job.options = options
        plan = props_stage.density_plan(job, options.memory_mb)
        args = (job.mol, done.ref, job.auxmol, job.jk_auxmol, job.backend, want, method, plan)
        done.result.properties = {**(done.result.properties or {}), **props_stage.property_stage(*args)}
    return done


def properties_output(result, method_name: str) -> DriverOutput:
    """Driver 'properties' of an energy ``result`` that computed its dipoles (e·a0);
    ``method_name``: Psi4's prefix of the method ('MP2', 'SCS-MP2', 'SOS-MP2'; a double hybrid's
    name, 'B2PLYP'). SCF DIPOLE is the SCF's: the HF determinant's, a double hybrid's KS one's."""
    dip = (result.properties or {}).get("dipole")
    scf = list(map(float, (dip["hf"] if "hf" in dip else dip["ks"])["au"]))
    mine = list(map(float, dip["relaxed"]["au"]))
    return DriverOutput(
        return_result={"dipole": mine},
        qcvars={"SCF DIPOLE": scf, f"{method_name} DIPOLE": mine, "CURRENT DIPOLE": mine},
    )


def run_hessian(geom, options, method: str, progress=None, log=None):
    """(FrequencyResult, the reference geometry's GradientResult) of ``method`` at ``geom``:
    ``dfmp2 frequencies``' own Hessian (no IR intensities unless keywords.properties asks for
    the dipole)."""
    from dfmp2.workflows.frequencies import frequencies

    for name in ("checkpoint", "resume"):  # one energy checkpoint cannot hold 6N + 1 geometries
        if getattr(options, name):
            raise InputError(
                f"driver 'hessian' keeps no {name} file (its 6N + 1 gradients are at different geometries); "
                "run dfmp2 frequencies --checkpoint for a Hessian that resumes",
                option=name,
            )
    fr = frequencies(geom, options, method, ir="dipole" in options.properties, log=log, progress=progress)
    if fr.first is None:  # rank 0 computes the reference geometry (task 0): never None there
        raise InputError("the Hessian's reference geometry was not computed in this process")
    return fr, fr.first


def hessian_output(fr, method_name: str) -> DriverOutput:
    """Driver 'hessian' of a FrequencyResult ``fr`` (``method_name``: Psi4's prefix, 'MP2', 'DFT')."""
    import numpy as np

    H = np.asarray(fr.hessian, dtype=np.float64)
    hess = H.tolist()
    lines = [f"nuclear Hessian of E({fr.method.upper()}): central differences of analytic gradients, "
             f"step {fr.step:g} bohr, {fr.tasks.get('evaluations')} gradients",
             "harmonic frequencies / cm^-1 (imaginary as negative): "
             + " ".join(f"{f:.2f}" for f in fr.frequencies)]  # fmt: skip
    return DriverOutput(
        return_result=H,
        properties={"return_hessian": hess},
        qcvars={"CURRENT HESSIAN": hess, f"{method_name} TOTAL HESSIAN": hess},
        document=fr.to_dict(),
        report="\n".join(lines) + "\n",
    )
