"""The derivative integrals of the gradient, contracted on the host: the 3-center and metric
derivatives of a fitting set with packed weights (``df_deriv``: int3c2e_ip1/ip2, int2c2e_ip1),
the symmetric pair packing they take (``PairPack``), the one-electron derivatives
(``one_electron_deriv``: PySCF's hcore generator, ECP included, and int1e_ipovlp) and the
(μν|P) blocks over aux shells (``j3c_blocks``). Each in libcint's own (aux-major) layout."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from pyscf import lib as pyscf_lib
from pyscf.df import incore as df_incore
from pyscf.grad import rhf as pyscf_grad_rhf
from pyscf.scf import hf as pyscf_hf

from dfmp2 import distributed, memory
from dfmp2.df import integrals
from dfmp2.grad.common import block_owners
from dfmp2.grad.plan import AUX_BLOCK_MB

DERIV_GROUPS = 16  # the derivative integrals' aux blocks in this many fixed groups (where there are that many)


def j3c_blocks(mol, auxmol, block_mb: float = AUX_BLOCK_MB):
    """(p0, p1, (μν|P) as [P, μ, ν] (p1 - p0, nao, nao)) over aux-shell blocks of about block_mb,
    C-contiguous, symmetric in μν: libcint's pairs μ >= ν (s2ij, half the integrals of the full
    square) unpacked on the host (``integrals.unpack``, exact copies, into one reused buffer: the
    block is valid until the next one is made)."""
    nao = mol.nao_nr()
    step = max(1, int(block_mb * 1e6 // (nao * nao * 8)))
    buf = memory.Buffers()
    for s0, s1, p0, p1 in integrals.aux_shell_blocks(auxmol, step):
        sl = (0, mol.nbas, 0, mol.nbas, s0, s1)
        packed = torch.from_numpy(df_incore.aux_e2(mol, auxmol, "int3c2e", aosym="s2ij", shls_slice=sl).T)
        yield p0, p1, integrals.unpack(packed, nao, out=buf.get("j3c", (p1 - p0, nao, nao)))


def _atom_of(mol) -> np.ndarray:
    """(nao,) the atom of each basis function."""
    out = np.empty(mol.nao_nr(), dtype=int)
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        out[p0:p1] = a
    return out


class PairPack:
    """Symmetric [.., μ, ν] arrays in PySCF's s2ij pair order (μ >= ν, row by row) with each pair's
    weight w (2 off the diagonal, 1 on it), so that Σ_μν W_μν X_μν = Σ_pairs (w W)_pair X_pair for a
    symmetric X: ``sym`` of a (nb, nao, nao) block, ``pack`` of one (nao, nao) matrix. One per
    (nao, device), kept (index tensors of nao^2/2 int64)."""

    _cache: ClassVar[dict] = {}

    def __init__(self, nao: int, device):
        rows, cols = np.tril_indices(nao)
        dev = lambda x: torch.from_numpy(x).to(device)
        self.npair = len(rows)
        self.lower, self.upper = dev(rows * nao + cols), dev(cols * nao + rows)
        self.diag = dev(np.flatnonzero(rows == cols))
        self.weight = dev(np.where(rows == cols, 1.0, 2.0))

    @classmethod
    def get(cls, nao: int, device) -> PairPack:
        key = (nao, str(device))
        if key not in cls._cache:
            cls._cache.clear()
            cls._cache[key] = cls(nao, device)
        return cls._cache[key]

    def sym(self, M: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """w (M + M^T)/2 at μ >= ν: M_μν + M_νμ off the diagonal, M_μμ on it, for a contiguous M
        (nb, nao, nao), into ``out`` (nb, npair) (``scratch`` alike, for a device). In host memory
        (fp64) PySCF's C hermi_sum (M overwritten by M + M^T, cache-blocked) and pack_tril: about
        2.5 times faster there than torch's two gathers, whose second one strides by nao."""
        if M.is_cpu and M.dtype == torch.float64 and M.is_contiguous():
            pyscf_lib.hermi_sum(M.numpy(), axes=(0, 2, 1), inplace=True)
            pyscf_lib.pack_tril(M.numpy(), out=out.numpy())
        else:
            flat = M.reshape(M.shape[0], -1)
            torch.index_select(flat, 1, self.lower, out=out)
            out.add_(torch.index_select(flat, 1, self.upper, out=scratch))
        out[:, self.diag] *= 0.5
        return out

    def pack(self, D: torch.Tensor) -> torch.Tensor:
        """w D at μ >= ν (npair,) for a symmetric D (nao, nao)."""
        return D.reshape(-1)[self.lower] * self.weight


def df_deriv(mol, auxmol, g3_block, g2: np.ndarray, block_mb: float = AUX_BLOCK_MB, world=None) -> np.ndarray:
    """Σ_μνP g3_PμN d(μν|P)/dR + Σ_PQ g2_PQ d(P|Q)/dR for n weight sets at once: (n, natm, 3)
    Eh/bohr. ``g3_block(p0, p1)``: the weights g3 symmetric in μν, packed at μ >= ν with the
    pair's weight w (2 off the diagonal: ``PairPack``), a tensor (n, p1 - p0, nao(nao+1)/2) on any
    device (brought to the host); g2 (n, naux, naux) symmetric. libcint's int3c2e_ip1
    (∇μ ν|P) and int3c2e_ip2 (μν|∇P), both for the pairs μ >= ν only (PySCF's s2ij, half of
    int3c2e_ip1's full square), in aux-shell blocks contracted on the host (torch), and
    int2c2e_ip1 (∇P|Q). The derivative on ν's centre comes from translational invariance,
    (μ ∇ν|P) = -(∇μ ν|P) - (μν|∇P), so that with w W the pair's weight (w = 2 off the diagonal)
        dE/dR_A = Σ_P Σ_μ>=ν w W_PμN [(δ_A,at(ν) - δ_A,at(μ)) (∇μ ν|P) + (δ_A,at(ν) - δ_A,at(P)) (μν|∇P)]
    (the identity holds to rounding: the gradient moves by ~1e-15 relative).

    The aux blocks fall in DERIV_GROUPS fixed groups (fewer where there are fewer blocks), each
    group's per-pair sums added up from zero; the groups' sums are added in group order
    (``World.ordered_sum``). Over several ranks (``world``) each rank makes the groups
    ``block_owners`` gives it: the same bits as one process."""
    nao, naux, n = mol.nao_nr(), auxmol.nao_nr(), g2.shape[0]
    world = world if world is not None else distributed.World()
    rows, cols = np.tril_indices(nao)  # PySCF's s2ij order: μ >= ν, row by row
    step = max(1, int(block_mb * 1e6 // (3 * nao * nao * 8)))  # ip1 and ip2 packed: 3 nao^2 together
    blocks = integrals.aux_shell_blocks(auxmol, step)
    ngroup = min(len(blocks), DERIV_GROUPS)
    group_of = block_owners(len(blocks), ngroup)
    own = block_owners(ngroup, world.size)
    buf = memory.Buffers()  # the products' scratch, reused: a fresh temporary of this size is page faults
    m = n * 3 * len(rows)
    shape = (2 * m + n * 3 * naux,)  # [a1 | a2 | g_aux]

    def views(flat):  # a1, a2 (n, 3, npair): Σ_P w W (∇μ ν|P), Σ_P w W (μν|∇P) per pair; g_aux (n, 3, naux) per P
        return flat[:m].view(n, 3, -1), flat[m : 2 * m].view(n, 3, -1), flat[2 * m :].view(n, 3, naux)

    def group_sums(g):
        flat = torch.zeros(shape, dtype=torch.float64)
        a1, a2, g_aux = views(flat)
        for s0, s1, p0, p1 in (blk for blk, gb in zip(blocks, group_of) if gb == g):
            distributed.fault("gradient")
            sl = (0, mol.nbas, 0, mol.nbas, s0, s1)
            Wp = g3_block(p0, p1).to("cpu", torch.float64)  # (n, nb, npair), w W at μ >= ν
            for name, acc in (("int3c2e_ip1", a1), ("int3c2e_ip2", a2)):
                ip = torch.from_numpy(
                    df_incore.aux_e2(mol, auxmol, name, aosym="s2ij", comp=3, shls_slice=sl).transpose(0, 2, 1)
                )  # [x, P, μ>=ν]
                prod = buf.get("prod", ip.shape[1:])
                for k in range(n):
                    for x in range(3):
                        torch.mul(ip[x], Wp[k], out=prod)
                        acc[k, x] += prod.sum(0)
                        if acc is a2:
                            g_aux[k, x, p0:p1] = prod.sum(1)
                del ip
        return flat

    mine = (group_sums(g) for g in range(ngroup) if own[g] == world.rank)
    a1, a2, g_aux = views(world.ordered_sum(mine, shape, torch.float64, "cpu", "gradient"))
    return _assign_to_atoms(mol, auxmol, rows, cols, a1, a2, g_aux, g2)


def _assign_to_atoms(mol, auxmol, rows, cols, a1, a2, g_aux, g2) -> np.ndarray:
    """``df_deriv``'s per-pair and per-P sums (a1, a2 (n, 3, npair); g_aux (n, 3, naux)) and the
    metric's weights g2 (n, naux, naux) to (n, natm, 3) Eh/bohr: a1 to at(ν) minus at(μ), a2 to
    at(ν), -g_aux and -2 Σ_Q g2_PQ (∇P|Q) to at(P)."""
    at_mu, at_nu = _atom_of(mol)[rows], _atom_of(mol)[cols]
    ip = auxmol.intor("int2c2e_ip1")  # (3, naux, naux)
    g = np.zeros((a1.shape[0], mol.natm, 3))
    for k in range(a1.shape[0]):
        s1, s2 = a1[k].numpy().T, a2[k].numpy().T
        np.add.at(g[k], at_nu, s1 + s2)
        np.add.at(g[k], at_mu, -s1)
        np.add.at(g[k], _atom_of(auxmol), -g_aux[k].numpy().T - 2.0 * np.einsum("xpq,pq->px", ip, g2[k], optimize=True))
    return g


def one_electron_deriv(mol, pairs) -> list:
    """[Σ D dh/dR - Σ W dS/dR (natm, 3) Eh/bohr for each (D, W) in ``pairs``] (symmetric D, W
    (nao, nao)): PySCF's hcore generator (kinetic, nuclear attraction, ECP) and -int1e_ipovlp,
    each atom's integrals made once."""
    mf_grad = pyscf_grad_rhf.Gradients(pyscf_hf.RHF(mol))
    hcore_deriv = mf_grad.hcore_generator(mol)
    s1 = mf_grad.get_ovlp(mol)  # -(∇μ|ν)
    out = [np.zeros((mol.natm, 3)) for _ in pairs]
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        h1 = hcore_deriv(a)
        for g, (D, W) in zip(out, pairs):
            g[a] += np.einsum("xij,ij->x", h1, D) - 2.0 * np.einsum("xij,ij->x", s1[:, p0:p1], W[p0:p1])
    return out
