"""The SCF's DF two-electron operator on the JK-fit set for the gradient (``DFJK``: G[D] =
J[D] - K[D]/2 from our JK factor, in memory, on disk or split over ranks; its MO and AO forms
for the Z-vector) and the explicit derivative of the DF-HF two-electron energy
(``jk_energy_deriv_rhf``, ``jk_energy_deriv_blocked``) through ``df_deriv``."""

from __future__ import annotations

import numpy as np
import torch

from dfmp2 import distributed, linalg, memory
from dfmp2.df.outofcore import Scratch
from dfmp2.grad.common import GradientError, metric_cholesky, on_device
from dfmp2.grad.deriv3c import PairPack, df_deriv
from dfmp2.grad.plan import AUX_BLOCK_MB, npair
from dfmp2.scf.jk import build_jk_factor


class DFJK:
    """The SCF's DF two-electron operator on the JK-fit set: G[D] = J[D] - K[D]/2 from our JK
    factor (``dfmp2.scf.jk.build_jk_factor``, fp64 on the backend) for the response, and
    (``jk_energy_deriv_rhf``, ``jk_energy_deriv_blocked``) the explicit derivative of the DF-HF
    two-electron energy with the fitted coefficients."""

    def __init__(
        self,
        mol,
        auxmol,
        backend,
        timer,
        factor: str = "memory",
        fit_mb: float | None = None,
        scratch_dir=None,
        world=None,
    ):
        self.mol, self.auxmol, self.backend = mol, auxmol, backend
        self.world = world  # the ranks the derivative integrals are split over (df_deriv); None: one process
        self.mo = None  # the factor in the MO basis (B_ov, B_oo, B_vv), from build_mo
        self.C = None  # (C_o, C_v) on the device for the AO forms, from use_ao
        self.scratch = None
        self.split = None  # factor 'split': the ranks whose groups of rows this factor is one share of
        self.spans = None  # factor 'split': every rank's (first, end) rows, once ``all_rows`` has asked
        if factor == "disk":  # a scratch file read per aux block (dfmp2.scf.jk.DiskJKFactor); removed by release
            self.scratch = Scratch(scratch_dir)
            self.scratch.check_space(auxmol.nao_nr() * npair(mol.nao_nr()) * 8 / 1e6)
            self.fac, _ = build_jk_factor(
                mol, auxmol, backend, torch.float64, timer, layout="disk", scratch=self.scratch, fit_mb=fit_mb
            )
        elif factor == "split":  # this rank's groups of rows (dfmp2.scf.jk_dist), the SCF's split fit
            if world is None or not distributed.split_scf(world):
                raise ValueError("the JK factor split over the ranks needs several ranks with the split SCF")
            self.split = world
            self.fac, _ = build_jk_factor(mol, auxmol, backend, torch.float64, timer, world=world)
        else:
            self.fac, _ = build_jk_factor(mol, auxmol, backend, torch.float64, timer)
        self.nao, self.naux = self.fac.nao, auxmol.nao_nr()  # naux: all of the factor's rows, on every rank
        if self.fac.metric != "cholesky":
            raise GradientError(
                "the JK-fit metric is not positive definite (the SCF used its "
                "eigen-decomposition); its gradient is not implemented",
                option="auxbasis",
            )

    def _blocks(self):
        """(p0, p1, B^P (p1 - p0, nao, nao)) of the unpacked factor B = L^-1 (P|μν), symmetric,
        over blocks of ``fac.block`` functions (near JK_BLOCK_MB unpacked), each valid until the
        next is made (one reused buffer); p0, p1 are the rows of this rank's share (all of them in
        one process: ``rows``)."""
        return self.fac.blocks()

    @property
    def rows(self) -> tuple[int, int]:
        """(first, end) of the global aux rows this rank's factor holds ((0, naux) unless split)."""
        return self.fac.row0, self.fac.row0 + self.fac.naux

    def group_sum(self, shape, add) -> torch.Tensor:
        """Σ over the factor's fixed groups of rows (dfmp2.scf.jk_dist) of ``add(buf, p0, p1, B^P)``
        into a zero fp64 buffer of ``shape`` per group, the groups' added in group order: over the
        ranks of a split factor (``World.ordered_sum``) the same bits as one process."""
        world = self.split if self.split is not None else distributed.World()
        return world.ordered_sum(self.fac._group_sums(shape, add), shape, torch.float64, self.fac.device, "gradient")

    def all_rows(self, local: torch.Tensor) -> torch.Tensor:
        """(naux, ...) of every rank's rows of ``local`` (this rank's (rows, ...), row ``rows[0]``
        first), on every rank: each rank's rows sent to the others in rank order (exact copies);
        ``local`` itself in one process."""
        if self.split is None:
            return local
        if self.spans is None:  # every rank's (first, end) rows, gathered once
            self.spans = self.split.gather_objects(self.rows, "gradient")
        out = torch.empty((self.naux, *local.shape[1:]), dtype=local.dtype, device=local.device)
        r0, r1 = self.rows
        out[r0:r1] = local
        for r, (a, b) in enumerate(self.spans):
            self.split.broadcast([out[a:b]], r, "gradient")
        return out

    def release(self) -> None:
        """Drop the factor (and any MO factor; a factor on disk: its scratch directory): later
        steps need neither."""
        self.fac, self.mo = None, None
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None

    def use_ao(self, C_o: np.ndarray, C_v: np.ndarray) -> None:
        """The AO forms (``G`` through ``G_ao``, ``ao_hessian``) for these orbitals; no MO factor."""
        self.mo = None
        self.C = (on_device(self.backend, C_o), on_device(self.backend, C_v))

    def G(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """``G_mo`` with the MO factor (``build_mo``), else ``G_ao`` (``use_ao``)."""
        return self.G_mo(P, vir_rows) if self.mo is not None else self.G_ao(P, vir_rows)

    def G_ao(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """``G_mo``'s C^T G[C P C^T] C_o (nmo, nocc) (vir_rows False: C_o^T G C_o (nocc, nocc))
        from the AO factor streamed per aux block, no MO factor: with D = C P C^T (symmetrised),
        ρ_P = Σ B^P_μν D_μν, W^P = B^P C_o, J C_o = Σ_P ρ_P W^P, K C_o = Σ_P B^P (D W^P);
        6 naux nao^2 nocc + 2 naux nao^2 flops."""
        be, nao = self.backend, self.nao
        Co, Cv = self.C
        nocc = Co.shape[1]
        Cd = torch.cat([Co, Cv], dim=1)
        Pd = on_device(be, 0.5 * (P + P.T))
        D = linalg.gemm(linalg.gemm(Cd, Pd, backend=be), Cd, trans_b=True, backend=be)
        D = 0.5 * (D + D.T)

        def add(out, p0, p1, Bb):  # out[0]: J C_o flat [μ k], out[1]: (K C_o)^T [k μ]
            nb, B2 = p1 - p0, Bb.view(-1, nao)
            rho = linalg.gemm(Bb.view(nb, -1), D.view(-1, 1), backend=be)  # (nb, 1)
            W = linalg.gemm(B2, Co, backend=be)  # [(P, μ), k] = (B^P C_o)_μk
            linalg.gemm(rho, W.view(nb, -1), trans_a=True, beta=1.0, out=out[0].view(1, -1), backend=be)
            Wt = W.view(nb, nao, nocc).transpose(1, 2).contiguous()  # [P, k, μ]
            V = linalg.gemm(Wt.view(-1, nao), D, backend=be)  # [(P, k), ν] = (D W^P)_νk
            V = V.view(nb, nocc, nao).transpose(1, 2).contiguous()  # [P, ν, k]
            linalg.gemm(V.view(-1, nocc), B2, trans_a=True, beta=1.0, out=out[1], backend=be)  # Σ_Pν V B^P_νμ

        JK = self.group_sum((2, nocc, nao), add)
        GC = JK[0].view(nao, nocc) - 0.5 * JK[1].T
        rows = Cd if vir_rows else Co
        return linalg.gemm(rows, GC, trans_a=True, backend=be).cpu().numpy()

    def ao_hessian(self):
        """``mo_hessian``'s product z (nvir, nocc) -> 4 (ai|bj) z - (ab|ij) z - (aj|ib) z from the AO
        factor streamed per aux block (``use_ao``; no MO factor): with X = C_v z and, per P,
        W^P = B^P [X, C_o] (nao, 2 nocc), S^P = [X, C_o]^T B^P C_o (A^P_ij = Σ_b z_bj B_ib^P and
        B_oo^P), ρ_P = tr A^P, the sum M = Σ_P W_X^P B_oo^P + W_o^P A^PT - 4 ρ_P W_o^P gives the
        product -C_v^T M. Per product 4 naux nao^2 nocc + 8 naux nao nocc^2 flops and one pass over
        the factor (the MO form: about 2 naux nvir^2 nocc + 8 naux nvir nocc^2, no pass)."""
        be, nao = self.backend, self.nao
        Co, Cv = self.C
        nocc = Co.shape[1]

        def hess(z):
            X = linalg.gemm(Cv, on_device(be, z), backend=be)  # (nao, nocc)
            Yc = torch.cat([X, Co], dim=1)  # (nao, 2 nocc)

            def add(Mt, p0, p1, Bb):  # M^T (nocc, nao)
                nb = p1 - p0
                W = linalg.gemm(Bb.view(-1, nao), Yc, backend=be)  # [(P, μ), c] = (B^P Yc)_μc
                Wt = W.view(nb, nao, 2 * nocc).transpose(1, 2).contiguous()  # [P, c, μ]
                S = linalg.gemm(Wt.view(-1, nao), Co, backend=be).view(nb, 2, nocc, nocc)  # [P, h, j, i]
                rho = S[:, 0].diagonal(dim1=-2, dim2=-1).sum(-1)  # Σ_bj B_jb^P z_bj
                R = torch.empty_like(S)  # [P, c, i]: B_oo^P for the X columns, A^PT - 4 ρ_P for C_o's
                R[:, 0], R[:, 1] = S[:, 1], S[:, 0]
                R[:, 1].diagonal(dim1=-2, dim2=-1).sub_(4.0 * rho[:, None])
                linalg.gemm(R.view(-1, nocc), Wt.view(-1, nao), trans_a=True, beta=1.0, out=Mt, backend=be)

            Mt = self.group_sum((nocc, nao), add)
            return -linalg.gemm(Mt, Cv, backend=be).T.cpu().numpy()

        return hess

    def build_mo(self, C_o: np.ndarray, C_v: np.ndarray) -> None:
        """Keep the factor in the MO basis (``mo_factor``) for ``G_mo``, ``mo_hessian`` and
        ``jk_energy_deriv_rhf`` (a whole factor: the MO forms sum over every P at once)."""
        if self.split is not None:
            raise ValueError("the MO forms need the whole JK factor; a split one runs the AO forms")
        self.mo = self.mo_factor(C_o, C_v)

    def G_mo(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """C^T G[C P C^T] C_o (nmo, nocc), occupied rows first (vir_rows False: those rows only,
        (nocc, nocc)), for a symmetric MO density P (nmo, nmo), from the MO factor (``build_mo``;
        no AO work): ρ_P = Σ_pq B^P_pq P_pq, J_rk = Σ_P ρ_P B^P_rk, F^P = P B^P_{:,o} and K_rk =
        Σ_P (B^P F^P)_rk, each sum over P one GEMM on a [P, ·, ·] layout (B_oo, B_vv symmetric in
        their MO indices). The vv block of P costs about 2 naux nvir^2 nocc flops, the virtual rows
        as much again; the rest is o^2 v naux."""
        be = self.backend
        B_ov, B_oo, B_vv = self.mo
        naux, nocc, nvir = B_ov.shape
        Pd = on_device(be, 0.5 * (P + P.T))
        Poo, Pov, Pvv = Pd[:nocc, :nocc], Pd[:nocc, nocc:], Pd[nocc:, nocc:]
        has_vv = bool(torch.count_nonzero(Pvv))
        oo, ov = B_oo.view(-1, nocc), B_ov.view(-1, nvir)  # [(P, ·), ·]
        rho = linalg.gemm(B_oo.view(naux, -1), Poo.reshape(-1, 1), backend=be)
        linalg.gemm(B_ov.view(naux, -1), Pov.reshape(-1, 1), alpha=2.0, beta=1.0, out=rho, backend=be)
        if has_vv:  # Σ_ab B_vv[a, P, b] P_ab, batched over a
            rho += linalg.gemm(B_vv, Pvv[:, :, None], backend=be).sum(0)
        F_o = linalg.gemm(oo, Poo, backend=be)  # [P, k, p] = Σ_q B_kq P_qp, p occupied
        linalg.gemm(ov, Pov, trans_b=True, beta=1.0, out=F_o, backend=be)
        F_v = linalg.gemm(oo, Pov, backend=be)  # [P, k, a], a virtual
        if has_vv:
            linalg.gemm(ov, Pvv, beta=1.0, out=F_v, backend=be)
        F_o = F_o.view(naux, nocc, nocc).transpose(1, 2).contiguous()  # [P, p, k]
        F_v = F_v.view(naux, nocc, nvir).transpose(1, 2).contiguous()  # [P, a, k]
        G_o = linalg.gemm(B_oo.view(naux, -1), rho, trans_a=True, backend=be).view(nocc, nocc)
        G_o -= 0.5 * linalg.gemm(oo, F_o.view(-1, nocc), trans_a=True, backend=be)
        G_o -= 0.5 * linalg.gemm(B_ov, F_v, backend=be).sum(0)  # Σ_P B_ov^P F_v^P, batched over P
        if not vir_rows:
            return G_o.cpu().numpy()
        G_v = linalg.gemm(B_ov.view(naux, -1), rho, trans_a=True, backend=be).view(nocc, nvir).T
        G_v = G_v - 0.5 * linalg.gemm(ov, F_o.view(-1, nocc), trans_a=True, backend=be)
        G_v -= 0.5 * linalg.gemm(B_vv.view(nvir, -1), F_v.view(-1, nocc), backend=be)  # [a, (P b)] [(P b), k]
        return torch.cat([G_o, G_v]).cpu().numpy()

    def mo_factor(self, C_o: np.ndarray, C_v: np.ndarray):
        """The factor in the MO basis on the device: B_ov [P, i, a] (naux, nocc, nvir), B_oo
        [P, i, j] (naux, nocc, nocc) and B_vv as [a, P, b] (nvir, naux, nvir): in that layout the
        Hessian's (ab|ij) product is two plain GEMMs, the first over (a P) rows (``mo_hessian``).
        Per aux block, three GEMMs over the whole block (B^P is symmetric): Z = C^T B [r, (P, μ)],
        then Z's occupied rows times C ([(i, P), r]) and its virtual rows times C_v ([(a, P), b],
        copied into B_vv's [:, P, :]). Only the oo, ov and vv blocks: 2 naux nao^2 nmo + 2 naux nao
        (nocc nmo + nvir^2) flops. An earlier form (C^T B^P batched over P, and one GEMM per P into
        B_vv's strided columns) ran at about a third of the DGEMM rate at (H2O)16's shapes."""
        be, naux = self.backend, self.fac.naux
        nao, nocc, nvir = self.nao, C_o.shape[1], C_v.shape[1]
        nmo = nocc + nvir
        Cd = on_device(be, np.hstack([C_o, C_v]))
        B_ov, B_oo, B_vv = (
            torch.empty(shape, dtype=torch.float64, device=Cd.device)
            for shape in ((naux, nocc, nvir), (naux, nocc, nocc), (nvir, naux, nvir))
        )
        Cv = Cd[:, nocc:]
        buf = memory.Buffers(device=Cd.device)
        for p0, p1, Bb in self._blocks():
            nb = p1 - p0
            Z = buf.get("Z", (nmo, nb * nao))  # [r, (P, μ)] = (C^T B^P)_rμ
            linalg.gemm(Cd, Bb.reshape(-1, nao), trans_a=True, trans_b=True, out=Z, backend=be)
            mo = linalg.gemm(Z[:nocc].view(-1, nao), Cd, out=buf.get("o", (nocc * nb, nmo)), backend=be)
            mo = mo.view(nocc, nb, nmo)  # [i, P, r]
            B_oo[p0:p1], B_ov[p0:p1] = mo[:, :, :nocc].transpose(0, 1), mo[:, :, nocc:].transpose(0, 1)
            vv = linalg.gemm(Z[nocc:].view(-1, nao), Cv, out=buf.get("v", (nvir * nb, nvir)), backend=be)
            B_vv[:, p0:p1] = vv.view(nvir, nb, nvir)
        return B_ov, B_oo, B_vv

    def mo_hessian(self):
        """z (nvir, nocc) -> (C_v^T G[2(C_v z C_o^T + h.c.)] C_o) in the MO basis of the factor:
        4 Σ_P B_ai^P Σ_bj B_bj^P z_bj - Σ_P Σ_bj (B_ab^P B_ij^P + B_aj^P B_ib^P) z_bj, i.e.
        4 (ai|bj) - (ab|ij) - (aj|ib) (DF-HF's orbital Hessian), from the factor ``build_mo`` kept:
        (ab|ij) as X[j, (a P)] = Σ_b z_bj B_vv[(a P), b] (one wide GEMM streaming B_vv, the largest
        operand: o v^2 naux flops; the SCF's K shape; X one buffer for every product) then
        Σ_j X[j] B_oo[:, j, :] (batched over j, from a [j, P, i] copy of B_oo); (aj|ib) through
        U[P, j, i] = Σ_b z_bj B_ib^P (batched over P) and B_ov[(P j), a]^T U; B_vv, B_oo symmetric
        in their MO indices. Why this order: the tall X[(a P), j] = B_vv z with its nocc columns ran
        at half the wide one's rate, and an earlier order (z B_oo^P batched over P, then
        B_vv[(P b), a]^T W) streamed B_vv, the largest operand, through a transposed one: slower."""
        B_ov, B_oo, B_vv = self.mo
        naux, nocc, nvir = B_ov.shape
        be = self.backend
        ov, ov2, vv2 = B_ov.view(naux, -1), B_ov.view(-1, nvir), B_vv.view(-1, nvir)
        oo_j = B_oo.permute(1, 0, 2).contiguous()  # [j, P, i]: read through strides, 1.4x slower there
        X = torch.empty((nocc, nvir * naux), dtype=torch.float64, device=B_ov.device)  # reused: no page faults

        def hess(z):
            zd = on_device(be, z)
            v = linalg.gemm(ov, zd.T.reshape(-1, 1), backend=be)  # Σ_bj B_jb^P z_bj
            J = linalg.gemm(ov, v, trans_a=True, alpha=4.0, backend=be).view(nocc, nvir).T
            linalg.gemm(zd, vv2, trans_a=True, trans_b=True, out=X, backend=be)  # [j, (a, P)] = Σ_b z_bj B_ab^P
            U = linalg.gemm(zd, B_ov, trans_a=True, trans_b=True, backend=be)  # [P, j, i] = Σ_b z_bj B_ib^P
            out = J - linalg.gemm(X.view(nocc, nvir, naux), oo_j, backend=be).sum(0)
            out -= linalg.gemm(ov2, U.view(naux * nocc, nocc), trans_a=True, backend=be)
            return out.cpu().numpy()

        return hess


def jk_energy_deriv_rhf(jk: DFJK, C: np.ndarray, nocc: int, P: np.ndarray) -> np.ndarray:
    """``jk_energy_deriv_blocked(jk, [C], [nocc], [2], [P/2])`` of an RHF (C (nao, nmo), the first
    ``nocc`` columns occupied; P (nmo, nmo) the relaxed density in the MO basis): (2, natm, 3)
    Eh/bohr, E_G^x(D/2, D) and E_G^x(P, D), from the factor in the MO basis the Z-vector kept
    (``DFJK.build_mo``: B_oo, B_ov) rather than from the AO factor. With ckm^P = C^T ck^P =
    L^-T [B_oo; B_vo]^P (nmo, nocc), held transposed as [P, k, r] so that every product below is
    a 2-D GEMM: for D1 = D/4 = C_o C_o^T/2, Y1 = C_o cko/2 and m = cko cko^T (cko = ckm's
    occupied rows: naux nocc^2 per product rather than naux nao nocc); for P, Y1m = P ckm / 2
    in the MO basis, m = 2 ckm Y1m^T and Y1 = C Y1m. The fitted densities d from the packed
    factor (one GEMV per density)."""
    be, nao, naux = jk.backend, jk.fac.nao, jk.fac.naux
    B_ov, B_oo = jk.mo[:2]
    L = on_device(be, metric_cholesky(jk.auxmol.intor("int2c2e"), "JK"))
    Cd, Pm = on_device(be, C), on_device(be, 0.5 * (P + P.T))
    Co = Cd[:, :nocc]
    D = linalg.gemm(Co, Co, trans_b=True, alpha=2.0, backend=be)
    P_ao = linalg.gemm(linalg.gemm(Cd, Pm, backend=be), Cd, trans_b=True, backend=be)
    D1t = [0.5 * D, 0.5 * (P_ao + P_ao.T)]
    pack = PairPack.get(nao, D.device)
    dens = torch.stack([pack.pack(x) for x in [D] + D1t])  # (3, npair), pair-weighted
    d = linalg.trsm(L, linalg.gemm(jk.fac.B, dens, trans_b=True, backend=be), trans=True, backend=be).T
    nmo = Cd.shape[1]
    ckm = torch.cat([B_oo, B_ov], dim=2)  # [P, k, r] = (C_o^T B^P C)_kr, ckm^P transposed
    ckm = linalg.trsm(L, ckm.view(naux, -1), trans=True, backend=be).contiguous().view(naux, nocc, nmo)
    cko = ckm[:, :, :nocc].reshape(naux, -1)  # [P, (k l)], symmetric in k, l
    Y1m = linalg.gemm(ckm.view(-1, nmo), Pm, alpha=0.5, backend=be)  # [P, k, r] = (P ckm^P / 2)_rk
    Y1 = [  # [P, μ, k] of [P, k, μ]: C_o cko^P / 2 and C Y1m^P
        linalg.gemm(cko.view(-1, nocc), Co, trans_b=True, alpha=0.5, backend=be),
        linalg.gemm(Y1m.view(-1, nmo), Cd, trans_b=True, backend=be),
    ]
    Y1 = [[y.view(naux, nocc, nao).transpose(1, 2).contiguous()] for y in Y1]
    ms = [linalg.gemm(cko, cko, trans_b=True, backend=be)]
    m = linalg.gemm(ckm.view(naux, -1), Y1m.view(naux, -1), trans_b=True, alpha=2.0, backend=be)
    ms.append(0.5 * (m + m.T))
    g2 = [-0.5 * (torch.outer(d[n + 1], d[0]) + torch.outer(d[0], d[n + 1])) + ms[n] for n in range(2)]
    return _jk_deriv_3c(jk, [Co], [2.0], D, D1t, d, Y1, g2)


def jk_energy_deriv_blocked(
    jk: DFJK, C: list, nocc: list, w: list, M: list, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """d/dR of E_G(D1) = Σ_σ w_σ D1^σ·(J[D] - K[D^σ]) at fixed densities, D^σ = C_o^σ C_o^σT,
    D = Σ_σ w_σ D^σ, for D1_hf^σ = D^σ / 2 and D1_m^σ = C^σ M^σ C^σT: (2, natm, 3) Eh/bohr, for the
    spins σ of C (each (nao, nmo), its first nocc_σ columns occupied) with weights w_σ and M^σ
    (nmo, nmo) symmetric in the MO basis. RHF: w = [2], M = P/2 (E_G(D1, D), G = J - K/2; the
    DF-RHF's two-electron gradient for D1 = D/2); UHF: w = [1, 1], M^σ = P^σ. With c = (μν|Q)
    (Q|P)^-1 = L^-T B the fitted coefficients (from the JK factor, never held whole): d0 = Σ D c,
    d1 = Σ D1t c with D1t = Σ_σ w_σ D1^σ, ck^σ_PλK = Σ_ν c_λνP C_νk, Y1^σ_PμK = Σ_λ D1^σ_μλ
    ck^σ_PλK; the weights of (μν|P)^x are D1t d0 + D d1 - Σ_σ w_σ (M^σ + M^σT)/2 with M^σ_PμN = 2
    Σ_k Y1^σ_PμK C_νk, those of (P|Q)^x -(d1 d0^T + d0 d1^T)/2 + Σ_σ w_σ (m^σ + m^σT)/4 with m^σ =
    2 Σ_μk ck^σ_PμK Y1^σ_QμK (``_jk_deriv_3c``), all in the MO basis below.

    Only the fitted MO coefficients are held whole: one pass over the AO factor gives the fitted
    densities' ρ and each spin's ckm's right-hand side [P, k, r] = (C_o^T B^P C)_kr (naux nocc_σ
    nmo; a factor split over ranks: each rank's rows, then sent to every rank, ``DFJK.all_rows``),
    then the factor is released (``DFJK.release``) and ckm = L^-T (that) is solved in place,
    column block by column block; with cko = ckm's occupied columns, Y1 = C_o cko / 2 (D1_hf) and
    C M ckm (D1_m), and the metric weights Σ_σ w_σ cko cko^T / 2 and m = Σ_σ w_σ ckm (M ckm)^T,
    are made per aux block (m column block by column block, Y1 inside the derivative integrals'
    blocks) instead of held (two of naux nao nocc and one of naux nocc nmo in
    ``jk_energy_deriv_rhf``). A spin with no occupied orbital has no exchange term."""
    be, nao, naux = jk.backend, jk.nao, jk.naux
    L = on_device(be, metric_cholesky(jk.auxmol.intor("int2c2e"), "JK"))
    Cd, Md = [on_device(be, c) for c in C], [on_device(be, m) for m in M]
    D = D1m = None
    for wi, c, no, m in zip(w, Cd, nocc, Md):
        Co = c[:, :no]
        D = linalg.gemm(Co, Co, trans_b=True, alpha=wi, beta=float(D is not None), out=D, backend=be)
        P_ao = linalg.gemm(linalg.gemm(c, m, backend=be), c, trans_b=True, alpha=wi, backend=be)
        D1m = P_ao if D1m is None else D1m + P_ao
    D1t = [0.5 * D, 0.5 * (D1m + D1m.T)]
    keep = [s for s, no in enumerate(nocc) if no]  # a spin with no electron has no exchange
    w, Cd, nocc, Md = [w[s] for s in keep], [Cd[s] for s in keep], [nocc[s] for s in keep], [Md[s] for s in keep]
    Co = [c[:, :no] for c, no in zip(Cd, nocc)]
    dens = torch.stack([D] + D1t).view(3, nao * nao)
    mine = jk.rows[1] - jk.rows[0]  # this rank's rows of a split factor (all in one process)
    rho = torch.empty((mine, 3), dtype=torch.float64, device=D.device)
    ckm = [torch.empty((mine, no, c.shape[1]), dtype=torch.float64, device=D.device) for c, no in zip(Cd, nocc)]
    for p0, p1, Bb in jk._blocks():
        nb = p1 - p0
        rho[p0:p1] = linalg.gemm(Bb.view(nb, -1), dens, trans_b=True, backend=be)
        for c, co, out in zip(Cd, Co, ckm):  # [P, k, r] of C_o^T B^P C
            ho = linalg.gemm(Bb.view(-1, nao), co, backend=be).view(nb, nao, -1).transpose(1, 2).contiguous()
            out[p0:p1] = linalg.gemm(ho.view(-1, nao), c, backend=be).view(nb, co.shape[1], -1)
    rho, ckm = jk.all_rows(rho).T, [jk.all_rows(x) for x in ckm]  # a split factor's shares on every rank
    jk.release()
    d = linalg.trsm(L, rho.T, trans=True, backend=be).T  # (3, naux)
    for x in ckm:
        trsm_columns(L, x.view(naux, -1), be)
    cko = [x[:, :, :no].reshape(naux, -1) for x, no in zip(ckm, nocc)]  # [P, (k l)], symmetric in k, l
    ms = _metric_weights(w, ckm, cko, Md, (naux, nao), block_mb, be, D.device)
    g2 = [-0.5 * (torch.outer(d[n + 1], d[0]) + torch.outer(d[0], d[n + 1])) + ms[n] for n in range(2)]

    def y1(p0, p1):  # per density, each spin's [P, μ, k] of C_o cko^P / 2 and C M ckm^P, this block of P only
        nb, out = p1 - p0, [[], []]
        for c, co, no, x, xo, mm in zip(Cd, Co, nocc, ckm, cko, Md):
            y0 = linalg.gemm(xo[p0:p1].reshape(-1, no), co, trans_b=True, alpha=0.5, backend=be)
            Y1m = linalg.gemm(x[p0:p1].view(-1, x.shape[2]), mm, backend=be)
            yp = linalg.gemm(Y1m, c, trans_b=True, backend=be)
            for n, y in enumerate((y0, yp)):
                out[n].append(y.view(nb, no, nao).transpose(1, 2).contiguous())
        return out

    return _jk_deriv_3c(jk, Co, w, D, D1t, d, y1, g2, block_mb)


def _metric_weights(w: list, ckm: list, cko: list, Md: list, sizes: tuple, block_mb: float, be, device) -> list:
    """``jk_energy_deriv_blocked``'s exchange parts of the metric weights (two (naux, naux)):
    Σ_σ w_σ cko cko^T / 2 and the symmetrised m = Σ_σ w_σ ckm (M ckm)^T, m column block by column
    block (about block_mb of M ckm each); sizes (naux, nao)."""
    naux, nao = sizes
    step = max(1, min(naux, int(block_mb * 1e6 // (3 * nao * nao * 8))))
    m = torch.empty((naux, naux), dtype=torch.float64, device=device)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        for s, (wi, x, mm) in enumerate(zip(w, ckm, Md)):
            Y1m = linalg.gemm(x[p0:p1].view(-1, x.shape[2]), mm, backend=be)  # [P, k, r] = (M ckm^P)_rk
            blk = linalg.gemm(x.view(naux, -1), Y1m.view(p1 - p0, -1), trans_b=True, alpha=wi, backend=be)
            if s:
                m[:, p0:p1] += blk
            else:
                m[:, p0:p1] = blk
    hf = torch.empty((naux, naux), dtype=torch.float64, device=device)
    for s, (wi, x) in enumerate(zip(w, cko)):
        linalg.gemm(x, x, trans_b=True, alpha=wi / 2, beta=float(s > 0), out=hf, backend=be)
    return [hf, 0.5 * (m + m.T)]


def trsm_columns(L: torch.Tensor, X: torch.Tensor, backend, block_mb: float = 64.0) -> None:
    """X <- L^-T X in place for lower-triangular L (n, n) and X (n, m), column block by column
    block (about block_mb each): no second X beside it."""
    n, m = X.shape
    step = max(1, int(block_mb * 1e6 // (8 * n)))
    for c0 in range(0, m, step):
        c1 = min(m, c0 + step)
        X[:, c0:c1] = linalg.trsm(L, X[:, c0:c1].contiguous(), trans=True, backend=backend)


def _jk_deriv_3c(  # noqa: PLR0913
    jk: DFJK, Cd: list, w: list, D, D1t: list, d, Y1, g2: list, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """``jk_energy_deriv_blocked``'s contraction with the derivative integrals (``df_deriv``), from its
    intermediates on the device: each spin's C_o (``Cd``) and weight, D, the D1t and Y1 of each
    density, d (1 + n, naux) and the metric weights g2 (n of (naux, naux)). Y1: per density a list
    of each spin's [P, μ, k] (naux, nao, nocc_σ), or a function (p0, p1) -> that list for the
    block of P in [p0, p1) (made per block, never held whole)."""
    be, nao = jk.backend, jk.nao
    if not callable(Y1):
        Y1_all = Y1
        Y1 = lambda p0, p1: [[y[p0:p1] for y in ys] for ys in Y1_all]
    buf = memory.Buffers(device=D.device)
    pack = PairPack.get(nao, D.device)
    dens_p = [torch.stack([pack.pack(x), pack.pack(D)]) for x in D1t]  # (2, npair) each, pair-weighted

    def g3(p0, p1):  # -(M + M^T)/2 + D1t d0 + D d1, packed with the pair weights
        nb = p1 - p0
        out, M = buf.get("out", (len(D1t), nb, pack.npair)), buf.get("M", (nb * nao, nao))
        for n, ys in enumerate(Y1(p0, p1)):
            for k, (wi, c, y) in enumerate(zip(w, Cd, ys)):
                linalg.gemm(
                    y.reshape(-1, c.shape[1]), c, trans_b=True, alpha=2.0 * wi, beta=float(k > 0), out=M, backend=be
                )
            pack.sym(M.view(nb, nao, nao), out[n], buf.get("M2", (nb, pack.npair)))
            coef = torch.stack([d[0, p0:p1], d[n + 1, p0:p1]], dim=1)  # (nb, 2)
            linalg.gemm(coef, dens_p[n], beta=-1.0, out=out[n], backend=be)  # minus the exchange part
        return out

    return df_deriv(jk.mol, jk.auxmol, g3, torch.stack(g2).cpu().numpy(), block_mb=block_mb, world=jk.world)
