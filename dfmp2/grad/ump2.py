"""The UHF DF-MP2 nuclear gradient: the spin-unrestricted peer of ``dfmp2.grad.mp2`` (fp64), the
derivative of exactly the energy ``dfmp2 run`` prints for a UHF reference,
    E = E_UHF[DF, JK-fit set] + c_os E_OS + c_ss E_SS[DF, MP2-fit set]
(MP2, SCS-MP2, SOS-MP2 through ``dfmp2.grad.mp2.SCALES``), frozen core as the energy freezes it (the
same lowest orbitals in both spins). Notation as ``dfmp2.grad.mp2``'s, with σ, τ the spins (τ ≠ σ):
i, j active occupied, I frozen occupied, k any occupied, a, b virtual of one spin.

    K^στ_iajb = Σ_Q B^σ_ia^Q B^τ_jb^Q,  B^σ = (ia|P)^σ L^-T,  D_ijab = e_i + e_j - e_a - e_b
    same spin:  t~_ijab = (K_iajb - K_ibja) / D      E_SS = Σ_σ 1/2 Σ t~ K^σσ
    αβ:         t_iajb = K^αβ_iajb / D               E_OS = Σ t K^αβ
    Γ^α_ia^Q = c_ss/2 Σ_jb t~^αα_ijab B^α_jb + c_os/2 Σ_jb t_iajb B^β_jb     (Γ^β alike)
    Γ~^σ = Γ^σ L^-1,  γ = Σ_σ L^-T (B^σT Γ^σ) L^-1
    P^α_ij = -c_ss/2 Σ_kab t~_ikab t~_jkab - c_os Σ_kab t_iakb t_jakb        (β alike)
    P^α_ab =  c_ss/2 Σ_ijc t~_ijac t~_ijbc + c_os Σ_ijc t_iajc t_ibjc
    Y^σ_rp, the coefficient of U^σ_rp (C^σ(x) = C^σ U^σ) in dE:
          Y^σ_ri += 4 Σ_aP (ra|P) Γ~^σ_iaP,  Y^σ_ra += 4 Σ_iP (ir|P) Γ~^σ_iaP,  Y^σ_qp += 2 P^σ_pq e_q,
          Y^σ_rk += 2 (C^σT G^σ[P] C^σ)_rk,  Y^σ_kk += 2 e_k (UHF);
          G^σ[P] = J[P^α + P^β] - K[P^σ] (JK-fit set)
    P^σ_Ij = Y^σ_Ij / (2 (e_j - e_I))                        frozen-active block, per spin
    Z-vector (the coupled α/β CPHF of the DF-UHF): (e_a - e_i) z^σ_ai + (C_v^σT G^σ[dD] C_o^σ)_ai = R^σ_ai
          = Y^σ_ai - Y^σ_ia,  dD^τ = C_v^τ z^τ C_o^τT + h.c.;  P^σ_ai = P^σ_ia = -z^σ_ai / 2
          (the operator is ``dfmp2.scf.uhf.DFUHF.hessian_product``'s, over the gradient's JK factor)
    dE/dx = Σ_σ (D^σ + P^σ) h^x - Σ W S^x + E_nuc^x + E_G^x(D^σ/2 + P^σ)[JK-fit]
            + 4 Σ_σ Γ~^σ_iaP (ia|P)^x - 2 Σ γ_PQ (P|Q)^x [MP2-fit],   W = Σ_σ C^σ sym(Y^σ) C^σT / 2
with D^σ = C_o^σ C_o^σT and E_G(D1) = Σ_σ D1^σ G^σ[D] (J of the total density, K per spin).
For α = β every term is half the RHF's spin-summed one (the RHF gradient; tested).

Cost: the pair loops (``dfmp2.grad.pairs.pair_densities``) are the energy's (αα, ββ, αβ) plus a second
αβ pass from the β side (P^β_oo's sum runs over two β orbitals of one α): about E_aa + E_bb +
2 E_ab, each at the RHF loop's cost per pair.
Memory: a ``dfmp2.grad.plan.GradientPlan`` of ``uhf_shapes`` (``uhf_phase_mb``), the RHF stage's
phases in its order: the correlation part (B^σ and Γ^σ of both spins, then per spin Γ~ and its half
back-transform T_v, nao naux_mp2 nact_σ) and its derivative integrals before the JK factor; the
factor in memory, split over the ranks or on disk; the Z-vector's J/K streamed over it per aux block;
the JK derivative with each spin's fitted MO coefficients held and the rest per aux block
(``dfmp2.grad.jk_deriv.jk_energy_deriv_blocked``). The same J/K (``DFJK``'s factor), derivative
integrals (``dfmp2.grad.deriv3c``: ``df_deriv``, ``one_electron_deriv``) and linear dependence warning as the
RHF stage.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse.linalg
import torch
from pyscf.grad import rhf as pyscf_grad_rhf

from dfmp2 import memory
from dfmp2.grad.common import GradientError, Orbitals, host_tensor, metric_cholesky, on_device
from dfmp2.grad.densities import from_correlation
from dfmp2.grad.deriv3c import df_deriv, one_electron_deriv
from dfmp2.grad.jk_deriv import DFJK, jk_energy_deriv_blocked
from dfmp2.grad.mp2 import ON_HOST, GradientParts, check_channels, linear_dependence_warnings, orb_frozen
from dfmp2.grad.pairs import fit_b, gamma3_weights, gamma_terms, pair_densities, response_3c
from dfmp2.grad.plan import AUX_BLOCK_MB, PAIR_BLOCK_MB, GradientPlan, choose_plan, default_limit_mb, uhf_shapes
from dfmp2.grad.zvector import ZVECTOR_MAX_ITER, ZVECTOR_TOL
from dfmp2.scf.uhf import DFUHF
from dfmp2.timing import Timer


def uhf_mp2_gradient(  # noqa: PLR0913
    mol,
    ref,
    mp2_auxmol,
    jk_auxmol,
    backend,
    *,
    c_os: float = 1.0,
    c_ss: float = 1.0,
    timer: Timer | None = None,
    plan: GradientPlan | None = None,
    world=None,
) -> GradientParts:
    """dE/dR (natm, 3) Eh/bohr of E_UHF + c_os E_OS + c_ss E_SS for the converged DF-UHF ``ref``
    (two channels; frozen core from their masks) with the MP2-fit set ``mp2_auxmol`` and the
    JK-fit set ``jk_auxmol`` (the SCF's), on ``backend`` (fp64: GradientError otherwise). ``plan``:
    where the JK factor lives (in memory, split over the ranks or on disk) and the blocks (``choose_plan`` of
    ``uhf_shapes``; default the one that fits memory.DEFAULT_FRACTION of the available memory).
    Over several ranks (``world``) the pair loops' blocks (``pair_densities``) and the
    derivative integrals (``df_deriv``) are split, added in one fixed order; the JK factor
    is whole on every rank, or (plan factor 'split') in the SCF's groups of rows over the ranks,
    its sums added in group order: either way one process's bits for the plan's forms.

    The phases run in the RHF stage's order, which keeps the fewest large arrays alive together:
    the correlation part (B, Γ, then T_v) and its derivative integrals first, T_v freed; then the
    JK factor, the Z-vector and the JK part's derivative (the factor released before its
    derivative integrals)."""
    if ref.restricted:
        raise GradientError(
            "uhf_mp2_gradient needs a UHF reference (two spin channels); an RHF runs through "
            "dfmp2.grad.mp2.mp2_gradient",
            option="reference",
        )
    check_channels(ref, backend)
    if plan is None:
        plan = choose_plan(uhf_shapes(mol, ref, mp2_auxmol, jk_auxmol), default_limit_mb())
    timer = timer or Timer(backend)
    kernels0 = dict(backend.kernels_used)
    t0 = time.perf_counter()
    orbs = [Orbitals(ch) for ch in ref.channels]
    e_corr, P, Y, corr_3c, t0 = correlation_terms_uhf(
        mol, mp2_auxmol, orbs, backend, c_os, c_ss, timer, t0, plan, world
    )
    P_unrelaxed = [p.copy() for p in P]
    P, Y, zinfo, (jk_hf, jk_p), t0 = _response_and_jk(mol, jk_auxmol, orbs, P, Y, backend, plan, timer, t0, world)
    one_hf, one_p = _one_electron_terms(mol, orbs, P, Y)
    hf = one_hf + pyscf_grad_rhf.grad_nuc(mol) + jk_hf
    grad = hf + one_p + jk_p + corr_3c
    timer.add("grad_derivative_integrals", t0)
    warnings = linear_dependence_warnings(orbs[0].C)
    ran = _uhf_ran(backend, kernels0, plan)
    return GradientParts(
        grad,
        hf,
        grad - hf,
        e_corr,
        c_os,
        c_ss,
        zinfo,
        warnings,
        {k: v for k, v in timer.seconds.items() if k.startswith("grad_")},
        ran,
        {k: v for k, v in timer.stage_flops().items() if k.startswith("grad_")},
        uhf_record(orbs, P_unrelaxed, P, c_os, c_ss, zinfo, ran),
        peak_rss_mb={k: v for k, v in timer.stage_rss().items() if k.startswith("grad_")},
    )


def correlation_terms_uhf(mol, mp2_auxmol, orbs, backend, c_os, c_ss, timer, t0, plan, world):  # noqa: PLR0913
    """The correlation part of a UHF-like gradient (the UMP2 one, a UKS double hybrid's PT2), the
    peer of ``dfmp2.grad.mp2.correlation_terms``: the pair loops' densities (``corr_uhf``, timed
    'grad_mp2_densities') and the 3-center derivative of Γ^σ and γ fitted with ``mp2_auxmol``
    ((natm, 3) Eh/bohr, timed 'grad_derivative_integrals'). Returns (e_corr (Hartree), P and Y per
    spin (nmo, nmo) MO: the unrelaxed density and the 3-index terms, the derivative, t0)."""
    e_corr, P, Y, T_v, gamma_pq = corr_uhf(mol, mp2_auxmol, orbs, backend, c_os, c_ss, world=world, plan=plan)
    t0 = timer.add("grad_mp2_densities", t0)
    C_act = [o.C[:, o.act] for o in orbs]
    gbuf = memory.Buffers(device=T_v[0].device)
    corr_3c = df_deriv(
        mol,
        mp2_auxmol,
        lambda p0, p1: gamma3_weights(C_act, T_v, p0, p1, backend, gbuf)[None],
        -2.0 * gamma_pq[None],
        block_mb=plan.block_mb,
        world=world,
    )[0]
    T_v, gbuf = None, None  # (naux_mp2, nao, nact_σ) each: not needed beside the JK factor
    return e_corr, P, Y, corr_3c, timer.add("grad_derivative_integrals", t0)


def _one_electron_terms(mol, orbs, P: list, Y: list) -> list:
    """[the HF part, the correlation part] (natm, 3) Eh/bohr of Σ D h^x - Σ W S^x over both spins
    (``one_electron_deriv``): D^σ and the relaxed P^σ (MO, per spin) in the AO basis, W from Y."""
    C_o = [o.C[:, o.occ] for o in orbs]
    D = [c @ c.T for c in C_o]
    P_ao = [o.C @ p @ o.C.T for o, p in zip(orbs, P)]
    W = sum(0.5 * o.C @ (0.5 * (y + y.T)) @ o.C.T for o, y in zip(orbs, Y))
    W_hf = sum((c * o.eps[o.occ]) @ c.T for o, c in zip(orbs, C_o))
    return one_electron_deriv(mol, [(D[0] + D[1], W_hf), (P_ao[0] + P_ao[1], W - W_hf)])


def _uhf_ran(backend, kernels0: dict, plan: GradientPlan) -> dict:
    """What the UHF stage ran where (the gradient's ``ran``): all on ``backend`` in fp64, its
    kernels since ``kernels0``, and ``plan``'s record."""
    used = {k: n - kernels0.get(k, 0) for k, n in backend.kernels_used.items() if n != kernels0.get(k, 0)}
    return {
        "device": backend.name,
        "precision": "fp64",
        "reference": "uhf",
        "kernels": dict(sorted(used.items())),
        "on_device": "each spin's B transforms, the pair loops (αα, ββ, αβ from each side: K, t, θ, Γ, "
        "P_oo, P_vv), the JK factor, the Z-vector's J/K (dfmp2.scf.uhf.DFUHF.hessian_product), the "
        "derivative weights",
        "host": ON_HOST + "; the Z-vector's conjugate gradients (scipy)",
        "plan": plan.record(),
    }


def _response_and_jk(mol, jk_auxmol, orbs, P, Y, backend, plan: GradientPlan, timer: Timer, t0: float, world):  # noqa: PLR0913
    """``uhf_mp2_gradient`` from the JK factor on (in memory or on disk, ``plan``): the Z-vector
    (``relaxed_density``; P and Y changed in place) and the JK part's derivative
    (``jk_energy_deriv_blocked``, the factor released before its derivative integrals). Returns
    (P, Y, Z-vector info, (E_G^x(D/2, D), E_G^x(P, D)), t0 after the Z-vector)."""
    f0 = timer.executed()
    jk = DFJK(mol, jk_auxmol, backend, timer, plan.factor, plan.fit_mb, plan.scratch_dir, world)
    try:
        t0 = timer.add("grad_jk_factor", t0, flops0=f0)  # encloses the factor's scf_integrals and scf_fit
        P, Y, zinfo = relaxed_density(orbs, P, Y, response_operator(jk, orbs))
        zinfo["form"] = plan.zvector
        t0 = timer.add("grad_zvector", t0)
        nocc = [len(o.occ) for o in orbs]
        Pm = [0.5 * (p + p.T) for p in P]
        jk_terms = jk_energy_deriv_blocked(jk, [o.C for o in orbs], nocc, [1.0, 1.0], Pm, plan.block_mb)
    finally:
        jk.release()  # a factor on disk: its scratch directory goes, however the stage ends
    return P, Y, zinfo, jk_terms, t0


def uhf_record(orbs, P_unrelaxed: list, P: list | None, c_os, c_ss, zinfo, ran, timings=None):
    """The MP2Densities of a UHF's two channels from the per-spin correlation densities (MO):
    ``P_unrelaxed`` (P_ij, P_ab blocks) and ``P`` relaxed (None: not made); the HF part added."""
    return from_correlation(
        False,
        [o.C for o in orbs],
        [len(o.occ) for o in orbs],
        [orb_frozen(o) for o in orbs],
        P_unrelaxed,
        P,
        c_os=c_os,
        c_ss=c_ss,
        zvector=zinfo,
        ran=ran,
        timings=dict(timings or {}),
    )


def response_operator(jk: DFJK, orbs):
    """The DF-UHF's J/K steps (``dfmp2.scf.uhf.DFUHF.response``) over the gradient's fp64 JK factor
    (a split one: J and K added over its ranks in group order), as ``relaxed_density`` takes them."""
    return UHFResponse(DFUHF.response(jk.fac, jk.backend, tuple(len(o.occ) for o in orbs), world=jk.split))


class UHFResponse:
    """The two-electron part of the UHF orbital Hessian in the terms ``relaxed_density`` takes
    (a KS peer: ``dfmp2.grad.dh.UKSResponse``): ``spin_g`` and ``hessian`` over a
    ``DFUHF.response``'s J/K."""

    def __init__(self, uhf: DFUHF):
        self.uhf = uhf

    def spin_g(self, D_ao) -> list:
        """G^σ[D] = J[D^α + D^β] - K[D^σ] (per spin (nao, nao)) of D_ao (two (nao, nao), symmetrised)
        with the DF-UHF's own J/K step (``DFUHF.two_electron``; K through each D^σ's eigenvectors,
        ``delta_factors``)."""
        resp = self.uhf
        D = resp.dense.to_device(host_tensor(np.stack([0.5 * (d + d.T) for d in D_ao])), torch.float64)
        return list(resp.two_electron(D, *resp.delta_factors(D)).cpu().numpy())

    def hessian(self, orbs):
        """(hop, hdiag) of the orbital Hessian (``DFUHF.hessian_product``: x (n,) -> (e_a - e_i) x^σ
        + C_v^σT G^σ[dD] C_o^σ, n = Σ_σ nvir_σ nocc_σ; hdiag (n,) = e_a - e_i)."""
        dense = self.uhf.dense
        C = dense.to_device(host_tensor(np.stack([o.C for o in orbs])), torch.float64)
        mo_e = dense.to_device(host_tensor(np.stack([o.eps for o in orbs])), torch.float64)
        return self.uhf.hessian_product(C, mo_e)


# ---------------------------------------------------------------------------- correlation part
def corr_uhf(mol, auxmol, orbs, backend, c_os: float, c_ss: float, response: bool = True, world=None, plan=None):  # noqa: PLR0913
    """The pair loops (``pair_densities``: each spin's same-spin pairs with θ = c_ss/2 of
    the antisymmetrised amplitudes, and the αβ pairs from each side with θ = c_os/2 t: about
    E_aa + E_bb + 2 E_ab of pair arithmetic), then per spin γ's share and Γ~ (``gamma_terms``),
    B and Γ of that spin dropped, and the orbital-response terms (``response_3c``). The
    (μν|P) and pair blocks are ``plan``'s (None: AUX_BLOCK_MB and PAIR_BLOCK_MB). Returns (e_corr =
    Σ_σ Γ^σ·B^σ = c_os E_OS + c_ss E_SS (Hartree), P (per spin (nmo, nmo): the unrelaxed P_oo, P_vv
    in place), Y (per spin (nmo, nmo): the 3-index terms), T_v (per spin (naux, nao, nact) = 4 C_v
    Γ~, on the device), γ (naux, naux)). ``response`` False: the unrelaxed densities only (Y zero,
    T_v empty and γ None: no 3-index terms)."""
    block_mb, pair_mb = (plan.block_mb, plan.pair_mb) if plan is not None else (AUX_BLOCK_MB, PAIR_BLOCK_MB)
    L = metric_cholesky(auxmol.intor("int2c2e"), "MP2")
    naux, nao = L.shape[0], orbs[0].C.shape[0]
    has = [bool(len(o.act) and len(o.vir)) for o in orbs]
    fit = lambda o: fit_b(mol, auxmol, o.C[:, o.act], o.C[:, o.vir], L, backend, block_mb)
    Bd = [on_device(backend, fit(o) if h else np.zeros((0, naux))) for o, h in zip(orbs, has)]
    eo = [on_device(backend, o.eps[o.act]) for o in orbs]
    ev = [on_device(backend, o.eps[o.vir]) for o in orbs]
    acc = [
        (
            torch.zeros_like(b),
            torch.zeros((len(o.act),) * 2, dtype=torch.float64, device=b.device),
            torch.zeros((len(o.vir),) * 2, dtype=torch.float64, device=b.device),
        )
        for b, o in zip(Bd, orbs)
    ]
    for s in (0, 1):
        if not has[s]:
            continue
        if c_ss:
            pair_densities(Bd[s], eo[s], ev[s], backend, 0.0, 0.5 * c_ss, out=acc[s], block_mb=pair_mb, world=world)
        if c_os and has[1 - s]:  # Γ of the other spin (the j side), P_oo and P_vv of this one
            pair_densities(
                Bd[s],
                eo[s],
                ev[s],
                backend,
                0.5 * c_os,
                0.0,
                cols=(Bd[1 - s], eo[1 - s], ev[1 - s]),
                out=(acc[1 - s][0], acc[s][1], acc[s][2]),
                block_mb=pair_mb,
                world=world,
            )
    e_corr = sum(float(torch.dot(a[0].reshape(-1), b.reshape(-1))) for a, b in zip(acc, Bd))
    gamma_pq, P, Y, T_v = np.zeros((naux, naux)), [], [], []
    for s, (o, h) in enumerate(zip(orbs, has)):
        p, y = np.zeros((o.nmo, o.nmo)), np.zeros((o.nmo, o.nmo))
        P.append(p)
        Y.append(y)
        G, po, pv = acc[s]
        if not h:
            T_v.append(torch.zeros((naux, nao, len(o.act)), dtype=torch.float64, device=Bd[s].device))
            continue
        if response:
            g, gamma_t = gamma_terms(L, Bd[s], G, backend, len(o.act), len(o.vir))
            gamma_pq += g
        Bd[s], acc[s], G = None, None, None  # this spin's B and Γ (nact nvir naux each) go before its T_v
        if response:
            X_o, X_v, tv = response_3c(mol, auxmol, o.C[:, o.act], o.C[:, o.vir], gamma_t, backend, block_mb)
            del gamma_t
            y[:, o.act], y[:, o.vir] = o.C.T @ X_o, o.C.T @ X_v
            T_v.append(tv)
        po, pv = po.cpu().numpy(), pv.cpu().numpy()
        p[np.ix_(o.act, o.act)] = 0.5 * (po + po.T)
        p[np.ix_(o.vir, o.vir)] = 0.5 * (pv + pv.T)
    return e_corr, P, Y, T_v, (0.5 * (gamma_pq + gamma_pq.T) if response else None)


# ---------------------------------------------------------------------------- response (Z-vector)
def relaxed_density(orbs, P, Y, resp):
    """(P per spin (nmo, nmo): the relaxed density in the MO basis, Y per spin: the
    orbital-change coefficients with the relaxation and the UHF part, Z-vector info), from the
    unrelaxed P and the 3-index Y of ``corr_uhf`` (both changed in place). ``resp``: the orbital
    Hessian's two-electron part (``UHFResponse``, or a KS one: ``dfmp2.grad.dh.UKSResponse``)."""
    for o, p, y in zip(orbs, P, Y):
        if len(o.frz):  # the frozen-active rotations keep each spin's frozen and active blocks canonical
            pfa = y[np.ix_(o.frz, o.act)] / (2.0 * (o.eps[o.act][None, :] - o.eps[o.frz][:, None]))
            p[np.ix_(o.frz, o.act)] = pfa
            p[np.ix_(o.act, o.frz)] = pfa.T
    _add_density_terms(Y, P, orbs, resp)
    R = [y[np.ix_(o.vir, o.occ)] - y[np.ix_(o.occ, o.vir)].T for o, y in zip(orbs, Y)]
    z, info = _solve_zvector(R, orbs, resp)
    Pov = []
    for o, zs in zip(orbs, z):
        pov = np.zeros((o.nmo, o.nmo))
        pov[np.ix_(o.vir, o.occ)] = -0.5 * zs
        pov[np.ix_(o.occ, o.vir)] = -0.5 * zs.T
        Pov.append(pov)
    _add_density_terms(Y, Pov, orbs, resp)
    for o, y in zip(orbs, Y):
        y[o.occ, o.occ] += 2.0 * o.eps[o.occ]
    return [p + q for p, q in zip(P, Pov)], Y, info


def _add_density_terms(Y, P, orbs, resp) -> None:
    """Y^σ += the orbital-change terms of a density P (per spin, MO): 2 (C^T G^σ[P] C)_rk, 2 P_pq e_q."""
    G = resp.spin_g([o.C @ p @ o.C.T for o, p in zip(orbs, P)])
    for o, p, y, g in zip(orbs, P, Y, G):
        y[:, o.occ] += 2.0 * (o.C.T @ g @ o.C[:, o.occ])
        y += 2.0 * o.eps[:, None] * p


def _solve_zvector(R, orbs, resp):
    """z per spin (nvir_σ, nocc_σ) of the coupled α/β CPHF (module docstring) by preconditioned
    conjugate gradients (scipy's cg; the diagonal e_a - e_i as preconditioner) over
    ``resp.hessian`` (``DFUHF.hessian_product``'s): positive definite for a stable UHF (UKS).
    GradientError when it does not converge to ZVECTOR_TOL (cg's relative residual) in
    ZVECTOR_MAX_ITER, or when the recomputed residual ||R - A z|| / ||R|| (recorded) is above 10
    ZVECTOR_TOL."""
    hop, hdiag = resp.hessian(orbs)
    b = np.concatenate([r.ravel() for r in R])
    n = b.size
    A = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda x: hop(np.ravel(x)), dtype=np.float64)
    M = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda x: np.ravel(x) / hdiag, dtype=np.float64)
    bnorm = float(np.linalg.norm(b))
    iters = [0]
    if bnorm == 0.0:
        x, res = np.zeros(n), 0.0
    else:
        x, flag = scipy.sparse.linalg.cg(
            A,
            b,
            x0=b / hdiag,
            rtol=ZVECTOR_TOL,
            atol=0.0,
            maxiter=ZVECTOR_MAX_ITER,
            M=M,
            callback=lambda xk: iters.__setitem__(0, iters[0] + 1),
        )
        res = float(np.linalg.norm(b - hop(x))) / bnorm
        if flag != 0 or res > 10 * ZVECTOR_TOL:
            raise GradientError(
                f"the Z-vector (UHF CPHF) equations did not converge in {ZVECTOR_MAX_ITER} "
                f"iterations (relative residual {res:.1e}); is the UHF reference stable?"
            )
    z, p = [], 0
    for r in R:
        z.append(x[p : p + r.size].reshape(r.shape))
        p += r.size
    return z, {"iterations": iters[0], "residual": res}
