"""The UHF DF-MP2 nuclear gradient: the spin-unrestricted peer of ``mp2grad`` (fp64, host), the
derivative of exactly the energy ``dfmp2 run`` prints for a UHF reference,
    E = E_UHF[DF, JK-fit set] + c_os E_OS + c_ss E_SS[DF, MP2-fit set]
(MP2, SCS-MP2, SOS-MP2 through ``mp2grad.SCALES``), frozen core as the energy freezes it (the
same lowest orbitals in both spins). Notation as ``mp2grad``'s, with σ, τ the spins (τ ≠ σ):
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
          (the operator is ``dfhf.DFUHF.hessian_product``'s, over the gradient's JK factor)
    dE/dx = Σ_σ (D^σ + P^σ) h^x - Σ W S^x + E_nuc^x + E_G^x(D^σ/2 + P^σ)[JK-fit]
            + 4 Σ_σ Γ~^σ_iaP (ia|P)^x - 2 Σ γ_PQ (P|Q)^x [MP2-fit],   W = Σ_σ C^σ sym(Y^σ) C^σT / 2
with D^σ = C_o^σ C_o^σT and E_G(D1) = Σ_σ D1^σ G^σ[D] (J of the total density, K per spin).
For α = β every term is half the RHF's spin-summed one (the RHF gradient; tested).

Cost: the pair loops are the energy's (αα, ββ, αβ) plus a second αβ pass for P^α_oo (its
sum runs over two α pairs; the pass over β orbitals has them): about (E_aa + E_bb + 2 E_ab).
Held in memory (no out-of-core path, ``memory_mb``): B^σ and Γ^σ of both spins, Γ~'s half
back-transform per spin (nao naux_mp2 nact_σ), the JK part's half-transformed coefficients per
spin. The same J/K (``mp2grad._DFJK``'s factor), derivative integrals (``mp2grad.df_deriv``,
``_one_electron_deriv``) and linear dependence warning as the RHF stage.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse.linalg
import torch
from pyscf.grad import rhf as pyscf_grad_rhf

from dfmp2 import linalg

from . import dfhf
from .mp2grad import (AUX_BLOCK_MB, ZVECTOR_MAX_ITER, ZVECTOR_TOL, GradientError, GradientParts, _cholesky, _DFJK,
                      _gemm, _ia_3c, _j3c_blocks, _one_electron_deriv, _Orbitals, _solve_lower, _t,
                      check_channels, df_deriv)
from .timing import Timer


def memory_mb(*, nao: int, nocc: tuple, nact: tuple, nvir: tuple, naux_mp2: int, naux_jk: int,
              block_mb: float = AUX_BLOCK_MB) -> float:
    """Peak MB (10^6 bytes, fp64) of the UHF gradient stage, an estimate (per-spin tuples
    (alpha, beta)): the JK factor (naux_jk nao(nao+1)/2) and Γ~'s half back-transforms
    (nao naux_mp2 Σ nact_σ) throughout, plus the larger of the pair loops' phase (B and Γ of both
    spins: 2 naux_mp2 Σ nact_σ nvir_σ, (ia|P) of one spin while fitting, K, t and their products of
    one outer orbital: 5 max nvir_σ nact_τ nvir_τ) and the derivative phase (per spin the JK
    part's half-transformed coefficients and Y1 for two densities: 3 nao naux_jk Σ nocc_σ; a
    block of derivative integrals and its weights: twice block_mb, at most 3 nao^2 naux)."""
    held = naux_jk * nao * (nao + 1) // 2 + nao * naux_mp2 * sum(nact)
    ov = [a * v for a, v in zip(nact, nvir)]
    pair = 2 * naux_mp2 * sum(ov) + naux_mp2 * max(ov) + 5 * max(v * o for v in nvir for o in ov)
    deriv = 3 * nao * naux_jk * sum(nocc) + 2 * min(block_mb * 1e6 / 8, 3 * nao * nao * max(naux_mp2, naux_jk))
    return 8 * (held + max(pair, deriv)) / 1e6


def uhf_mp2_gradient(mol, ref, mp2_auxmol, jk_auxmol, backend, *, c_os: float = 1.0, c_ss: float = 1.0,
                     timer: Timer | None = None) -> GradientParts:
    """dE/dR (natm, 3) Eh/bohr of E_UHF + c_os E_OS + c_ss E_SS for the converged DF-UHF ``ref``
    (two channels; frozen core from their masks) with the MP2-fit set ``mp2_auxmol`` and the
    JK-fit set ``jk_auxmol`` (the SCF's), on ``backend`` (fp64: GradientError otherwise)."""
    if ref.restricted:
        raise GradientError("uhf_mp2_gradient needs a UHF reference (two spin channels); an RHF runs "
                            "through mp2grad.mp2_gradient", option="reference")
    check_channels(ref, backend)
    timer = timer or Timer(backend)
    kernels0 = dict(backend.kernels_used)
    t0 = time.perf_counter()
    orbs = [_Orbitals(ch) for ch in ref.channels]
    jk = _DFJK(mol, jk_auxmol, backend, timer)
    resp = _response_operator(jk, orbs)
    t0 = timer.add("grad_jk_factor", t0)
    e_corr, P, Y, T_v, gamma_pq = _corr_uhf(mol, mp2_auxmol, orbs, backend, c_os, c_ss)
    t0 = timer.add("grad_mp2_densities", t0)
    P, Y, zinfo = _relaxed_density(orbs, P, Y, resp)
    t0 = timer.add("grad_zvector", t0)
    C_o = [o.C[:, o.occ] for o in orbs]
    D = [c @ c.T for c in C_o]
    P_ao = [o.C @ p @ o.C.T for o, p in zip(orbs, P)]
    W = sum(0.5 * o.C @ (0.5 * (y + y.T)) @ o.C.T for o, y in zip(orbs, Y))
    W_hf = sum((c * o.eps[o.occ]) @ c.T for o, c in zip(orbs, C_o))
    jk_hf, jk_p = _jk_energy_deriv(jk, [[0.5 * d for d in D], P_ao], C_o)
    one_hf, one_p = _one_electron_deriv(mol, [(D[0] + D[1], W_hf), (P_ao[0] + P_ao[1], W - W_hf)])
    hf = one_hf + pyscf_grad_rhf.grad_nuc(mol) + jk_hf

    def g3(p0, p1):          # 4 Σ_σ Σ_ia C_μi C_νa Γ~^σ_iaP, symmetrised in μν
        G3 = sum(np.einsum("mi,npi->mnp", c, t[:, p0:p1], optimize=True) for c, t in
                 zip([o.C[:, o.act] for o in orbs], T_v))
        return (0.5 * (G3 + G3.transpose(1, 0, 2)))[None]
    corr_3c = df_deriv(mol, mp2_auxmol, g3, -2.0 * gamma_pq[None])[0]
    grad = hf + one_p + jk_p + corr_3c
    timer.add("grad_derivative_integrals", t0)
    warnings = []
    if orbs[0].C.shape[1] < orbs[0].C.shape[0]:
        warnings.append(f"linear dependence: {orbs[0].C.shape[0] - orbs[0].C.shape[1]} basis functions dropped; "
                        "the gradient leaves out the change of the kept space with the geometry (it is not "
                        "the exact derivative of the energy)")
    used = {k: n - kernels0.get(k, 0) for k, n in backend.kernels_used.items() if n != kernels0.get(k, 0)}
    ran = {"device": backend.name, "precision": "fp64", "reference": "uhf", "kernels": dict(sorted(used.items())),
           "on_device": "the pair loops' GEMMs (αα, ββ, αβ and the second αβ pass: K, Γ, P_oo, P_vv), the JK "
                        "factor and the Z-vector's J/K (dfhf.DFUHF.hessian_product)",
           "host": "libcint derivative integrals and their contractions, the fits' triangular solves, "
                   "dense nmo x nmo algebra and the Z-vector's conjugate gradients (numpy/scipy, fp64)"}
    return GradientParts(grad, hf, grad - hf, e_corr, c_os, c_ss, zinfo, warnings,
                         {k: v for k, v in timer.seconds.items() if k.startswith("grad_")}, ran)


def _response_operator(jk: _DFJK, orbs):
    """The DF-UHF's J/K steps (``dfhf.DFUHF.response``) over the gradient's fp64 JK factor."""
    return dfhf.DFUHF.response(jk.fac, jk.backend, tuple(len(o.occ) for o in orbs))


# ---------------------------------------------------------------------------- correlation part
def _spin_b(mol, auxmol, orb: _Orbitals, L: np.ndarray, backend) -> np.ndarray:
    """B^σ (nact nvir, naux) = (ia|P) L^-T of one spin (no rows where it has no active pair)."""
    if not (len(orb.act) and len(orb.vir)):
        return np.zeros((0, L.shape[0]))
    A = _ia_3c(mol, auxmol, orb, backend).reshape(len(orb.act) * len(orb.vir), -1)
    return np.ascontiguousarray(_solve_lower(L, A.T).T)


def _same_spin(B, orb: _Orbitals, backend, c_ss: float, Gam, P_oo, P_vv) -> float:
    """One spin's same-spin pairs over active occupied i: E_SS^σ (Hartree, unscaled) returned;
    Γ^σ (nact, nvir, naux), P_oo^σ, P_vv^σ accumulated (c_ss/2 t~ terms)."""
    e_o, e_v = orb.eps[orb.act], orb.eps[orb.vir]
    nact, nvir = len(e_o), len(e_v)
    e = 0.0
    for i in range(nact):
        K = _gemm(B[i * nvir:(i + 1) * nvir], B, backend, trans_b=True)            # (a, jb)
        K = K.reshape(nvir, nact, nvir).transpose(1, 0, 2)                         # [j, a, b]
        tA = (K - K.transpose(0, 2, 1)) / (e_o[i] + e_o[:, None, None] - e_v[None, :, None] - e_v[None, None, :])
        e += 0.5 * float(np.sum(tA * K))
        th = 0.5 * c_ss * tA
        th_a = np.ascontiguousarray(th.transpose(1, 0, 2)).reshape(nvir, nact * nvir)
        Gam[i] += _gemm(th_a, B, backend)
        P_vv += _gemm(np.ascontiguousarray(tA.transpose(1, 0, 2)).reshape(nvir, -1), th_a, backend, trans_b=True)
        P_oo -= _gemm(tA.reshape(nact, -1), th.reshape(nact, -1), backend, trans_b=True)
    return e


def _ab_amplitudes(B_out, B_in, o_out: _Orbitals, o_in: _Orbitals, backend):
    """(i, t (nvir_out, nact_in, nvir_in), K) for each active occupied i of the outer spin:
    t[a, j, b] = (ia|jb) / D of the αβ pairs with i (outer spin) and j (inner)."""
    e_o, e_v, f_o, f_v = o_out.eps[o_out.act], o_out.eps[o_out.vir], o_in.eps[o_in.act], o_in.eps[o_in.vir]
    nv, nj, nb = len(e_v), len(f_o), len(f_v)
    for i in range(len(e_o)):
        K = _gemm(B_out[i * nv:(i + 1) * nv], B_in, backend, trans_b=True).reshape(nv, nj, nb)
        yield i, K / (e_o[i] - e_v[:, None, None] + f_o[None, :, None] - f_v[None, None, :]), K


def _opposite_spin(Bs, orbs, backend, c_os: float, Gam, P_oo, P_vv) -> float:
    """The αβ pairs, α outer: E_OS (Hartree, unscaled) returned; Γ^α, Γ^β, P_vv of both spins
    and P_oo^β accumulated; then a pass with β outer for P_oo^α."""
    Ba, Bb = Bs
    if not (Ba.size and Bb.size):
        return 0.0
    nva, nb, nvb = len(orbs[0].vir), len(orbs[1].act), len(orbs[1].vir)
    e = 0.0
    for i, t, K in _ab_amplitudes(Ba, Bb, orbs[0], orbs[1], backend):
        e += float(np.sum(t * K))
        th = (0.5 * c_os * t).reshape(nva, nb * nvb)                               # [a, (j b)]
        Gam[0][i] += _gemm(th, Bb, backend)
        Gam[1] += _gemm(th, Ba[i * nva:(i + 1) * nva], backend, trans_a=True).reshape(nb, nvb, -1)
        ta = t.reshape(nva, -1)
        P_vv[0] += c_os * _gemm(ta, ta, backend, trans_b=True)
        tb = np.ascontiguousarray(t.transpose(2, 0, 1)).reshape(nvb, -1)           # [b, (a j)]
        P_vv[1] += c_os * _gemm(tb, tb, backend, trans_b=True)
        tj = np.ascontiguousarray(t.transpose(1, 0, 2)).reshape(nb, -1)            # [j, (a b)]
        P_oo[1] -= c_os * _gemm(tj, tj, backend, trans_b=True)
    na = len(orbs[0].act)
    for _, t, _ in _ab_amplitudes(Bb, Ba, orbs[1], orbs[0], backend):          # t[b, i, a]
        ti = np.ascontiguousarray(t.transpose(1, 0, 2)).reshape(na, -1)
        P_oo[0] -= c_os * _gemm(ti, ti, backend, trans_b=True)
    return e


def _corr_uhf(mol, auxmol, orbs, backend, c_os: float, c_ss: float):
    """The pair loops (see the module docstring), then Γ~, γ and the orbital-response terms (a
    second pass over (μν|P)). Returns (e_corr = c_os E_OS + c_ss E_SS (Hartree), P (per spin
    (nmo, nmo): the unrelaxed P_oo, P_vv in place), Y (per spin (nmo, nmo): the 3-index terms),
    T_v (per spin (nao, naux, nact) = 4 C_v Γ~), γ (naux, naux))."""
    L = _cholesky(auxmol.intor("int2c2e"), "MP2")
    naux = L.shape[0]
    Bs = [_spin_b(mol, auxmol, o, L, backend) for o in orbs]
    Gam = [np.zeros((len(o.act), len(o.vir), naux)) for o in orbs]
    P_oo = [np.zeros((len(o.act), len(o.act))) for o in orbs]
    P_vv = [np.zeros((len(o.vir), len(o.vir))) for o in orbs]
    e_ss = sum(_same_spin(B, o, backend, c_ss, G, po, pv) for B, o, G, po, pv in zip(Bs, orbs, Gam, P_oo, P_vv)
               ) if c_ss else 0.0
    e_os = _opposite_spin(Bs, orbs, backend, c_os, Gam, P_oo, P_vv) if c_os else 0.0
    gamma_pq, gamma_t = np.zeros((naux, naux)), []
    for B, G in zip(Bs, Gam):
        Gf = G.reshape(-1, naux)
        if B.size:
            gamma_pq += _solve_lower(L, _solve_lower(L, _gemm(B, Gf, backend, trans_a=True), trans=True).T,
                                     trans=True).T
        gamma_t.append(_solve_lower(L, Gf.T, trans=True).reshape(naux, G.shape[0], G.shape[1]))   # Γ~ [P, i, a]
    del Bs, Gam
    T_v = [4.0 * np.einsum("na,pia->npi", o.C[:, o.vir], g, optimize=True) for o, g in zip(orbs, gamma_t)]
    X_o = [np.zeros((o.C.shape[0], len(o.act))) for o in orbs]
    X_v = [np.zeros((o.C.shape[0], len(o.vir))) for o in orbs]
    for p0, p1, j3c in _j3c_blocks(mol, auxmol):         # X_μ· = Σ_νP (μν|P) T_ν,P,·
        flat = j3c.reshape(j3c.shape[0], -1)
        for o, g, tv, xo, xv in zip(orbs, gamma_t, T_v, X_o, X_v):
            if not g.size:
                continue
            T_o = 4.0 * np.einsum("ni,pia->npa", o.C[:, o.act], g[p0:p1], optimize=True)   # (nao, nb, nvir)
            xo += _gemm(flat, np.ascontiguousarray(tv[:, p0:p1]).reshape(-1, len(o.act)), backend)
            xv += _gemm(flat, T_o.reshape(-1, len(o.vir)), backend)
    P, Y = [], []
    for o, po, pv, xo, xv in zip(orbs, P_oo, P_vv, X_o, X_v):
        p, y = np.zeros((o.nmo, o.nmo)), np.zeros((o.nmo, o.nmo))
        p[np.ix_(o.act, o.act)] = 0.5 * (po + po.T)
        p[np.ix_(o.vir, o.vir)] = 0.5 * (pv + pv.T)
        y[:, o.act] += o.C.T @ xo
        y[:, o.vir] += o.C.T @ xv
        P.append(p)
        Y.append(y)
    return c_os * e_os + c_ss * e_ss, P, Y, T_v, 0.5 * (gamma_pq + gamma_pq.T)


# ---------------------------------------------------------------------------- response (Z-vector)
def _relaxed_density(orbs, P, Y, resp):
    """(P per spin (nmo, nmo): the relaxed density in the MO basis, Y per spin: the
    orbital-change coefficients with the relaxation and the UHF part, Z-vector info), from the
    unrelaxed P and the 3-index Y of ``_corr_uhf`` (both changed in place)."""
    for o, p, y in zip(orbs, P, Y):
        if len(o.frz):     # the frozen-active rotations keep each spin's frozen and active blocks canonical
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


def _spin_g(resp, D_ao) -> list:
    """G^σ[D] = J[D^α + D^β] - K[D^σ] (per spin (nao, nao)) of symmetric D_ao (two (nao, nao)) with
    the DF-UHF's own J/K step (``DFUHF.two_electron``; K through each D^σ's eigenvectors,
    ``delta_factors``)."""
    D = resp.dense.to_device(_t(np.stack([0.5 * (d + d.T) for d in D_ao])), torch.float64)
    return list(resp.two_electron(D, *resp.delta_factors(D)).cpu().numpy())


def _add_density_terms(Y, P, orbs, resp) -> None:
    """Y^σ += the orbital-change terms of a density P (per spin, MO): 2 (C^T G^σ[P] C)_rk, 2 P_pq e_q."""
    G = _spin_g(resp, [o.C @ p @ o.C.T for o, p in zip(orbs, P)])
    for o, p, y, g in zip(orbs, P, Y, G):
        y[:, o.occ] += 2.0 * (o.C.T @ g @ o.C[:, o.occ])
        y += 2.0 * o.eps[:, None] * p


def _solve_zvector(R, orbs, resp):
    """z per spin (nvir_σ, nocc_σ) of the coupled α/β CPHF (module docstring) by preconditioned
    conjugate gradients (scipy's cg; the diagonal e_a - e_i as preconditioner) over
    ``DFUHF.hessian_product``: positive definite for a stable UHF. GradientError when it does not
    converge to ZVECTOR_TOL (cg's relative residual) in ZVECTOR_MAX_ITER, or when the recomputed
    residual ||R - A z|| / ||R|| (recorded) is above 10 ZVECTOR_TOL."""
    dense = resp.dense
    C = dense.to_device(_t(np.stack([o.C for o in orbs])), torch.float64)
    mo_e = dense.to_device(_t(np.stack([o.eps for o in orbs])), torch.float64)
    hop, hdiag = resp.hessian_product(C, mo_e)
    b = np.concatenate([r.ravel() for r in R])
    n = b.size
    A = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda x: hop(np.ravel(x)), dtype=np.float64)
    M = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda x: np.ravel(x) / hdiag, dtype=np.float64)
    bnorm = float(np.linalg.norm(b))
    iters = [0]
    if bnorm == 0.0:
        x, res = np.zeros(n), 0.0
    else:
        x, flag = scipy.sparse.linalg.cg(A, b, x0=b / hdiag, rtol=ZVECTOR_TOL, atol=0.0, maxiter=ZVECTOR_MAX_ITER,
                                         M=M, callback=lambda xk: iters.__setitem__(0, iters[0] + 1))
        res = float(np.linalg.norm(b - hop(x))) / bnorm
        if flag != 0 or res > 10 * ZVECTOR_TOL:
            raise GradientError(f"the Z-vector (UHF CPHF) equations did not converge in {ZVECTOR_MAX_ITER} "
                                f"iterations (relative residual {res:.1e}); is the UHF reference stable?")
    z, p = [], 0
    for r in R:
        z.append(x[p:p + r.size].reshape(r.shape))
        p += r.size
    return z, {"iterations": iters[0], "residual": res}


# ---------------------------------------------------------------------------- DF-UHF two-electron derivative
def _jk_fit(jk: _DFJK, dens: np.ndarray, C_o: list, L: np.ndarray):
    """From the JK factor B = L^-1 (P|μν) (no integrals again): the fitted coefficients of each
    density in ``dens`` (n, nao, nao): d (n, naux), and per spin ck_kλP = Σ_σ C_σk c_λσP
    (nocc_σ, nao, naux), c = (μν|Q)(Q|P)^-1."""
    fac, be = jk.fac, jk.backend
    nao, naux = fac.nao, fac.naux
    dd = be.to_device(_t(dens.reshape(len(dens), nao * nao)), torch.float64)
    Cd = [be.to_device(_t(c), torch.float64) for c in C_o]
    rho, ck = np.empty((len(dens), naux)), [np.empty((c.shape[1], nao, naux)) for c in C_o]
    for p0 in range(0, naux, fac.block):
        p1 = min(naux, p0 + fac.block)
        Bb = fac.unpack(fac.B[p0:p1]).reshape(p1 - p0, nao * nao)
        rho[:, p0:p1] = linalg.gemm(dd, Bb, trans_b=True, backend=be).cpu().numpy()
        for c, out in zip(Cd, ck):
            if c.shape[1]:
                half = linalg.gemm(Bb.reshape(-1, nao), c, backend=be).cpu().numpy()     # [(P, λ), k]
                out[:, :, p0:p1] = half.reshape(p1 - p0, nao, -1).transpose(2, 1, 0)
    d = _solve_lower(L, rho.T, trans=True).T
    ck = [_solve_lower(L, c.reshape(-1, naux).T, trans=True).T.reshape(c.shape) for c in ck]
    return d, ck


def _jk_energy_deriv(jk: _DFJK, D1s: list, C_o: list) -> np.ndarray:
    """d/dR of E_G(D1) = Σ_σ D1^σ (J[D] - K[D^σ]) at fixed densities, D^σ = C_o^σ C_o^σT,
    D = D^α + D^β, for each D1 = [D1^α, D1^β] (symmetric (nao, nao)) in ``D1s``: (len(D1s),
    natm, 3) Eh/bohr (the DF-UHF's two-electron gradient for D1^σ = D^σ / 2). The RHF
    ``_DFJK.energy_deriv``'s weights with K per spin: with d the fitted coefficients of D and
    of D1^α + D1^β, Y1^σ_kμP = Σ_λ D1^σ_μλ ck^σ_kλP, the weights of (μν|P)^x are
    D1 d + D d1 - Σ_σ (M^σ + M^σT)/2 with M^σ_μνP = 2 Σ_k C^σ_νk Y1^σ_kμP, those of (P|Q)^x
    -(d1 d^T + d d1^T)/2 + Σ_σ (m^σ + m^σT)/4 with m^σ = 2 Σ_kμ ck^σ_kμP Y1^σ_kμQ."""
    L = _cholesky(jk.auxmol.intor("int2c2e"), "JK")
    naux = L.shape[0]
    D = sum(c @ c.T for c in C_o)
    D1t = [0.5 * (d1[0] + d1[0].T + d1[1] + d1[1].T) for d1 in D1s]
    d, ck = _jk_fit(jk, np.stack([D] + D1t), C_o, L)
    Y1 = [[np.einsum("ml,klp->kmp", 0.5 * (x + x.T), c, optimize=True) for x, c in zip(d1, ck)] for d1 in D1s]
    g2 = []
    for n, ys in enumerate(Y1):
        g = -0.5 * (np.outer(d[n + 1], d[0]) + np.outer(d[0], d[n + 1]))
        for c, y in zip(ck, ys):
            m = 2.0 * c.reshape(-1, naux).T @ y.reshape(-1, naux)
            g += 0.25 * (m + m.T)
        g2.append(g)

    def g3(p0, p1):
        out = np.empty((len(D1s), D.shape[0], D.shape[0], p1 - p0))
        for n, ys in enumerate(Y1):
            out[n] = D1t[n][:, :, None] * d[0, p0:p1] + D[:, :, None] * d[n + 1, p0:p1]
            for c, y in zip(C_o, ys):
                M = 2.0 * np.einsum("nk,kmp->mnp", c, y[:, :, p0:p1], optimize=True)
                out[n] -= 0.5 * (M + M.transpose(1, 0, 2))
        return out
    return df_deriv(jk.mol, jk.auxmol, g3, np.stack(g2))
