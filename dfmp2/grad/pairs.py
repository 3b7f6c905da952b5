"""The correlation part of the gradient: B's fit (``fit_b``), the pair loop over blocks of j
(``pair_densities``: K, t, θ, Γ, P_oo, P_vv), γ and Γ~ (``gamma_terms``), the 3-index
orbital-response terms (``response_3c``) and the weights of the (μν|P) derivative
(``gamma3_weights``); ``corr_intermediates`` runs them for one RHF channel (``Corr``).

The pair loop runs over blocks of j with every i at once (no i >= j symmetry: P_ij needs every i
of one j), all its steps in torch on the backend: K, t, θ, Γ, P_oo, P_vv are GEMMs and in-place
elementwise steps over one block (K and Γ over every ordered pair, P_oo and P_vv: about 4.6
times the flops of the energy's pair step, which takes i >= j)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dfmp2 import distributed, linalg, memory
from dfmp2.grad.common import Orbitals, block_owners, host_tensor, metric_cholesky, on_device, solve_lower
from dfmp2.grad.deriv3c import PairPack, j3c_blocks
from dfmp2.grad.plan import AUX_BLOCK_MB, PAIR_BLOCK_MB, GradientPlan

PAIR_MIN_BLOCKS = 8  # the pair loop's j in at least this many blocks (where there are that many): work for ranks


@dataclass
class Corr:
    """The correlation energy's intermediates: e_corr (Hartree); P_oo (nact, nact), P_vv (nvir,
    nvir) unrelaxed; Y_ri (nmo, nact), Y_ra (nmo, nvir) the 3-index orbital-response terms;
    T_v (naux, nao, nact) = 4 Σ_a C_νa Γ~_Pia (Γ~ in the non-orthogonal aux basis, half back-
    transformed, [P, ν, i]) on the device; gamma_pq γ (naux, naux)."""

    e_corr: float
    P_oo: np.ndarray
    P_vv: np.ndarray
    Y_ri: np.ndarray
    Y_ra: np.ndarray
    T_v: torch.Tensor
    gamma_pq: np.ndarray


def gamma3_weights(C_act: list, T_v: list, p0: int, p1: int, backend, buf=None) -> torch.Tensor:
    """The weight of (μν|P)^x in the correlation part for P in [p0, p1): Σ_spins 4 Σ_ia C_μi C_νa
    Γ~_iaP symmetrised in μν, from each spin's C_act (nao, nact) and T_v (naux, nao, nact), packed
    as ``df_deriv`` takes it: (p1 - p0, nao(nao+1)/2) at μ >= ν with the pair's weight
    (``PairPack.sym``), on the backend's device, in ``buf`` (a ``memory.Buffers``, reused by the next
    block) when given."""
    nb, nao = p1 - p0, T_v[0].shape[1]
    buf = buf or memory.Buffers(device=T_v[0].device)
    G = buf.get("G", (nb * nao, nao))  # [(P, ν), μ]
    beta = 0.0
    for C, T in zip(C_act, T_v):
        if C.shape[1]:
            linalg.gemm(
                T[p0:p1].reshape(nb * nao, -1), on_device(backend, C), trans_b=True, beta=beta, out=G, backend=backend
            )
            beta = 1.0
    if not beta:
        G.zero_()
    pack = PairPack.get(nao, G.device)
    return pack.sym(G.view(nb, nao, nao), buf.get("W", (nb, pack.npair)), buf.get("W2", (nb, pack.npair)))


def fit_b(
    mol, auxmol, C_o: np.ndarray, C_v: np.ndarray, L: np.ndarray, backend, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """B (nact nvir, naux) = (ia|P) L^-T, row i nvir + a, for C_o (nao, nact), C_v (nao, nvir)
    and the metric's Cholesky factor L: the raw 3-center integrals streamed over aux blocks,
    both transforms on the backend (fp64)."""
    nao, nact, nvir, naux = C_o.shape[0], C_o.shape[1], C_v.shape[1], L.shape[0]
    A = np.empty((naux, nact, nvir))
    Co, Cv = on_device(backend, C_o), on_device(backend, C_v)
    for p0, p1, j3c in j3c_blocks(mol, auxmol, block_mb):
        half = linalg.gemm(on_device(backend, j3c).view(-1, nao), Co, backend=backend).view(p1 - p0, nao, nact)
        A[p0:p1] = linalg.gemm(half, Cv, trans_a=True, backend=backend).cpu().numpy()  # [P, i, a]
    return np.ascontiguousarray(solve_lower(L, A.reshape(naux, -1)).T)


def response_3c(
    mol, auxmol, C_o: np.ndarray, C_v: np.ndarray, gamma_t: np.ndarray, backend, block_mb: float = AUX_BLOCK_MB
):
    """The 3-index density's orbital-response terms (a second pass over (μν|P)): with Γ~ [P, i, a]
    (naux, nact, nvir), T_v [P, ν, i] = 4 Σ_a C_νa Γ~_Pia, X_o = Σ_Pν (μν|P) T_v (nao, nact) and
    X_v = 4 Σ_Pi H_Pμi Γ~_Pia (nao, nvir) with H_Pμi = Σ_ν (μν|P) C_νi, the half transform (numpy);
    T_v (naux, nao, nact) on the device, kept for the derivative weights (``gamma3_weights``).
    Every product is a 2-D GEMM (about 2 nao naux nact (2 nao + nvir) + 2 nao naux nact nvir
    flops); contracting (μν|P) with T_o = 4 C_o Γ~ instead costs 2 nao^2 naux nvir."""
    nao, nact, nvir = C_o.shape[0], C_o.shape[1], C_v.shape[1]
    g, Co, Cv = on_device(backend, gamma_t), on_device(backend, C_o), on_device(backend, C_v)
    naux = g.shape[0]
    T_v = torch.empty((naux, nao, nact), dtype=torch.float64, device=g.device)  # [P, ν, i]
    step = max(1, int(block_mb * 1e6 // (8 * nao * max(1, nact))))  # no whole [P, i, ν] copy beside it
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        Tb = linalg.gemm(g[p0:p1].reshape(-1, nvir), Cv, trans_b=True, alpha=4.0, backend=backend)  # [P, i, ν]
        T_v[p0:p1] = Tb.view(p1 - p0, nact, nao).transpose(1, 2)
    del Tb  # (at most block_mb): not beside the (μν|P) blocks
    X_o = torch.zeros((nao, nact), dtype=torch.float64, device=g.device)
    X_vt = torch.zeros((nvir, nao), dtype=torch.float64, device=g.device)
    for p0, p1, j3c in j3c_blocks(mol, auxmol, block_mb):  # X_μ· = Σ_Pν (μν|P) T_Pν·
        J = on_device(backend, j3c).view(-1, nao)  # [(P ν), μ]
        H = linalg.gemm(J, Co, backend=backend).view(p1 - p0, nao, nact).transpose(1, 2).contiguous()  # [P, i, μ]
        linalg.gemm(J, T_v[p0:p1].reshape(-1, nact), trans_a=True, beta=1.0, out=X_o, backend=backend)
        linalg.gemm(g[p0:p1].reshape(-1, nvir), H.view(-1, nao), trans_a=True, beta=1.0, out=X_vt, backend=backend)
    return X_o.cpu().numpy(), 4.0 * X_vt.T.cpu().numpy(), T_v


def pair_densities(  # noqa: PLR0913
    B: torch.Tensor,
    e_o: torch.Tensor,
    e_v: torch.Tensor,
    backend,
    c_os: float,
    c_ss: float,
    cols=None,
    out=None,
    block_mb: float = PAIR_BLOCK_MB,
    world=None,
):
    """The pair loop over blocks J of occupied j (every i at once: P_oo needs all i of one j, so no
    i >= j symmetry), on the backend's device:
        K[i, a, j, b] = (ia|jb) = Σ_Q B_iaQ B_jbQ      (one GEMM, B B_J^T)
        t = K / (e_i + e_j - e_a - e_b)                (in place),  θ = (c_os + c_ss) t - c_ss t^{ba}
        Γ[(jb), Q] += Σ_ia θ[(ia), (jb)] B[(ia), Q]   (θ_ij^ab = θ_ji^ba: the rows of J, whole)
        P_oo[i, k] -= 2 Σ_ajb t[i, (ajb)] θ[k, (ajb)]
        P_vv[a, b] += 2 Σ_i Σ_jc t[i, a, (jc)] θ[i, b, (jc)]   (a GEMM batched over i)
    B (nact nvir, naux) (row i nvir + a), e_o (nact,), e_v (nvir,) Hartree, all one dtype on the
    device; ``cols`` = (B_c, f_o, f_v): the j, b side from another spin (UMP2's αβ pairs; c_ss
    must be 0), else B's own. RHF: c_os, c_ss the method's scales; UHF same spin: (0, c_ss/2) (θ =
    c_ss/2 of the antisymmetrised t); αβ: (c_os/2, 0), once from each side: Γ is then the j side's
    (the other spin's: t_ij^ab(αβ) = t_ji^ba(βα)), P_oo and P_vv the i side's. K and θ of one block
    take about ``block_mb`` MB, in at least PAIR_MIN_BLOCKS blocks where there are that many j.
    Returns Γ (ncol nvc, naux), P_oo (nact, nact), P_vv (nvir, nvir), unsymmetrised, on the
    device, added into ``out`` = (Γ, P_oo, P_vv) when given.

    Over several ranks (``world``): rank r computes the blocks
    ``block_owners`` gives it (Γ's rows of its j whole, each block's P_oo and P_vv shares), then
    every block is broadcast from its owner in block order and P_oo, P_vv add the shares in that
    order, as one process adds them: the same bits on any number of ranks (equal threads)."""
    Bc, f_o, f_v = cols if cols is not None else (B, e_o, e_v)
    nact, nvir, ncol, nvc = e_o.shape[0], e_v.shape[0], f_o.shape[0], f_v.shape[0]
    if c_ss and nvc != nvir:
        raise ValueError("the exchange term needs the same virtual space on both sides")
    nj = max(1, min(-(-ncol // PAIR_MIN_BLOCKS), int(block_mb * 1e6 // (2 * nact * nvir * nvc * B.element_size()))))
    Gam, P_oo, P_vv = (
        out
        if out is not None
        else (
            torch.zeros_like(Bc),
            torch.zeros((nact, nact), dtype=B.dtype, device=B.device),
            torch.zeros((nvir, nvir), dtype=B.dtype, device=B.device),
        )
    )
    ranks = world is not None and world.distributed
    blocks = [(j0, min(ncol, j0 + nj)) for j0 in range(0, ncol, nj)]
    own = block_owners(len(blocks), world.size if ranks else 1)
    me = world.rank if ranks else 0
    shares = {}  # over ranks: block -> (P_oo's, P_vv's share), added in block order after the loop
    e_ia = (e_o[:, None] - e_v[None, :]).reshape(nact, nvir, 1, 1)
    e_jb = f_o[:, None] - f_v[None, :]
    buf = memory.Buffers(B.dtype, B.device)
    for b, (j0, j1) in enumerate(blocks):
        if own[b] != me:
            continue
        distributed.fault("gradient")
        rows = Gam[j0 * nvc : j1 * nvc]  # Γ's rows of J, whole: Σ_ia θ_ij^ab B_ia = Σ_ia θ_ji^ba B_ia
        x_oo, x_vv = _pair_block(B, Bc[j0 * nvc : j1 * nvc], e_ia, e_jb[j0:j1], rows, c_os, c_ss, backend, buf)
        if ranks:
            shares[b] = (x_oo, x_vv)
        else:
            P_oo -= 2.0 * x_oo
            P_vv += 2.0 * x_vv
    for b, (j0, j1) in enumerate(blocks if ranks else ()):  # every block from its owner, in order
        x_oo, x_vv = shares.pop(b) if own[b] == me else (torch.empty_like(P_oo), torch.empty_like(P_vv))
        world.broadcast([Gam[j0 * nvc : j1 * nvc], x_oo, x_vv], own[b], "gradient")
        P_oo -= 2.0 * x_oo
        P_vv += 2.0 * x_vv
    return Gam, P_oo, P_vv


def _pair_block(B, Bj, e_ia, e_jb, rows, c_os: float, c_ss: float, backend, buf):  # noqa: PLR0913
    """One block J of ``pair_densities``' loop: K = B Bj^T and t into ``buf`` (e_ia (nact, nvir, 1,
    1), e_jb (nj, nvc) the denominators' parts), θ, Γ's ``rows`` of J added into in place; returns
    (Σ_ajb t θ (nact, nact), Σ_i Σ_jc t θ (nvir, nvir)), this block's shares of P_oo and P_vv."""
    nact, nvir, nj, nvc = e_ia.shape[0], e_ia.shape[1], e_jb.shape[0], e_jb.shape[1]
    shape = (nact, nvir, nj, nvc)
    t = linalg.gemm(B, Bj, trans_b=True, out=buf.get("t", (nact * nvir, nj * nvc)), backend=backend).view(shape)
    th = torch.add(e_ia, e_jb.reshape(1, 1, nj, nvc), out=buf.get("th", shape))  # denominators
    t.div_(th)
    torch.mul(t, c_os + c_ss, out=th)
    if c_ss:
        th.sub_(t.permute(0, 3, 2, 1), alpha=c_ss)  # t_ij^ba = t[i, b, j, a]
    linalg.gemm(th.view(nact * nvir, -1), B, trans_a=True, beta=1.0, out=rows, backend=backend)
    x_oo = linalg.gemm(t.view(nact, -1), th.view(nact, -1), trans_b=True, backend=backend)
    x_vv = linalg.gemm(
        t.view(nact, nvir, -1),
        th.view(nact, nvir, -1),
        trans_b=True,
        out=buf.get("vv", (nact, nvir, nvir)),
        backend=backend,
    ).sum(0)  # batched over i
    return x_oo, x_vv


def _pair_loop(
    Bd: torch.Tensor,
    orb: Orbitals,
    backend,
    pair_backend,
    c_os: float,
    c_ss: float,
    world=None,
    pair_mb: float = PAIR_BLOCK_MB,
):
    """``pair_densities`` of Bd (nact nvir, naux; fp64 on ``backend``) on ``pair_backend`` in its
    fit dtype (fp32 without fp64; no copy when it is ``backend``), blocks of ``pair_mb``: Γ, P_oo,
    P_vv in fp64 on ``backend``."""
    if pair_backend is backend:
        e_o, e_v = backend.to_device(host_tensor(orb.eps[orb.act])), backend.to_device(host_tensor(orb.eps[orb.vir]))
        return pair_densities(Bd, e_o, e_v, backend, c_os, c_ss, block_mb=pair_mb, world=world)
    dt = pair_backend.fit_dtype(pair_backend.default_precision)
    dev = lambda x: pair_backend.to_device(torch.as_tensor(x).cpu(), dt)
    e_o, e_v = dev(orb.eps[orb.act]), dev(orb.eps[orb.vir])
    out = pair_densities(dev(Bd), e_o, e_v, pair_backend, c_os, c_ss, block_mb=pair_mb, world=world)
    return tuple(backend.to_device(x.cpu(), torch.float64) for x in out)


def corr_intermediates(  # noqa: PLR0913
    mol,
    auxmol,
    orb: Orbitals,
    backend,
    c_os: float,
    c_ss: float,
    pair_backend=None,
    plan: GradientPlan | None = None,
    response: bool = True,
    world=None,
) -> Corr:
    """B, then the pair loop (``pair_densities``: Γ, P_oo, P_vv; E_corr = Σ Γ B), then γ and the
    3-index orbital-response terms (``gamma_terms``, ``response_3c``; see the module docstring).
    The pair loop runs on ``pair_backend`` (default ``backend``) in its fit dtype (fp32 on trn), the rest
    on ``backend`` (fp64); the (μν|P) and pair blocks are ``plan``'s (None: AUX_BLOCK_MB and
    PAIR_BLOCK_MB). ``response`` False: the unrelaxed densities only (Y_ri, Y_ra, T_v and γ None:
    no second pass over (μν|P))."""
    block_mb, pair_mb = (plan.block_mb, plan.pair_mb) if plan is not None else (AUX_BLOCK_MB, PAIR_BLOCK_MB)
    L = metric_cholesky(auxmol.intor("int2c2e"), "MP2")
    Bd = on_device(backend, fit_b(mol, auxmol, orb.C[:, orb.act], orb.C[:, orb.vir], L, backend, block_mb))  # (ia, Q)
    Gd, P_oo, P_vv = _pair_loop(Bd, orb, backend, pair_backend or backend, c_os, c_ss, world, pair_mb)
    e_corr = float(torch.dot(Gd.reshape(-1), Bd.reshape(-1)))
    if not response:
        P_oo, P_vv = P_oo.cpu().numpy(), P_vv.cpu().numpy()
        return Corr(e_corr, 0.5 * (P_oo + P_oo.T), 0.5 * (P_vv + P_vv.T), None, None, None, None)
    gamma_pq, gamma_t = gamma_terms(L, Bd, Gd, backend, len(orb.act), len(orb.vir))
    del Bd, Gd  # B and Γ (nact nvir naux each) go before T_v and the second pass over (μν|P)
    X_o, X_v, T_v = response_3c(mol, auxmol, orb.C[:, orb.act], orb.C[:, orb.vir], gamma_t, backend, block_mb)
    del gamma_t
    P_oo, P_vv = P_oo.cpu().numpy(), P_vv.cpu().numpy()
    Y_ri, Y_ra = orb.C.T @ X_o, orb.C.T @ X_v
    return Corr(e_corr, 0.5 * (P_oo + P_oo.T), 0.5 * (P_vv + P_vv.T), Y_ri, Y_ra, T_v, 0.5 * (gamma_pq + gamma_pq.T))


def gamma_terms(L: np.ndarray, B: torch.Tensor, G: torch.Tensor, backend, nact: int, nvir: int):
    """γ's share L^-T (B^T Γ) L^-1 (naux, naux, unsymmetrised) and Γ~ = Γ L^-1 as [P, i, a]
    (naux, nact, nvir), from B and Γ (nact nvir, naux, fp64 on the device) and the MP2 metric's
    Cholesky factor L."""
    naux = L.shape[0]
    BtG = linalg.gemm(B, G, trans_a=True, backend=backend).cpu().numpy()
    gamma_pq = solve_lower(L, solve_lower(L, BtG, trans=True).T, trans=True).T
    gamma_t = solve_lower(L, G.cpu().numpy().T, trans=True).reshape(naux, nact, nvir)  # Γ~ as [P, i, a]
    return gamma_pq, gamma_t
