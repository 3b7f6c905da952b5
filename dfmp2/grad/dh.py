"""The closed-shell (RKS) double-hybrid nuclear gradient: a stage after the energy, a peer of
``dfmp2.grad.mp2`` (fp64).

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
"""

from __future__ import annotations

import time

import numpy as np
from pyscf.grad import rks as rks_grad

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
from dfmp2.grad.plan import DENSITY_PHASES, GradientPlan, choose_plan, default_limit_mb, rhf_shapes
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


def check_supported(mf, ref, what: str = "the double-hybrid gradient") -> None:
    """GradientError (one line) for a reference ``what`` (the gradient, the relaxed density) does
    not take: not a converged density-fitted PySCF RKS (a UKS double hybrid, exact J/K), or one
    with a nonlocal (VV10) part."""
    from pyscf.dft import rks

    if not ref.restricted or not isinstance(mf, rks.RKS):
        raise GradientError(
            f"{what} of double hybrids is implemented for closed shells (RKS) only; "
            "an open-shell (UKS) double hybrid's is not",
            option="reference",
        )
    if getattr(mf, "with_df", None) is None:
        raise GradientError(f"{what} needs a density-fitted KS-SCF", option="scf_mode")
    if mf.do_nlc():
        raise GradientError(f"{what} has no VV10 (nonlocal) part", option="method")


def dh_gradient(
    mol, ref, mp2_auxmol, dh, backend, *, timer: Timer | None = None, plan: GradientPlan | None = None, world=None
) -> GradientParts:
    """dE/dR (natm, 3) Eh/bohr of ``dh``'s energy (a dfmp2.functionals.DoubleHybrid) for the
    converged DF-RKS ``ref`` (``ref.mf``, PySCF's; frozen core from its mask), the PT2 part fitted
    with ``mp2_auxmol`` on ``backend`` (fp64). GradientParts: ``hf`` the KS part, ``corr`` the PT2
    and dispersion parts; ``double_hybrid`` their record (``parts_record``)."""
    mf = ref.mf
    check_supported(mf, ref)
    check_channels(ref, backend)
    if plan is None:
        plan = choose_plan(rhf_shapes(mol, ref, mp2_auxmol, mf.with_df.auxmol), default_limit_mb())
    timer = timer or Timer(backend)
    kernels0 = (dict(backend.kernels_used), dict(backend.kernels_used))
    t0 = time.perf_counter()
    orb = Orbitals(ref.channels[0])
    corr, corr_3c, t0 = correlation_terms(mol, mp2_auxmol, orb, backend, dh.c_os, dh.c_ss, timer, t0, None, plan, world)
    with pyscf_scratch(plan.scratch_dir) as tmp:  # PySCF's files (its DF tensor, when rebuilt there)
        df_tensor_back(mf, tmp)
        P, Y, zinfo = ks_relaxed_density(mf, orb, corr)
        t0 = timer.add("grad_zvector", t0)
        ks, fock, t0 = _ks_terms(mf, orb, P, timer, t0)
    C_o = orb.C[:, orb.occ]
    P_ao = orb.C @ P @ orb.C.T
    # Y holds the HF-like part 4 e_k on its occupied diagonal (relaxed_density): W less it
    W = 0.5 * orb.C @ (0.5 * (Y + Y.T)) @ orb.C.T - 2.0 * (C_o * orb.eps[orb.occ]) @ C_o.T
    pt2 = one_electron_deriv(mol, [(0.5 * (P_ao + P_ao.T), W)])[0] + fock + corr_3c
    disp = dispersion_gradient(mol, dh)
    timer.add("grad_derivative_integrals", t0)
    grad = ks + pt2 + disp
    ran = stage_ran(backend, backend, kernels0)
    ran["reference"] = "rks"
    ran["plan"] = None
    parts = GradientParts(
        grad,
        ks,
        grad - ks,
        corr.e_corr,
        dh.c_os,
        dh.c_ss,
        zinfo,
        linear_dependence_warnings(orb.C),
        {k: v for k, v in timer.seconds.items() if k.startswith("grad_")},
        ran,
        {k: v for k, v in timer.stage_flops().items() if k.startswith("grad_")},
        rhf_record(orb, corr, P, dh.c_os, dh.c_ss, zinfo, ran),
        peak_rss_mb={k: v for k, v in timer.stage_rss().items() if k.startswith("grad_")},
    )
    parts.double_hybrid = parts_record(dh, mf, ks, pt2, disp)
    return parts


def ks_relaxed_density(mf, orb: Orbitals, corr) -> tuple:
    """The relaxed PT2 density of a double hybrid, its one step through PySCF's KS objects: the
    Z-vector (``zvector.relaxed_density``, AO form) of the pair loop's ``corr`` (scaled by c_os,
    c_ss) with the KS orbital Hessian of the converged DF-RKS ``mf`` (``KSResponse``; its DF
    tensor must be there: ``df_tensor_back``). Returns (P, Y (nmo, nmo) MO: P the correlation part
    of the relaxed density, electrons; the Z-vector's record, its form 'ks-response'). The gradient
    (``dh_gradient``) and the density stage (``dh_densities``) both call it."""
    P, Y, zinfo = relaxed_density(orb, corr, KSResponse(mf, orb.C, len(orb.occ)), None, "ao")
    zinfo["form"] = "ks-response"
    return P, Y, zinfo


def dh_densities(
    mol, ref, mp2_auxmol, dh, backend, *, timer: Timer | None = None, plan: GradientPlan | None = None, world=None
) -> MP2Densities:
    """The one-particle densities of ``dh``'s energy (a dfmp2.functionals.DoubleHybrid) without
    any derivative integral, for a one-electron property (a dipole: -dE/dF): the converged DF-RKS
    ``ref`` (``ref.mf``; frozen core from its mask), the PT2 pair loop fitted with ``mp2_auxmol``
    on ``backend`` (fp64), then ``ks_relaxed_density``. An MP2Densities whose 'hf' kind is the KS
    determinant's density D_KS = 2 C_o C_o^T and whose 'relaxed' one is D_KS + P (c_os, c_ss the
    functional's); 'unrelaxed' D_KS + the scaled P_ij, P_ab. E_disp has no field dependence.
    ``plan``: the blocks of the pair loop (default: the fastest whose density phases fit).
    Timed as 'props_mp2_densities' and 'props_zvector'. An open-shell (UKS) reference: one
    GradientError (``check_supported``) until a UKS Z-vector is here."""
    mf = ref.mf
    check_supported(mf, ref, "the relaxed density")
    check_channels(ref, backend)
    if plan is None:
        shapes = rhf_shapes(mol, ref, mp2_auxmol, mf.with_df.auxmol)
        plan = choose_plan(shapes, default_limit_mb(), phases=DENSITY_PHASES, stage="density")
    timer = timer or Timer(backend)
    kernels0 = (dict(backend.kernels_used), dict(backend.kernels_used))
    t0 = time.perf_counter()
    orb = Orbitals(ref.channels[0])
    corr = corr_intermediates(mol, mp2_auxmol, orb, backend, dh.c_os, dh.c_ss, plan=plan, response=True, world=world)
    corr.T_v = None  # the derivative weights' half back-transform: not needed for a density
    t0 = timer.add("props_mp2_densities", t0)
    with pyscf_scratch(plan.scratch_dir) as tmp:  # PySCF's files (its DF tensor, when rebuilt there)
        df_tensor_back(mf, tmp)
        P, _, zinfo = ks_relaxed_density(mf, orb, corr)
    timer.add("props_zvector", t0)
    ran = stage_ran(backend, backend, kernels0)
    for k in ("on_device", "host"):  # the gradient's words: they name its derivative steps
        ran.pop(k, None)
    ran["reference"] = "rks"
    ran["response"] = "PySCF's RKS response (mf.gen_response): J, a_x K on the JK-fit set, f_xc on the SCF's grid"
    timings = {k: v for k, v in timer.seconds.items() if k in ("props_mp2_densities", "props_zvector")}
    return rhf_record(orb, corr, P, dh.c_os, dh.c_ss, zinfo, ran, timings)


def _ks_terms(mf, orb: Orbitals, P: np.ndarray, timer: Timer, t0: float):
    """``dh_gradient``'s derivative steps through PySCF's KS objects, after the relaxed density
    ``P`` (MO): the Fock matrix's explicit derivative and the KS gradient (with its grid
    response). Returns (ks, fock (natm, 3), t0)."""
    C_o = orb.C[:, orb.occ]
    P_ao = orb.C @ P @ orb.C.T
    mf_grad = mf.nuc_grad_method()
    fock = fock_deriv(mf_grad, 2.0 * C_o @ C_o.T, 0.5 * (P_ao + P_ao.T))
    mf_grad.grid_response = KS_GRID_RESPONSE
    ks = mf_grad.grad_elec() + mf_grad.grad_nuc()
    return ks, fock, timer.add("grad_derivative_integrals", t0)


def df_tensor_back(mf, tmp) -> None:
    """PySCF's DF tensor of ``mf`` again when the SCF kept it in a file of its scratch directory,
    removed since (``pyscf_scf.pyscf_scratch``): rebuilt under ``tmp`` (the Z-vector's J/K read it)."""
    from pathlib import Path

    cderi = getattr(mf.with_df, "_cderi", None)
    if isinstance(cderi, str) and not Path(cderi).exists():
        mf.with_df._cderi, mf.with_df._cderi_to_save = None, str(Path(tmp) / "pyscf-df-tensor.h5")
        mf.with_df.build()


def fock_deriv(mf_grad, D: np.ndarray, P: np.ndarray) -> np.ndarray:
    """(natm, 3) Eh/bohr: the explicit derivative of Σ P_μν F_μν[D] at fixed D and P (AO,
    symmetric), F's two-electron and XC parts: Σ P (J - a_x K/2)^x[D] on the SCF's JK-fit set with
    its auxiliary-basis response (PySCF's DF J/K derivatives, bilinear in (D, P)), and
    Σ P ⟨∇(μν)|v_xc[ρ_D]⟩ + ∫ ρ_P f_xc[ρ_D] ∇_x ρ_D on the SCF's grid (``xc_deriv``)."""
    mf, mol = mf_grad.base, mf_grad.mol
    ni = mf._numint
    omega, _, hyb = ni.rsh_and_hybrid_coeff(mf.xc, spin=mol.spin)
    if omega != 0:
        raise GradientError("the double-hybrid gradient has no range-separated exchange", option="method")
    dms = np.asarray([D, P])
    if abs(hyb) > 1e-14:
        vj, vk = mf_grad.get_jk(mol, dms, hermi=1)
    else:
        vj, vk = mf_grad.get_j(mol, dms, hermi=1), None
    # B(X, Y) = X.J[Y]/2: its AO part Σ_atom (vj[Y].X + vj[X].Y) (rows of the atom), aux part sym(aux[X, Y])
    v_p = 2.0 * vj[0] - (hyb * vk[0] if vk is not None else 0.0)  # pairs with P
    v_d = 2.0 * vj[1] - (hyb * vk[1] if vk is not None else 0.0)  # pairs with D
    de = np.zeros((mol.natm, 3))
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        de[a] = np.einsum("xij,ij->x", v_p[:, p0:p1], P[p0:p1]) + np.einsum("xij,ij->x", v_d[:, p0:p1], D[p0:p1])
    if mf_grad.auxbasis_response:
        aux = vj.aux[0, 1] + vj.aux[1, 0]
        if vk is not None:
            aux = aux - 0.5 * hyb * (vk.aux[0, 1] + vk.aux[1, 0])
        de += aux
    return de + xc_deriv(mf, mol, D, P)


def xc_deriv(mf, mol, D: np.ndarray, P: np.ndarray) -> np.ndarray:
    """(natm, 3) Eh/bohr: d/dx of Σ P_μν V_xc[ρ_D]_μν at fixed D and P (AO, symmetric) on the
    SCF's fixed grid: 2 Σ_μ∈A P_μν ⟨-∇μ|v_xc|ν⟩ (the basis functions' move) + 2 Σ_μ∈A D_μν
    ⟨-∇μ|f_xc ρ_P|ν⟩ (ρ_D's change through them, f_xc contracted with P's density), for LDA, GGA
    and meta-GGA (PySCF's rks gradient helpers; the same per-point weights as its get_vxc)."""
    ni, grids, xc = mf._numint, mf.grids, mf.xc
    xctype = ni._xc_type(xc)
    if xctype == "HF":
        return np.zeros((mol.natm, 3))
    if xctype not in ("LDA", "GGA", "MGGA"):
        raise GradientError(f"the double-hybrid gradient has no {xctype} XC part", option="method")
    nao, ao_loc = mol.nao_nr(), mol.ao_loc_nr()
    v_p, v_d = np.zeros((3, nao, nao)), np.zeros((3, nao, nao))  # contract with P and D
    ncomp = {"LDA": 1, "GGA": 4, "MGGA": 5}[xctype]
    for ao, mask, weight, _ in ni.block_loop(mol, grids, nao, 1 if xctype == "LDA" else 2, mf.max_memory):
        ao_rho = ao[0] if xctype == "LDA" else ao[:10] if xctype == "MGGA" else ao[:4]
        rho = ni.eval_rho(mol, ao_rho, D, mask, xctype, hermi=1, with_lapl=False)
        vxc, fxc = ni.eval_xc_eff(xc, rho, 2, xctype=xctype)[1:3]
        rho1 = ni.eval_rho(mol, ao_rho, P, mask, xctype, hermi=1, with_lapl=False).reshape(ncomp, -1)
        wf = np.einsum("yg,xyg->xg", rho1, fxc) * weight
        for vmat, wv in ((v_p, vxc.reshape(ncomp, -1) * weight), (v_d, wf)):
            _grad_sum(vmat, mol, ao, wv, mask, ao_loc, xctype)
    de = np.zeros((mol.natm, 3))
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):  # -vmat: ∇_A = -∇_r
        de[a] = -2.0 * (
            np.einsum("xij,ij->x", v_p[:, p0:p1], P[p0:p1]) + np.einsum("xij,ij->x", v_d[:, p0:p1], D[p0:p1])
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
    return {
        "functional": dh.name,
        "xc": dh.xc,
        "ks": ks.tolist(),
        "pt2": pt2.tolist(),
        "dispersion": None if dh.dispersion is None else disp.tolist(),
        "grid_level": int(mf.grids.level),
        "grid_response": {"ks": KS_GRID_RESPONSE, "pt2": False},
        "ks_gradient": "pyscf.df.grad.rks (JK-fit set with its auxiliary-basis response)",
    }
