"""Double-hybrid DFT: the table of functionals and what our MP2 stage needs of each.

A double hybrid's energy is

    E = E_DFT[ρ_KS] + c_OS E_OS + c_SS E_SS + E_disp

E_DFT: the self-consistent Kohn–Sham energy with the functional's hybrid part (a fraction of HF
exchange, scaled semilocal exchange and correlation; PySCF's DF-RKS/UKS on the host, libxc's
components through PySCF's xc strings); E_OS and E_SS: our DF-MP2 stage's opposite- and same-spin
sums on the KS orbitals and orbital energies (dfmp2.mp2.stage, the MP2-fit set matched to the
orbital basis); E_disp: the D3(BJ) or D4 term where the functional's definition has one, from the
field's packages (pyscf-dispersion's simple-dftd3 and dftd4 builds), parameters by name from their
tables, never typed in here. All energies in Hartree.

``FUNCTIONALS`` is the one table (docs/double_hybrids.md prints it with the same sources). libxc
7 (PySCF 2.14) has no double-hybrid entries of its own (libxc dropped them in version 6) and no
ωB97X-2, whose semilocal part has its own fitted coefficients: it is left out rather than typed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from dfmp2.errors import InputError, shown

DISPERSION_PACKAGE = "pyscf-dispersion"  # PyPI: simple-dftd3 and dftd4 built for PySCF (import pyscf.dispersion)
# PWPB95's modified mPW91 exchange: libxc's GGA_X_MPW91 with the paper's b, c, d (Goerigk and Grimme
# 2011, Table 1): libxc's '_alpha' is c / X2S^2, X2S = 1 / (2 (6 π²)^(1/3)) (libxc's constant)
_X2S = 0.1282782438530421943003109254455883701296
_PWPB95_X = {"_bt": 0.00444, "_alpha": 0.32620 / _X2S**2, "_expo": 3.7868}
_PWPB95_C = {"_css": 0.03241, "_copp": 0.00250}  # its reparametrised B95 correlation (same paper)


@dataclass(frozen=True)
class Dispersion:
    """A dispersion term: ``version`` 'd3bj' (simple-dftd3, rational damping, two-body) or 'd4'
    (dftd4, rational damping with the three-body ATM term, as dftd4 defines it); ``parameters``:
    the name of its parameter set in that package's table; ``source``: where those parameters
    were published (the package's own citation)."""

    version: str
    parameters: str
    source: str

    @property
    def atm(self) -> bool:
        return self.version == "d4"

    @property
    def label(self) -> str:
        return {"d3bj": "D3(BJ)", "d4": "D4"}[self.version]


@dataclass(frozen=True)
class DoubleHybrid:
    """One functional: ``name`` as published; ``xc`` PySCF's description of the KS part (libxc
    components with their fractions; 'HF' the exact-exchange fraction); ``c_os``, ``c_ss`` the PT2
    scalings; ``dispersion`` or None; ``reference`` the functional's paper; ``custom``: libxc
    parameters changed from libxc's defaults, {libxc component: {parameter: value}} (PWPB95)."""

    name: str
    xc: str
    c_os: float
    c_ss: float
    dispersion: Dispersion | None
    reference: str
    custom: tuple = ()

    @property
    def pyscf_xc(self) -> str:
        """What PySCF's ``mf.xc`` is set to: ``xc``, or a registered custom name when libxc's
        parameters are changed (``register``)."""
        return f"dfmp2_{_key(self.name)}" if self.custom else self.xc

    def record(self) -> dict:
        """The definition as the result JSON carries it (``double_hybrid.functional``)."""
        return {
            "name": self.name,
            "xc": self.xc,
            "libxc_parameters": {k: dict(v) for k, v in self.custom} or None,
            "c_os": self.c_os,
            "c_ss": self.c_ss,
            "dispersion": None
            if self.dispersion is None
            else {
                "version": self.dispersion.version,
                "parameters": self.dispersion.parameters,
                "three_body": self.dispersion.atm,
                "source": self.dispersion.source,
            },
            "reference": self.reference,
        }


_GMTKN30_BJ = "Goerigk, Grimme, Phys. Chem. Chem. Phys. 13, 6670 (2011), doi:10.1039/c0cp02984j"
FUNCTIONALS = {
    "b2plyp": DoubleHybrid(
        "B2PLYP", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27, None, "Grimme, J. Chem. Phys. 124, 034108 (2006)"
    ),
    "b2gp-plyp": DoubleHybrid(
        "B2GP-PLYP",
        "0.65*HF + 0.35*B88, 0.64*LYP",
        0.36,
        0.36,
        None,
        "Karton, Tarnopolsky, Lamère, Schatz, Martin, J. Phys. Chem. A 112, 12868 (2008)",
    ),
    "mpw2plyp": DoubleHybrid(
        "mPW2PLYP",
        "0.55*HF + 0.45*MPW91, 0.75*LYP",
        0.25,
        0.25,
        None,
        "Schwabe, Grimme, Phys. Chem. Chem. Phys. 8, 4398 (2006)",
    ),
    "dsd-blyp": DoubleHybrid(
        "DSD-BLYP-D3(BJ)",
        "0.69*HF + 0.31*B88, 0.54*LYP",
        0.46,
        0.37,
        Dispersion("d3bj", "dsdblyp", _GMTKN30_BJ),
        "Kozuch, Gruzman, Martin, J. Phys. Chem. C 114, 20801 (2010)",
    ),
    "dsd-pbep86": DoubleHybrid(
        "DSD-PBEP86-D3(BJ)",
        "0.69*HF + 0.31*PBE, 0.44*P86",
        0.52,
        0.22,
        Dispersion("d3bj", "dsdpbep86", "Kozuch, Martin, J. Comput. Chem. 34, 2327 (2013), doi:10.1002/jcc.23391"),
        "Kozuch, Martin, J. Comput. Chem. 34, 2327 (2013)",
    ),
    "revdsd-pbep86-d4": DoubleHybrid(
        "revDSD-PBEP86-D4",
        "0.69*HF + 0.31*PBE, 0.4210*P86",
        0.5922,
        0.0636,
        Dispersion(
            "d4",
            "revdsdpbep86",
            "Santra, Sylvetsky, Martin, J. Phys. Chem. A 123, 5129 (2019), doi:10.1021/acs.jpca.9b03157",
        ),
        "Santra, Sylvetsky, Martin, J. Phys. Chem. A 123, 5129 (2019)",
    ),
    "pwpb95-d3bj": DoubleHybrid(
        "PWPB95-D3(BJ)",
        "0.50*HF + 0.50*GGA_X_MPW91, 0.731*MGGA_C_BC95",
        0.269,
        0.0,
        Dispersion("d3bj", "pwpb95", _GMTKN30_BJ),
        "Goerigk, Grimme, J. Chem. Theory Comput. 7, 291 (2011)",
        custom=(("GGA_X_MPW91", tuple(_PWPB95_X.items())), ("MGGA_C_BC95", tuple(_PWPB95_C.items()))),
    ),
}
# the names a user may also type for these (the published names without the dispersion suffix)
ALIASES = {"b2gpplyp": "b2gp-plyp", "dsd-blyp-d3bj": "dsd-blyp", "dsd-pbep86-d3bj": "dsd-pbep86"}
METHODS = ("mp2", *FUNCTIONALS)  # what RunOptions.method takes: MP2 (on HF orbitals) or a double hybrid


def _key(name: str) -> str:
    """A functional's name folded for lookup: lower case without '-', '_', '(', ')', spaces."""
    return "".join(c for c in name.lower() if c not in "-_() ")


_LOOKUP = {_key(k): k for k in (*FUNCTIONALS, *ALIASES)}


def canonical(method: str) -> str:
    """The table's key of ``method`` ('mp2' for MP2, a FUNCTIONALS key for a double hybrid); one
    InputError (option ``method``) for a name not in the table."""
    if not isinstance(method, str):
        raise InputError(f"option method must be a method name, got {method!r}", option="method")
    if _key(method) == "mp2":
        return "mp2"
    k = _LOOKUP.get(_key(method))
    if k is None:
        raise InputError(
            f"unknown method '{shown(method, 30)}'; use mp2 or a double hybrid: {', '.join(FUNCTIONALS)} "
            "(docs/double_hybrids.md)",
            option="method",
        )
    return ALIASES.get(k, k)


def get(method: str) -> DoubleHybrid | None:
    """The DoubleHybrid of ``method``, None for MP2 (``canonical``'s errors)."""
    k = canonical(method)
    return None if k == "mp2" else FUNCTIONALS[k]


def check_dispersion_package(dh: DoubleHybrid) -> None:
    """Before any work: a functional with a dispersion term needs pyscf-dispersion; one InputError
    naming the package when it cannot be imported."""
    if dh.dispersion is None:
        return
    try:
        import pyscf.dispersion  # noqa: F401
        from pyscf.dispersion import dftd3, dftd4  # noqa: F401
    except ImportError:
        raise InputError(
            f"{dh.name}'s {dh.dispersion.label} dispersion needs the {DISPERSION_PACKAGE} package "
            f"(simple-dftd3 and dftd4 for PySCF), which is not installed: pip install {DISPERSION_PACKAGE} "
            "(or pip install 'dfmp2[dh]')",
            option="method",
        ) from None


def refuse_derivatives(*methods: str) -> None:
    """One InputError (option ``method``), before any work, when any of ``methods`` names a double
    hybrid: its gradient (and so optimisations, frequencies, relaxed properties) needs the PT2
    term's orbital response with the XC kernel, which dfmp2 does not compute. Names outside the
    table are left to the caller's own check."""
    for m in methods:
        try:
            dh = get(m) if isinstance(m, str) else None
        except InputError:
            continue
        if dh is not None:
            raise InputError(
                f"analytic gradients of double hybrids ({dh.name}) are not implemented here (the PT2 term's "
                "orbital response needs the XC kernel); compute its energy with dfmp2 run --method, or use mp2, "
                "scs-mp2 or sos-mp2",
                option="method",
            )


def dispersion_energy(mol, dh: DoubleHybrid) -> tuple[float, dict]:
    """(E_disp in Hartree, its record) of the molecule ``mol`` (PySCF Mole, its geometry in Bohr
    inside) for ``dh``'s dispersion term, by the package's named parameters; (0.0, None) without one."""
    if dh.dispersion is None:
        return 0.0, None
    check_dispersion_package(dh)
    from importlib.metadata import PackageNotFoundError, version

    from pyscf.dispersion import dftd3, dftd4

    d = dh.dispersion
    if d.version == "d4":
        model = dftd4.DFTD4Dispersion(mol, d.parameters, atm=True)
    else:
        model = dftd3.DFTD3Dispersion(mol, d.parameters, version=d.version, atm=d.atm)
    energy = float(model.get_dispersion()["energy"])
    try:
        pkg = f"{DISPERSION_PACKAGE} {version(DISPERSION_PACKAGE)}"
    except PackageNotFoundError:  # pragma: no cover - an install without metadata
        pkg = DISPERSION_PACKAGE
    engine = "dftd4" if d.version == "d4" else "simple-dftd3"
    return energy, {
        "version": d.version,
        "label": d.label,
        "parameters": f"{engine} '{d.parameters}'",
        "three_body": d.atm,
        "package": pkg,
        "source": d.source,
        "energy": energy,
    }


def register(dh: DoubleHybrid) -> str:
    """Make ``dh.pyscf_xc`` known to PySCF (for a functional with changed libxc parameters:
    ``libxc.register_custom_functional_``, by the parameters' names, once per process, the same
    definition every time); returns the name to set as ``mf.xc``."""
    if not dh.custom:
        return dh.xc
    from pyscf.dft import libxc

    name = dh.pyscf_xc
    if name not in libxc._CUSTOM_FUNC_R:
        params = {int(libxc.XC_CODES[comp]): dict(values) for comp, values in dh.custom}
        libxc.register_custom_functional_(name, dh.xc, ext_params=params)
    return name


def record(dh: DoubleHybrid, e_dft: float, e_os: float, e_ss: float, disp: dict | None, ks: dict) -> dict:
    """The result's ``double_hybrid`` record: the functional's definition, the parts of its energy
    (Hartree: E_DFT, the scaled PT2 term, E_disp, the total) and the KS-SCF's grid and fitting set
    (``ks``: what ``pyscf_scf.run_ks`` recorded)."""
    e_pt2 = dh.c_os * e_os + dh.c_ss * e_ss
    e_disp = disp["energy"] if disp else 0.0
    return {
        "functional": dh.record(),
        "e_dft": e_dft,
        "e_pt2": e_pt2,
        "e_disp": e_disp,
        "e_total": e_dft + e_pt2 + e_disp,
        "dispersion": disp,
        "ks_scf": ks,
    }
