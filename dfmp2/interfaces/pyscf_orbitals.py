"""Orbitals given to the PySCF drop-in (``DFMP2(mf, frozen, mo_coeff=..., mo_occ=...)``) that are
not the mf's own canonical ones: PySCF's frozen natural orbitals (``make_fno``), orbitals rotated
within the occupied or virtual space, or fewer of them (a truncated virtual space).

As PySCF (``pyscf.mp.dfmp2.get_mo_energy``, ``mp2.get_e_hf``), the Fock matrix and E_HF are those
of the given orbitals' density under the mf's Hamiltonian. Where the active occupied and the active
virtual blocks of that Fock matrix are diagonal to SOLUTION_TOL (``make_fno``'s orbitals, which
PySCF makes semi-canonical; the mf's own), their diagonal is taken as the orbital energies, as
PySCF does: the same number as PySCF's ``dfmp2.DFMP2``, and the same tolerance by which the mf's own
orbitals count as canonical (``pyscf_dropin.check_scf_solution``). A block that is not diagonal
(orbitals rotated within the occupied or the virtual space) is diagonalised (semi-canonical
orbitals), so the energy is the MP2 energy of the given orbital space, invariant to such
rotations; PySCF's dfmp2 keeps only the diagonal there, which is not (``Semicanonical.rotated``:
the run says so in its warnings). The occupied space must be the SCF's: an occupied-virtual Fock
element above SOLUTION_TOL is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfmp2.errors import InputError

SOLUTION_TOL = 1e-4  # Hartree: largest occupied-virtual Fock element of orbitals that span the SCF's space
ORTHO_TOL = 1e-6  # largest deviation of C^T S C from the identity


@dataclass(frozen=True)
class Semicanonical:
    """The rotations that made the given orbitals semi-canonical, per spin channel: ``u_occ``
    (nocc_active, nocc_active) and ``u_vir`` (nvir_active, nvir_active), new = given @ u."""

    u_occ: tuple
    u_vir: tuple

    @property
    def rotated(self) -> bool:
        """Whether some block was not diagonal and the orbitals were rotated."""
        return any(u.size and not np.array_equal(u, np.eye(len(u))) for u in self.u_occ + self.u_vir)


def given_reference(mf, mol, frozen, mo_coeff, mo_occ, mo_energy=None):
    """(Reference on the given orbitals made semi-canonical, Semicanonical) for a converged RHF or
    UHF ``mf``; ``mo_coeff`` (nao, nmo) or (2, nao, nmo), ``mo_occ`` (nmo,) or (2, nmo), ``frozen``
    PySCF's meaning over these orbitals. InputError (one line) for orbitals of another size, not
    orthonormal, not an aufbau occupation, spanning another occupied space than the SCF's, or a
    given ``mo_energy`` that is not their Fock diagonal."""
    from dfmp2.provenance import ScfRecord
    from dfmp2.reference import Reference, _check_pyscf_reference, frozen_masks

    kind = _check_pyscf_reference(mf)
    Cs, occs = _shapes(kind == "UHF", mo_coeff, mo_occ, mol.nao_nr())
    S = mol.intor_symmetric("int1e_ovlp")
    if max(abs(c.T @ S @ c - np.eye(c.shape[1])).max() for c in Cs) > ORTHO_TOL:
        raise InputError("the mo_coeff given to DFMP2 are not orthonormal in the molecule's overlap")
    C_in, occ_in = (Cs, occs) if kind == "UHF" else (Cs[0], occs[0])
    dm = mf.make_rdm1(C_in, occ_in)
    vhf = mf.get_veff(mol, dm)
    fock = np.asarray(mf.get_fock(vhf=vhf, dm=dm))
    e_hf = float(mf.energy_tot(dm=dm, vhf=vhf))
    focks = fock if fock.ndim == 3 else fock[None]
    noccs = [int(np.count_nonzero(o > 0)) for o in occs]
    masks = frozen_masks(frozen, Cs.shape[2], noccs)
    eps_given = None if mo_energy is None else np.asarray(mo_energy, dtype=float).reshape(len(Cs), -1)
    channels, u_occ, u_vir = [], [], []
    for s, (c, f, n, m) in enumerate(zip(Cs, focks, noccs, masks)):
        fmo = c.T @ f @ c
        _check_fock(fmo, n, None if eps_given is None else eps_given[s])
        ch, uo, uv = _semicanonical(c, fmo, n, m)
        channels.append(ch)
        u_occ.append(uo)
        u_vir.append(uv)
    if max(ch.nocc_active for ch in channels) == 0 or max(ch.nvir_active for ch in channels) == 0:
        raise InputError(f"frozen={frozen!r} leaves no active occupied or virtual orbital; no MP2 correlation possible")
    s2 = s2_exact = None
    if kind == "UHF":
        s2 = float(mf.spin_square((Cs[0][:, : noccs[0]], Cs[1][:, : noccs[1]]), S)[0])
        s2_exact = mol.spin / 2 * (mol.spin / 2 + 1)
    scf = ScfRecord(
        engine="pyscf", reference=kind, device="host", source="given", iterations=None, jk="as the caller ran it"
    )
    ref = Reference(tuple(channels), e_hf, "pyscf", scf, None, s2, s2_exact, mf=mf)
    return ref, Semicanonical(tuple(u_occ), tuple(u_vir))


def _shapes(unrestricted: bool, mo_coeff, mo_occ, nao: int):
    """(C (nspin, nao, nmo), occ (nspin, nmo)) of the given orbitals, checked."""
    C = np.asarray(mo_coeff, dtype=float)
    occ = np.asarray(mo_occ, dtype=float)
    Cs, occs = (C, occ) if unrestricted else (C[None], occ[None])
    nspin = 2 if unrestricted else 1
    if Cs.ndim != 3 or Cs.shape[0] != nspin or Cs.shape[1] != nao or occs.shape != (nspin, Cs.shape[2]):
        raise InputError(
            f"mo_coeff {C.shape} and mo_occ {occ.shape} given to DFMP2 do not fit a "
            f"{'UHF' if unrestricted else 'RHF'} of {nao} basis functions "
            f"(expected {'(2, ' if unrestricted else '('}{nao}, nmo) and {'(2, nmo)' if unrestricted else '(nmo,)'})"
        )
    full = 1.0 if unrestricted else 2.0
    if not all(np.all((np.abs(o - full) < 1e-12) | (np.abs(o) < 1e-12)) and np.all(np.diff(o) <= 0) for o in occs):
        raise InputError(f"the mo_occ given to DFMP2 is not an aufbau occupation ({full:g} then 0)")
    return Cs, occs


def _check_fock(fmo: np.ndarray, nocc: int, eps) -> None:
    """InputError when the orbitals' occupied space is not the SCF's (an occupied-virtual Fock
    element above SOLUTION_TOL) or a given mo_energy is not the Fock diagonal."""
    off = float(abs(fmo[:nocc, nocc:]).max(initial=0.0))
    if off > SOLUTION_TOL:
        raise InputError(
            f"the orbitals given to DFMP2 do not span the mf's occupied space (occupied-virtual "
            f"Fock element {off:.2e} Eh, above {SOLUTION_TOL:g}): rotate only within the "
            "occupied or within the virtual orbitals, or converge an SCF for them"
        )
    if eps is not None and (eps.shape != (fmo.shape[0],) or abs(eps - np.diag(fmo)).max() > SOLUTION_TOL):
        raise InputError(
            "the mo_energy given to DFMP2 is not the Fock diagonal of the given orbitals: leave "
            "mo_energy out and it is computed from them"
        )


def _semicanonical(c: np.ndarray, fmo: np.ndarray, nocc: int, frozen: np.ndarray):
    """(SpinChannel with the active occupied and active virtual blocks of ``fmo`` diagonalised
    where an off-diagonal element exceeds SOLUTION_TOL, u_occ, u_vir (the identity where not)).
    Frozen orbitals keep the given coefficients and their Fock diagonal."""
    from dfmp2.reference import SpinChannel

    nmo = c.shape[1]
    c, eps = c.copy(), np.diag(fmo).copy()
    us = []
    for occupied in (True, False):
        idx = np.flatnonzero(((np.arange(nmo) < nocc) == occupied) & ~frozen)
        block = fmo[np.ix_(idx, idx)]
        if abs(block - np.diag(np.diag(block))).max(initial=0.0) <= SOLUTION_TOL:
            us.append(np.eye(len(idx)))  # semi-canonical already: PySCF's diagonal
            continue
        w, u = np.linalg.eigh(block)
        u = u * np.where(np.diag(u) < 0, -1.0, 1.0)  # nearest to the given orbitals' signs
        c[:, idx] = c[:, idx] @ u
        eps[idx] = w
        us.append(u)
    return SpinChannel(c, eps, nocc, frozen), us[0], us[1]


def rotate_t2(t2: np.ndarray, ui: np.ndarray, uj: np.ndarray, ua: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """t2 (nocc_i, nocc_j, nvir_a, nvir_b) of the semi-canonical orbitals back in the given ones
    (new = given @ u): t2_given[ijab] = u_i[i,k] u_j[j,l] u_a[a,c] u_b[b,d] t2[klcd]."""
    t = np.tensordot(ui, t2, axes=(1, 0))
    t = np.tensordot(uj, t, axes=(1, 1)).transpose(1, 0, 2, 3)
    t = np.tensordot(t, ua, axes=(2, 1)).transpose(0, 1, 3, 2)
    return np.tensordot(t, ub, axes=(3, 1))
