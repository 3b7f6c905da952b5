"""The RHF DF-MP2 nuclear gradient: a stage after the energy, a peer of ``dfmp2.mp2`` (fp64).

The gradient is the derivative of exactly the energy ``dfmp2 run`` prints,
    E = E_HF[DF, JK-fit set] + c_os E_OS + c_ss E_SS[DF, MP2-fit set]
(MP2: c_os = c_ss = 1; SCS-MP2 1.2, 1/3; SOS-MP2 1.3, 0), with both fitting sets' metric and
3-center derivatives (Weigend & Häser, Theor. Chem. Acc. 97, 331 (1997); DiStasio et al.,
J. Comput. Chem. 28, 839 (2007)). Orbital indices: i, j active occupied, I frozen occupied,
k any occupied, a, b virtual, r, p any orbital; P, Q auxiliary functions. Spin-summed, real.

    t_ij^ab = (ia|jb) / (e_i + e_j - e_a - e_b),   (ia|jb) = Σ_Q B_ia^Q B_jb^Q,  B = (ia|P) L^-T
    θ_ij^ab = (c_os + c_ss) t_ij^ab - c_ss t_ij^ba          E_corr = Σ θ_ij^ab (ia|jb)
    Γ_ia^Q = Σ_jb θ_ij^ab B_jb^Q;  Γ~ = Γ L^-1 (non-orthogonal aux);  γ = L^-T (B^T Γ) L^-1
    P_ij = -2 Σ_kab t_ik^ab θ_jk^ab,  P_ab = 2 Σ_ijc t_ij^ac θ_ij^bc      (unrelaxed, symmetrised)
    Y_rp: the coefficient of the orbital change U_rp (C(x) = C U) in dE:
          Y_ri += 4 Σ_aP (ra|P) Γ~_iaP,   Y_ra += 4 Σ_iP (ir|P) Γ~_iaP,   Y_qp += 2 P_pq e_q,
          Y_rk += 4 (C^T G[P] C)_rk,      Y_kk += 4 e_k (HF);  G[D] = J[D] - K[D]/2 (JK-fit set)
    P_Ij = Y_Ij / (2 (e_j - e_I))                        frozen-active occupied block
    Z-vector (CPHF of the DF-HF):  (e_a - e_i) z_ai + (C_v^T G[2(C_v z C_o^T + h.c.)] C_o)_ai
                                    = R_ai = Y_ai - Y_ia;   P_ai = P_ia = -z_ai / 2
          (its G in the MO basis of the JK factor: 4 (ai|bj) - (ab|ij) - (aj|ib), five GEMMs)
    dE/dx = Σ (D + P) h^x - Σ W S^x + E_nuc^x + E_G^x(D/2 + P, D)[JK-fit]
            + 4 Σ Γ~_iaP (ia|P)^x - 2 Σ γ_PQ (P|Q)^x [MP2-fit],    W = C sym(Y) C^T / 2
with D = 2 C_o C_o^T, P the relaxed density in the AO basis, and E_G(D1, D2) = Σ D1 G[D2].

The pieces, in the order the stage runs them: the correlation part (``dfmp2.grad.pairs``: B, the
pair loop, Γ~ and the 3-index response terms) and its derivative integrals
(``dfmp2.grad.deriv3c``: libcint's int3c2e_ip1/ip2, int2c2e_ip1, int1e_ipovlp and PySCF's hcore
generator, ECP included, contracted on the host in torch in libcint's own aux-major layout,
(μν|P) and its derivatives streamed in aux-shell blocks of AUX_BLOCK_MB); then the JK factor on
the JK-fit set the SCF used (``dfmp2.grad.jk_deriv.DFJK``, over ``dfmp2.scf.jk.JKFactor``), the
Z-vector (``dfmp2.grad.zvector``) and the JK part's derivative (``dfmp2.grad.jk_deriv``). Each
phase holds its own large arrays only; the memory plan that picks their forms is
``dfmp2.grad.plan``'s (``choose_plan``); the UHF stage is ``dfmp2.grad.ump2``.

The stage keeps the unrelaxed density (P_ij, P_ab) and the relaxed one (P above) it made, with
the HF part, in ``GradientParts.densities`` (``dfmp2.grad.densities.MP2Densities``: dipoles);
``dfmp2.grad.relaxed`` runs this module's code up to the relaxed density, no derivatives.

With linear dependence (nmo < nao) the orbitals span the kept space of the canonical
orthogonalisation; the derivative of that space's choice is not included (a warning says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from pyscf.grad import rhf as pyscf_grad_rhf

from dfmp2 import linalg, memory
from dfmp2.grad.common import GradientError, Orbitals
from dfmp2.grad.densities import MP2Densities, from_correlation
from dfmp2.grad.deriv3c import df_deriv, one_electron_deriv
from dfmp2.grad.jk_deriv import DFJK, jk_energy_deriv_blocked, jk_energy_deriv_rhf
from dfmp2.grad.pairs import Corr, corr_intermediates, gamma3_weights
from dfmp2.grad.plan import GradientPlan, choose_plan, default_limit_mb, rhf_shapes
from dfmp2.grad.zvector import relaxed_density
from dfmp2.io.result import METHOD_SCALES, kernel_records
from dfmp2.timing import Timer

# their copies were 0.5 GB of (H2O)16's 2.0 GB peak at --memory 1.5GB, in the second pass over (μν|P))
SCALES = METHOD_SCALES


@dataclass
class GradientParts:
    """The nuclear gradient (natm, 3) in Eh/bohr and its parts: 'hf' (the DF-HF gradient with the
    JK-fit set), 'corr' (the correlation part, c_os and c_ss included); e_corr the correlation
    energy it differentiates (Hartree, recomputed here: equal to the stage's; on a device without
    fp64 to the energy run's fp32 error); zvector: CG
    iterations and final relative residual; warnings; timings (s) and flops (executed through
    dfmp2.linalg: the derivative integrals' libcint and numpy contractions are not counted) per stage."""

    gradient: np.ndarray
    hf: np.ndarray
    corr: np.ndarray
    e_corr: float
    c_os: float
    c_ss: float
    zvector: dict
    warnings: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    ran: dict = field(default_factory=dict)
    flops: dict = field(default_factory=dict)  # per stage of timings, through dfmp2.linalg (dfmp2.timing.Timer)
    # the unrelaxed and relaxed MP2 densities the stage made on its way (not in the JSON; dipoles from them)
    densities: MP2Densities | None = None
    peak_rss_mb: dict = field(default_factory=dict)  # per stage of timings: the process's peak RSS, MB (schema 7)
    # a double hybrid's gradient (dfmp2.grad.dh): the functional, its KS, PT2 and dispersion parts; None for MP2
    double_hybrid: dict | None = None

    def to_dict(self) -> dict:
        """As the result JSON writes it: the kernel maps of ``ran`` as ``result.kernel_records``
        (no '.' in any key, schema 3), ``flops`` beside ``timings`` (schema 4). The same keys for RHF
        and UHF (dfmp2/io/schemas): what only the RHF stage has (its plan, the Z-vector's form) is
        null for UHF."""
        ran = {k: kernel_records(v) if k in ("kernels", "host_kernels") else v for k, v in self.ran.items()}
        ran.setdefault("plan", None)  # UHF: one in-memory form, no plan to choose
        zvector = {"form": None, **self.zvector}
        return {
            "gradient": self.gradient.tolist(),
            "units": "Eh/bohr",
            "hf": self.hf.tolist(),
            "corr": self.corr.tolist(),
            "e_corr": self.e_corr,
            "c_os": self.c_os,
            "c_ss": self.c_ss,
            "zvector": zvector,
            "warnings": list(self.warnings),
            "timings": dict(self.timings),
            "flops": dict(self.flops),
            "peak_rss_mb": dict(self.peak_rss_mb),
            "ran": ran,
            "double_hybrid": self.double_hybrid,  # schema 10: null for MP2
        }


def check_supported(ref, backend) -> None:
    """GradientError (one line) for what this stage does not do: a UHF reference (its gradient is
    ``dfmp2.grad.ump2``'s), and what ``check_channels`` refuses."""
    if not ref.restricted:
        raise GradientError(
            "mp2_gradient is the RHF stage; a UHF reference's gradient is dfmp2.grad.ump2.uhf_mp2_gradient",
            option="reference",
        )
    check_channels(ref, backend, fp32_pair_loop=True)


def check_channels(ref, backend, fp32_pair_loop: bool = False) -> None:
    """GradientError (one line) for what the RHF and UHF stages do not do: frozen virtual orbitals
    (in any spin channel), a device without fp64 (unless ``fp32_pair_loop``: the RHF stage runs
    only its pair loop there, in fp32, and the rest on a host CPU backend in fp64)."""
    if any(np.any(ch.frozen[ch.nocc :]) for ch in ref.channels):
        raise GradientError(
            "frozen virtual orbitals are not supported by the gradient; freeze core orbitals only", option="frozen_core"
        )
    if not backend.has_fp64 and not fp32_pair_loop:
        raise GradientError(
            f"the UHF DF-MP2 gradient needs fp64 arithmetic, which device '{backend.name}' "
            "lacks (only the RHF gradient runs there); run it on the CPU",
            option="device",
        )


def correlation_terms(mol, mp2_auxmol, orb: Orbitals, host, c_os, c_ss, timer, t0, pair_backend, plan, world):  # noqa: PLR0913
    """The correlation part of an RHF-like gradient (the MP2 one, a double hybrid's PT2): the pair
    loop's intermediates (``corr_intermediates``, timed 'grad_mp2_densities') and the 3-center
    derivative of Γ and γ fitted with ``mp2_auxmol`` ((natm, 3) Eh/bohr, timed
    'grad_derivative_integrals'), with ``pair_backend`` running the pair loop's GEMMs and ``host``
    the rest. Returns (corr with its T_v freed, the derivative, t0)."""
    corr = corr_intermediates(mol, mp2_auxmol, orb, host, c_os, c_ss, pair_backend=pair_backend, plan=plan, world=world)
    t0 = timer.add("grad_mp2_densities", t0)
    gbuf = memory.Buffers(device=corr.T_v.device)
    corr_3c = df_deriv(
        mol,
        mp2_auxmol,
        lambda p0, p1: gamma3_weights([orb.C[:, orb.act]], [corr.T_v], p0, p1, host, gbuf)[None],
        -2.0 * corr.gamma_pq[None],
        block_mb=plan.block_mb,
        world=world,
    )[0]
    corr.T_v, gbuf = None, None  # (naux_mp2, nao, nact): not needed beside the JK factor
    return corr, corr_3c, timer.add("grad_derivative_integrals", t0)


def mp2_gradient(  # noqa: PLR0913
    mol,
    ref,
    mp2_auxmol,
    jk_auxmol,
    backend,
    *,
    c_os: float = 1.0,
    c_ss: float = 1.0,
    timer: Timer | None = None,
    plan: GradientPlan | None = None,
    world=None,
) -> GradientParts:
    """dE/dR (natm, 3) Eh/bohr of E_HF + c_os E_OS + c_ss E_SS for the converged DF-RHF ``ref``
    (its frozen core taken from its mask) with the MP2-fit set ``mp2_auxmol`` and the JK-fit set
    ``jk_auxmol`` (the SCF's), on ``backend``. A backend without fp64 (trn) runs the densities'
    pair loop (``pair_densities``) in fp32 and everything else on a host CPU backend in fp64
    (``dfmp2.scf.uhf.DFUHF``'s host backend); ``ran`` says which part ran where and which plan
    (``plan``: the forms of the Z-vector and of the JK derivative; default the fastest that fits
    memory.DEFAULT_FRACTION of the available memory, ``choose_plan``).

    The phases run in the order that keeps the fewest large arrays alive together: the
    correlation part (B, Γ, then T_v) and its derivative integrals first, T_v freed; then the JK
    factor, the Z-vector and the JK part's derivative."""
    check_supported(ref, backend)
    if plan is None:
        plan = choose_plan(rhf_shapes(mol, ref, mp2_auxmol, jk_auxmol), default_limit_mb())
    host = backend if backend.has_fp64 else linalg.TorchBackend("cpu")  # as dfmp2.scf.rhf.DFRHF.dense
    timer = timer or Timer(backend)
    timer.watch(host)
    kernels0 = (dict(backend.kernels_used), dict(host.kernels_used))
    t0 = time.perf_counter()
    ch = ref.channels[0]
    orb = Orbitals(ch)
    corr, corr_3c, t0 = correlation_terms(mol, mp2_auxmol, orb, host, c_os, c_ss, timer, t0, backend, plan, world)
    f0 = timer.executed()
    jk = DFJK(mol, jk_auxmol, host, timer, plan.factor, plan.fit_mb, plan.scratch_dir, world)
    try:
        return _response_and_jk(mol, orb, corr, corr_3c, jk, host, backend, plan, timer, (t0, f0), kernels0, c_os, c_ss)
    finally:
        jk.release()  # a factor on disk: its scratch directory goes, however the stage ends


def _response_and_jk(mol, orb, corr, corr_3c, jk, host, backend, plan, timer, t0f0, kernels0, c_os, c_ss):  # noqa: PLR0913
    """``mp2_gradient`` from the JK factor on: the Z-vector, the JK and one-electron derivatives."""
    t0, f0 = t0f0
    t0 = timer.add("grad_jk_factor", t0, flops0=f0)  # encloses the factor's scf_integrals and scf_fit
    P, Y, zinfo = relaxed_density(orb, corr, jk, host, plan.zvector)
    t0 = timer.add("grad_zvector", t0)
    C_o = orb.C[:, orb.occ]
    D = 2.0 * C_o @ C_o.T
    P_ao = orb.C @ P @ orb.C.T
    W = 0.5 * orb.C @ (0.5 * (Y + Y.T)) @ orb.C.T
    W_hf = 2.0 * (C_o * orb.eps[orb.occ]) @ C_o.T
    if plan.jk_deriv == "mo":
        jk_hf, jk_p = jk_energy_deriv_rhf(jk, orb.C, len(orb.occ), P)  # E_G^x(D/2, D), E_G^x(P, D)
    else:
        jk.mo = None
        Pm = 0.5 * (P + P.T)
        jk_hf, jk_p = jk_energy_deriv_blocked(jk, [orb.C], [len(orb.occ)], [2.0], [0.5 * Pm], plan.block_mb)
    jk.release()
    one_hf, one_p = one_electron_deriv(mol, [(D, W_hf), (P_ao, W - W_hf)])
    hf = one_hf + pyscf_grad_rhf.grad_nuc(mol) + jk_hf
    grad = hf + one_p + jk_p + corr_3c
    timer.add("grad_derivative_integrals", t0)
    warnings = linear_dependence_warnings(orb.C)
    ran = stage_ran(backend, host, kernels0)
    ran["plan"] = plan.record()
    return GradientParts(
        grad,
        hf,
        grad - hf,
        corr.e_corr,
        c_os,
        c_ss,
        zinfo,
        warnings,
        {k: v for k, v in timer.seconds.items() if k.startswith("grad_")},
        ran,
        {k: v for k, v in timer.stage_flops().items() if k.startswith("grad_")},
        rhf_record(orb, corr, P, c_os, c_ss, zinfo, ran),
        peak_rss_mb={k: v for k, v in timer.stage_rss().items() if k.startswith("grad_")},
    )


def linear_dependence_warnings(C: np.ndarray) -> list:
    """The gradient's warning when the orbitals C (nao, nmo) span fewer than nao functions: the
    change of the kept space with the geometry is not in the gradient."""
    if C.shape[1] >= C.shape[0]:
        return []
    return [
        f"linear dependence: {C.shape[0] - C.shape[1]} basis functions dropped; the "
        "gradient leaves out the change of the kept space with the geometry (it is not "
        "the exact derivative of the energy)"
    ]


def unrelaxed_corr(orb: Orbitals, corr: Corr) -> np.ndarray:
    """The unrelaxed correlation density in the MO basis (nmo, nmo): P_ij (active occupied) and
    P_ab (``orb.vir``), nothing else."""
    P = np.zeros((orb.nmo, orb.nmo))
    P[np.ix_(orb.act, orb.act)] = corr.P_oo
    P[np.ix_(orb.vir, orb.vir)] = corr.P_vv
    return P


def rhf_record(orb: Orbitals, corr: Corr, P: np.ndarray | None, c_os, c_ss, zinfo, ran, timings=None):
    """The MP2Densities of one RHF channel: the unrelaxed blocks of ``corr`` and the relaxed
    correlation density ``P`` (MO, None: not made), the HF part added."""
    return from_correlation(
        True,
        [orb.C],
        [len(orb.occ)],
        [orb_frozen(orb)],
        [unrelaxed_corr(orb, corr)],
        None if P is None else [P],
        c_os=c_os,
        c_ss=c_ss,
        zvector=zinfo,
        ran=ran,
        timings=dict(timings or {}),
    )


def orb_frozen(orb: Orbitals) -> np.ndarray:
    """(nmo,) bool: the orbitals of ``orb`` left out of the correlation (neither act nor vir)."""
    frozen = np.ones(orb.nmo, dtype=bool)
    frozen[orb.act] = frozen[orb.vir] = False
    return frozen


def _used(backend, kernels0: dict) -> dict:
    """The backend's kernels_used since ``kernels0`` (calls per 'op:kernel')."""
    return dict(sorted((k, n - kernels0.get(k, 0)) for k, n in backend.kernels_used.items() if n != kernels0.get(k, 0)))


# what each stage runs where (the gradient's ``ran``): on the backend (torch or linalg GEMMs) and on the host
PAIR_LOOP = "the pair loop (K, t, θ, Γ, P_oo, P_vv)"


BESIDE_PAIR_LOOP = (
    "B's two transforms, the JK factor, the Z-vector's MO factor and J/K, the derivative weights "
    "(through the JK factor's fitted coefficients)"
)


ON_DEVICE = f"{PAIR_LOOP}, {BESIDE_PAIR_LOOP}"


ON_HOST = (
    "libcint's 3-center and derivative integrals and their contractions (torch, fp64), the fits' "
    "Cholesky factors and triangular solves, dense nmo x nmo algebra (numpy, fp64)"
)


def stage_ran(backend, host, kernels0: tuple) -> dict:
    """What the RHF stage ran where: all on ``backend`` in fp64 (``host`` is ``backend``), or the
    pair loop on a device without fp64 in fp32 and the rest on the fp64 ``host``."""
    if host is backend:
        return {
            "device": backend.name,
            "precision": "fp64",
            "kernels": _used(backend, kernels0[0]),
            "on_device": ON_DEVICE,
            "host": ON_HOST,
        }
    return {
        "device": backend.name,
        "engine": backend.engine,
        "simulated": backend.caps.simulable and backend.engine != "neuron-hardware",
        "precision": "fp32 (the pair loop); fp64 on the host (the rest)",
        "kernels": _used(backend, kernels0[0]),
        "on_device": "the densities' pair loop's GEMMs (K = B B_J^T, Γ += θ B_J, P_oo, P_vv) in fp32; "
        "its elementwise steps (denominators, θ) in torch fp32 on the host",
        "host_device": host.name,
        "host_precision": "fp64",
        "host_kernels": _used(host, kernels0[1]),
        "host": f"on the host {host.name} backend (fp64): {BESIDE_PAIR_LOOP}; {ON_HOST}",
    }
