"""The Hessian by second differences of the energy ``dfmp2 run`` prints (``gradient_fd.energy``:
a double hybrid's total, or MP2's), the reference of the frequencies tests that is independent of
the gradient code (imported as ``from hessian_fd import ...``):

    H_ii = (E(+h e_i) - 2 E_0 + E(-h e_i)) / h²
    H_ij = (E(+h e_i + h e_j) - E(+h e_i - h e_j) - E(-h e_i + h e_j) + E(-h e_i - h e_j)) / 4h²

over the Cartesian coordinates ``coords`` (default all 3N; Eh/bohr²), the others' rows and columns
left zero; 1 + 2n + 4 n(n-1)/2 energies for n coordinates."""

import itertools

import numpy as np
from gradient_fd import energy
from pyscf.data.nist import BOHR


def energy_hessian(geom, options, method: str, step: float, coords=None) -> np.ndarray:
    """(3N, 3N) Eh/bohr² by second differences of the energy at ``step`` (bohr) over ``coords``
    (indices 3 atom + xyz; default all); the rest zero."""
    n = 3 * geom.natm
    coords = list(range(n)) if coords is None else list(coords)
    x0 = np.asarray(geom.coords_angstrom, dtype=np.float64)

    def e(*moves):  # moves: (coordinate, sign) pairs
        x = x0.copy()
        for c, s in moves:
            x[c // 3, c % 3] += s * step * BOHR
        return energy(geom, options, method, x)

    e0 = e()
    H = np.zeros((n, n))
    for i in coords:
        H[i, i] = (e((i, 1)) - 2 * e0 + e((i, -1))) / step**2
    for i, j in itertools.combinations(coords, 2):
        d = e((i, 1), (j, 1)) - e((i, 1), (j, -1)) - e((i, -1), (j, 1)) + e((i, -1), (j, -1))
        H[i, j] = H[j, i] = d / (4 * step**2)
    return H
