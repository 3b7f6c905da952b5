"""The double hybrids' table: every functional's definition and reference, as data (below
``options.py``, which takes these names for ``RunOptions.method``; the stage that runs them is
dfmp2.mp2.double_hybrids).

A double hybrid's energy is E_DFT[ρ_KS] + c_OS E_OS + c_SS E_SS + E_disp (Hartree): ``xc`` is
PySCF's description of the KS part (libxc components with their fractions), ``c_os``/``c_ss`` the
PT2 scalings, ``dispersion`` the D3(BJ) or D4 term by its parameter set's name in the field's
packages (never typed in here).

``FUNCTIONALS`` is the one table (docs/double_hybrids.md prints it with the same sources). libxc
7 (PySCF 2.14) has no double-hybrid entries of its own (libxc dropped them in version 6) and no
ωB97X-2, whose semilocal part has its own fitted coefficients: it is left out rather than typed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dfmp2.errors import InputError, shown

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
    def components(self) -> tuple:
        """The libxc components of ``xc`` by name, upper case, without their fractions or signs ('HF'
        too): its terms are separated by ',', '+' or a ' - ' (a subtracted component)."""
        return tuple(t.split("*")[-1].strip().upper() for t in re.split(r",|\+| - ", self.xc))

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


def _p86(fraction: str) -> str:
    """``fraction`` of libxc's P86 correlation with its local part made continuous: GGA_C_P86 is
    PZ81's LDA correlation (libxc's LDA_C_PZ) plus Perdew's gradient term, and PZ81's published
    5-digit parameters make ε_c jump by 3.2e-5 Eh per electron where its two branches meet, at
    r_s = 1 (ρ = 3/4π bohr⁻³; 3.1e-5 at ζ = 0.2), a jump no potential carries: the gradient was
    1e-5 Eh/bohr from differences of the energy. Subtracting LDA_C_PZ and adding libxc's
    LDA_C_PZ_MOD (the same with the r_s < 1 branch's c, d refitted for continuity) leaves P86's
    gradient term as it is; the energy moves by 3.2e-5 per electron at most, where r_s < 1
    (docs/double_hybrids.md: -6.4e-5 Eh for DSD-PBEP86 on water)."""
    return f"{fraction}*P86 - {fraction}*LDA_C_PZ + {fraction}*LDA_C_PZ_MOD"


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
        f"0.69*HF + 0.31*PBE, {_p86('0.44')}",
        0.52,
        0.22,
        Dispersion("d3bj", "dsdpbep86", "Kozuch, Martin, J. Comput. Chem. 34, 2327 (2013), doi:10.1002/jcc.23391"),
        "Kozuch, Martin, J. Comput. Chem. 34, 2327 (2013)",
    ),
    "revdsd-pbep86-d4": DoubleHybrid(
        "revDSD-PBEP86-D4",
        f"0.69*HF + 0.31*PBE, {_p86('0.4210')}",
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
