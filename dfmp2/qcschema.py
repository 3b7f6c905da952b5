"""QCSchema in and out: ``dfmp2 run input.json`` (an AtomicInput) and ``--qcschema out.json``
(an AtomicResult, or a FailedOperation carrying the same one-line message as the CLI's error).

Both are validated with ``qcelemental``'s models, an optional dependency imported only here
(``pip install -e ".[qcschema]"``).

AtomicInput accepted: driver ``energy``; model ``{"method": "mp2", "basis": <orbital basis>}``;
the molecule's geometry in Bohr (QCSchema's unit), its molecular_charge and
molecular_multiplicity; keywords (all optional, the CLI's defaults otherwise) ``auxbasis``,
``frozen_core`` (bool), ``ecp`` (auto|none|none-for-testing), ``scf_mode`` (df|pyscf-df|exact),
``device``, ``precision``
(fp64|fp32), ``memory_mb``. The AtomicResult: ``return_energy`` = E(MP2); the standard
properties (scf_total_energy, mp2_same_spin_correlation_energy,
mp2_opposite_spin_correlation_energy, mp2_singles_energy = 0 (canonical RHF),
mp2_doubles_energy, mp2_correlation_energy, mp2_total_energy, calcinfo_*); SCS- and SOS-MP2,
which QCSchema has no field for, in ``extras["qcvars"]`` under Psi4's names; and the whole
``dfmp2 run --json`` result (what ran, timings, memory plan, ECP, warnings) in
``extras["dfmp2"]``. Energies in Hartree.
"""
from __future__ import annotations

import json

from .errors import InputError, SCFNotConvergedError, shown
from .options import ECP_CHOICES, PRECISIONS, SCF_MODES
from .xyz import read_input_text

INSTALL = 'pip install -e ".[qcschema]"'
METHODS = ("mp2",)
# keyword (a RunOptions field) -> check(value): what it must be, or None when it is fine
KEYWORDS = {
    "auxbasis": lambda v: None if isinstance(v, str) and v.strip() else "a basis name",
    "frozen_core": lambda v: None if isinstance(v, bool) else "true or false",
    "ecp": lambda v: None if v in ECP_CHOICES else " or ".join(map(repr, ECP_CHOICES)),
    "scf_mode": lambda v: None if v in SCF_MODES else " or ".join(map(repr, SCF_MODES)),
    "device": lambda v: None if isinstance(v, str) and v.strip() else "a device name (cpu, cuda, cuda:N, trn1, trn2)",
    "precision": lambda v: None if v in PRECISIONS else " or ".join(map(repr, PRECISIONS)),
    "memory_mb": lambda v: None if (isinstance(v, (int, float)) and not isinstance(v, bool)
                                    and 0 < v < float("inf")) else "a positive number of MB",
}
# the RunOptions fields an AtomicInput sets besides its keywords
FROM_MOLECULE_AND_MODEL = {"basis": "model.basis", "charge": "molecule.molecular_charge",
                           "multiplicity": "molecule.molecular_multiplicity"}


def models():
    """qcelemental.models, or InputError naming the install command."""
    try:
        from qcelemental import models as qcmodels
    except ImportError:
        raise InputError(f"QCSchema input and output need the qcelemental package; install it with: "
                         f"{INSTALL}") from None
    return qcmodels


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


def parse_input(data: dict, where: str, options, given=()):
    """(AtomicInput, Geometry, RunOptions) from an AtomicInput document. ``options``: the
    RunOptions from the command line, whose fields named in ``given`` (options the user typed)
    must not also be set by the input (refused, never silently overridden)."""
    import dataclasses

    import numpy as np
    from pyscf.lib.parameters import BOHR

    from .xyz import MAX_COORD_ANGSTROM, Geometry

    qcmodels = models()
    from qcelemental import exceptions as qcex
    try:
        inp = qcmodels.AtomicInput(**data)
    # pydantic's ValidationError is a ValueError; qcelemental's own errors (an unknown element,
    # inconsistent masses, no atoms) are Exceptions of its own
    except (ValueError, TypeError, KeyError, qcex.ValidationError, qcex.NotAnElementError,
            qcex.MoleculeFormatError, qcex.ChoicesError, qcex.DataUnavailableError) as e:
        errs = getattr(e, "errors", lambda: [])()
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        first = errs[0] if errs else {"loc": (), "msg": f"{type(e).__name__}: {text}"}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise InputError(f"{where}: not a valid QCSchema AtomicInput: {loc + ': ' if loc else ''}"
                         f"{shown(first.get('msg', ''), 160)}") from None
    driver = getattr(inp.driver, "value", inp.driver)
    if driver != "energy":
        raise InputError(f"{where}: driver '{driver}' is not supported; dfmp2 computes energies (driver 'energy')")
    method = str(inp.model.method).strip().lower()
    if method not in METHODS:
        raise InputError(f"{where}: model.method '{shown(inp.model.method, 30)}' is not supported; use 'mp2'")
    if not isinstance(inp.model.basis, str) or not inp.model.basis.strip():
        raise InputError(f"{where}: model.basis must name the orbital basis (e.g. 'cc-pvdz')")
    mol = inp.molecule
    if not all(mol.real):
        raise InputError(f"{where}: ghost atoms (molecule.real false) are not supported")
    charge = float(mol.molecular_charge)
    if charge != round(charge):
        raise InputError(f"{where}: molecule.molecular_charge must be an integer, got {charge:g}")
    mult = float(mol.molecular_multiplicity)
    if mult != round(mult):
        raise InputError(f"{where}: molecule.molecular_multiplicity must be an integer, got {mult:g}")
    settings = {"basis": inp.model.basis.strip(), "charge": int(round(charge)),
                "multiplicity": int(round(mult))}
    for key, value in inp.keywords.items():
        if key not in KEYWORDS:
            raise InputError(f"{where}: unknown keyword '{shown(key, 30)}'; use {', '.join(KEYWORDS)}")
        problem = KEYWORDS[key](value)
        if problem:
            raise InputError(f"{where}: keyword {key} must be {problem}, got {shown(json.dumps(value), 40)}")
        settings[key] = value.strip() if isinstance(value, str) else value
    clash = sorted(set(settings) & set(given))
    if clash:
        what = ", ".join(f"{c} ({FROM_MOLECULE_AND_MODEL.get(c, 'keywords.' + c)})" for c in clash)
        raise InputError(f"{where} already sets {what}; give it in the input or as an option, not both",
                         option=tuple(clash))
    # The coordinates as written: qcelemental's Molecule rounds them to 1e-8 Bohr (enough to move
    # E_HF by 2e-10 Eh). Bohr -> Ångström with PySCF's own constant, so PySCF (which converts
    # back with it) sees the Bohr coordinates given.
    coords = np.asarray(data["molecule"]["geometry"], dtype=np.float64).reshape(-1, 3) * BOHR
    if not np.all(np.isfinite(coords)) or np.abs(coords).max() > MAX_COORD_ANGSTROM:
        raise InputError(f"{where}: molecule.geometry must be finite and within "
                         f"±{MAX_COORD_ANGSTROM / BOHR:.3g} Bohr")
    geom = Geometry(symbols=tuple(s.capitalize() for s in mol.symbols), coords_angstrom=coords,
                    charge=settings["charge"], multiplicity=settings["multiplicity"], source=str(where))
    return inp, geom, dataclasses.replace(options, **settings)


def input_from_run(geom, options) -> dict:
    """The AtomicInput document of a run that started from an XYZ file (for ``--qcschema``)."""
    import numpy as np
    from pyscf.lib.parameters import BOHR

    keywords = {"frozen_core": options.frozen_core, "ecp": options.ecp, "scf_mode": options.scf_mode,
                "device": options.device}
    for k in ("auxbasis", "precision", "memory_mb"):
        if getattr(options, k) is not None:
            keywords[k] = getattr(options, k)
    charge = options.charge if options.charge is not None else (geom.charge or 0)
    mult = options.multiplicity if options.multiplicity is not None else (geom.multiplicity or 1)
    return {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "model": {"method": "mp2", "basis": options.basis}, "keywords": keywords,
            "molecule": {"symbols": list(geom.symbols),
                         "geometry": (np.asarray(geom.coords_angstrom) / BOHR).ravel().tolist(),
                         "molecular_charge": charge, "molecular_multiplicity": mult,
                         "fix_com": True, "fix_orientation": True}}


def atomic_result(inp: dict, result) -> str:
    """The AtomicResult JSON (validated by qcelemental) of ``result`` for input document ``inp``."""
    import dfmp2
    qcmodels = models()
    base = qcmodels.AtomicInput(**inp)
    e = result.energies()
    nocc_all = result.nocc + result.nfrozen
    properties = {
        "calcinfo_nbasis": result.nbasis, "calcinfo_nmo": result.nmo, "calcinfo_natom": result.natm,
        "calcinfo_nalpha": nocc_all, "calcinfo_nbeta": nocc_all,
        "return_energy": e["e_mp2"], "scf_total_energy": e["e_hf"],
        "mp2_same_spin_correlation_energy": e["e_corr_ss"],
        "mp2_opposite_spin_correlation_energy": e["e_corr_os"],
        "mp2_singles_energy": 0.0, "mp2_doubles_energy": e["e_corr"],
        "mp2_correlation_energy": e["e_corr"], "mp2_total_energy": e["e_mp2"],
    }
    qcvars = {"HF TOTAL ENERGY": e["e_hf"], "SCF TOTAL ENERGY": e["e_hf"],
              "MP2 SAME-SPIN CORRELATION ENERGY": e["e_corr_ss"],
              "MP2 OPPOSITE-SPIN CORRELATION ENERGY": e["e_corr_os"],
              "MP2 CORRELATION ENERGY": e["e_corr"], "MP2 TOTAL ENERGY": e["e_mp2"],
              "SCS-MP2 CORRELATION ENERGY": e["e_corr_scs"], "SCS-MP2 TOTAL ENERGY": e["e_scs_mp2"],
              "SOS-MP2 CORRELATION ENERGY": e["e_corr_sos"], "SOS-MP2 TOTAL ENERGY": e["e_sos_mp2"],
              "CURRENT ENERGY": e["e_mp2"]}
    doc = base.dict()
    doc.update(schema_name="qcschema_output", properties=properties, return_result=e["e_mp2"],
               success=True, extras={**base.extras, "qcvars": qcvars, "dfmp2": result.to_dict()},
               provenance={"creator": "dfmp2", "version": dfmp2.__version__, "routine": "dfmp2.qcschema"})
    out = qcmodels.AtomicResult(**doc)
    return json.dumps(json.loads(out.json()), indent=2) + "\n"


def failed_operation(inp: dict | None, message: str, exc: Exception) -> str:
    """The FailedOperation JSON for an error whose one-line message is ``message``."""
    qcmodels = models()
    kind = ("convergence_error" if isinstance(exc, SCFNotConvergedError)
            else "input_error" if isinstance(exc, InputError) else "execution_error")
    out = qcmodels.FailedOperation(input_data=inp, success=False,
                                   error={"error_type": kind, "error_message": message})
    return json.dumps(json.loads(out.json()), indent=2) + "\n"


class FailedOperationOnError:
    """Context manager: an expected error inside (the ones the CLI prints as one ``error:`` line)
    writes a FailedOperation with that same line to ``path`` (when given), then goes on up.
    ``input_data``: the input document so far (None until it is read)."""

    def __init__(self, path):
        self.path, self.input_data = path, None

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        from linalg import DeviceUnavailableError, KernelError

        from .errors import error_line
        from .outputs import write_text
        if self.path and isinstance(exc, (InputError, DeviceUnavailableError, KernelError)):
            write_text(self.path, failed_operation(self.input_data, error_line(exc), exc))
        return False
