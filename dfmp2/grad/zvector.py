"""The RHF gradient's orbital response: the relaxed density (``relaxed_density``) from the
unrelaxed one and the 3-index terms, by the Z-vector (CPHF of the DF-HF, conjugate gradients
over the JK factor's J/K, ``DFJK``)."""

from __future__ import annotations

import numpy as np

from dfmp2.grad.common import GradientError, Orbitals
from dfmp2.grad.jk_deriv import DFJK
from dfmp2.grad.pairs import Corr

# CPHF residual norm, relative to the right-hand side's: at 1e-9 the gradient is within ~1e-11 Eh/bohr
# of 1e-10's, in fewer iterations ((H2O)8/cc-pVDZ: scripts/results/docstring-measurements.md)
ZVECTOR_TOL = 1e-9
ZVECTOR_MAX_ITER = 100


def relaxed_density(orb: Orbitals, corr: Corr, jk: DFJK, backend, form: str = "mo"):
    """(P (nmo, nmo) the relaxed density in the MO basis, Y (nmo, nmo) the orbital-change
    coefficients with the relaxation and the HF part, zvector info). ``form`` 'mo': every J/K
    here is in the MO basis of the JK factor (``DFJK.build_mo``, kept for
    ``jk_energy_deriv_rhf``); 'ao': streamed from the AO factor per aux block (``DFJK.use_ao``)."""
    eps, occ, vir, act, frz = orb.eps, orb.occ, orb.vir, orb.act, orb.frz
    if form == "mo":
        jk.build_mo(orb.C[:, occ], orb.C[:, vir])
    else:
        jk.use_ao(orb.C[:, occ], orb.C[:, vir])
    P = np.zeros((orb.nmo, orb.nmo))
    P[np.ix_(act, act)] = corr.P_oo
    P[np.ix_(vir, vir)] = corr.P_vv
    Y = np.zeros((orb.nmo, orb.nmo))
    Y[:, act] += corr.Y_ri
    Y[:, vir] += corr.Y_ra
    if len(frz):  # the frozen-active rotations keep the frozen and active blocks canonical
        pfa = Y[np.ix_(frz, act)] / (2.0 * (eps[act][None, :] - eps[frz][:, None]))
        P[np.ix_(frz, act)] = pfa
        P[np.ix_(act, frz)] = pfa.T
    _add_density_terms(Y, P, orb, jk.G(P))
    R = Y[np.ix_(vir, occ)] - Y[np.ix_(occ, vir)].T
    z, hz, info = _solve_zvector(R, orb, jk)
    info["form"] = form
    Pov = np.zeros_like(P)
    Pov[np.ix_(vir, occ)] = -0.5 * z
    Pov[np.ix_(occ, vir)] = -0.5 * z.T
    # C_v^T G[Pov] C_o = -hess(z)/4 (the CG's own product); the occupied rows in the MO basis
    _add_density_terms(Y, Pov, orb, np.vstack([jk.G(Pov, vir_rows=False), -0.25 * hz]))
    if jk.mo is not None:
        jk.mo = jk.mo[:2] + (None,)  # B_vv (naux nvir^2) is not needed after the response
    Y[occ, occ] += 4.0 * eps[occ]
    return P + Pov, Y, info


def _add_density_terms(Y: np.ndarray, P: np.ndarray, orb: Orbitals, G: np.ndarray) -> None:
    """Y += the orbital-change terms of a density P (MO): 4 (C^T G[P] C)_rk, 2 P_pq e_q, with
    G = C^T G[P] C_o (nmo, nocc) given."""
    Y[:, orb.occ] += 4.0 * G
    Y += 2.0 * orb.eps[:, None] * P


def _solve_zvector(R: np.ndarray, orb: Orbitals, jk: DFJK) -> tuple[np.ndarray, np.ndarray, dict]:
    """(z, hess(z), info): z (nvir, nocc) of (e_a - e_i) z + C_v^T G[2(C_v z C_o^T + h.c.)] C_o = R
    by conjugate gradients with the diagonal preconditioner (the DF-RHF's orbital Hessian:
    positive definite for a stable RHF), and the two-electron product hess(z) of the solution from
    the CG's own recurrence (A z = R - r, the residual it carries: no further product; it differs
    from a fresh product by rounding, ~1e-15 relative). GradientError when it does not converge in
    ZVECTOR_MAX_ITER."""
    diag = orb.eps[orb.vir][:, None] - orb.eps[orb.occ][None, :]
    hess = jk.mo_hessian() if jk.mo is not None else jk.ao_hessian()

    def op(z):
        return diag * z + hess(z)

    rnorm0 = float(np.linalg.norm(R))
    z = R / diag
    if rnorm0 == 0.0:
        return z, np.zeros_like(R), {"iterations": 0, "residual": 0.0}
    r = R - op(z)
    s = r / diag
    p = s.copy()
    rs = float(np.sum(r * s))
    for it in range(1, ZVECTOR_MAX_ITER + 1):
        Ap = op(p)
        alpha = rs / float(np.sum(p * Ap))
        z += alpha * p
        r -= alpha * Ap
        res = float(np.linalg.norm(r)) / rnorm0
        if res < ZVECTOR_TOL:
            return z, (R - r) - diag * z, {"iterations": it, "residual": res}
        s = r / diag
        rs_new = float(np.sum(r * s))
        p = s + (rs_new / rs) * p
        rs = rs_new
    raise GradientError(
        f"the Z-vector (CPHF) equations did not converge in {ZVECTOR_MAX_ITER} iterations "
        f"(relative residual {res:.1e}); is the RHF reference stable?"
    )
