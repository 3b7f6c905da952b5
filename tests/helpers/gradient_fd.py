"""The finite-difference harness of the RHF and UHF gradient tests (tests/grad/test_gradient.py,
tests/grad/test_gradient_uhf.py; imported as ``from gradient_fd import ...``): central
differences of the energy ``dfmp2 run`` prints (``dfmp2.interfaces.api.run``, SCF converged to
1e-10), the step shown converged by halving it, on geometries distorted so that no gradient
component vanishes by symmetry."""

import dataclasses
from pathlib import Path

import numpy as np
from pyscf.data.nist import BOHR

from dfmp2.drivers import energy as energy_driver
from dfmp2.grad.mp2 import SCALES
from dfmp2.interfaces import api
from dfmp2.io.xyz import Geometry
from dfmp2.options import RunOptions

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
TOL = 1e-6  # Eh/bohr: the acceptance tolerance, analytic against finite differences
STEP = 1e-3  # bohr; STEP/2 is the convergence check
STEP_AGREE = 5e-7  # Eh/bohr: FD(STEP) and FD(STEP/2) agree to this: the step's error (~STEP^2) at STEP
# is 4/3 of their difference, below TOL (glycine's stiffest component: 3.4e-7)
CONV = 1e-10  # SCF orbital-gradient threshold for the finite differences
# a fixed distortion (Ångström) that breaks the inputs' symmetry: every component is nonzero
DISTORT = np.array([[0.013, -0.021, 0.008], [-0.017, 0.011, 0.024], [0.009, 0.019, -0.015], [0.022, -0.006, -0.018]])


def distorted(geom):
    """``geom`` moved by DISTORT (its first rows; repeated for more than four atoms)."""
    return dataclasses.replace(
        geom, coords_angstrom=geom.coords_angstrom + np.resize(DISTORT, geom.coords_angstrom.shape)
    )


def options(**kw) -> RunOptions:
    return RunOptions(scf_conv_tol_grad=CONV, **kw)


_backends = {}


def energy(geom, options, method, coords_angstrom) -> float:
    """The energy ``dfmp2 run`` prints for ``method`` at these coordinates (one CPU backend for all):
    a double hybrid's (``options.method``) total E_KS + PT2 + E_disp, else E_HF + MP2's scaled parts."""
    be = _backends.setdefault(options.device, energy_driver.make_backend(options))
    r = api.run(dataclasses.replace(geom, coords_angstrom=coords_angstrom), options, backend=be)
    if r.double_hybrid is not None:
        return r.double_hybrid["e_total"]
    c_os, c_ss = SCALES[method]
    return r.e_hf + c_os * r.e_os + c_ss * r.e_ss


def fd(geom, options, method, atom, xyz, step) -> float:
    """Central difference of the printed energy along one Cartesian component, Eh/bohr."""
    plus, minus = geom.coords_angstrom.copy(), geom.coords_angstrom.copy()
    plus[atom, xyz] += step * BOHR
    minus[atom, xyz] -= step * BOHR
    return (energy(geom, options, method, plus) - energy(geom, options, method, minus)) / (2 * step)


def assert_matches_fd(g, geom, options, method, *, halve=True, also=(), step=STEP):
    """The analytic gradient ``g`` (Eh/bohr) against central differences of every component at
    ``step`` (bohr, default STEP), to TOL. With ``halve``: the step is converged at the worst
    component and at ``also`` (components (atom, xyz)): FD(step/2) agrees with FD(step) to
    STEP_AGREE and with ``g`` to TOL. Returns the differences."""
    d = np.array([[fd(geom, options, method, a, x, step) for x in range(3)] for a in range(geom.natm)])
    assert np.abs(g - d).max() <= TOL, (g, d)
    if halve:
        for a, x in dict.fromkeys([np.unravel_index(np.abs(g - d).argmax(), g.shape), *also]):
            half = fd(geom, options, method, a, x, step / 2)
            assert abs(half - d[a, x]) <= STEP_AGREE
            assert abs(g[a, x] - half) <= TOL
    return d


def assert_dropin_matches_fd_along(mf_at, coords_bohr, seed: int, frozen: int = 1) -> None:
    """PySCF's route, ``dfmp2.DFMP2(mf_at(coords), frozen=frozen).nuc_grad_method()``, against the
    central difference (STEP, bohr) of ``DFMP2(...).run().e_tot`` along one random unit direction
    of all atoms at once (NumPy's generator seeded ``seed``), to TOL. ``mf_at(coords_bohr)``: a
    converged density-fitted PySCF RHF or UHF at those coordinates (natm, 3) in bohr."""
    import dfmp2

    de = dfmp2.DFMP2(mf_at(coords_bohr), frozen=frozen).nuc_grad_method().kernel()
    d = np.random.default_rng(seed).normal(size=coords_bohr.shape)  # all components at once
    d /= np.linalg.norm(d)
    e = [dfmp2.DFMP2(mf_at(coords_bohr + s * STEP * d), frozen=frozen).run().e_tot for s in (1, -1)]
    assert abs((e[0] - e[1]) / (2 * STEP) - float(np.sum(de * d))) <= TOL


def assert_matches_fd_along(g, geom, options, method, direction, step=STEP):
    """``g`` against the central difference (``step``, bohr) along one unit ``direction`` of all atoms at once."""
    e = [energy(geom, options, method, geom.coords_angstrom + s * step * BOHR * direction) for s in (1, -1)]
    assert abs((e[0] - e[1]) / (2 * step) - float(np.sum(g * direction))) <= TOL


# NH2 (doublet, 2B1): no degenerate partly filled shell, its UKS converges cleanly
NH2 = distorted(
    Geometry(
        symbols=("N", "H", "H"),
        coords_angstrom=np.array([[0, 0, 0], [0, 0.8020, 0.6367], [0, -0.8020, 0.6367]]),
        multiplicity=2,
        source="test",
    )
)
