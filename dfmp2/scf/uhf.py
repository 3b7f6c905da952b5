"""Our DF-UHF (``DFUHF``): DFRHF (dfmp2.scf.rhf) with two spin channels.

Open shells (``unrestricted``): DFUHF, the same factor and steps with two spin channels: J of
the total density, K per spin, one DIIS over both spins' stacked Fock matrices and commutators,
PySCF's UHF guess, <S^2> of the result (``reference.spin_square``). On a device without fp64 as
the RHF, with the host rebuild of G that open shells need (HOST_REBUILD_BELOW).
Shapes: D, G, F (2, nao, nao), C (2, nao, nmo), mo_energy (2, nmo), stacked alpha, beta (fp64,
Hartree). ``DFUHF.response`` and ``hessian_product``: the orbital Hessian products of the
stability check (dfmp2.scf.stability) and the UHF gradient's Z-vector (dfmp2.grad.ump2).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from pyscf.scf import uhf as pyscf_uhf

from dfmp2 import distributed, linalg
from dfmp2.df import basis
from dfmp2.provenance import ScfRecord
from dfmp2.reference import Reference, spin_square, unrestricted
from dfmp2.scf import stability
from dfmp2.scf.diis import UHF_DIIS_SPACE
from dfmp2.scf.jk import JKFactor
from dfmp2.scf.precision import UHF_PLANNED_REBUILD
from dfmp2.scf.rhf import DFRHF, ENGINE
from dfmp2.scf.settings import DEFAULT_SETTINGS, SCFSettings


class DFUHF(DFRHF):
    """Our DF-UHF: DFRHF with two spin channels, its spin-dependent steps overridden and the rest
    (the JK factor, iterations, mixed precision, incremental builds, finish, record) kept.
    D, G, F (2, nao, nao), C (2, nao, nmo) and mo_energy (2, nmo) are stacked alpha, beta:
        G_s = J(D_a + D_b) - K(D_s),  D_s = C_s,occ C_s,occ^T,  E = Σ_s tr D_s (H + G_s/2) + E_nuc
    one J of the total density, one K per spin (JKFactor.exchange). DIIS extrapolates both spins
    at once: one error vector of the stacked commutators F_s D_s S - S D_s F_s (PySCF's UHF
    DIIS), UHF_DIIS_SPACE of them. The orbital gradient is ||(C_a,vir^T F_a C_a,occ, C_b,vir^T F_b C_b,occ)|| (PySCF's
    UHF get_grad). Guess: PySCF's UHF ``get_init_guess`` ('minao', half the RHF density per spin;
    a singlet's symmetry broken as PySCF does). <S^2> of the result: ``reference.spin_square``."""

    reference = "UHF"
    diis_space = UHF_DIIS_SPACE
    planned_rebuild = UHF_PLANNED_REBUILD
    jk_text = "J of the total density by GEMVs, K per spin by GEMM + SYRK over the packed JK factor"
    jk_text_unpacked = (
        "J of the total density and K per spin in one pass over the unpacked JK factor "
        "(K by GEMM + SYRK, J by a GEMV per block)"
    )

    def __init__(self, mol, backend, settings: SCFSettings = DEFAULT_SETTINGS, **kw):
        """DFRHF's, for both spins (``settings.stability``: the check after convergence, ``run``)."""
        self.nocc_s = tuple(int(n) for n in mol.nelec)  # (alpha, beta)
        super().__init__(mol, backend, settings, **kw)

    def run(self) -> Reference:
        """DFRHF.run, then (``settings.stability``) the internal stability check of the converged
        UHF with this SCF's J/K (``hessian_product``, dfmp2.scf.stability; time 'stability'): its
        record in ``ScfRecord.stability``."""
        ref = super().run()
        if self.settings.stability:
            t0 = time.perf_counter()
            todev = self.dense.to_device
            C = todev(torch.from_numpy(np.stack([c.mo_coeff for c in ref.channels])), torch.float64)
            mo_e = todev(torch.from_numpy(np.stack([c.mo_energy for c in ref.channels])), torch.float64)
            rec = stability.lowest_root(
                *self.hessian_product(C, mo_e),
                ran=(
                    f"ours: Hessian products with this SCF's J/K ({self.backend.name}, "
                    f"{str(self.fac.dtype).replace('torch.float', 'fp')} factor), pyscf.lib.davidson on the host"
                ),
            )
            ref.scf.stability = rec.to_dict()
            self.timer.add("stability", t0)
        return ref

    def density_shape(self) -> tuple:
        return (2, self.nao, self.nao)

    def initial_density(self):
        """PySCF's UHF default guess, (2, nao, nao) numpy."""
        return pyscf_uhf.UHF(self.mol).get_init_guess()

    def guess(self):
        D = self.dense.to_device(np.asarray(self.dm0), torch.float64)
        return D, self.two_electron(D, *self.delta_factors(D, self.nao))

    def two_electron(self, Dm, C, split=(None, None), f=None):
        """G (2, nao, nao) fp64: G_s = J(Dm_a + Dm_b) - K(Dm_s); C and split one per spin."""
        J, K = self.coulomb_exchange(Dm[0] + Dm[1], f or self.cycle_factor(), list(zip(C, split)), 1.0)
        return J - K

    def occupied_factor(self, C):
        return tuple(C[s][:, :n] for s, n in enumerate(self.nocc_s)), (None, None)

    def delta_factors(self, dD, width=None):
        """Per spin (``delta_factor``, the same width for both: one kernel shape)."""
        pairs = [self.delta_factor(d, width) for d in dD]
        return tuple(c for c, _ in pairs), tuple(s for _, s in pairs)

    def diagonalize(self, F):
        pairs = [DFRHF.diagonalize(self, Fs) for Fs in F]
        return torch.stack([e for e, _ in pairs]), torch.stack([c for _, c in pairs])

    def density(self, C):
        return torch.stack(
            [
                linalg.syrk(Cs[:, :n], backend=self.dense) if n else torch.zeros_like(self.S)
                for Cs, n in zip(C, self.nocc_s)
            ]
        )

    def diis_error(self, F, D):
        return torch.stack([DFRHF.diis_error(self, Fs, Ds) for Fs, Ds in zip(F, D)])

    def orbital_gradient(self, F, C) -> float:
        return math.hypot(*(self.gradient_norm(F[s], C[s], n) for s, n in enumerate(self.nocc_s)))

    @classmethod
    def response(cls, fac: JKFactor, dense, nocc_s, world=None) -> DFUHF:
        """This class's J/K steps (``two_electron``, ``delta_factors``, ``hessian_product``) over a
        given fp64 factor ``fac`` on the fp64 backend ``dense``, without an SCF: the converged
        UHF's orbital response after the energy (the UHF gradient's Z-vector, dfmp2.grad.ump2).
        nocc_s: (alpha, beta) occupied orbitals. ``world``: the ranks a split factor's groups are
        on (J and K added over them in group order, ``World.ordered_sum``); None: one process, a
        whole factor. fp64 throughout."""
        if fac.dtype != torch.float64 or not dense.has_fp64:
            raise ValueError("the response's J/K are fp64: an fp64 factor on an fp64 backend")
        self = cls.__new__(cls)
        self.fac, self.fac32, self.fac64, self.dense, self.backend = fac, None, None, dense, dense
        self.world, self.nao = world if world is not None else distributed.World(), fac.nao
        self.nocc_s = tuple(int(n) for n in nocc_s)
        self.nocc = max(self.nocc_s)
        self.fp32_phase, self.g_noise = False, 0.0
        return self

    def hessian_product(self, C: torch.Tensor, mo_e: torch.Tensor):
        """(hop, hdiag) of the orbital Hessian of the converged UHF with orbitals C (2, nao, nmo)
        and energies mo_e (2, nmo) on the dense device, in PySCF's gen_g_hop_uhf convention
        (dfmp2.scf.stability): hop(x) (numpy (n,) -> (n,), n = Σ_s nvir_s nocc_s, Hartree) builds
        G_s = J(dD_a + dD_b) - K(dD_s) of dD_s = C_v x_s C_o^T + C_o x_s^T C_v^T with this SCF's
        J/K on the device (fp64 factor where the device has it; K of dD_s from the factors
        (C_v x_s ± C_o)/√2, split as in the incremental builds); hdiag (n,) = e_a - e_i."""
        dense, f = self.dense, self.fac
        occ = [(C[s][:, :n], C[s][:, n:], mo_e[s][:n], mo_e[s][n:]) for s, n in enumerate(self.nocc_s)]
        sizes = [(cv.shape[1], co.shape[1]) for co, cv, _, _ in occ]
        hdiag = np.concatenate([(ev[:, None] - eo[None, :]).reshape(-1).cpu().numpy() for _, _, eo, ev in occ])

        def hop(x):
            xs, p = [], 0
            for nv, no in sizes:
                xs.append(
                    dense.to_device(torch.from_numpy(np.ascontiguousarray(x[p : p + nv * no])), torch.float64).reshape(
                        nv, no
                    )
                )
                p += nv * no
            dD, factors = [], []
            for (co, cv, _, _), xk in zip(occ, xs):
                a = cv @ xk
                dD.append(a @ co.mT + co @ a.mT)
                factors.append(torch.cat([a + co, a - co], dim=1) / math.sqrt(2.0))
            G = self.two_electron(torch.stack(dD), tuple(factors), split=tuple(self.nocc_s), f=f)
            out = [
                (cv.mT @ G[s] @ co + ev[:, None] * xk - xk * eo[None, :]).reshape(-1)
                for s, ((co, cv, eo, ev), xk) in enumerate(zip(occ, xs))
            ]
            return torch.cat(out).cpu().numpy()

        return hop, hdiag

    def reference_of(self, C, mo_e, e_tot: float, record: ScfRecord) -> Reference:
        """Two channels, with <S^2> of the occupied orbitals."""
        na, nb = self.nocc_s
        s2 = spin_square(C[0][:, :na], C[1][:, :nb], self.S.cpu().numpy())
        return unrestricted(
            C,
            mo_e,
            self.nocc_s,
            e_hf=e_tot,
            source=ENGINE,
            scf=record,
            jk_auxbasis=basis.describe_auxbasis(self.jk_spec),
            s2=s2,
        )
