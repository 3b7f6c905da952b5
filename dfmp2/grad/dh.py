"""The double-hybrid nuclear gradient, closed (RKS) and open (UKS) shells: a stage after the
energy, a peer of ``dfmp2.grad.mp2`` and ``dfmp2.grad.ump2`` (fp64).

The energy differentiated is exactly the one ``dfmp2 run --method`` prints,
    E = E_KS[ρ] + c_os E_OS + c_ss E_SS + E_disp
(dfmp2.mp2.double_hybrids): E_KS PySCF's DF-RKS energy of the functional's hybrid part (a_x HF
exchange, scaled semilocal exchange and correlation, the JK-fit set), E_OS/E_SS our DF-MP2 sums on
the KS orbitals and eigenvalues (the MP2-fit set). Following Neese, Schwabe, Grimme, J. Chem. Phys.
126, 124115 (2007), the gradient is

    dE/dx = dE_KS/dx                                  PySCF's DF-RKS gradient (pyscf.df.grad.rks)
          + Σ P h^x - Σ W S^x                          the PT2 Lagrangian's one-electron part
          + Σ P_μν (J - a_x K/2)^x[D]_μν                its two-electron part (JK-fit set, aux response)
          + Σ P_μν ⟨∇(μν)|v_xc⟩ + ∫ ρ_P f_xc ∇ρ_D     its XC part (the Fock matrix's derivative at fixed D)
          + 4 Σ Γ~ (ia|P)^x - 2 Σ γ (P|Q)^x            the 3-index terms (MP2-fit set)
          + dE_disp/dx                                  pyscf-dispersion's gradient

with the PT2 pieces of ``dfmp2.grad.mp2`` (``dfmp2.grad.pairs``: Γ, P_ij, P_ab, Y) scaled by c_os,
c_ss, D = 2 C_o C_o^T, and P the relaxed PT2 density: the Z-vector (``dfmp2.grad.zvector``) solved
with the KS orbital Hessian, whose two-electron part is PySCF's RKS response
G_KS[X] = J[X] - a_x K[X]/2 + f_xc[X] (``mf.gen_response(singlet=None, hermi=1)``: the XC kernel
on the SCF's grid). The grid's own response (its points and Becke weights moving with the atoms)
is in the KS part (PySCF's ``grid_response``) and not in the PT2 part's XC terms: water/cc-pVDZ at
grid level 3 is within 2e-7 Eh/bohr of central differences (docs/double_hybrids.md).

UKS (``_uks_lagrangian``): the same terms per spin σ, D^σ = C_o^σ C_o^σT, with the PT2 pieces of
``dfmp2.grad.ump2`` (Γ^σ, P^σ_ij, P^σ_ab, Y^σ) and its coupled α/β Z-vector solved with PySCF's UKS
response G^σ_KS[X] = J[X^α + X^β] - a_x K[X^σ] + f_xc^σ[X] (``UKSResponse``); the two-electron
part Σ_σ P^σ (J[D^α + D^β] - a_x K[D^σ])^x and the spin-polarised XC part (``fock_deriv``,
``xc_deriv``, which take one spin-summed density for RKS or two for UKS).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from pyscf.grad import rks as rks_grad

from dfmp2.grad import ump2
from dfmp2.grad.common import GradientError, Orbitals
from dfmp2.grad.densities import MP2Densities
from dfmp2.grad.deriv3c import one_electron_deriv
from dfmp2.grad.mp2 import (
    GradientParts,
    check_channels,
    correlation_terms,
    linear_dependence_warnings,
    rhf_record,
    stage_ran,
)
from dfmp2.grad.pairs import corr_intermediates
from dfmp2.grad.plan import DENSITY_PHASES, GradientPlan, choose_plan, default_limit_mb, rhf_shapes, uhf_shapes
from dfmp2.grad.zvector import relaxed_density
from dfmp2.scf.pyscf_scf import pyscf_scratch
from dfmp2.timing import Timer

# The KS part with its grid's response (PySCF's grid_response): water/cc-pVDZ at grid level 3 was
# 2.4e-6 Eh/bohr from central differences without it, 1.3e-7 with it (docs/double_hybrids.md)
KS_GRID_RESPONSE = True


class KSResponse:
    """The RKS orbital Hessian's two-electron part in ``relaxed_density``'s terms (``DFJK``'s AO
    form): ``G`` and ``ao_hessian`` through PySCF's response function of the converged ``mf``
    (J, a_x-scaled K on its JK-fit set, the XC kernel on its grid), C (nao, nmo), nocc."""

    def __init__(self, mf, C: np.ndarray, nocc: int):
        self.vresp = mf.gen_response(singlet=None, hermi=1)
        self.C, self.nocc = C, nocc
        self.mo = None  # no MO factor: relaxed_density's AO form

    def use_ao(self, C_o, C_v) -> None:
        """Nothing to build: every product is a PySCF response call."""

    def G(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """C^T G_KS[C P C^T] C_o (nmo, nocc) (vir_rows False: C_o^T G_KS C_o), P (nmo, nmo) symmetrised."""
        C, Co = self.C, self.C[:, : self.nocc]
        V = self.vresp(C @ (0.5 * (P + P.T)) @ C.T)
        return (C if vir_rows else Co).T @ V @ Co

    def ao_hessian(self):
        """z (nvir, nocc) -> C_v^T G_KS[2 (C_v z C_o^T + h.c.)] C_o."""
        Co, Cv = self.C[:, : self.nocc], self.C[:, self.nocc :]

        def hess(z):
            X = Cv @ z @ Co.T
            return Cv.T @ self.vresp(2.0 * (X + X.T)) @ Co

        return hess


class UKSResponse:
    """The UKS orbital Hessian's two-electron part in ``dfmp2.grad.ump2.relaxed_density``'s terms
    (the peer of its ``UHFResponse``): G^σ_KS[D] = J[D^α + D^β] - a_x K[D^σ] + f_xc^σ[D] through
    PySCF's UKS response function of the converged ``mf`` (``mf.gen_response(hermi=1)``: its
    JK-fit set, the XC kernel on its grid)."""

    def __init__(self, mf):
        self.vresp = mf.gen_response(hermi=1)

    def spin_g(self, D_ao) -> list:
        """G^σ_KS[D] per spin (nao, nao) of D_ao (two (nao, nao), symmetrised)."""
        return list(self.vresp(np.stack([0.5 * (d + d.T) for d in D_ao])))

    def hessian(self, orbs):
        """(hop, hdiag): x (n,) -> (e_a - e_i) x^σ + C_v^σT G^σ_KS[dD] C_o^σ, dD^σ = C_v^σ x^σ C_o^σT
        + h.c., n = Σ_σ nvir_σ nocc_σ (the UHF's ``hessian_product`` convention); hdiag = e_a - e_i."""
        occ = [(o.C[:, o.occ], o.C[:, o.vir], o.eps[o.occ], o.eps[o.vir]) for o in orbs]
        hdiag = np.concatenate([(ev[:, None] - eo[None, :]).ravel() for _, _, eo, ev in occ])

        def hop(x):
            xs, p = [], 0
            for co, cv, _, _ in occ:
                xs.append(np.asarray(x[p : p + cv.shape[1] * co.shape[1]]).reshape(cv.shape[1], co.shape[1]))
                p += xs[-1].size
            dD = np.stack([cv @ xk @ co.T for (co, cv, _, _), xk in zip(occ, xs)])
            V = self.vresp(dD + dD.transpose(0, 2, 1))
            return np.concatenate(
                [
                    (cv.T @ v @ co + ev[:, None] * xk - xk * eo[None, :]).ravel()
                    for (co, cv, eo, ev), v, xk in zip(occ, V, xs)
                ]
            )

        return hop, hdiag


def check_supported(mf, ref, what: str = "the double-hybrid gradient") -> None:
    """GradientError (one line) for a reference ``what`` (the gradient, the relaxed density) does
    not take: not a converged density-fitted PySCF RKS or UKS (exact J/K), or one with a nonlocal
    (VV10) part."""
    from pyscf.dft import rks, uks

    if not isinstance(mf, rks.RKS if ref.restricted else uks.UKS):
        raise GradientError(
            f"{what} differentiates PySCF's RKS (closed shell) or UKS (open shell) "
            f"KS-SCF; this reference is {type(mf).__name__}",
            option="reference",
        )
    if getattr(mf, "with_df", None) is None:
        raise GradientError(f"{what} needs a density-fitted KS-SCF", option="scf_mode")
    if mf.do_nlc():
        raise GradientError(f"{what} has no VV10 (nonlocal) part", option="method")


@dataclass
class Lagrangian:
    """The PT2 Lagrangian's pieces (AO; per spin (2, nao, nao) for UKS, (nao, nao) spin-summed for
    RKS): the KS density D, the relaxed PT2 density P (symmetric), W (energy-weighted, less the
    KS part's; spin-summed), the 3-index derivative corr_3c (natm, 3) Eh/bohr, the PT2 energy
    e_corr (Hartree), the Z-vector's record, and ``record(ran)``: the stage's MP2Densities."""

    e_corr: float
    D: np.ndarray
    P: np.ndarray
    W: np.ndarray
    corr_3c: np.ndarray
    zinfo: dict
    record: object


def dh_gradient(
    mol, ref, mp2_auxmol, dh, backend, *, timer: Timer | None = None, plan: GradientPlan | None = None, world=None
) -> GradientParts:
    """dE/dR (natm, 3) Eh/bohr of ``dh``'s energy (a dfmp2.functionals.DoubleHybrid) for the
    converged DF-RKS or DF-UKS ``ref`` (``ref.mf``, PySCF's; frozen core from its masks), the PT2
    part fitted with ``mp2_auxmol`` on ``backend`` (fp64): ``_rks_lagrangian`` or
    ``_uks_lagrangian``, then the derivatives they share. Over ranks (``world``) the PT2 pair
    loops and 3-center derivatives are split, the KS steps run whole on every rank.
    GradientParts: ``hf`` the KS part, ``corr`` the PT2 and dispersion parts; ``double_hybrid``
    their record (``parts_record``)."""
    mf = ref.mf
    check_supported(mf, ref)
    check_channels(ref, backend)
    if plan is None:
        shapes = rhf_shapes if ref.restricted else uhf_shapes
        plan = choose_plan(shapes(mol, ref, mp2_auxmol, mf.with_df.auxmol), default_limit_mb())
    timer = timer or Timer(backend)
    kernels0 = (dict(backend.kernels_used), dict(backend.kernels_used))
    t0 = time.perf_counter()
    lagrangian = _rks_lagrangian if ref.restricted else _uks_lagrangian
    with pyscf_scratch(plan.scratch_dir) as tmp:  # PySCF's files (its DF tensor, when rebuilt there)
        df_tensor_back(mf, tmp)
        lag, t0 = lagrangian(mol, mp2_auxmol, mf, ref, dh, backend, timer, t0, plan, world)
        lag.zinfo["form"] = "ks-response"
        t0 = timer.add("grad_zvector", t0)
        mf_grad = mf.nuc_grad_method()
        fock = fock_deriv(mf_grad, lag.D, lag.P)
        mf_grad.grid_response = KS_GRID_RESPONSE
        ks = mf_grad.grad_elec() + mf_grad.grad_nuc()
    P_tot = lag.P if ref.restricted else lag.P[0] + lag.P[1]
    pt2 = one_electron_deriv(mol, [(P_tot, lag.W)])[0] + fock + lag.corr_3c
    disp = dispersion_gradient(mol, dh)
    timer.add("grad_derivative_integrals", t0)
    grad = ks + pt2 + disp
    ran = stage_ran(backend, backend, kernels0)
    ran["reference"] = "rks" if ref.restricted else "uks"
    ran["plan"] = None
    parts = GradientParts(
        grad,
        ks,
        grad - ks,
        lag.e_corr,
        dh.c_os,
        dh.c_ss,
        lag.zinfo,
        linear_dependence_warnings(np.asarray(ref.channels[0].mo_coeff)),
        {k: v for k, v in timer.seconds.items() if k.startswith("grad_")},
        ran,
        {k: v for k, v in timer.stage_flops().items() if k.startswith("grad_")},
        lag.record(ran),
        peak_rss_mb={k: v for k, v in timer.stage_rss().items() if k.startswith("grad_")},
    )
    parts.double_hybrid = parts_record(dh, mf, ks, pt2, disp)
    return parts


def dh_densities(
    mol, ref, mp2_auxmol, dh, backend, *, timer: Timer | None = None, plan: GradientPlan | None = None, world=None
) -> MP2Densities:
    """The one-particle densities of ``dh``'s energy (a dfmp2.functionals.DoubleHybrid) without
    any derivative integral, for a one-electron property (a dipole: -dE/dF): the converged DF-RKS
    or DF-UKS ``ref`` (``ref.mf``; frozen core from its mask), the PT2 pair loops fitted with
    ``mp2_auxmol`` on ``backend`` (fp64), then the Z-vector with the KS response (``KSResponse``,
    ``UKSResponse``: the gradient's own). An MP2Densities whose 'hf' kind is the KS determinant's
    density and whose 'relaxed' one is D_KS + P (c_os, c_ss the functional's); 'unrelaxed' D_KS +
    the scaled P_ij, P_ab (per spin for UKS). E_disp has no field dependence. ``plan``: the blocks
    of the pair loop (default: the fastest whose density phases fit). Timed as
    'props_mp2_densities' and 'props_zvector'."""
    mf = ref.mf
    check_supported(mf, ref, "the relaxed density")
    check_channels(ref, backend)
    if plan is None:
        shapes = (rhf_shapes if ref.restricted else uhf_shapes)(mol, ref, mp2_auxmol, mf.with_df.auxmol)
        plan = choose_plan(shapes, default_limit_mb(), phases=DENSITY_PHASES, stage="density")
    timer = timer or Timer(backend)
    kernels0 = (dict(backend.kernels_used), dict(backend.kernels_used))
    t0 = time.perf_counter()
    if ref.restricted:
        orb = Orbitals(ref.channels[0])
        corr = corr_intermediates(
            mol, mp2_auxmol, orb, backend, dh.c_os, dh.c_ss, plan=plan, response=True, world=world
        )
        corr.T_v = None  # the derivative weights' half back-transform: not needed for a density
    else:
        orbs = [Orbitals(ch) for ch in ref.channels]
        _, P, Y, _, _ = ump2.corr_uhf(mol, mp2_auxmol, orbs, backend, dh.c_os, dh.c_ss, plan=plan, world=world)
        P_unrelaxed = [p.copy() for p in P]
    t0 = timer.add("props_mp2_densities", t0)
    with pyscf_scratch(plan.scratch_dir) as tmp:  # PySCF's files (its DF tensor, when rebuilt there)
        df_tensor_back(mf, tmp)
        if ref.restricted:
            P, _, zinfo = relaxed_density(orb, corr, KSResponse(mf, orb.C, len(orb.occ)), None, "ao")
        else:
            P, _, zinfo = ump2.relaxed_density(orbs, P, Y, UKSResponse(mf))
    zinfo["form"] = "ks-response"
    timer.add("props_zvector", t0)
    ran = stage_ran(backend, backend, kernels0)
    for k in ("on_device", "host"):  # the gradient's words: they name its derivative steps
        ran.pop(k, None)
    ran["reference"] = "rks" if ref.restricted else "uks"
    ran["response"] = (
        f"PySCF's {'R' if ref.restricted else 'U'}KS response (mf.gen_response): J, a_x K on the JK-fit set, "
        "f_xc on the SCF's grid"
    )
    timings = {k: v for k, v in timer.seconds.items() if k in ("props_mp2_densities", "props_zvector")}
    if ref.restricted:
        return rhf_record(orb, corr, P, dh.c_os, dh.c_ss, zinfo, ran, timings)
    return ump2.uhf_record(orbs, P_unrelaxed, P, dh.c_os, dh.c_ss, zinfo, ran, timings)


def _rks_lagrangian(mol, mp2_auxmol, mf, ref, dh, backend, timer: Timer, t0: float, plan, world):  # noqa: PLR0913
    """The closed shell's PT2 pieces (``correlation_terms``, spin-summed) and its relaxed density
    (``dfmp2.grad.zvector.relaxed_density`` with ``KSResponse``). Returns (Lagrangian, t0)."""
    orb = Orbitals(ref.channels[0])
    corr, corr_3c, t0 = correlation_terms(mol, mp2_auxmol, orb, backend, dh.c_os, dh.c_ss, timer, t0, None, plan, world)
    P, Y, zinfo = relaxed_density(orb, corr, KSResponse(mf, orb.C, len(orb.occ)), None, "ao")
    C_o = orb.C[:, orb.occ]
    P_ao = orb.C @ P @ orb.C.T
    # Y holds the HF-like part 4 e_k on its occupied diagonal (relaxed_density): W less it
    W = 0.5 * orb.C @ (0.5 * (Y + Y.T)) @ orb.C.T - 2.0 * (C_o * orb.eps[orb.occ]) @ C_o.T
    record = lambda ran: rhf_record(orb, corr, P, dh.c_os, dh.c_ss, zinfo, ran)
    return Lagrangian(corr.e_corr, 2.0 * C_o @ C_o.T, 0.5 * (P_ao + P_ao.T), W, corr_3c, zinfo, record), t0


def _uks_lagrangian(mol, mp2_auxmol, mf, ref, dh, backend, timer: Timer, t0: float, plan, world):  # noqa: PLR0913
    """The open shell's PT2 pieces per spin (``dfmp2.grad.ump2.correlation_terms_uhf``) and its
    relaxed density (the coupled α/β Z-vector, ``dfmp2.grad.ump2.relaxed_density`` with
    ``UKSResponse``). Returns (Lagrangian, t0)."""
    orbs = [Orbitals(ch) for ch in ref.channels]
    e_corr, P, Y, corr_3c, t0 = ump2.correlation_terms_uhf(
        mol, mp2_auxmol, orbs, backend, dh.c_os, dh.c_ss, timer, t0, plan, world
    )
    P_unrelaxed = [p.copy() for p in P]
    P, Y, zinfo = ump2.relaxed_density(orbs, P, Y, UKSResponse(mf))
    C_o = [o.C[:, o.occ] for o in orbs]
    P_ao = np.stack([o.C @ (0.5 * (p + p.T)) @ o.C.T for o, p in zip(orbs, P)])
    # Y^σ holds the HF-like part 2 e_k on its occupied diagonal (relaxed_density): W less it
    W = sum(0.5 * o.C @ (0.5 * (y + y.T)) @ o.C.T - (c * o.eps[o.occ]) @ c.T for o, y, c in zip(orbs, Y, C_o))
    record = lambda ran: ump2.uhf_record(orbs, P_unrelaxed, P, dh.c_os, dh.c_ss, zinfo, ran)
    return Lagrangian(e_corr, np.stack([c @ c.T for c in C_o]), P_ao, W, corr_3c, zinfo, record), t0


def df_tensor_back(mf, tmp) -> None:
    """PySCF's DF tensor of ``mf`` again when the SCF kept it in a file of its scratch directory,
    removed since (``pyscf_scf.pyscf_scratch``): rebuilt under ``tmp`` (the Z-vector's J/K read it)."""
    from pathlib import Path

    cderi = getattr(mf.with_df, "_cderi", None)
    if isinstance(cderi, str) and not Path(cderi).exists():
        mf.with_df._cderi, mf.with_df._cderi_to_save = None, str(Path(tmp) / "pyscf-df-tensor.h5")
        mf.with_df.build()


def fock_deriv(mf_grad, D: np.ndarray, P: np.ndarray) -> np.ndarray:
    """(natm, 3) Eh/bohr: the explicit derivative of Σ_σ P^σ_μν F^σ_μν[D] at fixed D and P (AO,
    symmetric; RKS: (nao, nao) spin-summed, UKS: (2, nao, nao) per spin), F's two-electron and XC
    parts: Σ P_t J^x[D_t] - c_K Σ_σ P^σ K^x[D^σ] (c_K = a_x/2 spin-summed, a_x per spin) on the
    SCF's JK-fit set with its auxiliary-basis response (PySCF's DF J/K derivatives, bilinear in
    (D, P)), and the XC part on the SCF's grid (``xc_deriv``)."""
    mf, mol = mf_grad.base, mf_grad.mol
    ni = mf._numint
    omega, _, hyb = ni.rsh_and_hybrid_coeff(mf.xc, spin=mol.spin)
    if omega != 0:
        raise GradientError("the double-hybrid gradient has no range-separated exchange", option="method")
    Ds, Ps = (D, P) if D.ndim == 3 else (D[None], P[None])
    ns, c_k = len(Ds), hyb if D.ndim == 3 else 0.5 * hyb
    dms = np.concatenate([Ds, Ps])
    if abs(hyb) > 1e-14:
        vj, vk = mf_grad.get_jk(mol, dms, hermi=1)
    else:
        vj, vk = mf_grad.get_j(mol, dms, hermi=1), None
    # B(X, Y) = X.J[Y]/2: its AO part Σ_atom (vj[Y].X + vj[X].Y) (rows of the atom), aux part sym(aux[X, Y])
    pairs = [(2.0 * vj[:ns].sum(axis=0), Ps.sum(axis=0)), (2.0 * vj[ns:].sum(axis=0), Ds.sum(axis=0))]
    if vk is not None:  # (derivative matrix, the density it pairs with)
        pairs += [(-2.0 * c_k * vk[s], Ps[s]) for s in range(ns)] + [
            (-2.0 * c_k * vk[ns + s], Ds[s]) for s in range(ns)
        ]
    de = np.zeros((mol.natm, 3))
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        de[a] = sum(np.einsum("xij,ij->x", v[:, p0:p1], m[p0:p1]) for v, m in pairs)
    if mf_grad.auxbasis_response:
        de += sum(vj.aux[i, ns + j] + vj.aux[ns + j, i] for i in range(ns) for j in range(ns))
        if vk is not None:
            de -= c_k * sum(vk.aux[s, ns + s] + vk.aux[ns + s, s] for s in range(ns))
    return de + xc_deriv(mf, mol, D, P)


def xc_deriv(mf, mol, D: np.ndarray, P: np.ndarray) -> np.ndarray:
    """(natm, 3) Eh/bohr: d/dx of Σ_σ P^σ_μν V^σ_xc[ρ_D]_μν at fixed D and P (AO, symmetric; RKS
    (nao, nao) spin-summed, UKS (2, nao, nao) per spin) on the SCF's fixed grid: 2 Σ_σ Σ_μ∈A
    P^σ_μν ⟨-∇μ|v^σ_xc|ν⟩ (the basis functions' move) + 2 Σ_τ Σ_μ∈A D^τ_μν ⟨-∇μ|Σ_σ f^στ_xc
    ρ_P^σ|ν⟩ (ρ_D's change through them, f_xc contracted with P's densities), for LDA, GGA and
    meta-GGA (PySCF's rks gradient helpers; the per-point weights of its rks and uks get_vxc)."""
    ni, grids, xc = mf._numint, mf.grids, mf.xc
    xctype = ni._xc_type(xc)
    if xctype == "HF":
        return np.zeros((mol.natm, 3))
    if xctype not in ("LDA", "GGA", "MGGA"):
        raise GradientError(f"the double-hybrid gradient has no {xctype} XC part", option="method")
    spin = int(D.ndim == 3)
    Ds, Ps = (D, P) if spin else (D[None], P[None])
    ns, nao, ao_loc = len(Ds), mol.nao_nr(), mol.ao_loc_nr()
    v_p, v_d = np.zeros((ns, 3, nao, nao)), np.zeros((ns, 3, nao, nao))  # contract with P^σ and D^σ
    ncomp = {"LDA": 1, "GGA": 4, "MGGA": 5}[xctype]
    for ao, mask, weight, _ in ni.block_loop(mol, grids, nao, 1 if xctype == "LDA" else 2, mf.max_memory):
        ao_rho = ao[0] if xctype == "LDA" else ao[:10] if xctype == "MGGA" else ao[:4]
        rho, rho1 = (
            np.stack(
                [ni.eval_rho(mol, ao_rho, m, mask, xctype, hermi=1, with_lapl=False).reshape(ncomp, -1) for m in ms]
            )
            for ms in (Ds, Ps)
        )  # (ns, ncomp, ngrid)
        r = rho[:, 0] if xctype == "LDA" else rho
        vxc, fxc = ni.eval_xc_eff(xc, r if spin else r[0], 2, xctype=xctype, spin=spin)[1:3]
        vxc, fxc = vxc.reshape(ns, ncomp, -1), fxc.reshape(ns, ncomp, ns, ncomp, -1)
        wf = np.einsum("syg,sytxg->txg", rho1, fxc) * weight
        for s in range(ns):
            for vmat, wv in ((v_p[s], vxc[s] * weight), (v_d[s], wf[s])):
                _grad_sum(vmat, mol, ao, wv, mask, ao_loc, xctype)
    de = np.zeros((mol.natm, 3))
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):  # -vmat: ∇_A = -∇_r
        de[a] = -2.0 * sum(
            np.einsum("xij,ij->x", v_p[s][:, p0:p1], Ps[s][p0:p1])
            + np.einsum("xij,ij->x", v_d[s][:, p0:p1], Ds[s][p0:p1])
            for s in range(ns)
        )
    return de


def _grad_sum(vmat, mol, ao, wv, mask, ao_loc, xctype) -> None:
    """vmat (3, nao, nao) += ⟨∇μ|w|ν⟩ for the per-point weights ``wv`` (ncomp, ngrid) of one grid
    block, as PySCF's rks get_vxc adds them (its halved density and tau components)."""
    from pyscf.dft import numint

    if xctype == "LDA":
        rks_grad._d1_dot_(vmat, mol, ao[1:4], numint._scale_ao(ao[0], wv[0]), mask, ao_loc, True)
        return
    wv = wv.copy()
    wv[0] *= 0.5
    if xctype == "MGGA":
        wv[4] *= 0.5
    rks_grad._gga_grad_sum_(vmat, mol, ao, wv, mask, ao_loc)
    if xctype == "MGGA":
        rks_grad._tau_grad_dot_(vmat, mol, ao, wv[4], mask, ao_loc, True)


def dispersion_gradient(mol, dh) -> np.ndarray:
    """(natm, 3) Eh/bohr: the gradient of ``dh``'s D3(BJ) or D4 term (pyscf-dispersion, the
    parameters the energy used: dfmp2.mp2.double_hybrids.dispersion_energy); zeros without one.
    Ghost atoms have none (their rows stay zero)."""
    out = np.zeros((mol.natm, 3))
    if dh.dispersion is None:
        return out
    from pyscf import gto

    from dfmp2.mp2.double_hybrids import dispersion_model

    g = np.asarray(dispersion_model(mol, dh).get_dispersion(grad=True)["gradient"])
    real = [i for i in range(mol.natm) if not gto.is_ghost_atom(mol.atom_symbol(i))]
    out[real] = g
    return out


def parts_record(dh, mf, ks: np.ndarray, pt2: np.ndarray, disp: np.ndarray) -> dict:
    """What the gradient JSON's ``double_hybrid`` says: the functional, its parts (Eh/bohr) and the
    grid (its response: not included)."""
    kind = "uks" if mf.istype("UKS") else "rks"
    return {
        "functional": dh.name,
        "xc": dh.xc,
        "ks": ks.tolist(),
        "pt2": pt2.tolist(),
        "dispersion": None if dh.dispersion is None else disp.tolist(),
        "grid_level": int(mf.grids.level),
        "grid_response": {"ks": KS_GRID_RESPONSE, "pt2": False},
        "ks_gradient": f"pyscf.df.grad.{kind} (JK-fit set with its auxiliary-basis response)",
    }
