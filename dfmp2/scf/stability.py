"""Internal stability of a converged UHF: the lowest eigenvalue of its orbital Hessian (real UHF ->
UHF rotations), the check of PySCF's ``scf.stability.uhf_internal``, which only logs that value.

    (H x)_s = 2 [ (e_a - e_i) x_ai + (C_v^T G_s(dD) C_o)_ai ],   s = alpha, beta
    dD_s = C_v x_s C_o^T + C_o x_s^T C_v^T,  G_s(dD) = J(dD_a + dD_b) - K(dD_s)
    x = (x_a (nvir_a, nocc_a), x_b (nvir_b, nocc_b)) raveled;  lambda_min < STABLE_ABOVE (Eh): unstable

PySCF's convention (``pyscf.soscf.newton_ah.gen_g_hop_uhf``'s product, doubled). The lowest root
comes from ``pyscf.lib.davidson`` on the host (vectors of nvir*nocc numbers) with uhf_internal's
preconditioner and tolerance. The product is the caller's: our DF-UHF builds G with its own JK
factor on the run's device (``dfmp2.scf.uhf.DFUHF.hessian_product``), a PySCF SCF with PySCF's response
(``pyscf_product``, on the host). ``StabilityRecord.ran`` says which.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

STABLE_ABOVE = -1e-5  # Eh: PySCF's threshold (uhf_internal: unstable when lambda_min < -1e-5)
TOL = 1e-4  # PySCF's STAB_TOL: the Davidson's convergence (Eh)


@dataclass
class StabilityRecord:
    """The internal stability check of a UHF: the lowest orbital-Hessian eigenvalue (Hartree),
    whether it is stable (lowest >= threshold), what built the Hessian products and where,
    how many products, seconds."""

    lowest: float
    stable: bool
    threshold: float
    ran: str
    products: int
    seconds: float

    def warning(self) -> str | None:
        """One line when the UHF is internally unstable, else None."""
        if self.stable:
            return None
        return (
            f"internal instability: the converged UHF's orbital Hessian has eigenvalue {self.lowest:.3e} Eh "
            f"(below {self.threshold:g}): a lower UHF solution lies nearby, this one is a saddle point; "
            "try another guess or multiplicity"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def warning(record: dict | None) -> str | None:
    """The warning line of a StabilityRecord's dict (``ScfRecord.stability``), None when stable or
    not checked."""
    return StabilityRecord(**record).warning() if record else None


def lowest_root(hop, hdiag: np.ndarray, ran: str) -> StabilityRecord:
    """The lowest eigenvalue of the orbital Hessian whose product is ``hop(x)`` (x, Hx: (n,) fp64,
    Hartree, PySCF's gen_g_hop_uhf convention without the factor 2) with diagonal estimate
    ``hdiag`` (n,), as uhf_internal takes it (its start vector without point-group symmetry,
    its preconditioner, tolerance TOL), one root. ``ran``: what built the products."""
    from pyscf import lib

    t0, count = time.perf_counter(), [0]
    hdiag = 2.0 * np.asarray(hdiag, dtype=np.float64)

    def hessian_x(x):
        count[0] += 1
        return 2.0 * np.asarray(hop(x), dtype=np.float64)

    def precond(dx, e, _x0):
        d = hdiag - e
        d[abs(d) < 1e-8] = 1e-8
        return dx / d

    x0 = 1.0 / np.where(abs(hdiag) < 1e-8, 1e-8, hdiag)
    x0[np.argmin(hdiag)] = 1.0
    e, _ = lib.davidson(hessian_x, x0, precond, tol=TOL, nroots=1, verbose=0)
    e = float(np.atleast_1d(e)[0])
    return StabilityRecord(
        lowest=e,
        stable=not e < STABLE_ABOVE,
        threshold=STABLE_ABOVE,
        ran=ran,
        products=count[0],
        seconds=time.perf_counter() - t0,
    )


def pyscf_product(mf):
    """(hop, hdiag) of PySCF's UHF ``mf`` (converged, its own orbitals): gen_g_hop_uhf on the host."""
    from pyscf.soscf import newton_ah

    _, hop, hdiag = newton_ah.gen_g_hop_uhf(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    return hop, hdiag


def uhf_internal_pyscf(mf) -> StabilityRecord:
    """The check of a UHF PySCF converged (``mf``), its products by PySCF on the host."""
    hop, hdiag = pyscf_product(mf)
    jk = "DF-J/K" if getattr(mf, "with_df", None) is not None else "exact J/K"
    return lowest_root(hop, hdiag, f"PySCF on the host: gen_g_hop_uhf products ({jk}), pyscf.lib.davidson")
