"""What the gradient's modules share: its error (``GradientError``), the index sets of one
channel's orbitals (``Orbitals``), host and device tensors, the fitting metric's Cholesky factor
and its triangular solves, and the split of blocks of work over ranks (``block_owners``)."""

from __future__ import annotations

import numpy as np
import torch

from dfmp2.errors import InputError


class GradientError(InputError):
    """A gradient this code does not compute (say why, before the work)."""


class Orbitals:
    """Index sets of one RHF channel: occ (all occupied), act (active occupied), frz (frozen
    occupied), vir (virtual; ``active_virtuals``: the active ones only, for the unrelaxed
    densities with frozen virtuals, which the response does not take); C (nao, nmo), eps (nmo,)
    Hartree."""

    def __init__(self, ch, active_virtuals: bool = False):
        self.C, self.eps = np.asarray(ch.mo_coeff, dtype=np.float64), np.asarray(ch.mo_energy, dtype=np.float64)
        nmo = self.C.shape[1]
        idx = np.arange(nmo)
        self.occ = idx[: ch.nocc]
        self.act = idx[(idx < ch.nocc) & ~ch.frozen]
        self.frz = idx[(idx < ch.nocc) & ch.frozen]
        self.vir = idx[(idx >= ch.nocc) & ~ch.frozen] if active_virtuals else idx[ch.nocc :]
        self.nmo = nmo


def host_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def metric_cholesky(j2c: np.ndarray, what: str) -> np.ndarray:
    """L (lower) of the metric; GradientError when it is not positive definite (the energy then
    used eigh with dropped directions, whose derivative this code does not have). torch's LAPACK,
    as every other host step here: numpy's OpenBLAS threads beside torch's OpenMP ones contend on
    a small machine, where a small Cholesky became far slower (scripts/results/docstring-measurements.md)."""
    L, info = torch.linalg.cholesky_ex(torch.from_numpy(np.ascontiguousarray(j2c)))
    if int(info) != 0:
        raise GradientError(
            f"the {what} fitting metric is not positive definite (the energy used its "
            "eigen-decomposition with dropped directions); its gradient is not "
            "implemented",
            option="auxbasis",
        )
    return L.numpy()


def solve_lower(L: np.ndarray, X: np.ndarray, trans: bool = False) -> np.ndarray:
    """L^-1 X (trans: L^-T X) for lower-triangular L (n, n), X (n, m), on the host (torch)."""
    Lt = torch.from_numpy(L)
    out = torch.linalg.solve_triangular(Lt.T if trans else Lt, torch.from_numpy(np.asarray(X)), upper=trans)
    return out.numpy()


def on_device(backend, x) -> torch.Tensor:
    """A host array (or tensor) as fp64 on the backend's device."""
    return backend.to_device(host_tensor(x) if isinstance(x, np.ndarray) else x, torch.float64)


def block_owners(nblocks: int, size: int) -> list[int]:
    """The rank of each of ``nblocks`` equal blocks of work over ``size`` ranks: contiguous runs
    (rank r before rank r + 1, as ``World.ordered_sum`` adds), as even as the count allows."""
    return [b * size // max(1, nblocks) for b in range(nblocks)]
