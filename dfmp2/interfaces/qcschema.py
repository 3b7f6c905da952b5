"""QCSchema in and out, in process: ``run_qcschema(atomic_input) -> AtomicResult`` (a dict or a
qcelemental model, QCSchema v1 or v2; the result in the input's version), which ``dfmp2 run
input.json`` and the QCEngine harness (``dfmp2.qcengine``) both call; ``--qcschema out.json``
writes an AtomicResult, or a FailedOperation carrying the same one-line message as the CLI's error.

Both are validated with ``qcelemental``'s models (0.50 or newer: v1 and v2), an optional
dependency imported only here (``pip install -e ".[qcschema]"``). Inside, an input is a v2
AtomicInput (qcelemental converts v1), as QCEngine hands it to harnesses.

AtomicInput accepted: driver ``energy``, ``gradient`` (RHF or UHF, density-fitted SCF:
``run_gradient``; ``return_result`` and ``properties.return_gradient`` the N x 3 gradient of the
method's energy in Hartree/Bohr, the order of the input's atoms; a double hybrid's too,
qcvars DFT TOTAL GRADIENT and CURRENT GRADIENT), ``hessian`` and ``properties``
(``dfmp2.interfaces.qcschema_drivers``); model ``{"method": "mp2", "basis": <orbital
basis>}``; the molecule's geometry in Bohr (QCSchema's unit), its molecular_charge and
molecular_multiplicity, ghost atoms (``real: false``: their element's orbital and fitting basis
functions, no nucleus, no electrons); keywords (all optional, the CLI's defaults otherwise)
``auxbasis``, ``frozen_core`` (bool), ``ecp`` (auto|none|none-for-testing), ``scf_mode``
(df|pyscf-df|exact), ``device``, ``precision`` (fp64|fp32), ``memory_mb``, ``properties``
(["dipole"]: ``scf_dipole_moment`` and ``mp2_dipole_moment``, the relaxed MP2 dipole, in e·a0 about
the input's origin), and Psi4's names where they map one to one (``dfmp2.interfaces.qcschema_keywords``).
The AtomicResult keeps the input's ``id``. model.method is the run's (a CLI ``--method`` beside it is refused). The
AtomicResult: ``return_energy`` = the method's total (E(MP2), E(SCS-MP2) for scs-mp2, a double
hybrid's ``Result.e_tot``); the standard properties (nuclear_repulsion_energy,
scf_one_electron_energy, scf_two_electron_energy, scf_total_energy, scf_iterations,
mp2_same_spin_correlation_energy, mp2_opposite_spin_correlation_energy, mp2_singles_energy = 0
(canonical RHF or UHF), mp2_doubles_energy, mp2_correlation_energy, mp2_total_energy, calcinfo_*
with the alpha and beta electron counts); SCS- and SOS-MP2, which QCSchema has no field for, in
``extras["qcvars"]`` under Psi4's names; and the whole ``dfmp2 run --json`` result (what ran,
timings, memory plan, ECP, warnings) in ``extras["dfmp2"]``. Energies in Hartree.

Errors on this path are InputError (and its kinds) with the library's message; ``error_line``
names the QCSchema field an error is about (``keywords.memory_mb``, ``model.basis``) where the
CLI would name its flag.
"""

from __future__ import annotations

import json

from dfmp2.errors import InputError, SCFNotConvergedError, shown
from dfmp2.interfaces.qcschema_drivers import DRIVERS, DriverOutput, driver_of
from dfmp2.interfaces.qcschema_keywords import keyword_settings
from dfmp2.io.xyz import read_input_text
from dfmp2.mp2 import double_hybrids
from dfmp2.options import ECP_CHOICES, PRECISIONS, PROPERTY_CHOICES, SCF_MODES, basis_text

INSTALL = 'pip install -e ".[qcschema]"'
SCHEMA_VERSIONS = (1, 2)  # of the AtomicInput read (v2: QCEngine >= 0.50 hands it to harnesses)
METHODS = ("mp2", "scs-mp2", "sos-mp2")  # dfmp2.io.result.METHOD_SCALES: return_energy is the method's
# the energies (Result.energies) and Psi4's qcvar prefix of each method
METHOD_ENERGY = {"mp2": ("e_mp2", "MP2"), "scs-mp2": ("e_scs_mp2", "SCS-MP2"), "sos-mp2": ("e_sos_mp2", "SOS-MP2")}
DOUBLE_HYBRIDS = double_hybrids.FUNCTIONALS  # model.method of a double hybrid (docs/double_hybrids.md)
# keywords.basis_map: {element: basis name} for those elements, model.basis for the rest (_basis)
BASIS_MAP = "basis_map"
# keyword (a RunOptions field) -> check(value): what it must be, or None when it is fine
KEYWORDS = {
    "auxbasis": lambda v: None if isinstance(v, str) and v.strip() else "a basis name",
    "frozen_core": lambda v: None if isinstance(v, bool) else "true or false",
    "ecp": lambda v: None if v in ECP_CHOICES else " or ".join(map(repr, ECP_CHOICES)),
    "scf_mode": lambda v: None if v in SCF_MODES else " or ".join(map(repr, SCF_MODES)),
    "device": lambda v: None if isinstance(v, str) and v.strip() else "a device name (cpu, cuda, cuda:N, trn1, trn2)",
    "precision": lambda v: None if v in PRECISIONS else " or ".join(map(repr, PRECISIONS)),
    "memory_mb": lambda v: (
        None
        if (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"))
        else "a positive number of MB"
    ),
    "properties": lambda v: (
        None
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
        else f"a list of property names ({', '.join(PROPERTY_CHOICES)})"
    ),
}
# the RunOptions fields an AtomicInput sets besides its keywords
FROM_MOLECULE_AND_MODEL = {
    "method": "model.method",  # RunOptions.method: 'mp2' for mp2, scs-mp2 and sos-mp2, else the double hybrid
    "basis": "model.basis",
    "charge": "molecule.molecular_charge",
    "multiplicity": "molecule.molecular_multiplicity",
}
# where a RunOptions field is set in an AtomicInput: what an error on this path names (the CLI: a flag)
FIELDS = {**{k: "keywords." + k for k in KEYWORDS}, **FROM_MOLECULE_AND_MODEL}
HINTS = {"cpu": "keywords.device 'cpu'"}  # DeviceUnavailableError.alternatives this path can take


def models():
    """qcelemental.models (with its ``v1`` and ``v2``), or InputError naming the install command."""
    try:
        from qcelemental import models as qcmodels
    except ImportError:
        raise InputError(
            f"QCSchema input and output need the qcelemental package; install it with: {INSTALL}"
        ) from None
    if getattr(qcmodels, "v2", None) is None:
        import qcelemental

        raise InputError(
            f"QCSchema input and output need qcelemental 0.50 or newer (QCSchema v1 and "
            f"v2), found {qcelemental.__version__}; install it with: {INSTALL}"
        )
    return qcmodels


def error_line(e: Exception) -> str:
    """The one line of an expected error on the QCSchema path: the library's message and, where
    the CLI names its flag (``dfmp2.errors.error_line``), the AtomicInput field it is about."""
    option = getattr(e, "option", None)
    options = (option,) if isinstance(option, str) else tuple(option or ())
    fields = [FIELDS[o] for o in options if o in FIELDS]
    line = str(e) + (f" ({', '.join(fields)})" if fields else "")
    hints = [HINTS[a] for a in getattr(e, "alternatives", ()) if a in HINTS]
    return f"{line}; or use {' or '.join(hints)}" if hints else line


def is_qcschema_path(path) -> bool:
    """Input files named *.json are QCSchema AtomicInputs (anything else is read as XYZ)."""
    return str(path).lower().endswith(".json")


def read_raw(path) -> dict:
    """The JSON document at ``path`` (InputError for a missing, unreadable or non-JSON file)."""
    text = read_input_text(path, "a QCSchema AtomicInput (.json)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a QCSchema AtomicInput is a JSON object, found {type(data).__name__}")
    return data


def schema_version(data: dict, where: str) -> int:
    """The QCSchema version of an AtomicInput document: its ``schema_version``, else 2 when it
    has a ``specification`` (v2's layout) and 1 otherwise (QCEngine's rule); InputError for
    another version."""
    version = data.get("schema_version", 2 if "specification" in data else 1)
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        raise InputError(
            f"{where}: schema_version {shown(json.dumps(version), 20)} is not supported; "
            f"dfmp2 reads QCSchema AtomicInput v1 and v2 (schema_version 1 or 2)"
        )
    return int(version)


def input_model(atomic_input, where: str):
    """(v2 AtomicInput, the version it came in): from a dict (a JSON document) or a qcelemental
    AtomicInput, v1 or v2; InputError (one line, the first problem) for anything else."""
    qcmodels = models()
    if isinstance(atomic_input, qcmodels.v2.AtomicInput):
        return atomic_input, 2
    if isinstance(atomic_input, qcmodels.v1.AtomicInput):
        return atomic_input.convert_v(2), 1
    if not isinstance(atomic_input, dict):
        raise InputError(
            f"{where}: expected a QCSchema AtomicInput (a dict or a qcelemental AtomicInput, "
            f"v1 or v2), got {type(atomic_input).__name__}"
        )
    version = schema_version(atomic_input, where)
    model = qcmodels.v2.AtomicInput if version == 2 else qcmodels.v1.AtomicInput
    inp = validated(model, atomic_input, where)
    return (inp if version == 2 else inp.convert_v(2)), version


def validated(model, data: dict, where: str):
    """``model(**data)``, or InputError with the first problem qcelemental or pydantic found."""
    from qcelemental import exceptions as qcex

    try:
        return model(**data)
    # pydantic's ValidationError is a ValueError; qcelemental's own errors (an unknown element,
    # inconsistent masses, no atoms) are Exceptions of its own
    except (
        ValueError,
        TypeError,
        KeyError,
        qcex.ValidationError,
        qcex.NotAnElementError,
        qcex.MoleculeFormatError,
        qcex.ChoicesError,
        qcex.DataUnavailableError,
    ) as e:
        errs = getattr(e, "errors", lambda: [])()
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        first = errs[0] if errs else {"loc": (), "msg": f"{type(e).__name__}: {text}"}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise InputError(
            f"{where}: not a valid QCSchema AtomicInput: {loc + ': ' if loc else ''}{shown(first.get('msg', ''), 160)}"
        ) from None


def parse_input(atomic_input, where: str, options=None, given=()):
    """(v2 AtomicInput, the version it came in, Geometry, RunOptions) from an AtomicInput (a dict
    or a qcelemental model, v1 or v2). ``options``: the RunOptions to start from (default
    RunOptions()); its fields named in ``given`` (options the user typed on the command line)
    must not also be set by the input (refused, never silently overridden)."""
    import dataclasses

    from dfmp2.options import RunOptions

    options = options if options is not None else RunOptions()
    inp, version = input_model(atomic_input, where)
    settings = _settings(inp, where)
    clash = sorted(set(settings) & set(given))
    if clash:
        what = ", ".join(f"{c} ({FIELDS[c]})" for c in clash)
        raise InputError(
            f"{where} already sets {what}; give it in the input or as an option, not both", option=tuple(clash)
        )
    raw = atomic_input.get("molecule") if isinstance(atomic_input, dict) else None
    geom = _geometry(inp.molecule, raw.get("geometry") if isinstance(raw, dict) else None, settings, where)
    return inp, version, geom, dataclasses.replace(options, **settings)


def _settings(inp, where: str) -> dict:
    """The RunOptions fields a v2 AtomicInput sets (basis, charge, multiplicity, its keywords),
    after checking its driver, method, basis and keywords."""
    spec, mol = inp.specification, inp.molecule
    driver = getattr(spec.driver, "value", spec.driver)
    if driver not in DRIVERS:
        raise InputError(
            f"{where}: driver '{driver}' is not supported; dfmp2 computes driver {', '.join(map(repr, DRIVERS))}"
        )
    method = str(spec.model.method).strip().lower()
    if method not in METHODS and method not in DOUBLE_HYBRIDS:
        raise InputError(
            f"{where}: model.method '{shown(spec.model.method, 30)}' is not supported; use {', '.join(METHODS)} "
            f"or a double hybrid ({', '.join(DOUBLE_HYBRIDS)})"
        )
    wfn = getattr(spec.protocols.wavefunction, "value", spec.protocols.wavefunction)
    if wfn != "none":
        raise InputError(
            f"{where}: protocols.wavefunction '{wfn}' is not supported: dfmp2 returns no wavefunction "
            "(use 'none'; the orbitals are in `dfmp2 run --checkpoint`)"
        )
    if not isinstance(spec.model.basis, str) or not spec.model.basis.strip():
        raise InputError(f"{where}: model.basis must name the orbital basis (e.g. 'cc-pvdz')")
    charge = float(mol.molecular_charge)
    if charge != round(charge):
        raise InputError(f"{where}: molecule.molecular_charge must be an integer, got {charge:g}")
    mult = float(mol.molecular_multiplicity)
    if mult != round(mult):
        raise InputError(f"{where}: molecule.molecular_multiplicity must be an integer, got {mult:g}")
    settings = {
        # the input's method always wins over RunOptions' (a --method typed beside it is refused): a
        # double hybrid (its gradient and Hessian drivers checked by the gradient's own checks) or MP2's run
        "method": method if method in DOUBLE_HYBRIDS else "mp2",
        "basis": _basis(spec, where),
        "charge": int(round(charge)),
        "multiplicity": int(round(mult)),
    }
    # dfmp2's names and Psi4's (freeze_core, df_basis_mp2, mp2_type, scf_type, basis); basis_map: _basis
    keywords = {k: v for k, v in spec.keywords.items() if k != BASIS_MAP}
    settings.update(keyword_settings(keywords, KEYWORDS, spec.model.basis, where))
    if "properties" in settings:  # the names checked as RunOptions checks them: one line, naming the keyword
        from dfmp2.options import property_names

        settings["properties"] = property_names(settings["properties"])
    return settings


def _basis(spec, where: str):
    """The basis option of model.basis (a name, or the per-element text 'O:cc-pvdz,H:sto-3g') and
    keywords.basis_map ({element: name}: those elements' bases, model.basis the rest's)."""
    base = spec.model.basis.strip()
    extra = spec.keywords.get(BASIS_MAP)
    if extra is None:
        return base
    if not isinstance(extra, dict) or not extra or not all(isinstance(v, str) for v in extra.values()):
        raise InputError(
            f"{where}: keyword {BASIS_MAP} must be {{element: basis name}}, got {shown(json.dumps(extra), 40)}"
        )
    if ":" in base:
        raise InputError(f"{where}: give a per-element basis in model.basis or in keywords.{BASIS_MAP}, not both")
    return {"default": base, **extra}


def _geometry(mol, raw, settings: dict, where: str):
    """The Geometry (Ångström) of a qcelemental Molecule; ``raw``: its geometry as written in the
    document (None for a model), used when given since qcelemental rounds the coordinates to
    1e-8 Bohr (enough to move E_HF by 2e-10 Eh). Atoms with ``real`` false are ghost atoms."""
    import numpy as np
    from pyscf.lib.parameters import BOHR

    from dfmp2.io.xyz import MAX_COORD_ANGSTROM, Geometry

    # Bohr -> Ångström with PySCF's own constant, so PySCF (which converts back with it) sees
    # the Bohr coordinates given
    coords = np.asarray(raw if raw is not None else mol.geometry, dtype=np.float64).reshape(-1, 3) * BOHR
    if not np.all(np.isfinite(coords)) or np.abs(coords).max() > MAX_COORD_ANGSTROM:
        raise InputError(f"{where}: molecule.geometry must be finite and within ±{MAX_COORD_ANGSTROM / BOHR:.3g} Bohr")
    ghost = tuple(not bool(r) for r in mol.real)
    return Geometry(
        symbols=tuple(s.capitalize() for s in mol.symbols),
        coords_angstrom=coords,
        charge=settings["charge"],
        multiplicity=settings["multiplicity"],
        source=str(where),
        ghost=ghost if any(ghost) else (),
    )


class ScfEnergyParts:
    """Called with the energy run's molecule and reference (``dfmp2.drivers.energy.EnergyRun``'s ``mol`` and
    ``ref``: ``parts(done.mol, done.ref)``): the parts of the reference's E_HF
    that QCSchema has fields for, in Hartree: the nuclear repulsion (PySCF's ``energy_nuc``:
    ghost atoms have no charge, an ECP's core is taken off its atom's charge), the one-electron
    energy tr(D h) of the SCF's density with PySCF's core Hamiltonian (kinetic, nuclear
    attraction, ECP), and the two-electron energy as the rest, E_HF - E_nuc - E_1: the SCF's own
    (density-fitted for scf_mode df and pyscf-df) Coulomb and exchange energy. ``values``: {}
    until the reference is made."""

    def __init__(self):
        self.values = {}

    def __call__(self, mol, ref) -> None:
        import numpy as np
        from pyscf.scf import hf

        h = hf.get_hcore(mol)  # (nao, nao)
        weight = 2.0 if ref.restricted else 1.0  # RHF: both spins in one channel
        e1 = sum(
            weight * float(np.einsum("pi,pq,qi->", c.mo_coeff[:, : c.nocc], h, c.mo_coeff[:, : c.nocc]))
            for c in ref.channels
        )
        e_nuc = float(mol.energy_nuc())
        self.values = {
            "nuclear_repulsion_energy": e_nuc,
            "scf_one_electron_energy": e1,
            "scf_two_electron_energy": float(ref.e_hf) - e_nuc - e1,
        }


def run_atomic_input(
    atomic_input, options=None, *, given=(), where: str = "AtomicInput", progress=None, log=None, on_plan=None
):
    """Run the AtomicInput ``atomic_input`` (a dict or a qcelemental model, v1 or v2) in this
    process: (AtomicResult in the input's QCSchema version, dfmp2's Result; for driver 'gradient'
    the GradientResult, whose ``result`` is the energy's and whose JSON carries the gradient, as
    ``dfmp2 gradient --json`` writes it). ``options``: the
    RunOptions to start from (the input's model, molecule and keywords set theirs); ``given``:
    fields that must not also be in the input (``parse_input``); ``where``: what error lines call
    the input (a file name). Expected errors are InputError (and its kinds),
    DeviceUnavailableError and KernelError, as for ``dfmp2 run``."""
    from dfmp2.drivers.energy import prepare, run_energy

    inp, version, geom, options = parse_input(atomic_input, where, options, given)
    parts = ScfEnergyParts()
    method = input_method(inp)
    driver = driver_of(inp)
    if driver == "hessian":
        return _run_hessian(inp, version, geom, options, method, progress, log)
    if driver == "gradient":
        from dfmp2.drivers.gradient import run_gradient

        gr = run_gradient(geom, options, method, progress=progress, log=log, on_plan=on_plan)
        parts(gr.energy_run.mol, gr.energy_run.ref)
        return result_model(inp, version, gr.result, parts.values, gradient=gr, options=options), gr
    extra = None
    if driver == "properties":
        from dfmp2.interfaces import qcschema_drivers as drivers

        options = drivers.properties_options(inp, options, where)
        done = drivers.run_properties(geom, options, method, progress=progress, log=log, on_plan=on_plan)
        name = METHOD_ENERGY[method][1] if method in METHOD_ENERGY else done.result.double_hybrid["functional"]["name"]
        extra = drivers.properties_output(done.result, name.upper())
    else:
        done = run_energy(prepare(geom, options, log=log), progress=progress, log=log, on_plan=on_plan)
    parts(done.mol, done.ref)
    return result_model(inp, version, done.result, parts.values, options=options, extra=extra), done.result


def _run_hessian(inp, version, geom, options, method, progress, log):
    """Driver 'hessian' (dfmp2.interfaces.qcschema_drivers): (the AtomicResult, the reference
    geometry's GradientResult, whose energy and gradient the result's properties carry)."""
    from dfmp2.interfaces.qcschema_drivers import hessian_output, run_hessian

    fr, gr = run_hessian(geom, options, method, progress=progress, log=log)
    parts = ScfEnergyParts()
    parts(gr.energy_run.mol, gr.energy_run.ref)
    extra = hessian_output(fr, psi4_prefix(method))
    model = result_model(inp, version, gr.result, parts.values, gradient=gr, options=options, extra=extra)
    return model, gr


def psi4_prefix(method: str) -> str:
    """Psi4's qcvar prefix of ``method``'s total energy and derivatives: 'MP2', 'SCS-MP2',
    'SOS-MP2', and 'DFT' for a double hybrid (DFT TOTAL ENERGY, DFT TOTAL GRADIENT)."""
    return METHOD_ENERGY[method][1] if method in METHOD_ENERGY else "DFT"


def input_method(inp) -> str:
    """The checked model.method of a v2 AtomicInput (one of METHODS)."""
    return str(inp.specification.model.method).strip().lower()


def run_qcschema(atomic_input, options=None):
    """AtomicInput in, AtomicResult out, in this process (no subprocess, no files): a dict or a
    qcelemental AtomicInput, QCSchema v1 or v2; the AtomicResult (a qcelemental model, validated)
    is in the input's version, energies in Hartree. ``options``: a ``dfmp2.options.RunOptions``
    for what QCSchema does not carry (scratch_dir, storage, ...); the input's model, molecule
    and keywords set the rest. Errors raise (InputError and its kinds, DeviceUnavailableError,
    KernelError); ``error_line(e)`` is their one line, ``failed_operation`` their QCSchema record."""
    return run_atomic_input(atomic_input, options)[0]


def input_from_run(geom, options) -> dict:
    """The AtomicInput document (v1) of a run that started from an XYZ file (for ``--qcschema``)."""
    import numpy as np
    from pyscf.lib.parameters import BOHR

    keywords = {
        "frozen_core": options.frozen_core,
        "ecp": options.ecp,
        "scf_mode": options.scf_mode,
        "device": options.device,
    }
    for k in ("auxbasis", "precision", "memory_mb"):
        if getattr(options, k) is not None:
            keywords[k] = getattr(options, k)
    if options.properties:
        keywords["properties"] = list(options.properties)
    charge = options.charge if options.charge is not None else (geom.charge or 0)
    mult = options.multiplicity if options.multiplicity is not None else (geom.multiplicity or 1)
    return {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "energy",
        "model": {"method": options.method, "basis": basis_text(options.basis)},
        "keywords": keywords,
        "molecule": {
            "symbols": list(geom.symbols),
            "geometry": (np.asarray(geom.coords_angstrom) / BOHR).ravel().tolist(),
            "molecular_charge": charge,
            "molecular_multiplicity": mult,
            "fix_com": True,
            "fix_orientation": True,
        },
    }


def properties(result, parts: dict, method: str = "mp2") -> dict:
    """The AtomicProperties of ``result`` (Hartree); ``parts``: ``ScfEnergyParts.values``;
    ``return_energy`` the ``method``'s total energy (METHOD_ENERGY)."""
    e = result.energies()
    if result.double_hybrid:  # its parts: no MP2 energies of Kohn-Sham orbitals
        return {
            "calcinfo_nbasis": result.nbasis,
            "calcinfo_nmo": result.nmo,
            "calcinfo_natom": result.natm,
            "scf_iterations": (result.ran.get("scf") or {}).get("iterations"),
            "return_energy": result.e_tot,
            "scf_total_energy": e["e_dft"],
            "scf_dispersion_correction_energy": e["e_disp"],
            **dipole_properties(result),
        }
    spin = result.spin or {}
    nalpha = spin.get("nocc_alpha", result.nocc) + result.nfrozen  # frozen core included
    nbeta = spin.get("nocc_beta", result.nocc) + result.nfrozen
    return {
        "calcinfo_nbasis": result.nbasis,
        "calcinfo_nmo": result.nmo,
        "calcinfo_natom": result.natm,
        "calcinfo_nalpha": nalpha,
        "calcinfo_nbeta": nbeta,
        **parts,
        "scf_iterations": (result.ran.get("scf") or {}).get("iterations"),
        "return_energy": e[METHOD_ENERGY[method][0]],
        "scf_total_energy": e["e_hf"],
        "mp2_same_spin_correlation_energy": e["e_corr_ss"],
        "mp2_opposite_spin_correlation_energy": e["e_corr_os"],
        "mp2_singles_energy": 0.0,
        "mp2_doubles_energy": e["e_corr"],
        "mp2_correlation_energy": e["e_corr"],
        "mp2_total_energy": e["e_mp2"],
        **dipole_properties(result),
    }


def dipole_properties(result) -> dict:
    """QCSchema's dipole fields (e·a0, QCSchema's unit; origin (0, 0, 0) of the input coordinates)
    when the run computed the dipole (keywords.properties ['dipole']): ``scf_dipole_moment`` of
    the HF density (a double hybrid's: its KS determinant's), ``mp2_dipole_moment`` of the relaxed
    MP2 density (the derivative of E(MP2) with respect to a field; not a double hybrid's); {}
    otherwise."""
    dip = (result.properties or {}).get("dipole")
    if not dip:
        return {}
    out = {"scf_dipole_moment": list((dip["hf"] if "hf" in dip else dip["ks"])["au"])}  # a double hybrid's: its KS
    if dip.get("method", "mp2") == "mp2":  # SCS- and SOS-MP2's dipole is not MP2's: in the qcvars only
        out["mp2_dipole_moment"] = list(dip["relaxed"]["au"])
    return out


def qcvars(result, method: str = "mp2", gradient=None) -> dict:
    """Psi4's names of the energies (Hartree), SCS- and SOS-MP2 among them, CURRENT ENERGY the
    ``method``'s; with a gradient (``GradientResult``) Psi4's gradient names too (N x 3,
    Hartree/Bohr): SCF TOTAL GRADIENT, <METHOD> TOTAL GRADIENT and CURRENT GRADIENT."""
    e = result.energies()
    if result.double_hybrid:  # Psi4's names of a double hybrid's parts
        out = {
            "DFT FUNCTIONAL TOTAL ENERGY": e["e_dft"],
            "DOUBLE-HYBRID CORRECTION ENERGY": e["e_pt2"],
            "DISPERSION CORRECTION ENERGY": e["e_disp"],
            "DFT TOTAL ENERGY": result.e_tot,
            "CURRENT ENERGY": result.e_tot,
        }
    else:
        out = mp2_qcvars(e, method)
    if gradient is not None:
        g = gradient.gradient.tolist()
        out["SCF TOTAL GRADIENT"] = gradient.parts.hf.tolist()  # a double hybrid's: its KS part's
        out[f"{psi4_prefix(method)} TOTAL GRADIENT"] = g
        out["CURRENT GRADIENT"] = g
    return out


def mp2_qcvars(e: dict, method: str) -> dict:
    """Psi4's names of an MP2 run's energies ``e`` (``Result.energies``, Hartree), CURRENT ENERGY
    the ``method``'s."""
    return {
        "HF TOTAL ENERGY": e["e_hf"],
        "SCF TOTAL ENERGY": e["e_hf"],
        "MP2 SAME-SPIN CORRELATION ENERGY": e["e_corr_ss"],
        "MP2 OPPOSITE-SPIN CORRELATION ENERGY": e["e_corr_os"],
        "MP2 CORRELATION ENERGY": e["e_corr"],
        "MP2 TOTAL ENERGY": e["e_mp2"],
        "SCS-MP2 CORRELATION ENERGY": e["e_corr_scs"],
        "SCS-MP2 TOTAL ENERGY": e["e_scs_mp2"],
        "SOS-MP2 CORRELATION ENERGY": e["e_corr_sos"],
        "SOS-MP2 TOTAL ENERGY": e["e_sos_mp2"],
        "CURRENT ENERGY": e[METHOD_ENERGY[method][0]],
    }


def report_text(result, gradient=None, width: int = 120) -> str:
    """The human-readable report of a run (AtomicResult.stdout): the tables ``dfmp2 run`` prints,
    and for a gradient its per-atom table (Hartree/Bohr), as plain text."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    result.render(console)
    if gradient is not None:
        console.print(f"nuclear gradient of E({gradient.method.upper()}) / (Eh/bohr)")
        for i, (sym, row) in enumerate(zip(result.geometry["symbols"], gradient.gradient)):
            console.print(f"{i + 1:>4} {sym:<3}" + "".join(f" {v:+.10f}" for v in row))
    return console.file.getvalue()


def result_model(
    inp, version: int, result, parts: dict, gradient=None, options=None, extra: DriverOutput | None = None
):
    """The AtomicResult (validated by qcelemental) of ``result`` for the v2 AtomicInput ``inp``,
    in QCSchema ``version`` (1 or 2); ``gradient``: the ``GradientResult`` of driver
    'gradient' (return_result the N x 3 gradient, Hartree/Bohr); ``extra``: what driver
    'hessian' or 'properties' adds (its return_result, properties, qcvars, document). As
    QCEngine's Psi4 harness fills them: ``id`` the input's, ``stdout`` the human report,
    ``native_files['input']`` the input document, ``provenance`` with ``memory`` (GiB, the run's
    limit) and ``nthreads`` (torch's threads)."""
    import torch

    import dfmp2
    from dfmp2.memory import MB

    method = input_method(inp)
    props = properties(result, parts, method)
    if gradient is not None:
        props["return_gradient"] = gradient.gradient.tolist()
        props["scf_total_gradient"] = gradient.parts.hf.tolist()
    limit_mb = (result.memory or {}).get("limit_mb") or getattr(options, "memory_mb", None)
    extra = extra or DriverOutput(gradient.gradient.tolist() if gradient is not None else props["return_energy"])
    document = gradient.to_dict() if gradient is not None else result.to_dict()
    out = models().v2.AtomicResult(
        id=inp.id,  # QCEngine's convention: the result carries its input's id
        input_data=inp,
        molecule=inp.molecule,
        properties={**props, **extra.properties},
        return_result=extra.return_result,
        success=True,
        stdout=report_text(result, gradient) + extra.report,
        native_files={"input": inp.model_dump_json(indent=1)},
        extras={
            "qcvars": {**qcvars(result, method, gradient), **extra.qcvars},
            "dfmp2": extra.document if extra.document is not None else document,
        },
        provenance={
            "creator": "dfmp2",
            "version": dfmp2.__version__,
            "routine": "dfmp2.interfaces.qcschema",
            "memory": round(limit_mb * MB / 2**30, 3) if limit_mb else None,  # GiB, QCEngine's unit
            "nthreads": torch.get_num_threads(),
        },
    )
    return out if version == 2 else out.convert_v(1)


def to_json(model) -> str:
    """A qcelemental model as indented JSON text (numpy arrays as lists)."""
    text = model.model_dump_json() if hasattr(model, "model_dump_json") else model.json()
    from dfmp2.io.outputs import json_text

    return json_text(json.loads(text), indent=2, where="the QCSchema result")


def failed_operation(inp: dict | None, message: str, exc: Exception) -> str:
    """The FailedOperation JSON (v2 for a v2 input, else v1) for an error whose one-line message
    is ``message``."""
    qcmodels = models()
    kind = (
        "convergence_error"
        if isinstance(exc, SCFNotConvergedError)
        else "input_error"
        if isinstance(exc, InputError)
        else "execution_error"
    )
    v2 = isinstance(inp, dict) and (
        inp.get("schema_version") == 2 or ("specification" in inp and "schema_version" not in inp)
    )
    model = qcmodels.v2.FailedOperation if v2 else qcmodels.v1.FailedOperation
    out = model(input_data=inp, success=False, error={"error_type": kind, "error_message": message})
    return to_json(out)


class FailedOperationOnError:
    """Context manager: an expected error inside (the ones the CLI prints as one ``error:`` line)
    writes a FailedOperation with that same line to ``path`` (when given), then goes on up.
    ``input_data``: the input document so far (None until it is read)."""

    def __init__(self, path):
        self.path, self.input_data = path, None

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        from dfmp2.errors import error_line as cli_error_line
        from dfmp2.io.outputs import write_text
        from dfmp2.linalg import DeviceUnavailableError, KernelError

        if self.path and isinstance(exc, (InputError, DeviceUnavailableError, KernelError)):
            write_text(self.path, failed_operation(self.input_data, cli_error_line(exc), exc))
        return False
