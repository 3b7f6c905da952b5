"""What a user may ask for: the choices of every option and ``RunOptions``, defined once.

The CLI's options (dfmp2.cli.options), the Python API and the QCSchema keywords are all built from
this module; nothing here imports PySCF, so the CLI starts fast. Library errors name the
``RunOptions`` field they are about (``InputError.option``) and never a CLI flag; the CLI adds
its flag.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Integral, Real

from dfmp2 import functionals, linalg, memory
from dfmp2.errors import InputError, shown
from dfmp2.linalg import DTYPES

PRECISIONS = tuple(DTYPES)  # fp64, fp32
DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "trn1", "trn2")
SCF_MODES = ("df", "pyscf-df", "exact")  # df: our DF-SCF (dfmp2.scf.driver); pyscf-df: PySCF's; exact: PySCF's
SCF_DF_MODES = ("df", "pyscf-df")  # density-fitted with the JK-fit set (default_auxbasis 'jk')
SCF_PRECISIONS = ("auto", "fp64", "mixed")  # our DF-SCF's J/K (dfmp2.scf.precision.resolve_precision)
SCF_MAX_CYCLE = 100
SCF_CONV_TOL = 1e-12  # Hartree, energy change
SCF_CONV_TOL_GRAD = 1e-9  # orbital-gradient norm (1e-8 left 2e-10 Eh of thread-count noise in large cases)
SCF_SCREEN = 1e-12  # our DF-SCF's JK factor: shell pairs kept when sqrt((μν|μν)) >= this (dfmp2.scf.jk)
# the largest scf_screen: above it screening stops being an approximation (scripts/results/scf_screen.md): at
# 1e-6 E(HF) moves by 5-6e-7 Eh (S22 water dimer, (H2O)8; the gradient 4e-7 Eh/bohr from finite differences,
# their floor 2-3e-7), at 1e-5 (H2O)8's by 2e-4 Eh, and at 1e-2 the dimer's SCF collapses 0.18 Eh (cc-pVDZ) and
# 20.6 Eh (aug-cc-pVDZ) below the unscreened run's
SCF_SCREEN_MAX = 1e-6
# above this a run warns with the measured effect ((H2O)8: 2e-10 Eh at 1e-8, 2.3e-7 Eh at 1e-7)
SCF_SCREEN_QUIET = 1e-8
REFERENCES = ("auto", "rhf", "uhf", "rohf")
ECP_CHOICES = ("auto", "none", "none-for-testing")  # scf.build_molecule says what each does
STORAGE_CHOICES = memory.STORAGE_CHOICES  # auto (memory if it fits), memory, disk
INTEGRAL_ENGINES = ("auto", "host", "gpu4pyscf")  # dfmp2.df.integrals.ENGINES
PAIR_KERNEL_CHOICES = linalg.backend.pair_kernel_choices()  # cuda: linalg.cuda; cpu: linalg.cpu_pair
CPU_BLAS_CHOICES = linalg.cpu_blas.MODES  # cpu only: auto (measured, cached), torch, openblas
# what a run computes after the energy (dfmp2.props): dipole, the HF and the unrelaxed and relaxed MP2 dipole moments
PROPERTY_CHOICES = ("dipole",)
# dfmp2 optimize --convergence: geomeTRIC's named criteria sets (its OptParams ``convergence_set``);
# "default" is dfmp2.workflows.optimize.CONVERGENCE (GAU with the largest gradient tightened)
CONVERGENCE_SETS = ("default", "gau_loose", "nwchem_loose", "gau", "turbomole", "gau_tight", "gau_verytight")
# the SCF part of a CBS extrapolation (dfmp2.workflows.cbs, a basis bracket such as cc-pv[dt]z): Psi4's names
CBS_SCF_SCHEMES = ("xtpl_highest_1", "scf_xtpl_helgaker_2", "scf_xtpl_helgaker_3")
# the energy a run computes: MP2 on HF orbitals (SCS and SOS beside it), or a double hybrid (PySCF's
# KS-SCF, our PT2 stage on its orbitals: dfmp2.functionals.FUNCTIONALS)
METHODS = functionals.METHODS
# a double hybrid's KS-SCF grid: PySCF's grids.level (0 coarsest .. 9 finest; 3 is PySCF's default,
# (50-75 radial, 302 angular) points per first- and second-row atom, NWChem pruning)
DFT_GRID_LEVEL = 3


_PATH = (str, os.PathLike, type(None))
# over several ranks: our DF-SCF's JK factor split by auxiliary index (J and K summed over fixed
# groups of it in group order, dfmp2.scf.jk_dist) or the whole SCF on every rank; either gives
# E(HF), E_OS and E_SS bit-identical to one process (equal threads per process, the same BLAS)
DIST_SCF_MODES = ("split", "replicated")

# (field, allowed types, what the error says): bool only where listed (it is an int to Python)
_FIELD_TYPES = (
    ("basis", (str, dict, list, tuple), "a basis set name, 'El:name,El:name', or a {element: name or shells} dict"),
    ("auxbasis", (str, dict, type(None)), "a basis set name, a {element: name} dict or None"),
    ("charge", (Integral, type(None)), "an integer or None"),
    ("multiplicity", (Integral, type(None)), "an integer (2S+1) or None"),
    ("device", (str,), f"one of {', '.join(DEVICE_CHOICES)}"),
    ("simulate", (bool,), "True or False"),
    ("precision", (str, type(None)), f"one of {', '.join(PRECISIONS)} or None"),
    ("frozen_core", (bool,), "True or False"),
    ("ecp", (str,), f"one of {', '.join(ECP_CHOICES)}"),
    ("scf_mode", (str,), f"one of {', '.join(SCF_MODES)}"),
    ("memory_mb", (Real, type(None)), "a number of MB or None"),
    ("storage", (str,), f"one of {', '.join(STORAGE_CHOICES)}"),
    ("scratch_dir", _PATH, "a directory path or None"),
    ("checkpoint", _PATH, "a file path or None"),
    ("resume", _PATH, "a file path or None"),
    ("pair_kernel", (str,), f"one of {', '.join(PAIR_KERNEL_CHOICES)}"),
    ("integrals", (str,), f"one of {', '.join(INTEGRAL_ENGINES)}"),
    ("cpu_blas", (str,), f"one of {', '.join(CPU_BLAS_CHOICES)}"),
    ("occ_block_max", (Integral, type(None)), "a positive integer or None"),
    ("j3c_block_mb", (Real,), "a positive number of MB"),
    ("scf_max_cycle", (Integral,), "a positive integer"),
    ("scf_conv_tol_grad", (Real,), "a positive number"),
    ("scf_screen", (Real,), f"a number from 0 to {SCF_SCREEN_MAX:g}"),
    ("scf_precision", (str,), f"one of {', '.join(SCF_PRECISIONS)}"),
    ("scf_stability", (bool,), "True or False"),
    ("dist_scf", (str,), f"one of {', '.join(DIST_SCF_MODES)}"),
    ("ranks_per_run", (Integral,), "a positive integer"),
    ("reference", (str,), f"one of {', '.join(REFERENCES)}"),
    ("cbs_scf", (str,), f"one of {', '.join(CBS_SCF_SCHEMES)}"),
    ("properties", (str, tuple, list), f"a list of property names ({', '.join(PROPERTY_CHOICES)})"),
    ("method", (str,), f"one of {', '.join(METHODS)}"),
    ("dft_grid", (Integral,), "a grid level from 0 to 9"),
)


@dataclass
class RunOptions:
    """What the user asked for. ``precision=None``: fp64 on cpu/cuda, fp32 on trn (no fp64 there)."""

    # a name, or per element (basis_spec: 'O:cc-pvdz,H:sto-3g' or {element: name or PySCF shells},
    # 'default' for the elements not named): kept canonical (a name, or a dict sorted by key)
    basis: str | dict = "cc-pvdz"
    auxbasis: str | None = None  # None: the MP2-fit set matched to ``basis``
    charge: int | None = None  # None: from the XYZ comment line, else 0
    multiplicity: int | None = None
    device: str = "cpu"
    simulate: bool = False
    precision: str | None = None
    frozen_core: bool = False
    ecp: str = "auto"  # auto: the ECP the basis comes with (scf.build_molecule); none; none-for-testing
    scf_mode: str = "df"
    memory_mb: float | None = None  # None: a safe fraction of available memory
    storage: str = "auto"  # where B lives: auto (memory if it fits), memory, disk
    scratch_dir: str | None = None  # out-of-core files; None: the system's temp directory
    checkpoint: str | None = None  # write a checkpoint (HDF5) here as the run goes
    resume: str | None = None  # continue the run in this checkpoint (and keep writing it)
    pair_kernel: str = "auto"  # MP2 pair-step path of cuda (linalg.cuda) or cpu (linalg.cpu_pair)
    integrals: str = "auto"  # integral engine (INTEGRAL_ENGINES): auto, host, gpu4pyscf
    cpu_blas: str = "auto"  # cpu only: BLAS of GEMM/SYRK/pair GEMMs (linalg.cpu_blas): auto, torch, openblas
    # occupied orbitals per block, before the memory plan; None: the device's (memory.occ_block_max)
    occ_block_max: int | None = None
    j3c_block_mb: float = memory.J3C_BLOCK_MB  # target MB of one streamed (μν|P) block
    scf_max_cycle: int = SCF_MAX_CYCLE
    scf_conv_tol_grad: float = SCF_CONV_TOL_GRAD  # orbital-gradient norm the SCF must reach
    scf_screen: float = SCF_SCREEN  # our DF-SCF's JK factor: the Schwarz threshold of its pairs (0: all kept)
    scf_precision: str = "auto"  # our DF-SCF's J/K: auto (mixed where it pays), fp64, mixed (SCF_PRECISIONS)
    scf_stability: bool = True  # a UHF's internal stability check (dfmp2.scf.stability); RHF: none
    dist_scf: str = "split"  # over several ranks (dfmp2.distributed): our DF-SCF split or replicated
    ranks_per_run: int = 1  # a task-parallel command: each run over a group of this many ranks (workflows.tasks)
    reference: str = "auto"  # auto (RHF closed shell, UHF open shell), rhf, uhf; rohf refused
    cbs_scf: str = (
        "xtpl_highest_1"  # a basis bracket's SCF scheme (dfmp2.workflows.cbs): Psi4's default, the largest basis
    )
    # after the energy (dfmp2.props, PROPERTY_CHOICES): names, or one comma-separated string; kept as a tuple
    properties: tuple = ()
    method: str = "mp2"  # or a double hybrid (METHODS; names folded by functionals.canonical)
    dft_grid: int = DFT_GRID_LEVEL  # a double hybrid's KS-SCF grid level (PySCF's grids.level)

    def __post_init__(self):
        """Every field's type and range, as the CLI's parser checks them: a Python caller's
        ``frozen_core='no'`` or ``memory_mb='4GB'`` is one InputError naming the option."""
        for name, kinds, what in _FIELD_TYPES:
            value = getattr(self, name)
            ok = (value is None and type(None) in kinds) or (
                isinstance(value, tuple(k for k in kinds if k is not type(None)))
                and not (isinstance(value, bool) and bool not in kinds)
            )
            if not ok:
                raise InputError(f"option {name} must be {what}, got {value!r}", option=name)
        self.basis = basis_spec(self.basis)
        for name in ("basis", "auxbasis"):  # PySCF reads a multi-line string as basis-set text
            value = getattr(self, name)
            if isinstance(value, str) and (not value.strip() or not value.isprintable()):
                raise InputError(
                    f"option {name} must be a basis set name (one printable line), got {value!r}", option=name
                )
        for name, low in (("memory_mb", 0.0), ("j3c_block_mb", 0.0), ("scf_conv_tol_grad", 0.0)):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > low):
                raise InputError(f"option {name} must be a finite number above {low:g}, got {value!r}", option=name)
        if not (math.isfinite(self.scf_screen) and 0.0 <= self.scf_screen <= SCF_SCREEN_MAX):
            what = (
                f"option scf_screen must be a number from 0 to {SCF_SCREEN_MAX:g}, got {self.scf_screen!r} (above "
                f"{SCF_SCREEN_MAX:g} screening is no approximation: (H2O)8's E(HF) is 2e-4 Eh off at 1e-5, the "
                "water dimer's 20 Eh at 1e-2)"
            )
            raise InputError(what, option="scf_screen")
        for name in ("occ_block_max", "scf_max_cycle", "ranks_per_run"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"option {name} must be at least 1, got {value!r}", option=name)
        self.properties = property_names(self.properties)
        self.method = functionals.canonical(self.method)
        if not 0 <= self.dft_grid <= 9:
            raise InputError(
                f"option dft_grid must be a grid level from 0 to 9, got {self.dft_grid!r}", option="dft_grid"
            )

    def resolved_precision(self) -> str:
        """The working precision: ``precision``, or the device's default; InputError for an
        unknown device or precision, or one the device cannot run."""
        try:
            caps = linalg.device_capabilities(self.device)
        except ValueError as e:  # an unknown device name
            raise InputError(str(e), option="device") from None
        p = self.precision or caps.default_precision
        if p not in PRECISIONS:
            raise InputError(f"unknown precision '{p}'; use one of {', '.join(PRECISIONS)}", option="precision")
        if caps.precision_problem(p):
            raise InputError(
                f"{self.device}: {caps.precision_problem(p)}; use precision fp32 "
                "(energies are still accumulated in fp64)",
                option="precision",
            )
        return p

    def check_choices(self) -> None:
        """InputError (naming the option) for a value outside its choices."""
        for name, choices in (
            ("scf_mode", SCF_MODES),
            ("storage", STORAGE_CHOICES),
            ("reference", REFERENCES),
            ("ecp", ECP_CHOICES),
            ("integrals", INTEGRAL_ENGINES),
            ("pair_kernel", PAIR_KERNEL_CHOICES),
            ("cpu_blas", CPU_BLAS_CHOICES),
            ("scf_precision", SCF_PRECISIONS),
            ("cbs_scf", CBS_SCF_SCHEMES),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise InputError(
                    f"unknown {name.replace('_', ' ')} '{value}'; use one of {', '.join(choices)}", option=name
                )
        try:
            caps = linalg.device_capabilities(self.device)
        except ValueError as e:  # an unknown device name
            raise InputError(str(e), option="device") from None
        try:
            linalg.cpu_blas.check_choice(self.cpu_blas, self.device, caps.is_host)
        except linalg.cpu_blas.CpuBlasChoiceError as e:
            raise InputError(str(e), option="cpu_blas") from None
        if self.scf_precision != "auto" and not caps.has_fp64:
            raise InputError(
                f"SCF precision {self.scf_precision} needs fp64 arithmetic, which device "
                f"'{self.device}' lacks; use auto (fp32 J/K of the density change, Fock "
                "matrix in fp64)",
                option="scf_precision",
            )
        if self.simulate and not caps.simulable:
            raise InputError(f"simulation applies only to trn1/trn2, not to device '{self.device}'", option="simulate")


BASIS_DEFAULT_KEY = "default"  # PySCF's key of a per-element basis dict for the elements it does not name
GIVEN_SHELLS = "(given shells)"  # basis_text's word for a basis given as PySCF shells
MAX_L = 6  # the highest angular momentum of a shell given by hand (i functions)


def basis_spec(value):
    """The orbital basis in its canonical form: a name (stripped), or a dict {key: name or PySCF
    shells (nested lists, as ``gto.basis.parse`` gives)} sorted by key, 'default' first. Keys are
    element symbols (capitalised: 'o' -> 'O'), atom labels or 'default' (PySCF's meaning). Taken:
    one name; the per-element text 'O:cc-pvdz,H:sto-3g' (commas inside parentheses belong to a
    name: 'H:6-31g(d,p)'); a dict; PySCF shells alone (every element). {'default': name} is that
    name. InputError (option basis) for an empty key or name, a repeated key, a basis bracket in a
    per-element basis (a CBS bracket takes one name) or shells that are not lists."""
    if isinstance(value, str):
        if ":" not in value:
            return value.strip()
        value = _per_element_text(value)
    elif isinstance(value, (list, tuple)):
        value = {BASIS_DEFAULT_KEY: value}
    if not isinstance(value, dict):
        return value  # the type check names it
    out = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key.strip():
            raise InputError(f"option basis: a per-element basis needs element keys, got {key!r}", option="basis")
        k = _basis_key(key)
        if k in out:
            raise InputError(f"option basis: {k} is given twice", option="basis")
        out[k] = _basis_value(k, v)
    if not out:
        raise InputError("option basis: the per-element basis is empty", option="basis")
    if list(out) == [BASIS_DEFAULT_KEY] and isinstance(out[BASIS_DEFAULT_KEY], str):
        return out[BASIS_DEFAULT_KEY]
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != BASIS_DEFAULT_KEY, kv[0])))


def _per_element_text(text: str) -> dict:
    """{key: name} of 'O:cc-pvdz,H:sto-3g' (commas at parenthesis depth 0 separate entries)."""
    entries, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            entries.append(cur)
            cur = ""
        else:
            cur += ch
    entries.append(cur)
    out = {}
    for entry in entries:
        key, sep, name = entry.partition(":")
        if not sep or not key.strip() or not name.strip() or ":" in name:
            raise InputError(
                f"option basis: '{shown(entry.strip(), 40)}' is not 'element:basis' (a per-element basis "
                "reads 'O:cc-pvdz,H:sto-3g', with 'default:name' for the elements not named)",
                option="basis",
            )
        if _basis_key(key) in out:
            raise InputError(f"option basis: {_basis_key(key)} is given twice", option="basis")
        out[_basis_key(key)] = name.strip()
    return out


def _basis_key(key: str) -> str:
    """A per-element basis key as PySCF spells it: 'o' -> 'O', 'CL' -> 'Cl', 'Default' -> 'default'."""
    k = key.strip()
    if k.lower() == BASIS_DEFAULT_KEY:
        return BASIS_DEFAULT_KEY
    return k[0].upper() + k[1:].lower() if k.isalpha() else k


def _basis_value(key: str, v):
    """A per-element entry: a name (one printable line, no bracket) or shells as nested lists."""
    if isinstance(v, str):
        if not v.strip() or not v.strip().isprintable():
            raise InputError(f"option basis: the basis of {key} must be a name, got {v!r}", option="basis")
        if "[" in v or "]" in v:
            raise InputError(
                f"option basis: a basis bracket ({v.strip()}, a CBS extrapolation) takes one basis for "
                "every element, not a per-element basis",
                option="basis",
            )
        return v.strip()
    shells = _plain(v)
    if not (isinstance(shells, list) and shells and all(_shell_ok(sh) for sh in shells)):
        raise InputError(
            f"option basis: the basis of {key} must be a name or PySCF shells (gto.basis.parse(...): "
            f"[[l, [exponent, coefficient, ...], ...], ...]), got {shown(repr(v), 60)}",
            option="basis",
        )
    return shells


def _shell_ok(shell) -> bool:
    """Whether ``shell`` reads as PySCF's [l, (kappa,) [exponent, c1, ...], ...]: l from 0 to
    MAX_L, primitives of one length (at least 2), exponents positive, every number finite."""
    if not (isinstance(shell, list) and len(shell) >= 2 and type(shell[0]) is int and 0 <= shell[0] <= MAX_L):
        return False
    rows = shell[2:] if type(shell[1]) is int else shell[1:]
    return bool(rows) and all(
        isinstance(r, list)
        and len(r) == len(rows[0]) >= 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in r)
        and r[0] > 0
        for r in rows
    )


def _plain(v):
    """Nested lists of Python numbers of tuples, lists and arrays (JSON-able, hashable as text)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def basis_text(basis) -> str:
    """One line of an orbital basis option: the name, or 'default:cc-pvdz,H:sto-3g' (shells read
    GIVEN_SHELLS): what results and tables record."""
    if isinstance(basis, str):
        return basis
    return ",".join(f"{k}:{v if isinstance(v, str) else GIVEN_SHELLS}" for k, v in basis.items())


def property_names(value) -> tuple:
    """The property names of ``value`` (one string, comma-separated, or a list or tuple of such
    strings) as a tuple without repeats, in the order given: InputError (option ``properties``)
    for an empty name or one outside PROPERTY_CHOICES."""
    items = [value] if isinstance(value, str) else list(value)
    names = []
    for item in items:
        if not isinstance(item, str):
            raise InputError(f"option properties takes property names (strings), got {item!r}", option="properties")
        for name in item.split(","):
            name = name.strip().lower()
            if not name:
                raise InputError(
                    f"option properties takes a comma-separated list of names ({', '.join(PROPERTY_CHOICES)}), "
                    f"got {item!r}",
                    option="properties",
                )
            if name not in PROPERTY_CHOICES:
                raise InputError(
                    f"unknown property '{shown(name, 30)}'; use one of {', '.join(PROPERTY_CHOICES)}",
                    option="properties",
                )
            if name not in names:
                names.append(name)
    return tuple(names)
