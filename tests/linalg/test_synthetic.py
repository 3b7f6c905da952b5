"""Philox-built test data: SPD matrices with a prescribed condition number, synthetic DF-MP2 problems."""

import pytest
import torch

from dfmp2 import linalg
from dfmp2.linalg import mp2_pair_energy, random_spd, synthetic_problem
from dfmp2.linalg.synthetic import spd_eigenvalues


@pytest.mark.parametrize("cond", [1.0, 1e2, 1e6, 1e10])
def test_random_spd_condition_number(cond):
    a = random_spd(64, cond, 1, lmax=2.0)
    assert torch.equal(a, a.T)
    w = torch.linalg.eigvalsh(a)
    assert w.min() > 0
    assert float(w.max()) == pytest.approx(2.0, rel=1e-12)
    assert float(w.max() / w.min()) == pytest.approx(cond, rel=1e-4)
    assert torch.allclose(w.flip(0), spd_eigenvalues(64, cond, 2.0), rtol=1e-5, atol=1e-14)


def test_random_spd_reproducible_and_rounded():
    a, b = random_spd(20, 1e3, 5), random_spd(20, 1e3, 5)
    assert torch.equal(a, b) and not torch.equal(a, random_spd(20, 1e3, 6))
    assert torch.equal(random_spd(20, 1e3, 5, dtype=torch.float32), a.float())
    assert random_spd(1, 10.0, 1).item() == 1.0
    with pytest.raises(ValueError):
        random_spd(4, 0.5, 1)


def test_synthetic_problem_shapes_energies_and_gap():
    p = synthetic_problem(12, 60, 150, seed=11)
    assert p.B.shape == (12, 60, 150) and p.B.dtype == torch.float64
    assert (p.nocc, p.nvir, p.naux) == (12, 60, 150)
    eo, ev = p.eps_occ, p.eps_vir
    assert eo.dtype == ev.dtype == torch.float64
    assert torch.all(eo[1:] >= eo[:-1]) and torch.all(ev[1:] >= ev[:-1])
    assert -20 <= eo.min() and eo.max() == -0.3 and ev.min() == 0.1 and ev.max() <= 5.0
    assert float(ev.min() - eo.max()) == pytest.approx(0.4)
    e_os, e_ss = mp2_pair_energy(p.B, p.B, eo, eo, ev, symmetric=True)
    per_occ = (e_os + e_ss) / p.nocc
    assert -0.05 <= per_occ <= -0.01  # chemically plausible correlation per occupied orbital
    assert 0.05 < e_ss / e_os < 0.5  # same-spin a fraction of opposite-spin, as in molecules


def test_synthetic_problem_reproducible_and_dtype():
    p, q = synthetic_problem(3, 10, 20, seed=1), synthetic_problem(3, 10, 20, seed=1)
    assert torch.equal(p.B, q.B) and torch.equal(p.eps_occ, q.eps_occ)
    assert not torch.equal(p.B, synthetic_problem(3, 10, 20, seed=2).B)
    r = synthetic_problem(3, 10, 20, seed=1, dtype=torch.float32)
    assert r.B.dtype == torch.float32 and torch.equal(r.B, p.B.float())
    assert r.eps_occ.dtype == torch.float64
    one = synthetic_problem(1, 1, 1, seed=0)
    assert one.B.shape == (1, 1, 1) and torch.isfinite(one.B).all()
    with pytest.raises(ValueError, match="nvir"):
        synthetic_problem(2, 0, 3, seed=0)
    assert linalg.philox.synthetic_problem is synthetic_problem
