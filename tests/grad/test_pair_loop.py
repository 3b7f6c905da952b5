"""The gradient's pair loop (``grad_pairs.pair_densities``) against einsum on a random problem, in
one block and in many (the blocks the ranks share), for RHF MP2/SCS and UMP2's same-spin and αβ
forms; and the derivative integrals' grouping (``df_deriv``) against one group."""

import numpy as np
import pytest
import torch

from dfmp2 import linalg
from dfmp2.grad import common as grad_common
from dfmp2.grad import deriv3c
from dfmp2.grad import pairs as grad_pairs

NACT, NVIR, NAUX = 6, 7, 11


def _problem(seed, nact=NACT, nvir=NVIR):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(nact * nvir, NAUX, dtype=torch.float64, generator=g)
    e_o = -1.0 - torch.rand(nact, dtype=torch.float64, generator=g)
    e_v = 1.0 + torch.rand(nvir, dtype=torch.float64, generator=g)
    return B, e_o, e_v


def _reference(B, e_o, e_v, c_os, c_ss, cols=None):
    Bc, f_o, f_v = cols if cols is not None else (B, e_o, e_v)
    Bt, Bu = B.view(len(e_o), len(e_v), -1), Bc.view(len(f_o), len(f_v), -1)
    K = torch.einsum("iaq,jbq->iajb", Bt, Bu)
    t = K / (e_o[:, None, None, None] - e_v[None, :, None, None] + f_o[None, None, :, None] - f_v[None, None, None, :])
    th = (c_os + c_ss) * t - (c_ss * t.permute(0, 3, 2, 1) if c_ss else 0.0)
    if cols is None:  # Γ_ia = Σ_jb θ_ij^ab B_jb, its definition (the loop makes rows of j: θ symmetric)
        G = torch.einsum("iajb,jbq->iaq", th, Bu).reshape(B.shape)
    else:  # αβ: the j side's Γ, Σ_ia θ_ij^ab B_ia (the other spin's from its own side)
        G = torch.einsum("iajb,iaq->jbq", th, Bt).reshape(Bc.shape)
    return G, -2.0 * torch.einsum("iajb,kajb->ik", t, th), 2.0 * torch.einsum("iajc,ibjc->ab", t, th)


@pytest.mark.parametrize("c_os,c_ss", [(1.0, 1.0), (1.2, 1.0 / 3.0), (0.0, 0.5)], ids=["mp2", "scs", "same-spin"])
@pytest.mark.parametrize("block_js", [1, 4, NACT], ids=["one-j", "uneven", "one-block"])
def test_pair_densities_match_einsum(monkeypatch, c_os, c_ss, block_js):
    """Γ, P_oo, P_vv in blocks of 1, 4 (6 = 4 + 2) and all j equal the einsum forms to 1e-12
    relative; the one-block path (PAIR_MIN_BLOCKS off) as well."""
    B, e_o, e_v = _problem(1)
    if block_js == NACT:
        monkeypatch.setattr(grad_pairs, "PAIR_MIN_BLOCKS", 1)
    block_mb = block_js * 2 * NACT * NVIR * NVIR * 8 / 1e6
    got = grad_pairs.pair_densities(B, e_o, e_v, linalg.TorchBackend("cpu"), c_os, c_ss, block_mb=block_mb)
    for x, y in zip(got, _reference(B, e_o, e_v, c_os, c_ss)):
        assert torch.allclose(x, y, rtol=1e-12, atol=1e-12 * float(y.abs().max()))


def test_alpha_beta_pairs_match_einsum():
    """UMP2's αβ pairs (``cols`` the other spin: 4 occupied, 9 virtual), θ = c_os/2 t: Γ of the
    j side, P_oo and P_vv of the i side."""
    B, e_o, e_v = _problem(2)
    Bc, f_o, f_v = _problem(3, nact=4, nvir=9)
    got = grad_pairs.pair_densities(
        B, e_o, e_v, linalg.TorchBackend("cpu"), 0.6, 0.0, cols=(Bc, f_o, f_v), block_mb=1e-3
    )
    for x, y in zip(got, _reference(B, e_o, e_v, 0.6, 0.0, cols=(Bc, f_o, f_v))):
        assert torch.allclose(x, y, rtol=1e-12, atol=1e-12 * float(y.abs().max()))


def test_block_owners_are_contiguous_and_even():
    assert grad_common.block_owners(7, 3) == [0, 0, 0, 1, 1, 2, 2]
    assert grad_common.block_owners(2, 3) == [0, 1]
    assert grad_common.block_owners(5, 1) == [0] * 5


def test_derivative_integral_groups_add_to_one_group(monkeypatch):
    """df_deriv with its aux blocks in DERIV_GROUPS groups equals the one-group sum to 1e-12
    (water / cc-pVDZ, cc-pVDZ-RI, random symmetric weights; small blocks: many groups)."""
    from pyscf import gto
    from pyscf.df import addons

    mol = gto.M(atom="O 0 0 0.117; H 0 0.757 -0.467; H 0 -0.757 -0.467", basis="cc-pvdz", verbose=0)
    aux = addons.make_auxmol(mol, "cc-pvdz-ri")
    nao, naux = mol.nao_nr(), aux.nao_nr()
    rng = np.random.default_rng(4)
    W = torch.from_numpy(rng.standard_normal((1, naux, nao * (nao + 1) // 2)))
    g2 = rng.standard_normal((1, naux, naux))
    g2 = g2 + g2.transpose(0, 2, 1)
    block_mb = 8 * 3 * nao * nao * 8 / 1e6  # 8 functions a block
    many = deriv3c.df_deriv(mol, aux, lambda p0, p1: W[:, p0:p1], g2, block_mb=block_mb)
    monkeypatch.setattr(deriv3c, "DERIV_GROUPS", 1)
    one = deriv3c.df_deriv(mol, aux, lambda p0, p1: W[:, p0:p1], g2, block_mb=block_mb)
    assert np.allclose(many, one, rtol=1e-12, atol=1e-12 * abs(one).max()) and abs(one).max() > 1e-3
