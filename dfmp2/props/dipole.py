"""Dipole moments of the HF, the unrelaxed MP2 and the relaxed MP2 density (a double hybrid's: the
KS determinant's and the relaxed one), PySCF's convention.

    μ = Σ_A Z_A (R_A - O) - Σ_μν D_μν <ν| r - O |μ>          (e·bohr, atomic units; × AU_TO_DEBYE: debye)

with Z_A the nuclear charges as the Hamiltonian has them (an ECP's core taken off its atom's
charge, ghost atoms 0: ``mol.atom_charges()``), R_A in bohr, D the total density in the AO basis
(both spins) and O the origin: (0, 0, 0) of the input's coordinates (``ORIGIN``), as PySCF's
``scf.hf.dip_moment`` takes it by default, so that the numbers compare with PySCF's. A neutral
molecule's dipole does not depend on the origin; a charged one's does (``origin_dependent``).
The relaxed MP2 dipole is -dE/dF of the MP2 energy in a uniform field F (the derivative the
relaxed density carries); the unrelaxed one leaves out the orbital response. A double hybrid's
relaxed dipole is -dE/dF of its energy E_KS + c_os E_OS + c_ss E_SS + E_disp (D_KS + P, P the
relaxed PT2 density of its gradient, dfmp2.grad.dh); its 'ks' one that of the KS determinant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf.data.nist import AU2DEBYE

AU_TO_DEBYE = float(AU2DEBYE)  # debye per e·bohr (PySCF's constant: its dip_moment's unit='Debye')
ORIGIN = (0.0, 0.0, 0.0)  # bohr: the input coordinates' origin, PySCF's dip_moment default
ORIGIN_RULE = "the origin (0, 0, 0) of the input coordinates, as PySCF's scf.hf.dip_moment takes it"
# record key -> MP2Densities kind: MP2's dipoles, and a double hybrid's (its KS determinant's
# density is the densities' 'hf' kind; a double hybrid has no HF or MP2 dipole)
KINDS = {"hf": "hf", "unrelaxed": "unrelaxed", "relaxed": "relaxed"}
DH_KINDS = {"ks": "hf", "relaxed": "relaxed"}


def dipole_au(mol, dm_ao: np.ndarray, origin=ORIGIN) -> np.ndarray:
    """μ (3,) in e·bohr of the total AO density ``dm_ao`` (nao, nao) on ``mol`` about ``origin``
    (bohr): the nuclear part minus Σ D_μν <ν|r - O|μ> (module docstring)."""
    origin = np.asarray(origin, dtype=np.float64)
    with mol.with_common_orig(origin):
        r = mol.intor_symmetric("int1e_r", comp=3)  # (3, nao, nao)
    electrons = np.einsum("xij,ji->x", r, dm_ao)
    nuclei = np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords() - origin[None, :])
    return nuclei - electrons


@dataclass
class Dipoles:
    """The dipole moments (3,) in e·bohr of the densities of ``method`` (the energy the densities
    differentiate: 'mp2', 'scs-mp2', 'sos-mp2' or a double hybrid's table key), about ``origin``
    (bohr); ``charge`` of the molecule (nonzero: the values depend on the origin). MP2: ``hf``,
    ``unrelaxed``, ``relaxed``; a double hybrid: ``ks`` (its KS determinant's) and ``relaxed``
    (D_KS + the relaxed PT2 density: -dE/dF of E_KS + c_os E_OS + c_ss E_SS + E_disp), the
    others None."""

    hf: np.ndarray | None
    unrelaxed: np.ndarray | None
    relaxed: np.ndarray
    method: str
    origin: tuple = ORIGIN
    charge: int = 0
    ks: np.ndarray | None = None

    @property
    def origin_dependent(self) -> bool:
        return self.charge != 0

    @property
    def kinds(self) -> tuple:
        """The record's kinds, in its order: ('ks', 'relaxed') for a double hybrid, else KINDS'."""
        return tuple(DH_KINDS if self.ks is not None else KINDS)

    def debye(self, kind: str) -> np.ndarray:
        """The ``kind`` ('hf', 'unrelaxed', 'relaxed'; a double hybrid's 'ks', 'relaxed') dipole in debye."""
        return getattr(self, kind) * AU_TO_DEBYE

    def to_dict(self) -> dict:
        """As the result JSON writes it (``properties.dipole``): per kind the vector and its
        norm in both units, the units, the origin (bohr) and how it was chosen."""
        out = {
            "method": self.method,
            "units": {"au": "e*bohr", "debye": "debye"},
            "au_to_debye": AU_TO_DEBYE,
            "origin": [float(x) for x in self.origin],
            "origin_units": "bohr",
            "origin_rule": ORIGIN_RULE,
            "origin_dependent": self.origin_dependent,
        }
        for kind in self.kinds:
            au = getattr(self, kind)
            out[kind] = {
                "au": [float(x) for x in au],
                "debye": [float(x) for x in au * AU_TO_DEBYE],
                "norm_au": float(np.linalg.norm(au)),
                "norm_debye": float(np.linalg.norm(au) * AU_TO_DEBYE),
            }
        return out


def dipoles(mol, densities, method: str = "mp2", origin=ORIGIN, double_hybrid: bool = False) -> Dipoles:
    """The Dipoles of an ``MP2Densities`` (dfmp2.grad.densities; its relaxed density made) on
    ``mol``; ``double_hybrid``: densities of a double hybrid's energy (``dfmp2.grad.dh.dh_densities``
    or its gradient's), whose kinds are DH_KINDS."""
    kinds = DH_KINDS if double_hybrid else KINDS
    mu = {kind: dipole_au(mol, densities.total_ao(dens), origin) for kind, dens in kinds.items()}
    org, charge = tuple(float(x) for x in origin), int(mol.charge)
    if double_hybrid:
        return Dipoles(None, None, mu["relaxed"], method, org, charge, ks=mu["ks"])
    return Dipoles(mu["hf"], mu["unrelaxed"], mu["relaxed"], method, org, charge)
