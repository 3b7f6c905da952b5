"""The reference MP2 pair energy every test compares against: one einsum over all (i, j, a, b), as
psi4numpy writes it. Memory O(ni nj nvir^2), so for small test problems only; no backend, no
blocking, no symmetry (a diagonal block's full I x I sum is what ``symmetric=True`` also returns)."""

from __future__ import annotations

import torch


def mp2_pair_energy_reference(
    Bi, Bj, eps_i, eps_j, eps_vir, *, k_dtype=torch.float64, eps_vir_j=None
) -> tuple[float, float]:
    """(e_os, e_ss) in Hartree over all pairs (i, j) in I x J, summed in fp64.

    Bi (ni, nvir, naux), Bj (nj, nvir, naux): B_ia^P; eps_i (ni,), eps_j (nj,), eps_vir (nvir,) in
    Hartree. K_ij = B_i B_j^T is formed in ``k_dtype`` (fp64; pass Bi.dtype to model an fp32 GEMM),
    then e_os = sum K_ab^2 / D and e_ss = sum K_ab (K_ab - K_ba) / D with D = e_i + e_j - e_a - e_b.
    eps_vir_j (nvir_j,): j of the other spin, Bj (nj, nvir_j, naux), b runs over its virtuals;
    returns (e_os, NaN).
    """
    f64 = torch.float64
    K = torch.einsum("iaP,jbP->ijab", Bi.to(k_dtype), Bj.to(k_dtype)).to(f64)  # (ni, nj, nvir, nvir)
    ev = eps_vir.to(f64)
    evj = ev if eps_vir_j is None else eps_vir_j.to(f64)
    D = (
        eps_i.to(f64)[:, None, None, None]
        + eps_j.to(f64)[None, :, None, None]
        - ev[None, None, :, None]
        - evj[None, None, None, :]
    )
    e_os = (K * K / D).sum()
    if eps_vir_j is not None:
        return float(e_os), float("nan")
    e_ss = (K * (K - K.transpose(2, 3)) / D).sum()
    return float(e_os), float(e_ss)
