"""``dfmp2 frequencies``: harmonic frequencies, normal modes, IR intensities and ideal-gas
thermochemistry from central differences of our analytic gradients (DF-MP2, SCS- and SOS-MP2, and
the double hybrids: dfmp2.grad.dh).

Hessian: H_ij = (g_j(x + h e_i) - g_j(x - h e_i)) / 2h over the 3N Cartesian coordinates (Eh/bohr²),
symmetrised (H + H^T)/2: 6N gradient evaluations and the reference geometry's (its energy and
gradient: the stationary-point check, E0 of the thermochemistry). The step h is STEP_BOHR (0.005
bohr, ORCA's NumFreq default) unless given. Harmonic analysis and thermochemistry are PySCF's
(``pyscf.hessian.thermo``): ``harmonic_analysis`` projects the translations and rotations out of the
mass-weighted Hessian (as Psi4 and ORCA do; isotope-averaged masses), and ``thermo`` is the ideal-gas,
rigid-rotor, harmonic-oscillator model (the linear rotor's q_rot, S, RT and R for a linear
molecule), its rotational symmetry number σ from the point group that PySCF's ``detect_symm`` finds
at a geometric tolerance of SYMMETRY_TOL_BOHR (``symmetry``: PySCF's own 1e-5 bohr calls an
optimised water Cs and ammonia C1), or the caller's ``symmetry_number``; both in the result. IR
intensities: dμ/dx by the same central differences of the relaxed MP2 dipole
(``properties=('dipole',)``: the gradient's own relaxed density), projected on each normal mode;
|dμ/dQ|² in e²/amu times IR_KM_MOL (974.88 km/mol); a double hybrid's from its relaxed dipole.

Linear molecules (``linear_geometry``): every atom within LINEAR_TOL_BOHR of the axis of the
smallest principal moment of inertia. Their analysis (the projection, σ's point group, the rotational
constants) is that of the geometry with the atoms put on that axis (``analysis_molecule``): PySCF's
own test (a smallest moment below 1e-9 amu·bohr²) would call a molecule 1e-4 bohr off the line a
nonlinear one and project a bend out as its third rotation; projected out are 5 rigid-body modes,
3N - 5 vibrations are left, and the thermochemistry is the linear rotor's (PySCF's ``thermo``).

Over several ranks (torchrun) the evaluations are dealt round by round: in round r, rank k runs
task r·size + k alone (a one-process run: the same bits as one process at the same threads per
process) and the round's rows are summed over the ranks (each row nonzero on one rank only, so the
sum is exact). A failure on any rank ends every rank at the end of its round, with the failing
rank's error. ``checkpoint``: a JSON file rewritten (atomically) after every round with every
finished evaluation, bit for bit (JSON floats round-trip), and what they depend on; a run given
an existing checkpoint for the same molecule and options computes only what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from pyscf.lib.parameters import BOHR  # Å per bohr: PySCF's

from dfmp2 import distributed
from dfmp2.drivers import energy as energy_driver
from dfmp2.errors import InputError, file_kind, shown
from dfmp2.io import molecule as io_molecule
from dfmp2.io.outputs import write_json
from dfmp2.io.xyz import Geometry
from dfmp2.options import RunOptions

TEMPERATURE_K = (1e-2, 1e5)  # the thermochemistry's temperature, K (finite values beyond: see check_conditions)
PRESSURE_PA = (1e-10, 1e10)  # its pressure, Pa
STEP_BOHR = 0.005  # central-difference step, bohr (ORCA's NumFreq default)
IR_KM_MOL = 974.8801  # |dμ/dQ|² of 1 e²/amu in km/mol: 42.2561 (D/Å)²/amu x (4.80320 D/Å per e)²
STATIONARY_GMAX = 3e-4  # Eh/bohr: above this the geometry is not stationary (geomeTRIC's GAU gmax)
CHECKPOINT_KIND = "dfmp2-frequencies-checkpoint/1"
CHECKPOINT_BYTES_PER_NUMBER = 40  # a checkpoint's size bound: a float's repr is at most 24 characters, a comma
CHECKPOINT_MARGIN_BYTES = 1_000_000  # ... and the fingerprint's (the molecule, the options)
# the largest |value| a checkpoint row may hold: E (Eh; 1000 uranium atoms: 3e7), g (Eh/bohr), μ (e·bohr)
ROW_BOUNDS = {"energy": 1e9, "gradient": 1e6, "dipole": 1e6}
SCHEMA = "dfmp2-frequencies/2"  # 2: linear, vibrational_modes, symmetry
# PySCF's detect_symm tolerance (its symm.geom.TOLERANCE, bohr) for the point group of the symmetry number:
# an optimised geometry is symmetric only to its convergence (geomeTRIC's GAU: steps below 1.8e-3 Å), and
# PySCF's 1e-5 then finds water Cs (σ 1, not 2) and ammonia C1 (σ 1, not 3): G(T) 0.41 and 0.65 kcal/mol
# low. 1e-2 bohr (0.005 Å) finds C2v and C3v after such optimisations (ammonia needs 1e-3 or more).
SYMMETRY_TOL_BOHR = 1e-2
# A molecule is linear (3N - 5 modes, a linear rotor) when every atom lies within this distance (bohr) of the
# axis of its smallest principal moment of inertia: the symmetry tolerance, as an optimised CO2 or HCN is
# linear only to its convergence (0.01 bohr off the line: a bend of about 0.3° over a 1 Å bond).
LINEAR_TOL_BOHR = SYMMETRY_TOL_BOHR
# options that do not change a number (where files go, how much memory, which BLAS is faster)
_NOT_NUMBERS = ("memory_mb", "storage", "scratch_dir", "checkpoint", "resume", "occ_block_max", "j3c_block_mb")


class FrequencyError(InputError):
    """A frequency job that cannot run, or whose displacement failed (one line)."""


@dataclass
class FrequencyResult:
    """Harmonic analysis at ``geometry``: ``energy`` (Eh) and ``gradient`` (natm, 3) Eh/bohr there,
    the Hessian (3N, 3N) Eh/bohr², per mode the frequency (cm⁻¹, imaginary ones negative), the
    normal mode (natm, 3) Cartesian displacement (PySCF's norm_mode: M^-1/2 times the unit
    mass-weighted eigenvector), reduced mass (amu), force constant (mdyn/Å), IR intensity (km/mol;
    None without dipoles), and the thermochemistry (``thermo``: {name: (value, unit)})."""

    geometry: Geometry
    method: str
    energy: float
    gradient: np.ndarray
    hessian: np.ndarray
    frequencies: np.ndarray
    modes: np.ndarray
    reduced_masses: np.ndarray
    force_constants: np.ndarray
    ir: np.ndarray | None
    dipole: np.ndarray | None
    thermo: dict
    point_group: str
    zero_modes: dict
    step: float
    tasks: dict
    warnings: list = field(default_factory=list)
    first: object = None  # the reference geometry's GradientResult, where this process computed it
    symmetry: dict = field(default_factory=dict)  # ``symmetry``: point group, σ, tolerance, source
    linear: bool = False  # a linear molecule: 3N - 5 modes, 5 rigid-body modes projected, a linear rotor

    @property
    def imaginary(self) -> int:
        return int(np.count_nonzero(self.frequencies < 0))

    def to_dict(self) -> dict:
        from dfmp2.io.result import software_versions

        # a linear molecule's rotational constant about its axis is infinite: null in JSON
        th = {k: np.where(np.isinf(v[0]), None, v[0]).tolist() if k == "rot_const" else np.asarray(v[0]).tolist()
              for k, v in self.thermo.items()}  # fmt: skip
        return {
            "schema": SCHEMA,
            "method": self.method,
            "geometry": {
                "symbols": list(self.geometry.symbols),
                "coordinates_angstrom": np.asarray(self.geometry.coords_angstrom).tolist(),
            },
            "energy": self.energy,
            "gradient": self.gradient.tolist(),
            "max_abs_gradient": float(np.abs(self.gradient).max()),
            "hessian": self.hessian.tolist(),
            "linear": self.linear,
            "vibrational_modes": len(self.frequencies),
            "frequencies": self.frequencies.tolist(),
            "imaginary_modes": self.imaginary,
            "normal_modes": self.modes.tolist(),
            "reduced_masses": self.reduced_masses.tolist(),
            "force_constants": self.force_constants.tolist(),
            "ir_intensities": None if self.ir is None else self.ir.tolist(),
            "dipole": None if self.dipole is None else self.dipole.tolist(),
            "thermo": th,
            "point_group": self.point_group,
            "symmetry": dict(self.symmetry),
            "zero_modes": {k: v.tolist() for k, v in self.zero_modes.items()},
            "finite_differences": {"scheme": "central, Cartesian", "step_bohr": self.step, **self.tasks},
            "analysis": "pyscf.hessian.thermo: harmonic_analysis (translations and rotations projected: 5 "
            "rigid-body modes for a linear molecule, 6 otherwise), thermo (ideal gas, rigid rotor, harmonic "
            "oscillator; isotope-averaged masses)",
            "warnings": list(self.warnings),
            "versions": software_versions(),
            "units": {
                "energy": "hartree",
                "gradient": "hartree/bohr",
                "hessian": "hartree/bohr^2",
                "frequencies": "cm^-1 (imaginary as negative)",
                "zero_modes": "cm^-1: the six (five for a linear molecule) nearest zero (translations, rotations), "
                "projected and unprojected",
                "normal_modes": "Cartesian displacement per atom (mass-weighted unit vector times M^-1/2)",
                "reduced_masses": "amu",
                "force_constants": "mdyn/angstrom",
                "ir_intensities": "km/mol",
                "dipole": "e*bohr (atomic units), origin (0, 0, 0)",
                "thermo": {
                    k: v[1] + (" (null: infinite, about a linear molecule's axis)" if k == "rot_const" else "")
                    for k, v in self.thermo.items()
                },
            },
        }


def tasks_of(natm: int) -> list[tuple[int, int]]:
    """The evaluations, in order: (coordinate, sign): (-1, 0) the reference, then for each
    Cartesian coordinate i = 3 atom + xyz the +h and -h displacements."""
    return [(-1, 0)] + [(i, s) for i in range(3 * natm) for s in (1, -1)]


def displaced(geom: Geometry, coord: int, sign: int, step: float) -> Geometry:
    if coord < 0:
        return geom
    x = np.array(geom.coords_angstrom, dtype=np.float64)
    x[coord // 3, coord % 3] += sign * step * BOHR
    return dataclasses.replace(geom, coords_angstrom=x)


def check_molecule(geom: Geometry) -> None:
    """FrequencyError (one line) for a molecule without vibrations to analyse here: a single atom,
    ghost atoms, coincident atoms."""
    if geom.natm < 2:
        raise FrequencyError("a single atom has no vibrational modes", option="input")
    io_molecule.check_geometry(geom)  # coincident atoms, as run refuses them
    if any(geom.ghost):
        raise FrequencyError("ghost atoms have no mass to vibrate: remove them for dfmp2 frequencies", option="input")


def linear_geometry(mass: np.ndarray, x: np.ndarray, tol: float = LINEAR_TOL_BOHR) -> np.ndarray | None:
    """The atoms put on their line (bohr, (natm, 3)) when the molecule of ``mass`` (amu) at ``x``
    (bohr) is linear: every atom within ``tol`` bohr of the axis through the centre of mass along
    the principal axis of the smallest moment of inertia; None otherwise."""
    com = mass @ x / mass.sum()
    r = x - com
    inertia = np.eye(3) * np.einsum("a,ai,ai->", mass, r, r) - np.einsum("a,ai,aj->ij", mass, r, r)
    axis = np.linalg.eigh(inertia)[1][:, 0]  # the smallest moment's axis
    along = r @ axis
    off = r - np.outer(along, axis)
    if np.linalg.norm(off, axis=1).max() >= tol:
        return None
    return com + np.outer(along, axis)


def analysis_molecule(mol):
    """(``mol`` for the harmonic analysis, linear): a linear ``mol``'s copy with its atoms put on
    their line (``linear_geometry``), so that PySCF's analysis treats it as the linear rotor
    (5 rigid-body modes, its rotational terms); a nonlinear ``mol`` as it is."""
    on_line = linear_geometry(mol.atom_mass_list(isotope_avg=True), mol.atom_coords())
    if on_line is None:
        return mol, False
    lin = mol.copy()
    lin.set_geom_(on_line, unit="Bohr", symmetry=False)
    return lin, True


def fingerprint(geom: Geometry, options: RunOptions, method: str, step: float) -> dict:
    """What the evaluations depend on (JSON, floats exact): the molecule, the method, the step
    and every option that changes a number."""
    opts = {k: v for k, v in dataclasses.asdict(options).items() if k not in _NOT_NUMBERS}
    return {
        "symbols": list(geom.symbols),
        "coordinates_angstrom": np.asarray(geom.coords_angstrom, dtype=np.float64).tolist(),
        "charge": geom.charge,
        "multiplicity": geom.multiplicity,
        "ghost": list(geom.ghost),
        "method": method,
        "step_bohr": step,
        "options": json.loads(json.dumps(opts, default=str)),
    }


def load_checkpoint(path, fp: dict, ntask: int, width: int) -> dict:
    """{task: row} from a frequency checkpoint made for ``fp``; {} when there is no file.
    FrequencyError naming what differs when it was made for another job, and one naming the file
    (and the row) when it is not a regular file of sane size or a row is not ``width`` real
    finite numbers (``check_row``)."""
    text = _checkpoint_text(path, ntask, width)
    if text is None:
        return {}
    try:
        doc = json.loads(text, parse_constant=lambda c: math.nan)  # old files wrote NaN: no dipole
        assert doc["kind"] == CHECKPOINT_KIND and isinstance(doc["tasks"], dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise FrequencyError(
            f"{path} is not a dfmp2 frequency checkpoint (or it is damaged)", option="checkpoint"
        ) from None
    rows = {}
    for key, row in doc["tasks"].items():
        k = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= k < ntask:
            what = f"task {shown(key, 20)!r} is not one of this job's 0..{ntask - 1}"
            raise FrequencyError(f"{path} is damaged: {what}", option="checkpoint")
        rows[k] = check_row(row, width, f"{path}: task {k}")
    theirs = doc.get("fingerprint", {})
    theirs = theirs if isinstance(theirs, dict) else {}
    differ = sorted(k for k in set(fp) | set(theirs) if fp.get(k) != theirs.get(k))
    differ += sorted(
        f"options.{k}"
        for k in set(fp["options"]) | set(theirs.get("options") or {})
        if "options" in differ and fp["options"].get(k) != (theirs.get("options") or {}).get(k)
    )
    if differ:
        what = ", ".join(d for d in differ if d != "options") or "options"
        raise FrequencyError(f"the checkpoint {path} was made for another job: {what} differ", option="checkpoint")
    return rows


def _checkpoint_text(path, ntask: int, width: int) -> str | None:
    """The text of the frequency checkpoint at ``path`` (None: no file), read only when it is a
    regular file (/dev/zero would be read without end, a FIFO wait for a writer for ever) of at
    most the size its rows can take (``CHECKPOINT_BYTES_PER_NUMBER`` each, and a margin)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise FrequencyError(f"checkpoint {path}: {e.strerror}", option="checkpoint") from None
    if not stat.S_ISREG(st.st_mode):
        raise FrequencyError(
            f"checkpoint {path} is {file_kind(st.st_mode)}, not a regular file; give the path of a checkpoint file",
            option="checkpoint",
        )
    limit = CHECKPOINT_MARGIN_BYTES + CHECKPOINT_BYTES_PER_NUMBER * ntask * width
    if st.st_size > limit:
        raise FrequencyError(
            f"checkpoint {path} is {st.st_size:,} bytes, more than this job's checkpoint takes ({limit:,}); "
            "not a dfmp2 frequency checkpoint of this job",
            option="checkpoint",
        )
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        raise FrequencyError(
            f"{path} is not a dfmp2 frequency checkpoint (or it is damaged)", option="checkpoint"
        ) from None


def check_row(row, width: int, where: str) -> list:
    """A checkpoint row as floats: ``width`` numbers [E, g (3N), μ (3)], E and g real finite
    numbers (not booleans, not strings) within ``ROW_BOUNDS``, μ three such numbers or three
    nulls (NaN: no dipole). FrequencyError naming ``where`` and the entry otherwise."""

    def bad(i, what):
        return FrequencyError(f"{where}: entry {i} is {shown(json.dumps(row[i]), 30)}, {what}", option="checkpoint")

    if not isinstance(row, list) or len(row) != width:
        n = len(row) if isinstance(row, list) else type(row).__name__
        raise FrequencyError(f"{where}: expected {width} numbers (E, gradient, dipole), found {n}", option="checkpoint")
    no_dipole = all(x is None or (isinstance(x, float) and math.isnan(x)) for x in row[-3:])
    out = []
    for i, x in enumerate(row):
        if no_dipole and i >= width - 3:
            out.append(math.nan)
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise bad(i, "expected a number")
        if not math.isfinite(x):
            raise bad(i, "expected a finite number")
        bound = ROW_BOUNDS["energy" if i == 0 else "dipole" if i >= width - 3 else "gradient"]
        if abs(x) > bound:
            raise bad(i, f"beyond ±{bound:g}: not a value a run gives")
        out.append(float(x))
    return out


def save_checkpoint(path, fp: dict, rows: dict) -> None:
    doc = {
        "kind": CHECKPOINT_KIND,
        "fingerprint": fp,
        # an absent dipole (NaN) is null: JSON has no NaN (io.outputs.json_text refuses it)
        "tasks": {str(k): [None if math.isnan(x) else float(x) for x in v] for k, v in sorted(rows.items())},
    }
    write_json(path, doc)


def evaluate_gradient(geom: Geometry, options: RunOptions, method: str, world, progress=None, log=None):
    """(row [E, g (3N), μ (3, NaN without)], the GradientResult) of one evaluation, in this
    process alone (``world``: a one-process World)."""
    from dfmp2.drivers.gradient import run_gradient

    gr = run_gradient(geom, options, method=method, progress=progress, log=log, world=world)
    mu = _relaxed_dipole(gr)
    row = [gr.energy, *np.asarray(gr.gradient, dtype=np.float64).ravel(), *(mu if mu is not None else [math.nan] * 3)]
    return row, gr


def _relaxed_dipole(gr) -> list | None:
    """The relaxed dipole of the differentiated energy (e·bohr, (3,), about (0, 0, 0)) from the
    gradient's own relaxed density (``properties`` 'dipole'), when the run computed it."""
    d = (getattr(gr.result, "properties", None) or {}).get("dipole")
    return [float(x) for x in d["relaxed"]["au"]] if d else None


def frequencies(  # noqa: PLR0913
    geom: Geometry,
    options: RunOptions,
    method: str = "mp2",
    *,
    step: float = STEP_BOHR,
    temperature: float = 298.15,
    pressure: float = 101325.0,
    checkpoint=None,
    log=None,
    progress=None,
    evaluate=None,
    ir: bool = True,
    symmetry_number: int | None = None,
) -> FrequencyResult:
    """The harmonic analysis of ``method``'s energy at ``geom`` (module docstring): DF-MP2's, SCS-
    or SOS-MP2's, or a double hybrid's (its table key, in ``method`` or
    ``options.method``); the gradient's checks (``check_gradient_options``) before any work.
    ``ir``: the relaxed dipole at every evaluation too (``properties`` 'dipole', from the
    gradient's own relaxed density: no second Z-vector), for the IR intensities (a double
    hybrid's: its relaxed dipole, dfmp2.grad.dh).
    ``symmetry_number``: σ of the rotational partition function (None: the point group's, found at
    SYMMETRY_TOL_BOHR).
    ``evaluate(geometry, world) -> (row, GradientResult or None)``: one evaluation (default
    ``evaluate_gradient``; a test's stand-in). Over the ranks of ``distributed.current()``."""
    from dfmp2.drivers.gradient import check_gradient_options, gradient_options

    check_arguments(method, step, checkpoint, ir)
    check_conditions(temperature, pressure)
    if symmetry_number is not None and not (
        isinstance(symmetry_number, int) and not isinstance(symmetry_number, bool) and symmetry_number >= 1
    ):
        what = f"the rotational symmetry number must be a positive integer, got {symmetry_number!r}"
        raise FrequencyError(what, option="symmetry_number")
    check_molecule(geom)
    options, method = gradient_options(options, method)  # a double hybrid: its table key in both
    if ir and "dipole" not in options.properties:
        options = dataclasses.replace(options, properties=(*options.properties, "dipole"))
    options, method = check_gradient_options(geom, options, method)
    world = distributed.current()
    with world.agreeing():
        group_size = distributed.check_groups(options, world)  # each evaluation over a group of ranks
    mine = distributed.rank_options(options, world)  # each rank's evaluations on its own device
    say = log or (lambda msg: None)
    evaluate = evaluate or (lambda g, w: evaluate_gradient(g, mine, method, w, progress, log))
    tasks = tasks_of(geom.natm)
    width = 1 + 3 * geom.natm + 3
    fp = fingerprint(geom, options, method, step)
    rows, error = {}, None
    if checkpoint and not world.rank:  # rank 0 reads it; a refusal ends every rank (one collective)
        try:
            rows = load_checkpoint(checkpoint, fp, len(tasks), width)
        except FrequencyError as e:
            error = e
    world.agree(error, agreed_content(geom, options, method, step, temperature, pressure))
    rows = _share_rows(rows, len(tasks), width, world)
    resumed = len(rows)
    if resumed and not world.rank:
        say(f"resuming from {checkpoint}: {resumed} of {len(tasks)} evaluations done")
    first = _run_rounds(geom, tasks, rows, step, evaluate, world, say, checkpoint, fp, width, group_size)
    info = {"evaluations": len(tasks), "resumed": resumed, "computed": len(tasks) - resumed, "ranks": world.size}
    if group_size > 1:
        info["ranks_per_evaluation"] = group_size
    mol = io_molecule.build_molecule(geom, options.basis, options.charge, options.multiplicity, ecp=options.ecp)
    rows = np.array([rows[k] for k in range(len(tasks))])
    return analyse(mol, geom, method, rows, step, temperature, pressure, info, first, symmetry_number)


def check_arguments(method, step, checkpoint, ir) -> None:
    """FrequencyError (one line naming the argument) for an argument of another type (the Python
    API's keywords: ``ir='no'`` is not True, ``step='0.01'`` no number) or a step outside 1e-5..0.1 bohr."""
    if not isinstance(method, str):
        raise FrequencyError(f"method must be a method name (str), got {type(method).__name__}", option="method")
    number = isinstance(step, (int, float)) and not isinstance(step, bool)
    if not (number and math.isfinite(step) and 1e-5 <= step <= 0.1):
        raise FrequencyError(f"the step must be between 1e-5 and 0.1 bohr, got {step!r}", option="step")
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        what = f"checkpoint must be a path (str or pathlib.Path) or None, got {type(checkpoint).__name__}"
        raise FrequencyError(what, option="checkpoint")
    if not isinstance(ir, bool):
        raise FrequencyError(f"ir must be True or False, got {ir!r}", option="ir")


def check_conditions(temperature, pressure) -> None:
    """FrequencyError (naming the option) unless the temperature (K) and the pressure (Pa) are real
    numbers within ``TEMPERATURE_K`` and ``PRESSURE_PA``: beyond them (infinity, NaN, 1e-300 Pa)
    the thermochemistry is NaN or infinite, not a number JSON carries."""
    for name, value, (lo, hi), unit in (
        ("temperature", temperature, TEMPERATURE_K, "K"),
        ("pressure", pressure, PRESSURE_PA, "Pa"),
    ):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
        if not ok:
            raise FrequencyError(
                f"the {name} must be a number from {lo:g} to {hi:g} {unit}, got {value!r}", option=name
            )


def agreed_content(geom: Geometry, options: RunOptions, method: str, step: float, temperature, pressure) -> dict:
    """What the ranks agree on before any evaluation (``World.agree``): the molecule and options
    (``request_content``) and every parameter of the analysis that changes a number, each as
    'option <parameter>' (the flag in a refusal): the method differentiated (``--method``; a
    double hybrid's table key, in ``options.method`` too), the step, the temperature and the
    pressure. A rank with another step would fill the Hessian with its own differences."""
    return {
        **energy_driver.request_content(geom, options),
        "option method": method,
        "option step": step,
        "option temperature": temperature,
        "option pressure": pressure,
    }


def _share_rows(rows: dict, ntask: int, width: int, world) -> dict:
    """Rank 0's checkpointed rows on every rank (a sum: zeros elsewhere; exact)."""
    if not world.distributed:
        return rows
    a = torch.zeros((ntask, width + 1), dtype=torch.float64)
    for k, v in rows.items():
        a[k, :width], a[k, width] = torch.tensor(v, dtype=torch.float64), 1.0
    a = world.all_reduce_sum(a, "frequencies")
    return {k: a[k, :width].tolist() for k in range(ntask) if a[k, width] > 0}


def _run_rounds(geom, tasks, rows, step, evaluate, world, say, checkpoint, fp, width, group_size: int = 1):  # noqa: PLR0913
    """Every missing evaluation, dealt round by round over the ranks (module docstring), or over
    groups of ``group_size`` ranks (``World.split``: each evaluation a gradient over its group,
    which agrees on its input first; the group's first rank gives the row); returns the
    reference geometry's GradientResult where this rank computed it."""
    todo = [k for k in range(len(tasks)) if k not in rows]
    task_world, group, ngroups = world.split(group_size)
    first, n = None, len(tasks)
    for r0 in range(0, len(todo), ngroups):
        batch = todo[r0 : r0 + ngroups]
        out = torch.zeros((len(batch), width + 1), dtype=torch.float64)  # the last column: failed
        error = None
        if group < len(batch):
            k = batch[group]
            coord, sign = tasks[k]
            say(f"evaluation {k + 1} of {n}: {_label(geom, coord, sign, step)}")
            try:
                task_world.agreed = task_world.refused = False  # a group agrees on each evaluation anew
                row, gr = evaluate(displaced(geom, coord, sign, step), task_world)
                if task_world.rank == 0:
                    out[group, :width] = torch.tensor(row, dtype=torch.float64)
                first = gr if k == 0 else first
            except distributed.PeerRefusedError:  # another rank of the group refused: it says why
                out[group, width] = 1.0
            except InputError as e:
                if task_world.distributed and not task_world.refused:  # after the group agreed: as any
                    raise  # run over ranks, this process ends (the group's others: RankLostError)
                error, out[group, width] = e, 1.0
        out = world.all_reduce_sum(out, "frequencies")
        if error is not None:
            where = _label(geom, *tasks[batch[group]], step)
            raise FrequencyError(f"at {where}: {error}", option=getattr(error, "option", None)) from None
        if bool((out[:, width] > 0).any()):  # another rank failed and says why: stop quietly
            raise distributed.PeerRefusedError("another rank's evaluation failed")
        for j, k in enumerate(batch):
            rows[k] = out[j, :width].tolist()
        if checkpoint and not world.rank:
            save_checkpoint(checkpoint, fp, rows)
    return first


def _label(geom: Geometry, coord: int, sign: int, step: float) -> str:
    if coord < 0:
        return "the reference geometry"
    return (
        f"atom {coord // 3 + 1} ({geom.symbols[coord // 3]}) {'xyz'[coord % 3]} {'+' if sign > 0 else '-'}{step:g} bohr"
    )


def analyse(  # noqa: PLR0913
    mol, geom, method, rows: np.ndarray, step, temperature, pressure, tasks, first=None, symmetry_number=None
) -> FrequencyResult:
    """The Hessian, PySCF's harmonic analysis and thermochemistry, the IR intensities, from the
    evaluations' rows (``tasks_of``'s order); ``mol``: the molecule's PySCF Mole (its atoms,
    masses, multiplicity); ``symmetry_number``: σ of the rotational partition function (None: the
    detected point group's, ``symmetry``). A linear molecule's analysis is that of its atoms put
    on their line (``analysis_molecule``): 3N - 5 modes, the linear rotor's thermochemistry."""
    natm, n = geom.natm, 3 * geom.natm
    mol, linear = analysis_molecule(mol)
    E0, g0, mu0 = rows[0, 0], rows[0, 1 : 1 + n], rows[0, 1 + n :]
    plus, minus = rows[1::2], rows[2::2]  # (3N, width) each, coordinate i's +h and -h
    H = (plus[:, 1 : 1 + n] - minus[:, 1 : 1 + n]) / (2 * step)
    H = 0.5 * (H + H.T)
    res = harmonic(mol, H)
    freq = np.asarray(res["freq_wavenumber"], dtype=np.float64)
    modes = np.asarray(res["norm_mode"])  # (nmode, natm, 3)
    ir = None
    if np.isfinite(rows[:, 1 + n :]).all():
        dmu = (plus[:, 1 + n :] - minus[:, 1 + n :]) / (2 * step)  # (3N, 3): dμ/dx_i, e
        # dμ/dQ per mode (e/amu^1/2): Q mass-weighted, x = M^-1/2 L Q, and norm_mode is M^-1/2 L
        dq = np.einsum("mi,ic->mc", modes.reshape(len(freq), n), dmu)
        ir = IR_KM_MOL * (dq**2).sum(1)
    sym = symmetry(mol, symmetry_number)
    th = thermochemistry(mol, E0, np.asarray(res["freq_au"]), temperature, pressure, sym["symmetry_number"])
    warnings = []
    gmax = float(np.abs(g0).max())
    if gmax > STATIONARY_GMAX:
        warnings.append(
            f"the geometry is not stationary (max |gradient| {gmax:.2e} Eh/bohr > {STATIONARY_GMAX:g}): the "
            "frequencies and thermochemistry of a non-stationary point are not those of a minimum; optimise first"
        )
    if ir is not None and mol.charge:
        warnings.append(
            f"a charged molecule (charge {mol.charge}): its dipole, and so the IR intensities, depend on the "
            "origin, here (0, 0, 0) of the input coordinates"
        )
    if (freq < 0).any():
        warnings.append(f"{int((freq < 0).sum())} imaginary mode(s) (listed as negative frequencies)")
    mdyn = np.asarray(res["force_const_dyne"])  # PySCF's: μ k_au Eh/bohr² x 1e-2 (J/m² per 100) = mdyn/Å
    return FrequencyResult(
        geom, method, float(E0), g0.reshape(natm, 3), H, freq, modes, np.asarray(res["reduced_mass"]), mdyn,
        ir, mu0 if np.isfinite(mu0).all() else None, th, sym["point_group"], zero_modes(mol, H, linear), step, tasks,
        warnings, first, sym, linear,
    )  # fmt: skip


def harmonic(mol, H: np.ndarray, project: bool = True) -> dict:
    """PySCF's ``harmonic_analysis`` of the Cartesian Hessian H (3N, 3N) Eh/bohr² of ``mol``
    (translations and rotations projected unless ``project`` is False; imaginary frequencies as
    negative numbers)."""
    from pyscf.hessian import thermo

    natm = mol.natm
    H4 = H.reshape(natm, 3, natm, 3).transpose(0, 2, 1, 3)
    return thermo.harmonic_analysis(mol, H4, exclude_trans=project, exclude_rot=project, imaginary_freq=False)


def zero_modes(mol, H: np.ndarray, linear: bool = False) -> dict:
    """The six (``linear``: five) frequencies (cm⁻¹, imaginary as negative) nearest zero:
    'projected', of the mass-weighted Hessian with the translations and rotations projected out
    (P H P, PySCF's projector: the six it removes, or the three translations and the two rotations
    of a linear ``mol``, whose atoms are on a line; zero to rounding), and 'unprojected', of the
    Hessian as computed (the translations near zero when the gradient is translation-invariant;
    the rotations also reflect the residual gradient of a not quite stationary geometry)."""
    from pyscf.data import nist
    from pyscf.hessian import thermo

    mass = mol.atom_mass_list(isotope_avg=True)
    w = np.repeat(mass**-0.5, 3)
    Hm = H * w[:, None] * w[None, :]
    nzero = 5 if linear else 6  # a linear molecule's rotation about its axis moves no atom
    q, _ = np.linalg.qr(np.vstack(thermo._get_TR(mass, mol.atom_coords())[:nzero]).T)
    P = np.eye(len(w)) - q @ q.T
    au2cm = (nist.HARTREE2J / (nist.ATOMIC_MASS * nist.BOHR_SI**2)) ** 0.5 / (2 * np.pi) / nist.LIGHT_SPEED_SI * 1e-2
    out = {}
    for name, M in (("projected", P @ Hm @ P), ("unprojected", Hm)):
        e = np.linalg.eigvalsh(0.5 * (M + M.T))
        f = np.sign(e) * np.sqrt(np.abs(e)) * au2cm
        out[name] = f[np.argsort(np.abs(f))[:nzero]]
    return out


def point_group(mol, tol: float = SYMMETRY_TOL_BOHR) -> str:
    """The point group (Schoenflies) PySCF's ``detect_symm`` finds for ``mol``'s atoms at the
    geometric tolerance ``tol`` (bohr; PySCF's ``symm.geom.TOLERANCE``, set for the call)."""
    from pyscf.symm import geom as symm_geom

    saved = symm_geom.TOLERANCE
    symm_geom.TOLERANCE = tol
    try:
        return str(symm_geom.detect_symm(mol._atom)[0])
    finally:
        symm_geom.TOLERANCE = saved


def rotational_symmetry_number(group: str) -> int:
    """σ of a point group: the number of proper rotations in it (the orientations that only
    interchange identical atoms; CCCBDB's table, as PySCF's ``thermo``): C1, Ci, Cs, C∞v 1; Cn,
    Cnv, Cnh n; Dn, Dnd, Dnh 2n; D∞h 2; Sn n/2; T, Td 12; Oh 24; Ih 60."""
    fixed = {"SO3": 1, "C1": 1, "Ci": 1, "Cs": 1, "Coov": 1, "Dooh": 2, "T": 12, "Td": 12, "Th": 12, "O": 24}
    fixed.update({"Oh": 24, "I": 60, "Ih": 60})
    if group in fixed:
        return fixed[group]
    n = int("".join(c for c in group if c.isdigit()) or 0)
    if n and group[0] in "CDS":
        return {"C": n, "D": 2 * n, "S": max(1, n // 2)}[group[0]]
    raise ValueError(f"no rotational symmetry number for point group {group!r}")


def symmetry(mol, symmetry_number: int | None = None, tol: float = SYMMETRY_TOL_BOHR) -> dict:
    """The thermochemistry's symmetry: the point group at ``tol`` (``point_group``), σ (the
    caller's ``symmetry_number``, else the group's), and where σ came from."""
    group = point_group(mol, tol)
    given = symmetry_number is not None
    sigma = int(symmetry_number) if given else rotational_symmetry_number(group)
    source = "given" if given else f"point group from PySCF's detect_symm at {tol:g} bohr"
    return {"point_group": group, "symmetry_number": sigma, "tolerance_bohr": tol, "source": source}


def thermochemistry(mol, e0: float, freq_au: np.ndarray, temperature: float, pressure: float, sigma: int) -> dict:
    """PySCF's ``thermo.thermo`` with the rotational symmetry number ``sigma`` (PySCF detects its
    own at its 1e-5 bohr tolerance: its ``rotational_symmetry_number`` answers ``sigma`` for the call)."""
    from pyscf.hessian import thermo

    saved = thermo.rotational_symmetry_number
    thermo.rotational_symmetry_number = lambda _mol: sigma
    try:
        return thermo.thermo(SimpleNamespace(mol=mol, e_tot=e0), freq_au, temperature, pressure)
    finally:
        thermo.rotational_symmetry_number = saved


def molden_text(res: FrequencyResult) -> str:
    """The normal modes as a Molden file ([FREQ], [FR-COORD] in bohr, [FR-NORM-COORD], [INT]):
    what Molden, Jmol, Avogadro and Chemcraft open."""
    lines = ["[Molden Format]", "[FREQ]"] + [f"{f:.4f}" for f in res.frequencies]
    lines.append("[FR-COORD]")
    for s, x in zip(res.geometry.symbols, np.asarray(res.geometry.coords_angstrom) / BOHR):
        lines.append(f"{s} {x[0]:.10f} {x[1]:.10f} {x[2]:.10f}")
    lines.append("[FR-NORM-COORD]")
    for m, mode in enumerate(res.modes):
        lines.append(f"vibration {m + 1}")
        lines += [f"{d[0]:.8f} {d[1]:.8f} {d[2]:.8f}" for d in mode]
    if res.ir is not None:
        lines.append("[INT]")
        lines += [f"{i:.6f}" for i in res.ir]
    return "\n".join(lines) + "\n"
