"""The SCF reference, one type for both spins: what the DF-MP2 stage (and later gradients) reads.

    Reference.channels    one SpinChannel for RHF, two (alpha, beta) for UHF
    SpinChannel           mo_coeff (nao, nmo), mo_energy (nmo,) Hartree, nocc occupied orbitals,
                          frozen (nmo,) bool: orbitals left out of the correlation
                          -> C_occ (nao, nocc_active), C_vir (nao, nvir_active), eps_occ, eps_vir
    Reference.source      who made it: 'dfmp2.scf' (our DF-SCF), 'pyscf' (PySCF's SCF, run by us
                          or converged by the caller), 'checkpoint' (read back from a checkpoint),
                          'given' (orbitals a benchmark made, e.g. core-Hamiltonian ones)

``from_pyscf`` is the one way from a converged PySCF ``mf`` (RHF or UHF) to a Reference: the SCF
bridge (dfmp2.scf.pyscf_scf) and the Python API (dfmp2.interfaces.api,
dfmp2.interfaces.pyscf_dropin) both use it. Frozen orbitals are always a mask;
``freeze_lowest`` and ``frozen_mask`` turn a count or PySCF's index list into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from dfmp2.errors import InputError
from dfmp2.provenance import ScfRecord

S2_WARN = 0.1  # warn when <S^2> - S(S+1) exceeds this: the threshold Psi4/ORCA users commonly take
# for a UHF reference whose spin contamination makes (U)MP2 unreliable
GAP_WARN = 0.15  # Hartree: warn below this HOMO-LUMO gap. On stretched H2/cc-pVDZ against FCI the MP2
# error grows several-fold as the gap closes to about this value, and just below it
# E(MP2) falls below the exact energy of the basis (scripts/results/docstring-measurements.md)
# our DF-SCF's engine name in records, then the names it had before (read from older checkpoints)
OUR_SCF_NAMES = ("dfmp2.scf", "dfmp2.scf.dfhf", "dfmp2.dfhf")
SOURCES = (OUR_SCF_NAMES[0], "pyscf", "checkpoint", "given")  # given: orbitals a script made


@dataclass(frozen=True)
class SpinChannel:
    """One spin's canonical orbitals. mo_coeff (nao, nmo); mo_energy (nmo,) Hartree, ascending
    within occupied and virtual; the first ``nocc`` orbitals occupied; ``frozen`` (nmo,) bool.
    The active ones: C_occ (nao, nocc_active), C_vir (nao, nvir_active), eps_occ, eps_vir."""

    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    nocc: int
    frozen: np.ndarray

    @property
    def nmo(self) -> int:
        return self.mo_coeff.shape[1]

    def _active(self, occupied: bool) -> np.ndarray:
        return ((np.arange(self.nmo) < self.nocc) == occupied) & ~self.frozen

    C_occ = property(lambda self: self.mo_coeff[:, self._active(True)])
    C_vir = property(lambda self: self.mo_coeff[:, self._active(False)])
    eps_occ = property(lambda self: self.mo_energy[self._active(True)])
    eps_vir = property(lambda self: self.mo_energy[self._active(False)])
    nocc_active = property(lambda self: int(np.count_nonzero(self._active(True))))
    nvir_active = property(lambda self: int(np.count_nonzero(self._active(False))))


@dataclass
class Reference:
    """A converged RHF (one channel) or UHF (alpha, beta) reference. e_hf in Hartree; s2 <S^2>
    and s2_exact S(S+1) (dimensionless; UHF only); ``scf``: what ran it; ``mf``: PySCF's object
    when PySCF converged it (None for ours and from a checkpoint)."""

    channels: tuple
    e_hf: float
    source: str
    scf: ScfRecord
    jk_auxbasis: str | None = None
    s2: float | None = None
    s2_exact: float | None = None
    mf: object = field(default=None, repr=False)

    def __post_init__(self):
        assert len(self.channels) in (1, 2) and self.source in SOURCES, (len(self.channels), self.source)

    @property
    def restricted(self) -> bool:
        return len(self.channels) == 1

    @property
    def kind(self) -> str:
        return "RHF" if self.restricted else "UHF"

    @property
    def nmo(self) -> int:
        return self.channels[0].nmo

    def density(self) -> np.ndarray:
        """The SCF density in the AO basis, every occupied orbital (frozen ones too): RHF (nao, nao)
        = 2 C_occ C_occ^T with its orbitals attached (PySCF's tag_array: mo_coeff, mo_occ), UHF
        (2, nao, nao) alpha, beta, with (2, nao, nmo) orbitals and (2, nmo) occupations. What a
        later SCF of the same molecule and basis at a nearby
        geometry starts from (``dfmp2.drivers.energy.run_energy(guess=)``)."""
        from pyscf import lib

        dms = [c.mo_coeff[:, : c.nocc] @ c.mo_coeff[:, : c.nocc].T for c in self.channels]
        if not self.restricted:
            occ = np.stack([np.where(np.arange(c.nmo) < c.nocc, 1.0, 0.0) for c in self.channels])
            return lib.tag_array(np.stack(dms), mo_coeff=np.stack([c.mo_coeff for c in self.channels]), mo_occ=occ)
        c = self.channels[0]
        occ = np.where(np.arange(c.nmo) < c.nocc, 2.0, 0.0)
        return lib.tag_array(2.0 * dms[0], mo_coeff=c.mo_coeff, mo_occ=occ)

    def freeze(self, frozen: np.ndarray) -> Reference:
        """The same reference with ``frozen`` (nmo,) bool left out of the correlation in every
        channel (PySCF's meaning: the same orbital indices in both spins)."""
        return replace(self, channels=tuple(replace(c, frozen=np.asarray(frozen, dtype=bool)) for c in self.channels))

    def gap_warning(self) -> str | None:
        """One line when the smallest gap between an active virtual and an active occupied
        orbital energy (per spin) is below GAP_WARN: a near-degenerate reference, for which
        MP2's denominators blow up; else None."""
        gaps = [float(c.eps_vir.min() - c.eps_occ.max()) for c in self.channels if c.nocc_active and c.nvir_active]
        if not gaps or min(gaps) >= GAP_WARN:
            return None
        return (
            f"near-degenerate reference: the HOMO-LUMO gap is {min(gaps):.3f} Eh (below {GAP_WARN} Eh); "
            "MP2 is unreliable there (H2 stretched to 5 A, gap 0.11 Eh, gives an E(MP2) below the "
            "exact energy): check with a multireference method"
        )

    def contamination_warning(self) -> str | None:
        """One line when a UHF's <S^2> exceeds S(S+1) by more than S2_WARN, else None."""
        s2, s2_exact = cast(float, self.s2), cast(float, self.s2_exact)  # a UHF's: both set
        if self.restricted or s2 - s2_exact <= S2_WARN:
            return None
        d = s2 - s2_exact
        return (
            f"spin contamination: UHF <S^2> = {self.s2:.4f}, exact S(S+1) = {self.s2_exact:.4f} "
            f"(excess {d:.3f} > {S2_WARN}); UMP2 energies of such a reference are unreliable "
            "(check for a lower-spin or broken-symmetry state)"
        )


def restricted(
    mo_coeff, mo_energy, nocc: int, *, e_hf: float, source: str, scf: ScfRecord, jk_auxbasis=None, mf=None
) -> Reference:
    """An RHF Reference with nothing frozen."""
    C, e = np.asarray(mo_coeff), np.asarray(mo_energy)
    return Reference(
        (SpinChannel(C, e, int(nocc), np.zeros(C.shape[1], dtype=bool)),), float(e_hf), source, scf, jk_auxbasis, mf=mf
    )


def unrestricted(
    mo_coeff, mo_energy, nocc, *, e_hf: float, source: str, scf: ScfRecord, jk_auxbasis=None, s2: float
) -> Reference:
    """A UHF Reference with nothing frozen: mo_coeff (2, nao, nmo), mo_energy (2, nmo), nocc
    (alpha, beta); s2 <S^2>, S(S+1) from the occupations."""
    chans = tuple(
        SpinChannel(np.asarray(C), np.asarray(e), int(n), np.zeros(np.shape(C)[1], dtype=bool))
        for C, e, n in zip(mo_coeff, mo_energy, nocc)
    )
    S = (nocc[0] - nocc[1]) / 2
    return Reference(chans, float(e_hf), source, scf, jk_auxbasis, float(s2), S * (S + 1))


def spin_square(C_occ_a, C_occ_b, S) -> float:
    """<S^2> of a UHF determinant (PySCF's ``scf.uhf.spin_square``): C_occ_a (nao, na), C_occ_b
    (nao, nb), S the overlap (nao, nao); (na + nb)/2 - ||C_occ_a^T S C_occ_b||_F^2 + (na - nb)^2/4."""
    na, nb = C_occ_a.shape[1], C_occ_b.shape[1]
    sab = C_occ_a.T @ S @ C_occ_b
    return float((na + nb) * 0.5 - np.sum(sab * sab) + (na - nb) ** 2 * 0.25)


def freeze_lowest(nmo: int, n: int) -> np.ndarray:
    """The (nmo,) mask freezing the ``n`` lowest orbitals (the chemical frozen core)."""
    mask = np.zeros(nmo, dtype=bool)
    mask[:n] = True
    return mask


def frozen_mask(frozen, nmo: int, nocc: int) -> np.ndarray:
    """(nmo,) bool of the orbitals PySCF's ``frozen`` leaves out: None (none), an int n (the n
    lowest, 0 <= n < nocc) or a list of orbital indices (occupied or virtual; negative ones count
    from the top and repeats are one, as PySCF's mask indexing reads them). InputError otherwise."""
    if frozen is None:
        return np.zeros(nmo, dtype=bool)
    if isinstance(frozen, (bool, np.bool_)):
        raise InputError(f"frozen must be None, an int or a list of orbital indices, got {frozen!r}")
    if isinstance(frozen, (int, np.integer)):
        if not 0 <= frozen < nocc:
            raise InputError(f"frozen={frozen} must be between 0 and {nocc - 1} (nocc {nocc})")
        return freeze_lowest(nmo, int(frozen))
    idx = _indices(frozen)
    if idx is None:
        raise InputError(f"frozen must be None, an int or a list of orbital indices, got {frozen!r}")
    if any(not -nmo <= i < nmo for i in idx):
        raise InputError(f"frozen orbital indices must be within {-nmo}..{nmo - 1} (nmo {nmo}), got {list(frozen)}")
    mask = np.zeros(nmo, dtype=bool)
    mask[idx] = True
    return mask


def _indices(frozen) -> list[int] | None:
    """The ints of a list/tuple/array of orbital indices, None when it is not one."""
    if isinstance(frozen, (str, bytes, dict)) or not hasattr(frozen, "__len__"):
        return None
    try:
        items = list(frozen)
    except TypeError:
        return None
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in items):
        return None
    return [int(i) for i in items]


def frozen_masks(frozen, nmo: int, noccs: list[int]) -> list[np.ndarray]:
    """One (nmo,) frozen mask per spin channel (``noccs``: nocc per channel, 1 for RHF, 2 for UHF),
    PySCF's forms: those of ``frozen_mask`` for every channel, and for a UHF a pair of index lists
    (``([alpha indices], [beta indices])``, ump2.get_frozen_mask's reading when the first item is
    not an int). InputError (one line) for anything else, a per-spin pair on an RHF included."""
    per_spin = (
        not isinstance(frozen, (int, np.integer, str, bytes, dict, type(None)))
        and hasattr(frozen, "__len__")
        and len(frozen) > 0
        and not isinstance(frozen[0], (int, np.integer))
    )
    if not per_spin:
        return [frozen_mask(frozen, nmo, noccs[0])] * len(noccs)
    if len(noccs) != 2 or len(frozen) != 2 or any(_indices(f) is None for f in frozen):
        what = "an RHF reference takes" if len(noccs) != 2 else "a UHF reference takes"
        raise InputError(
            f"frozen={frozen!r}: {what} None, an int, a list of orbital indices"
            + (", or a pair of such lists (alpha, beta)" if len(noccs) == 2 else "")
        )
    return [frozen_mask(list(f), nmo, n) for f, n in zip(frozen, noccs)]


def from_pyscf(
    mf, frozen=None, *, scf: ScfRecord | None = None, jk_auxbasis=None, kohn_sham: bool = False
) -> Reference:
    """A converged PySCF RHF or UHF as a Reference (source 'pyscf'), ``frozen`` (PySCF's meaning,
    the same in both spins) taken out. ``scf``: the record of the SCF when we ran it (default:
    converged by the caller). ``kohn_sham``: an RKS or UKS is taken too (a double hybrid's SCF,
    dfmp2.scf.pyscf_scf.run_ks; e_hf is then its KS energy). InputError for anything else (ROHF,
    GHF, Kohn-Sham unless asked for, unconverged, a non-aufbau occupation, nothing left to correlate)."""
    kind = _check_pyscf_reference(mf, kohn_sham)
    unrestricted = kind == "UHF"
    C, eps, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_energy), np.asarray(mf.mo_occ)
    full = 1.0 if unrestricted else 2.0
    occs = occ if unrestricted else occ[None]
    if not all(np.all((np.abs(o - full) < 1e-12) | (np.abs(o) < 1e-12)) and np.all(np.diff(o) <= 0) for o in occs):
        what = "an aufbau occupation in each spin" if unrestricted else "a closed-shell aufbau occupation"
        raise InputError(f"the {type(mf).__name__} reference is not {what} (occupations must be {full:g} then 0)")
    Cs, es = (C, eps) if unrestricted else (C[None], eps[None])
    noccs = [int(np.count_nonzero(o > 0)) for o in occs]
    masks = frozen_masks(frozen, Cs.shape[2], noccs)
    channels = tuple(SpinChannel(c, e, n, m) for c, e, n, m in zip(Cs, es, noccs, masks))
    occ_left = max(c.nocc_active for c in channels)
    vir_left = max(c.nvir_active for c in channels)
    if occ_left == 0 or vir_left == 0:
        raise InputError(
            f"frozen={frozen!r} leaves {occ_left} active occupied and {vir_left} virtual "
            "orbitals; no MP2 correlation possible"
        )
    s2 = s2_exact = None
    if unrestricted:
        s2 = float(mf.spin_square()[0])
        S = mf.mol.spin / 2
        s2_exact = S * (S + 1)
    if scf is None:
        scf = ScfRecord(
            engine="pyscf", reference=kind, device="host", source="given", iterations=None, jk="as the caller ran it"
        )
    return Reference(channels, float(mf.e_tot), "pyscf", scf, jk_auxbasis, s2, s2_exact, mf=mf)


def _check_pyscf_reference(mf, kohn_sham: bool = False) -> str:
    """'RHF' or 'UHF' for a converged PySCF Hartree-Fock object (or, with ``kohn_sham``, an RKS or
    UKS); InputError otherwise."""
    from pyscf.scf import ghf, hf, rohf, uhf

    try:
        from pyscf.dft.rks import KohnShamDFT
    except ImportError:  # pragma: no cover - every PySCF 2.x has it
        KohnShamDFT = ()
    kind = type(mf).__name__
    if not isinstance(mf, hf.SCF):
        raise InputError(f"DFMP2 takes a PySCF SCF object (e.g. scf.RHF(mol).run()), got {kind}")
    if KohnShamDFT and isinstance(mf, KohnShamDFT) and not kohn_sham:
        raise InputError(f"DFMP2 needs a Hartree-Fock reference; {kind} is Kohn-Sham DFT")
    if isinstance(mf, uhf.UHF) and not isinstance(mf, ghf.GHF):
        out = "UHF"
    elif isinstance(mf, (rohf.ROHF, ghf.GHF)):
        raise InputError(
            f"DFMP2 needs an RHF or UHF reference; {kind} is not supported (ROHF-MP2 "
            "needs semicanonical orbitals and a singles term)"
        )
    elif isinstance(mf, hf.RHF):
        out = "RHF"
    else:
        raise InputError(f"DFMP2 needs a closed-shell RHF reference, got {kind}")
    if getattr(mf, "mo_coeff", None) is None or not getattr(mf, "converged", False):
        raise InputError(
            f"the {kind} reference has not converged (run mf.kernel() to convergence "
            "first); MP2 on unconverged orbitals is meaningless"
        )
    return out


def project_density(dm0, S: np.ndarray):
    """A previous geometry's density made a proper one at this geometry: its occupied orbitals
    (``mo_coeff``, ``mo_occ`` of PySCF's tag_array) Löwdin-orthonormalised in this overlap S
    (nao, nao), C' = C (C^T S C)^-1/2, so that D S D = 2 D (RHF); (2, nao, nao) per spin, with
    (2, nao, nmo) orbitals. Returned as a tag_array with the new orbitals. A density without
    orbitals is returned as it is."""
    from pyscf import lib

    C, occ = getattr(dm0, "mo_coeff", None), getattr(dm0, "mo_occ", None)
    if C is None or occ is None:
        return dm0
    C, occ = np.asarray(C), np.asarray(occ)

    def orthonormal(Cs, occs):
        Co = Cs[:, occs > 0]
        w, V = np.linalg.eigh(Co.T @ S @ Co)
        return (Co @ (V / np.sqrt(w)) @ V.T), occs[occs > 0]

    if C.ndim == 2:
        Co, oo = orthonormal(C, occ)
        return lib.tag_array((Co * oo) @ Co.T, mo_coeff=Co, mo_occ=oo)
    pairs = [orthonormal(C[s], occ[s]) for s in (0, 1)]
    return np.stack([(Co * oo) @ Co.T for Co, oo in pairs])
