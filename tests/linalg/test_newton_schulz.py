"""Newton–Schulz A^-1/2: accuracy vs the eigh reference, convergence reporting, clear failures."""

import itertools
import math

import pytest
import torch

from dfmp2.linalg import ConvergenceError, get_backend, inv_sqrt_spd, random_spd
from dfmp2.linalg.newton_schulz import chen_chow_alphas, newton_schulz_inv_sqrt, residual


def eigh_ref(a):
    w, v = torch.linalg.eigh(a.double())
    return (v * w.rsqrt()) @ v.T


@pytest.mark.parametrize(
    "dtype,cond",
    [(torch.float64, 1e2), (torch.float64, 1e6), (torch.float64, 1e10), (torch.float32, 1e2), (torch.float32, 1e4)],
)
def test_newton_schulz_matches_eigh(dtype, cond):
    n = 60
    a = random_spd(n, cond, 7, dtype=dtype, lmax=3.0)
    be = get_backend("cpu")
    x, info = inv_sqrt_spd(a, method="newton_schulz", backend=be)
    ref = eigh_ref(a)
    eps = torch.finfo(dtype).eps
    assert info["converged"] and info["method"] == "newton_schulz"
    assert info["residual"] <= 50 * cond * eps * math.sqrt(n) and info["residual"] == pytest.approx(residual(x, a))
    assert 0 < info["iterations"] <= 40 and info["host_syncs"] < info["iterations"]
    assert float(torch.linalg.norm(x.double() - ref) / torch.linalg.norm(ref)) <= 50 * cond * eps
    assert be.describe()["kernels"] == {"inv_sqrt_spd:newton_schulz(torch.matmul)": 1}


def test_unscaled_and_one_by_one():
    a = random_spd(40, 1e3, 2)
    _x, info = newton_schulz_inv_sqrt(a, scaled=False)
    assert info["converged"] and not info["scaled"]
    x1, info1 = newton_schulz_inv_sqrt(torch.tensor([[4.0]], dtype=torch.float64))
    assert info1["converged"] and x1.item() == pytest.approx(0.5, rel=1e-14)


def test_fp32_ill_conditioned_raises_clear_error():
    a = random_spd(60, 1e8, 3, dtype=torch.float32)
    with pytest.raises(ConvergenceError, match=r"did not converge .* float32.*residual"):
        inv_sqrt_spd(a, method="newton_schulz")
    x, info = inv_sqrt_spd(a, method="newton_schulz", check=False)
    assert not info["converged"] and x.shape == a.shape


def test_not_spd_diverges_with_error():
    a = -torch.eye(5, dtype=torch.float64)
    a[0, 0] = 1.0
    with pytest.raises(ConvergenceError, match="not SPD"):
        newton_schulz_inv_sqrt(a)


def test_max_iter_reported():
    a = random_spd(30, 1e8, 4)
    with pytest.raises(ConvergenceError, match="max_iter=3"):
        newton_schulz_inv_sqrt(a, max_iter=3)


def test_chen_chow_schedule():
    alphas, bounds = chen_chow_alphas(1e-6, 30)
    assert alphas[0] == pytest.approx(math.sqrt(3), rel=1e-5)
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(bounds)) and bounds[-1] > 0.999
    assert alphas[-1] == pytest.approx(1.0, abs=1e-3)
    assert chen_chow_alphas(1e-6, 5, scaled=False)[0] == [1.0] * 5


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        newton_schulz_inv_sqrt(torch.zeros(3, 4, dtype=torch.float64))
