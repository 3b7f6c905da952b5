"""The RHF DF-MP2 nuclear gradient: a stage after the energy, a peer of ``mp2.py`` (fp64).

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

The pair loop (``_pair_densities``) runs over blocks of j with every i at once (no i >= j
symmetry: P_ij needs every i of one j), all its steps in torch on the backend: K, t, θ, Γ, P_oo,
P_vv are GEMMs and in-place elementwise steps over one block (K and Γ over every ordered pair, P_oo
and P_vv: about 4.6 times the flops of the energy's pair step, which takes i >= j). J/K (the G of
the CPHF and of P) are our DF builds on the JK-fit set the SCF used
(``dfmp2.scf.jk.JKFactor``); the derivative integrals (int3c2e_ip1/ip2, int2c2e_ip1, int1e_ipovlp, and
PySCF's hcore generator, ECP included) come from libcint on the host and are contracted there in
torch, each in libcint's own (aux-major) layout, with weights built as [P, μ, ν] blocks. (μν|P)
and its derivatives are streamed in aux-shell blocks (AUX_BLOCK_MB).

Memory: the phases run one after another, each holding its own large arrays only (``phase_mb``):
the densities (B and Γ, nact nvir naux_mp2 each, freed before Γ~'s half back-transform T_v,
naux_mp2 nao nact), the correlation part's derivative integrals (T_v freed after them), the JK
factor's fit (twice the packed factor), the Z-vector and the JK part's derivative. A plan
(``GradientPlan``, ``choose_plan``: the fastest that fits the limit) picks each of the last two
phases' form: the Z-vector with the factor in the MO basis held (B_ov, B_oo, B_vv) or streamed
from the AO factor per aux block (about 2.5 times the flops a product, no MO factor); the JK
derivative with its fitted coefficients' Y1 held, or made per aux block with the factor released
first. The factor itself is in memory (naux_jk nao(nao+1)/2 packed, its fit twice that), on
disk (the smallest plan) or, over ranks with the split SCF, split in the SCF's fixed groups of rows
(``FACTOR_HOMES``). The gradient records its plan (``ran['plan']``). Still held whole: B and Γ,
T_v and the fitted MO coefficients (naux_jk nocc nmo). The UHF stage (``mp2grad_uhf``) plans
the same way with its own phases (``uhf_phase_mb``) and one in-memory form (UHF_PLANS).

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
import torch
from pyscf import lib as pyscf_lib
from pyscf.df import incore as df_incore
from pyscf.grad import rhf as pyscf_grad_rhf
from pyscf.scf import hf as pyscf_hf

from dfmp2 import distributed, linalg, memory
from dfmp2.df import integrals
from dfmp2.df.outofcore import Scratch
from dfmp2.errors import InputError, MemoryLimitError
from dfmp2.grad.densities import MP2Densities, from_correlation
from dfmp2.io.result import METHOD_SCALES, kernel_records
from dfmp2.memory import human
from dfmp2.scf import driver as scf_driver
from dfmp2.scf.jk import JK_BLOCK_MB, build_jk_factor, jk_block
from dfmp2.timing import Timer

# CPHF residual norm, relative to the right-hand side's: at 1e-9 the gradient is within ~1e-11 Eh/bohr
# of 1e-10's, in fewer iterations ((H2O)8/cc-pVDZ: scripts/results/docstring-measurements.md)
ZVECTOR_TOL = 1e-9
ZVECTOR_MAX_ITER = 100
PAIR_BLOCK_MB = 128.0  # K and θ of one block of the densities' pair loop, at least ...
PAIR_BLOCK_MB_MAX = 512.0  # ... and at most, where that does not raise the stage's peak (make_plan): at
# (H2O)16's shapes K = B B_J^T ran at 96 GF/s with one j a block (128 MB), 113 GF/s with four (512 MB)
PAIR_MIN_BLOCKS = 8  # the pair loop's j in at least this many blocks (where there are that many): work for ranks
DERIV_GROUPS = 16  # the derivative integrals' aux blocks in this many fixed groups (where there are that many)
AUX_BLOCK_MB = 200.0  # target MB of one block of 3-center derivative integrals (3 nao^2 per function)
DISK_AUX_BLOCK_MB = 50.0  # the same in the plan with the JK factor on disk: a tight limit (the blocks and
# their copies were 0.5 GB of (H2O)16's 2.0 GB peak at --memory 1.5GB, in the second pass over (μν|P))
SCALES = METHOD_SCALES


class GradientError(InputError):
    """A gradient this code does not compute (say why, before the work)."""


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
        }


def npair(nao: int) -> int:
    return nao * (nao + 1) // 2


# the forms of the two phases that hold large JK-fit arrays, fastest first (``GradientPlan``)
ZVECTOR_FORMS = {
    "mo": "the JK factor in the MO basis held (B_ov, B_oo, B_vv): five GEMMs per Hessian product",
    "ao": "the AO JK factor streamed per aux block for every Hessian product and G (no MO factor: "
    "about 2.5 times the flops per product)",
}
JK_DERIV_FORMS = {
    "mo": "the fitted MO coefficients and Y1 of both densities held whole",
    "blocked": "the fitted MO coefficients held, Y1 and the metric weights per aux block, the JK "
    "factor released before the derivative integrals",
}
PLANS = (("mo", "mo"), ("mo", "blocked"), ("ao", "blocked"))  # fastest first, the JK factor in memory
UHF_PLANS = (("ao", "blocked"),)  # the UHF stage's one in-memory plan (dfmp2.grad.uhf, ``uhf_phase_mb``)
UHF_FORMS = {  # what its forms are (``GradientPlan.record``)
    "zvector": "the DF-UHF's J/K (DFUHF.hessian_product) streamed over the AO factor per aux block",
    "jk_deriv": "each spin's fitted MO coefficients held, Y1 and the metric weights per aux block, the JK "
    "factor released before the derivative integrals",
}
DISK_PLAN = ("ao", "blocked")  # the forms with the JK factor on disk or split (read per aux block: no whole factor)
FACTOR_HOMES = {  # where a plan's JK factor lives (``GradientPlan.factor``)
    "memory": "in memory, packed",
    "split": "split over the ranks in fixed groups of rows, packed (the split SCF's, dfmp2.scf.jk_dist)",
    "disk": "on disk (scratch), packed",
}
DENSITY_PHASES = ("densities", "jk_fit", "zvector")  # the phases of the relaxed density alone (dfmp2.grad.relaxed)


@dataclass
class GradientPlan:
    """The gradient stage's forms (``zvector``: 'mo' or 'ao', ``jk_deriv``: 'mo' or 'blocked';
    ZVECTOR_FORMS, JK_DERIV_FORMS; a UHF's: UHF_PLANS, UHF_FORMS) and the MB (10^6 bytes) each of
    its phases holds at its peak (``phases``, ``phase_mb``); ``limit_mb`` the limit it was chosen
    for (None: forced)."""

    zvector: str
    jk_deriv: str
    phases: dict
    limit_mb: float | None = None
    factor: str = "memory"  # the JK factor's home: 'memory' (packed) or 'disk' (a scratch file)
    fit_mb: float = 0.0  # with the factor on disk: the fit's row block (MB)
    scratch_dir: str | None = None  # with the factor on disk: where its scratch directory goes (None: the system's)
    block_mb: float = AUX_BLOCK_MB  # the 3-center (derivative) integrals' blocks
    pair_mb: float = PAIR_BLOCK_MB  # the densities' pair loop: K and θ of one block of j
    reference: str = "rhf"  # whose stage: 'rhf' (PLANS, phase_mb) or 'uhf' (UHF_PLANS, uhf_phase_mb)
    jk_rows: int = 0  # factor 'split': the JK factor's rows on the busiest rank (dfmp2.scf.jk_dist.planned_rows)

    @property
    def peak_mb(self) -> float:
        return max(self.phases.values())

    @property
    def largest(self) -> str:
        return max(self.phases, key=self.phases.get)

    def record(self) -> dict:
        """As the gradient's ``ran['plan']`` records it."""
        return {
            "zvector": self.zvector,
            "jk_deriv": self.jk_deriv,
            "factor": self.factor,  # 'memory', 'split' or 'disk' (FACTOR_HOMES)
            "jk_factor": FACTOR_HOMES[self.factor],
            "jk_rows_per_rank": self.jk_rows if self.factor == "split" else None,
            "jk_fit_block_mb": round(self.fit_mb, 1) if self.factor == "disk" else None,
            "zvector_form": UHF_FORMS["zvector"] if self.reference == "uhf" else ZVECTOR_FORMS[self.zvector],
            "jk_deriv_form": UHF_FORMS["jk_deriv"] if self.reference == "uhf" else JK_DERIV_FORMS[self.jk_deriv],
            "pair_block_mb": self.pair_mb,
            "peak_mb": round(self.peak_mb, 1),
            "phases_mb": {k: round(v, 1) for k, v in self.phases.items()},
            "limit_mb": self.limit_mb,
        }


def phase_mb(
    *,
    nao: int,
    nocc: int,
    nact: int,
    nvir: int,
    naux_mp2: int,
    naux_jk: int,
    zvector: str = "mo",
    jk_deriv: str = "mo",
    block_mb: float = AUX_BLOCK_MB,
    factor: str = "memory",
    fit_mb: float = 0.0,
    pair_mb: float = PAIR_BLOCK_MB,
    jk_rows: int = 0,
) -> dict:
    """MB (10^6 bytes, fp64) each phase of the RHF gradient stage holds at its peak, an estimate
    from the shapes, in the order the stage runs them (nothing large is held from one phase to
    the next but what is named):
      'densities': B's fit ((ia|P) and B: 2 nact nvir naux_mp2, a (μν|P) block of block_mb
        unpacked and its packed half), the pair loop (B, Γ; K and θ of one block, pair_mb
        at most;
        P_vv's batched product nact nvir^2), the 3-index terms (Γ~, T_v (naux_mp2 nao nact), a
        (μν|P) block and its half transforms);
      'corr_deriv': T_v and the derivative integrals' block and its weights (twice block_mb, at
        most 3 nao^2 naux);
      'jk_fit': the JK factor's fit (the raw integrals and the solution: twice the packed factor,
        naux_jk nao(nao+1)/2; the integral engine's blocks in flight, three of JK_BLOCK_MB; the
        metric and its factor);
      'zvector': the packed factor and, 'mo', its MO blocks ov, oo, vv (naux_jk (2 nvir nocc +
        2 nocc^2 + nvir^2), one product of ov's size and a copy of oo included), or, 'ao', one
        unpacked block of JK_BLOCK_MB and its half transforms;
      'jk_deriv': 'mo': the factor, B_ov and B_oo, the fitted MO coefficients (naux_jk nocc nmo)
        and their occupied part, with Y1m (naux_jk nocc nmo) and Y1 (two of naux_jk nao nocc, and
        their transposed copies while they are made), then Y1 with a derivative block and its
        weights; 'blocked': the factor with the coefficients (naux_jk nocc nmo) and one unpacked
        block, then, the factor released, the coefficients, their occupied part (naux_jk
        nocc^2), a derivative block (twice block_mb), its weights and its Y1."""
    nmo = nocc + nvir
    sh = _shared_terms(nao, naux_mp2, naux_jk, nocc, block_mb, factor, fit_mb, jk_rows)
    fac, deriv_nb, deriv_blk = sh["fac"], sh["deriv_nb"], sh["deriv_blk"]
    ov = nact * nvir * naux_mp2
    t_v = nao * naux_mp2 * nact
    j3c = sh["j3c_nb"] * (nao * nao + npair(nao) + 2 * nao * nact)  # a block unpacked, packed, its half transforms
    jk_blk = sh["jk_nb"] * nao * (nao + 4 * nocc) + sh["reads"]  # one unpacked block and its half transforms
    pair_blk = min(pair_mb * 1e6 / 8, 2 * (nact * nvir) ** 2)  # K and θ of one block of j
    densities = max(2 * ov + j3c, 2 * ov + pair_blk + nact * nvir * nvir, ov + t_v + j3c)
    if zvector == "mo":
        zvec = fac + naux_jk * (2 * nvir * nocc + 2 * nocc * nocc + nvir * nvir)
    else:
        zvec = fac + jk_blk
    ckm, cko = naux_jk * nocc * nmo, naux_jk * nocc * nocc
    g3 = deriv_nb * (nao * nao + 3 * npair(nao))  # the weights' product and packed copies per block
    if jk_deriv == "mo":  # Y1's two products and their transposed copies alive together, then the integrals
        held = fac + naux_jk * (nocc * nvir + nocc * nocc) + ckm + cko
        deriv = held + max(ckm + 4 * naux_jk * nao * nocc, 2 * naux_jk * nao * nocc + deriv_blk + g3)
    else:
        y1 = deriv_nb * (2 * nocc * nmo + 2 * nao * nocc)  # Y1m and both Y1 of one block
        deriv = max(fac + ckm + sh["ckm_rows"] * ckm + jk_blk, ckm + cko + deriv_blk + g3 + y1)
    phases = {
        "densities": densities,
        "corr_deriv": t_v + deriv_blk,
        "jk_fit": sh["jk_fit"],
        "zvector": zvec,
        "jk_deriv": deriv,
    }
    return {k: 8 * v / 1e6 for k, v in phases.items()}


def uhf_phase_mb(
    *,
    nao: int,
    nocc: tuple,
    nact: tuple,
    nvir: tuple,
    naux_mp2: int,
    naux_jk: int,
    zvector: str = "ao",
    jk_deriv: str = "blocked",
    block_mb: float = AUX_BLOCK_MB,
    factor: str = "memory",
    fit_mb: float = 0.0,
    pair_mb: float = PAIR_BLOCK_MB,
    jk_rows: int = 0,
) -> dict:
    """MB (10^6 bytes, fp64) each phase of the UHF gradient stage holds at its peak, an estimate
    from the shapes (per-spin tuples (alpha, beta)), in the order the stage runs them, as the RHF's
    (``phase_mb``; its one form: UHF_PLANS; shapes: ``dfmp2.grad.uhf.uhf_shapes``):
      'densities': each spin's B fitted beside the other's ((ia|P) and B, a (μν|P) block), the pair
        loops (B and Γ of both spins: 2 naux_mp2 Σ nact_σ nvir_σ; K and θ of one block, pair_mb at
        most, and P_vv's batched product), then per spin its 3-index terms (B and Γ of the spins
        not yet done, this spin's Γ~, the T_v made so far: naux_mp2 nao nact_σ each, a (μν|P) block
        and its half transforms);
      'corr_deriv': both T_v and the derivative integrals' block;
      'jk_fit': the JK factor's fit, as the RHF's;
      'zvector': the factor (in memory, or the reader's blocks on disk) and one unpacked block with
        the half transforms of both spins' K factors (two of 2 nocc_σ columns);
      'jk_deriv': the factor with each spin's fitted MO coefficients (naux_jk nocc_σ nmo) and one
        unpacked block, then, the factor released, the coefficients, their occupied part
        (naux_jk nocc_σ^2), the metric weights (three of naux_jk^2), a derivative block, its
        weights and each spin's Y1 of one block."""
    if (zvector, jk_deriv) != ("ao", "blocked"):
        raise ValueError(f"the UHF stage has one form (ao, blocked), not zvector={zvector!r}, jk_deriv={jk_deriv!r}")
    nmo = nocc[0] + nvir[0]
    sh = _shared_terms(nao, naux_mp2, naux_jk, max(nocc), block_mb, factor, fit_mb, jk_rows)
    fac, deriv_nb = sh["fac"], sh["deriv_nb"]
    ov = [a * v * naux_mp2 for a, v in zip(nact, nvir)]
    t_v = nao * naux_mp2 * sum(nact)
    j3c = sh["j3c_nb"] * (nao * nao + npair(nao) + 2 * nao * max(nact))
    pair_blk = max(
        min(pair_mb * 1e6 / 8, 2 * a * v * b * w) + a * v * v for a, v in zip(nact, nvir) for b, w in zip(nact, nvir)
    )
    three = max(2 * sum(ov[s + 1 :]) + ov[s] + nao * naux_mp2 * sum(nact[: s + 1]) for s in (0, 1)) + j3c
    densities = max(sum(ov) + max(ov) + j3c, 2 * sum(ov) + pair_blk, three)
    jk_blk = sh["jk_nb"] * nao * (nao + 8 * max(nocc)) + sh["reads"]
    ckm = naux_jk * nmo * sum(nocc)
    cko = naux_jk * sum(n * n for n in nocc)
    g3 = deriv_nb * (nao * nao + 3 * npair(nao))  # the weights' product and packed copies per block
    y1 = deriv_nb * sum(2 * n * nmo + 2 * nao * n for n in nocc)  # Y1m and both Y1 of one block, each spin
    first = fac + ckm + sh["ckm_rows"] * ckm + jk_blk  # the pass over the factor, then its derivative integrals
    deriv = max(first, ckm + cko + 3 * naux_jk * naux_jk + sh["deriv_blk"] + g3 + y1)
    phases = {
        "densities": densities,
        "corr_deriv": t_v + sh["deriv_blk"],
        "jk_fit": sh["jk_fit"],
        "zvector": fac + jk_blk,
        "jk_deriv": deriv,
    }
    return {k: 8 * v / 1e6 for k, v in phases.items()}


def _shared_terms(
    nao: int, naux_mp2: int, naux_jk: int, nocc: int, block_mb: float, factor: str, fit_mb: float, jk_rows: int = 0
) -> dict:
    """The elements (fp64 counts) the RHF and UHF stages' phases hold alike (``phase_mb``,
    ``uhf_phase_mb``; nocc: the most occupied orbitals of a spin): 'fac' the packed factor in
    memory (split: the busiest rank's ``jk_rows`` rows; 0 on disk), 'jk_fit' the factor's fit
    phase (in memory or split: the raw integrals and the solution, three integral blocks of
    JK_BLOCK_MB in flight, the metric and its factor; on disk: the SCF's own estimate with fit row
    blocks of fit_mb), 'reads' the disk reader's blocks
    (0 in memory), 'jk_nb' the functions of one unpacked exchange block, 'j3c_nb' of one (μν|P)
    block, 'deriv_nb' of one derivative block and 'deriv_blk' its integrals (twice block_mb, at
    most 3 nao^2 naux), 'ckm_rows' the share of the fitted coefficients' rows a split factor's
    rank holds beside their gathered whole (0 otherwise)."""
    fac = (jk_rows if factor == "split" else naux_jk) * npair(nao)
    jk_nb_packed = max(1, min(naux_jk, int(JK_BLOCK_MB * 1e6 // (npair(nao) * 8))))  # the fit's integral blocks
    out = {
        "fac": fac,
        "jk_fit": 2 * fac + 3 * jk_nb_packed * npair(nao) + 2 * naux_jk * naux_jk,
        "reads": 0,
        "jk_nb": jk_block(nao, naux_jk, 8),
        "j3c_nb": max(1, min(naux_mp2, int(block_mb * 1e6 // (nao * nao * 8)))),
        "deriv_nb": max(1, min(max(naux_mp2, naux_jk), int(block_mb * 1e6 // (3 * nao * nao * 8)))),
        "deriv_blk": 2 * min(block_mb * 1e6 / 8, 3 * nao * nao * max(naux_mp2, naux_jk)),
        "ckm_rows": jk_rows / naux_jk if factor == "split" else 0,
    }
    if factor == "disk":  # the SCF's own disk estimate (fit row blocks of fit_mb, the reader's blocks)
        disk = scf_driver.memory_mb(nao, naux_jk, nocc, 8, layout="disk", fit_mb=fit_mb)
        out["fac"], out["jk_fit"] = 0, disk["peak"] * 1e6 / 8
        out["reads"] = (scf_driver.DISK_READ_DEPTH + 1) * scf_driver.disk_rows(nao, naux_jk) * npair(nao)
    return out


def memory_mb(
    *, nao: int, nocc: int, nact: int, nvir: int, naux_mp2: int, naux_jk: int, block_mb: float = AUX_BLOCK_MB, **forms
) -> float:
    """Peak MB (10^6 bytes, fp64) of the RHF gradient stage with ``forms`` (zvector, jk_deriv;
    default the fastest plan): the largest of its phases (``phase_mb``)."""
    shapes = dict(nao=nao, nocc=nocc, nact=nact, nvir=nvir, naux_mp2=naux_mp2, naux_jk=naux_jk, block_mb=block_mb)
    return max(phase_mb(**shapes, **forms).values())


def make_plan(
    shapes: dict,
    zvector: str = "mo",
    jk_deriv: str = "mo",
    limit_mb: float | None = None,
    factor: str = "memory",
    fit_mb: float = 0.0,
    jk_rows: int = 0,
) -> GradientPlan:
    """The GradientPlan of these forms for ``shapes`` (``phase_mb``'s keywords); ``factor`` 'disk'
    (forms DISK_PLAN only) with the fit's row block ``fit_mb`` (0: the whole factor's MB), or
    'split' (forms DISK_PLAN only) over ranks whose busiest holds ``jk_rows`` of its rows. The pair
    loop's blocks are the largest of PAIR_BLOCK_MB_MAX, twice and once PAIR_BLOCK_MB that keeps the
    densities within the other phases' peak: from the shapes and forms only, so the same on every
    rank (the blocks decide the bits)."""
    if zvector not in ZVECTOR_FORMS or jk_deriv not in JK_DERIV_FORMS:
        raise ValueError(f"unknown gradient forms zvector={zvector!r}, jk_deriv={jk_deriv!r}")
    phase_fn, plans, reference = _phases_of(shapes)
    if (zvector, jk_deriv) not in (plans if factor == "memory" else (DISK_PLAN,)):
        raise ValueError(f"the forms zvector={zvector!r}, jk_deriv={jk_deriv!r} do not go with the factor in {factor}")
    if factor == "disk" and fit_mb <= 0:
        fit_mb = shapes["naux_jk"] * npair(shapes["nao"]) * 8 / 1e6
    if factor == "split" and jk_rows <= 0:
        raise ValueError("a JK factor split over the ranks needs its rows per rank (jk_rows)")
    block_mb = DISK_AUX_BLOCK_MB if factor == "disk" else AUX_BLOCK_MB
    forms = dict(zvector=zvector, jk_deriv=jk_deriv, factor=factor, fit_mb=fit_mb, block_mb=block_mb, jk_rows=jk_rows)
    phases = phase_fn(**shapes, **forms)
    others = max(mb for phase, mb in phases.items() if phase != "densities")
    pair_mb = PAIR_BLOCK_MB
    for mb in (PAIR_BLOCK_MB_MAX, 2 * PAIR_BLOCK_MB):  # larger blocks of j only within the other phases' peak
        bigger = phase_fn(**shapes, **forms, pair_mb=mb)
        if bigger["densities"] <= max(others, phases["densities"]):
            phases, pair_mb = bigger, mb
            break
    return GradientPlan(
        zvector,
        jk_deriv,
        phases,
        limit_mb,
        factor,
        fit_mb,
        block_mb=block_mb,
        pair_mb=pair_mb,
        reference=reference,
        jk_rows=jk_rows if factor == "split" else 0,
    )


def _phases_of(shapes: dict):
    """(the phase estimate, the in-memory plans, 'rhf' or 'uhf') of a stage's ``shapes``: a UHF's
    have per-spin tuples (``dfmp2.grad.uhf.uhf_shapes``), its phases ``uhf_phase_mb``."""
    if isinstance(shapes["nocc"], tuple):
        return uhf_phase_mb, UHF_PLANS, "uhf"
    return phase_mb, PLANS, "rhf"


def _disk_plan(shapes: dict, limit_mb: float) -> GradientPlan:
    """DISK_PLAN with the factor on disk and the largest fit row block the limit leaves room for
    (at most the whole factor, at least scf.driver.DISK_FIT_ROWS_MIN functions), but no larger
    than keeps the fit within the plan's largest other phase: a fit at the limit would raise the
    stage's peak for fewer re-reads of the file only, and leave nothing of the limit for the
    process's own memory (interpreter and libraries, about 0.3 GB, outside every plan)."""
    nao, naux = shapes["nao"], shapes["naux_jk"]
    row_mb = npair(nao) * 8 / 1e6
    least = min(naux, scf_driver.DISK_FIT_ROWS_MIN) * row_mb
    smallest = make_plan(shapes, *DISK_PLAN, limit_mb, "disk", least)
    fixed = smallest.phases["jk_fit"] - 2 * least
    others = max(mb for phase, mb in smallest.phases.items() if phase != "jk_fit")
    fit_mb = max(least, min(naux * row_mb, (limit_mb - fixed) / 2, (others - fixed) / 2))
    return make_plan(shapes, *DISK_PLAN, limit_mb, "disk", fit_mb)


def choose_plan(
    shapes: dict, limit_mb: float, phases: tuple | None = None, stage: str = "gradient", split_rows: int = 0
) -> GradientPlan:
    """The fastest plan (PLANS, fastest first) whose peak fits ``limit_mb``; MemoryLimitError (one
    line, in human units, naming the smallest plan's need and its largest phase) when none does.
    ``phases``: only these of ``phase_mb``'s phases run (the density stage: DENSITY_PHASES; default
    all), ``stage`` names the stage in the error line. ``split_rows`` (over several ranks with the
    split SCF: the busiest rank's rows of the JK factor): the factor split over the ranks is tried
    after the RHF's whole-factor plans (their MO forms give one process's bits; the split plan
    runs the AO forms) and before the disk; for a UHF first (its one in-memory form is the split
    plan's: the same bits, and the ranks share the Z-vector's J/K instead of each making all)."""
    _, in_memory, reference = _phases_of(shapes)
    plans = [make_plan(shapes, zv, jd, limit_mb) for zv, jd in in_memory]
    if split_rows:
        split = make_plan(shapes, *DISK_PLAN, limit_mb, "split", jk_rows=split_rows)
        plans.insert(0 if reference == "uhf" else len(plans), split)
    plans.append(_disk_plan(shapes, limit_mb))
    if phases is not None:
        for plan in plans:
            plan.phases = {k: v for k, v in plan.phases.items() if k in phases}
    for plan in plans:
        if plan.peak_mb <= limit_mb:
            return plan
    small = min(plans, key=lambda p: p.peak_mb)
    why = {
        "jk_fit": "the JK factor's fit",
        "densities": "the pair loop's B and Γ and the 3-index terms",
        "corr_deriv": "Γ~'s half back-transform and the derivative integrals' blocks",
        "zvector": "the Z-vector with the JK factor",
        "jk_deriv": "the JK part's derivative (its fitted MO coefficients)",
    }[small.largest]
    home = {"disk": "on disk", "split": "split over the ranks", "memory": "in memory"}[small.factor]
    deriv = f", JK derivative '{small.jk_deriv}'" if "jk_deriv" in small.phases else ""
    raise MemoryLimitError(
        f"the {stage} stage needs about {human(small.peak_mb)} even with its smallest plan (Z-vector "
        f"'{small.zvector}'{deriv}, JK factor {home}; the largest phase is {why}) "
        f"but the memory limit is {human(limit_mb)}; a limit of {human(small.peak_mb)} fits that plan, "
        f"{human(plans[0].peak_mb)} the fastest",
        need_mb=small.peak_mb,
        limit_mb=limit_mb,
    )


def rhf_shapes(mol, ref, mp2_auxmol, jk_auxmol) -> dict:
    """``phase_mb``'s shapes of the RHF ``ref`` on ``mol`` with both fitting sets."""
    ch = ref.channels[0]
    nmo = np.asarray(ch.mo_coeff).shape[1]
    nact = int(np.sum(~np.asarray(ch.frozen)[: ch.nocc]))
    return dict(
        nao=mol.nao_nr(),
        nocc=ch.nocc,
        nact=nact,
        nvir=nmo - ch.nocc,
        naux_mp2=mp2_auxmol.nao_nr(),
        naux_jk=jk_auxmol.nao_nr(),
    )


def check_supported(ref, backend) -> None:
    """GradientError (one line) for what this stage does not do: a UHF reference (its gradient is
    ``mp2grad_uhf``'s), and what ``check_channels`` refuses."""
    if not ref.restricted:
        raise GradientError(
            "mp2_gradient is the RHF stage; a UHF reference's gradient is dfmp2.grad.uhf.uhf_mp2_gradient",
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


def mp2_gradient(
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
    pair loop (``_pair_densities``) in fp32 and everything else on a host CPU backend in fp64
    (``dfmp2.scf.uhf.DFUHF``'s host backend); ``ran`` says which part ran where and which plan
    (``plan``: the forms of the Z-vector and of the JK derivative; default the fastest that fits
    memory.DEFAULT_FRACTION of the available memory, ``choose_plan``).

    The phases run in the order that keeps the fewest large arrays alive together: the
    correlation part (B, Γ, then T_v) and its derivative integrals first, T_v freed; then the JK
    factor, the Z-vector and the JK part's derivative."""
    check_supported(ref, backend)
    if plan is None:
        plan = choose_plan(rhf_shapes(mol, ref, mp2_auxmol, jk_auxmol), _default_limit_mb())
    host = backend if backend.has_fp64 else linalg.TorchBackend("cpu")  # as dfmp2.scf.rhf.DFRHF.dense
    timer = timer or Timer(backend)
    timer.watch(host)
    kernels0 = (dict(backend.kernels_used), dict(host.kernels_used))
    t0 = time.perf_counter()
    ch = ref.channels[0]
    orb = _Orbitals(ch)
    corr = _corr_intermediates(mol, mp2_auxmol, orb, host, c_os, c_ss, pair_backend=backend, plan=plan, world=world)
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
    t0 = timer.add("grad_derivative_integrals", t0)
    f0 = timer.executed()
    jk = _DFJK(mol, jk_auxmol, host, timer, plan.factor, plan.fit_mb, plan.scratch_dir, world)
    try:
        return _response_and_jk(mol, orb, corr, corr_3c, jk, host, backend, plan, timer, (t0, f0), kernels0, c_os, c_ss)
    finally:
        jk.release()  # a factor on disk: its scratch directory goes, however the stage ends


def _response_and_jk(mol, orb, corr, corr_3c, jk, host, backend, plan, timer, t0f0, kernels0, c_os, c_ss):
    """``mp2_gradient`` from the JK factor on: the Z-vector, the JK and one-electron derivatives."""
    t0, f0 = t0f0
    t0 = timer.add("grad_jk_factor", t0, flops0=f0)  # encloses the factor's scf_integrals and scf_fit
    P, Y, zinfo = _relaxed_density(orb, corr, jk, host, plan.zvector)
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
    one_hf, one_p = _one_electron_deriv(mol, [(D, W_hf), (P_ao, W - W_hf)])
    hf = one_hf + pyscf_grad_rhf.grad_nuc(mol) + jk_hf
    grad = hf + one_p + jk_p + corr_3c
    timer.add("grad_derivative_integrals", t0)
    warnings = []
    if orb.C.shape[1] < orb.C.shape[0]:
        warnings.append(
            f"linear dependence: {orb.C.shape[0] - orb.C.shape[1]} basis functions dropped; the "
            "gradient leaves out the change of the kept space with the geometry (it is not "
            "the exact derivative of the energy)"
        )
    ran = _stage_ran(backend, host, kernels0)
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


def unrelaxed_corr(orb: _Orbitals, corr: _Corr) -> np.ndarray:
    """The unrelaxed correlation density in the MO basis (nmo, nmo): P_ij (active occupied) and
    P_ab (``orb.vir``), nothing else."""
    P = np.zeros((orb.nmo, orb.nmo))
    P[np.ix_(orb.act, orb.act)] = corr.P_oo
    P[np.ix_(orb.vir, orb.vir)] = corr.P_vv
    return P


def rhf_record(orb: _Orbitals, corr: _Corr, P: np.ndarray | None, c_os, c_ss, zinfo, ran, timings=None):
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


def orb_frozen(orb: _Orbitals) -> np.ndarray:
    """(nmo,) bool: the orbitals of ``orb`` left out of the correlation (neither act nor vir)."""
    frozen = np.ones(orb.nmo, dtype=bool)
    frozen[orb.act] = frozen[orb.vir] = False
    return frozen


def _default_limit_mb() -> float:
    """The host's default limit (a caller without a limit): ``memory.default_limit_mb``."""
    return memory.default_limit_mb("cpu")


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


def _stage_ran(backend, host, kernels0: tuple) -> dict:
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


class _Orbitals:
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


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _cholesky(j2c: np.ndarray, what: str) -> np.ndarray:
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


def _solve_lower(L: np.ndarray, X: np.ndarray, trans: bool = False) -> np.ndarray:
    """L^-1 X (trans: L^-T X) for lower-triangular L (n, n), X (n, m), on the host (torch)."""
    Lt = torch.from_numpy(L)
    out = torch.linalg.solve_triangular(Lt.T if trans else Lt, torch.from_numpy(np.asarray(X)), upper=trans)
    return out.numpy()


# ---------------------------------------------------------------------------- correlation part
@dataclass
class _Corr:
    """The correlation energy's intermediates: e_corr (Hartree); P_oo (nact, nact), P_vv (nvir,
    nvir) unrelaxed; Y_ri (nmo, nact), Y_ra (nmo, nvir) the 3-index orbital-response terms;
    T_v (naux, nao, nact) = 4 Σ_a C_νa Γ~_Pia (Γ~ in the non-orthogonal aux basis, half back-
    transformed, [P, ν, i]) on the device; gamma_pq γ (naux, naux)."""

    e_corr: float
    P_oo: np.ndarray
    P_vv: np.ndarray
    Y_ri: np.ndarray
    Y_ra: np.ndarray
    T_v: torch.Tensor
    gamma_pq: np.ndarray


def gamma3_weights(C_act: list, T_v: list, p0: int, p1: int, backend, buf=None) -> torch.Tensor:
    """The weight of (μν|P)^x in the correlation part for P in [p0, p1): Σ_spins 4 Σ_ia C_μi C_νa
    Γ~_iaP symmetrised in μν, from each spin's C_act (nao, nact) and T_v (naux, nao, nact), packed
    as ``df_deriv`` takes it: (p1 - p0, nao(nao+1)/2) at μ >= ν with the pair's weight
    (``_PairPack.sym``), on the backend's device, in ``buf`` (a ``memory.Buffers``, reused by the next
    block) when given."""
    nb, nao = p1 - p0, T_v[0].shape[1]
    buf = buf or memory.Buffers(device=T_v[0].device)
    G = buf.get("G", (nb * nao, nao))  # [(P, ν), μ]
    beta = 0.0
    for C, T in zip(C_act, T_v):
        if C.shape[1]:
            linalg.gemm(
                T[p0:p1].reshape(nb * nao, -1), _dev(backend, C), trans_b=True, beta=beta, out=G, backend=backend
            )
            beta = 1.0
    if not beta:
        G.zero_()
    pack = _PairPack.get(nao, G.device)
    return pack.sym(G.view(nb, nao, nao), buf.get("W", (nb, pack.npair)), buf.get("W2", (nb, pack.npair)))


def _dev(backend, x) -> torch.Tensor:
    """A host array (or tensor) as fp64 on the backend's device."""
    return backend.to_device(_t(x) if isinstance(x, np.ndarray) else x, torch.float64)


def _j3c_blocks(mol, auxmol, block_mb: float = AUX_BLOCK_MB):
    """(p0, p1, (μν|P) as [P, μ, ν] (p1 - p0, nao, nao)) over aux-shell blocks of about block_mb,
    C-contiguous, symmetric in μν: libcint's pairs μ >= ν (s2ij, half the integrals of the full
    square) unpacked on the host (``integrals.unpack``, exact copies, into one reused buffer: the
    block is valid until the next one is made)."""
    nao = mol.nao_nr()
    step = max(1, int(block_mb * 1e6 // (nao * nao * 8)))
    buf = memory.Buffers()
    for s0, s1, p0, p1 in integrals.aux_shell_blocks(auxmol, step):
        sl = (0, mol.nbas, 0, mol.nbas, s0, s1)
        packed = torch.from_numpy(df_incore.aux_e2(mol, auxmol, "int3c2e", aosym="s2ij", shls_slice=sl).T)
        yield p0, p1, integrals.unpack(packed, nao, out=buf.get("j3c", (p1 - p0, nao, nao)))


def fit_b(
    mol, auxmol, C_o: np.ndarray, C_v: np.ndarray, L: np.ndarray, backend, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """B (nact nvir, naux) = (ia|P) L^-T, row i nvir + a, for C_o (nao, nact), C_v (nao, nvir)
    and the metric's Cholesky factor L: the raw 3-center integrals streamed over aux blocks,
    both transforms on the backend (fp64)."""
    nao, nact, nvir, naux = C_o.shape[0], C_o.shape[1], C_v.shape[1], L.shape[0]
    A = np.empty((naux, nact, nvir))
    Co, Cv = _dev(backend, C_o), _dev(backend, C_v)
    for p0, p1, j3c in _j3c_blocks(mol, auxmol, block_mb):
        half = linalg.gemm(_dev(backend, j3c).view(-1, nao), Co, backend=backend).view(p1 - p0, nao, nact)
        A[p0:p1] = linalg.gemm(half, Cv, trans_a=True, backend=backend).cpu().numpy()  # [P, i, a]
    return np.ascontiguousarray(_solve_lower(L, A.reshape(naux, -1)).T)


def response_3c(
    mol, auxmol, C_o: np.ndarray, C_v: np.ndarray, gamma_t: np.ndarray, backend, block_mb: float = AUX_BLOCK_MB
):
    """The 3-index density's orbital-response terms (a second pass over (μν|P)): with Γ~ [P, i, a]
    (naux, nact, nvir), T_v [P, ν, i] = 4 Σ_a C_νa Γ~_Pia, X_o = Σ_Pν (μν|P) T_v (nao, nact) and
    X_v = 4 Σ_Pi H_Pμi Γ~_Pia (nao, nvir) with H_Pμi = Σ_ν (μν|P) C_νi, the half transform (numpy);
    T_v (naux, nao, nact) on the device, kept for the derivative weights (``gamma3_weights``).
    Every product is a 2-D GEMM (about 2 nao naux nact (2 nao + nvir) + 2 nao naux nact nvir
    flops); contracting (μν|P) with T_o = 4 C_o Γ~ instead costs 2 nao^2 naux nvir."""
    nao, nact, nvir = C_o.shape[0], C_o.shape[1], C_v.shape[1]
    g, Co, Cv = _dev(backend, gamma_t), _dev(backend, C_o), _dev(backend, C_v)
    naux = g.shape[0]
    T_v = torch.empty((naux, nao, nact), dtype=torch.float64, device=g.device)  # [P, ν, i]
    step = max(1, int(block_mb * 1e6 // (8 * nao * max(1, nact))))  # no whole [P, i, ν] copy beside it
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        Tb = linalg.gemm(g[p0:p1].reshape(-1, nvir), Cv, trans_b=True, alpha=4.0, backend=backend)  # [P, i, ν]
        T_v[p0:p1] = Tb.view(p1 - p0, nact, nao).transpose(1, 2)
    del Tb  # (at most block_mb): not beside the (μν|P) blocks
    X_o = torch.zeros((nao, nact), dtype=torch.float64, device=g.device)
    X_vt = torch.zeros((nvir, nao), dtype=torch.float64, device=g.device)
    for p0, p1, j3c in _j3c_blocks(mol, auxmol, block_mb):  # X_μ· = Σ_Pν (μν|P) T_Pν·
        J = _dev(backend, j3c).view(-1, nao)  # [(P ν), μ]
        H = linalg.gemm(J, Co, backend=backend).view(p1 - p0, nao, nact).transpose(1, 2).contiguous()  # [P, i, μ]
        linalg.gemm(J, T_v[p0:p1].reshape(-1, nact), trans_a=True, beta=1.0, out=X_o, backend=backend)
        linalg.gemm(g[p0:p1].reshape(-1, nvir), H.view(-1, nao), trans_a=True, beta=1.0, out=X_vt, backend=backend)
    return X_o.cpu().numpy(), 4.0 * X_vt.T.cpu().numpy(), T_v


def _pair_densities(
    B: torch.Tensor,
    e_o: torch.Tensor,
    e_v: torch.Tensor,
    backend,
    c_os: float,
    c_ss: float,
    cols=None,
    out=None,
    block_mb: float = PAIR_BLOCK_MB,
    world=None,
):
    """The pair loop over blocks J of occupied j (every i at once: P_oo needs all i of one j, so no
    i >= j symmetry), on the backend's device:
        K[i, a, j, b] = (ia|jb) = Σ_Q B_iaQ B_jbQ      (one GEMM, B B_J^T)
        t = K / (e_i + e_j - e_a - e_b)                (in place),  θ = (c_os + c_ss) t - c_ss t^{ba}
        Γ[(jb), Q] += Σ_ia θ[(ia), (jb)] B[(ia), Q]   (θ_ij^ab = θ_ji^ba: the rows of J, whole)
        P_oo[i, k] -= 2 Σ_ajb t[i, (ajb)] θ[k, (ajb)]
        P_vv[a, b] += 2 Σ_i Σ_jc t[i, a, (jc)] θ[i, b, (jc)]   (a GEMM batched over i)
    B (nact nvir, naux) (row i nvir + a), e_o (nact,), e_v (nvir,) Hartree, all one dtype on the
    device; ``cols`` = (B_c, f_o, f_v): the j, b side from another spin (UMP2's αβ pairs; c_ss
    must be 0), else B's own. RHF: c_os, c_ss the method's scales; UHF same spin: (0, c_ss/2) (θ =
    c_ss/2 of the antisymmetrised t); αβ: (c_os/2, 0), once from each side: Γ is then the j side's
    (the other spin's: t_ij^ab(αβ) = t_ji^ba(βα)), P_oo and P_vv the i side's. K and θ of one block
    take about ``block_mb`` MB, in at least PAIR_MIN_BLOCKS blocks where there are that many j.
    Returns Γ (ncol nvc, naux), P_oo (nact, nact), P_vv (nvir, nvir), unsymmetrised, on the
    device, added into ``out`` = (Γ, P_oo, P_vv) when given.

    Over several ranks (``world``): rank r computes the blocks
    ``block_owners`` gives it (Γ's rows of its j whole, each block's P_oo and P_vv shares), then
    every block is broadcast from its owner in block order and P_oo, P_vv add the shares in that
    order, as one process adds them: the same bits on any number of ranks (equal threads)."""
    Bc, f_o, f_v = cols if cols is not None else (B, e_o, e_v)
    nact, nvir, ncol, nvc = e_o.shape[0], e_v.shape[0], f_o.shape[0], f_v.shape[0]
    if c_ss and nvc != nvir:
        raise ValueError("the exchange term needs the same virtual space on both sides")
    nj = max(1, min(-(-ncol // PAIR_MIN_BLOCKS), int(block_mb * 1e6 // (2 * nact * nvir * nvc * B.element_size()))))
    Gam, P_oo, P_vv = (
        out
        if out is not None
        else (
            torch.zeros_like(Bc),
            torch.zeros((nact, nact), dtype=B.dtype, device=B.device),
            torch.zeros((nvir, nvir), dtype=B.dtype, device=B.device),
        )
    )
    ranks = world is not None and world.distributed
    blocks = [(j0, min(ncol, j0 + nj)) for j0 in range(0, ncol, nj)]
    own = block_owners(len(blocks), world.size if ranks else 1)
    me = world.rank if ranks else 0
    shares = {}  # over ranks: block -> (P_oo's, P_vv's share), added in block order after the loop
    e_ia = (e_o[:, None] - e_v[None, :]).reshape(nact, nvir, 1, 1)
    e_jb = f_o[:, None] - f_v[None, :]
    buf = memory.Buffers(B.dtype, B.device)
    for b, (j0, j1) in enumerate(blocks):
        if own[b] != me:
            continue
        distributed.fault("gradient")
        Bj, shape = Bc[j0 * nvc : j1 * nvc], (nact, nvir, j1 - j0, nvc)
        t = linalg.gemm(B, Bj, trans_b=True, out=buf.get("t", (nact * nvir, (j1 - j0) * nvc)), backend=backend).view(
            shape
        )
        th = torch.add(e_ia, e_jb[j0:j1].reshape(1, 1, j1 - j0, nvc), out=buf.get("th", shape))  # denominators
        t.div_(th)
        torch.mul(t, c_os + c_ss, out=th)
        if c_ss:
            th.sub_(t.permute(0, 3, 2, 1), alpha=c_ss)  # t_ij^ba = t[i, b, j, a]
        rows = Gam[j0 * nvc : j1 * nvc]  # Γ's rows of J, whole: Σ_ia θ_ij^ab B_ia = Σ_ia θ_ji^ba B_ia
        linalg.gemm(th.view(nact * nvir, -1), B, trans_a=True, beta=1.0, out=rows, backend=backend)
        x_oo = linalg.gemm(t.view(nact, -1), th.view(nact, -1), trans_b=True, backend=backend)
        x_vv = linalg.gemm(
            t.view(nact, nvir, -1),
            th.view(nact, nvir, -1),
            trans_b=True,
            out=buf.get("vv", (nact, nvir, nvir)),
            backend=backend,
        ).sum(0)  # batched over i
        if ranks:
            shares[b] = (x_oo, x_vv)
        else:
            P_oo -= 2.0 * x_oo
            P_vv += 2.0 * x_vv
    for b, (j0, j1) in enumerate(blocks if ranks else ()):  # every block from its owner, in order
        x_oo, x_vv = shares.pop(b) if own[b] == me else (torch.empty_like(P_oo), torch.empty_like(P_vv))
        world.broadcast([Gam[j0 * nvc : j1 * nvc], x_oo, x_vv], own[b], "gradient")
        P_oo -= 2.0 * x_oo
        P_vv += 2.0 * x_vv
    return Gam, P_oo, P_vv


def block_owners(nblocks: int, size: int) -> list[int]:
    """The rank of each of ``nblocks`` equal blocks of work over ``size`` ranks: contiguous runs
    (rank r before rank r + 1, as ``World.ordered_sum`` adds), as even as the count allows."""
    return [b * size // max(1, nblocks) for b in range(nblocks)]


def _pair_loop(
    Bd: torch.Tensor,
    orb: _Orbitals,
    backend,
    pair_backend,
    c_os: float,
    c_ss: float,
    world=None,
    pair_mb: float = PAIR_BLOCK_MB,
):
    """``_pair_densities`` of Bd (nact nvir, naux; fp64 on ``backend``) on ``pair_backend`` in its
    fit dtype (fp32 without fp64; no copy when it is ``backend``), blocks of ``pair_mb``: Γ, P_oo,
    P_vv in fp64 on ``backend``."""
    if pair_backend is backend:
        e_o, e_v = backend.to_device(_t(orb.eps[orb.act])), backend.to_device(_t(orb.eps[orb.vir]))
        return _pair_densities(Bd, e_o, e_v, backend, c_os, c_ss, block_mb=pair_mb, world=world)
    dt = pair_backend.fit_dtype(pair_backend.default_precision)
    dev = lambda x: pair_backend.to_device(torch.as_tensor(x).cpu(), dt)  # noqa: E731
    e_o, e_v = dev(orb.eps[orb.act]), dev(orb.eps[orb.vir])
    out = _pair_densities(dev(Bd), e_o, e_v, pair_backend, c_os, c_ss, block_mb=pair_mb, world=world)
    return tuple(backend.to_device(x.cpu(), torch.float64) for x in out)


def _corr_intermediates(
    mol,
    auxmol,
    orb: _Orbitals,
    backend,
    c_os: float,
    c_ss: float,
    pair_backend=None,
    plan: GradientPlan | None = None,
    response: bool = True,
    world=None,
) -> _Corr:
    """B, then the pair loop (``_pair_densities``: Γ, P_oo, P_vv; E_corr = Σ Γ B), then γ and the
    3-index orbital-response terms (``_gamma_terms``, ``response_3c``; see the module docstring).
    The pair loop runs on ``pair_backend`` (default ``backend``) in its fit dtype (fp32 on trn), the rest
    on ``backend`` (fp64); the (μν|P) and pair blocks are ``plan``'s (None: AUX_BLOCK_MB and
    PAIR_BLOCK_MB). ``response`` False: the unrelaxed densities only (Y_ri, Y_ra, T_v and γ None:
    no second pass over (μν|P))."""
    block_mb, pair_mb = (plan.block_mb, plan.pair_mb) if plan is not None else (AUX_BLOCK_MB, PAIR_BLOCK_MB)
    L = _cholesky(auxmol.intor("int2c2e"), "MP2")
    Bd = _dev(backend, fit_b(mol, auxmol, orb.C[:, orb.act], orb.C[:, orb.vir], L, backend, block_mb))  # (ia, Q)
    Gd, P_oo, P_vv = _pair_loop(Bd, orb, backend, pair_backend or backend, c_os, c_ss, world, pair_mb)
    e_corr = float(torch.dot(Gd.reshape(-1), Bd.reshape(-1)))
    if not response:
        P_oo, P_vv = P_oo.cpu().numpy(), P_vv.cpu().numpy()
        return _Corr(e_corr, 0.5 * (P_oo + P_oo.T), 0.5 * (P_vv + P_vv.T), None, None, None, None)
    gamma_pq, gamma_t = _gamma_terms(L, Bd, Gd, backend, len(orb.act), len(orb.vir))
    del Bd, Gd  # B and Γ (nact nvir naux each) go before T_v and the second pass over (μν|P)
    X_o, X_v, T_v = response_3c(mol, auxmol, orb.C[:, orb.act], orb.C[:, orb.vir], gamma_t, backend, block_mb)
    del gamma_t
    P_oo, P_vv = P_oo.cpu().numpy(), P_vv.cpu().numpy()
    Y_ri, Y_ra = orb.C.T @ X_o, orb.C.T @ X_v
    return _Corr(e_corr, 0.5 * (P_oo + P_oo.T), 0.5 * (P_vv + P_vv.T), Y_ri, Y_ra, T_v, 0.5 * (gamma_pq + gamma_pq.T))


def _gamma_terms(L: np.ndarray, B: torch.Tensor, G: torch.Tensor, backend, nact: int, nvir: int):
    """γ's share L^-T (B^T Γ) L^-1 (naux, naux, unsymmetrised) and Γ~ = Γ L^-1 as [P, i, a]
    (naux, nact, nvir), from B and Γ (nact nvir, naux, fp64 on the device) and the MP2 metric's
    Cholesky factor L."""
    naux = L.shape[0]
    BtG = linalg.gemm(B, G, trans_a=True, backend=backend).cpu().numpy()
    gamma_pq = _solve_lower(L, _solve_lower(L, BtG, trans=True).T, trans=True).T
    gamma_t = _solve_lower(L, G.cpu().numpy().T, trans=True).reshape(naux, nact, nvir)  # Γ~ as [P, i, a]
    return gamma_pq, gamma_t


# ---------------------------------------------------------------------------- response (Z-vector)
def _relaxed_density(orb: _Orbitals, corr: _Corr, jk: "_DFJK", backend, form: str = "mo"):
    """(P (nmo, nmo) the relaxed density in the MO basis, Y (nmo, nmo) the orbital-change
    coefficients with the relaxation and the HF part, zvector info). ``form`` 'mo': every J/K
    here is in the MO basis of the JK factor (``_DFJK.build_mo``, kept for
    ``jk_energy_deriv_rhf``); 'ao': streamed from the AO factor per aux block (``_DFJK.use_ao``)."""
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


def _add_density_terms(Y: np.ndarray, P: np.ndarray, orb: _Orbitals, G: np.ndarray) -> None:
    """Y += the orbital-change terms of a density P (MO): 4 (C^T G[P] C)_rk, 2 P_pq e_q, with
    G = C^T G[P] C_o (nmo, nocc) given."""
    Y[:, orb.occ] += 4.0 * G
    Y += 2.0 * orb.eps[:, None] * P


def _solve_zvector(R: np.ndarray, orb: _Orbitals, jk: "_DFJK") -> tuple[np.ndarray, np.ndarray, dict]:
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


# ---------------------------------------------------------------------------- DF J/K (JK-fit set)
class _DFJK:
    """The SCF's DF two-electron operator on the JK-fit set: G[D] = J[D] - K[D]/2 from our JK
    factor (``dfmp2.scf.jk.build_jk_factor``, fp64 on the backend) for the response, and
    (``jk_energy_deriv_rhf``, ``jk_energy_deriv_blocked``) the explicit derivative of the DF-HF
    two-electron energy with the fitted coefficients."""

    def __init__(
        self,
        mol,
        auxmol,
        backend,
        timer,
        factor: str = "memory",
        fit_mb: float | None = None,
        scratch_dir=None,
        world=None,
    ):
        self.mol, self.auxmol, self.backend = mol, auxmol, backend
        self.world = world  # the ranks the derivative integrals are split over (df_deriv); None: one process
        self.mo = None  # the factor in the MO basis (B_ov, B_oo, B_vv), from build_mo
        self.C = None  # (C_o, C_v) on the device for the AO forms, from use_ao
        self.scratch = None
        self.split = None  # factor 'split': the ranks whose groups of rows this factor is one share of
        self.spans = None  # factor 'split': every rank's (first, end) rows, once ``all_rows`` has asked
        if factor == "disk":  # a scratch file read per aux block (dfmp2.scf.jk.DiskJKFactor); removed by release
            self.scratch = Scratch(scratch_dir)
            self.scratch.check_space(auxmol.nao_nr() * npair(mol.nao_nr()) * 8 / 1e6)
            self.fac, _ = build_jk_factor(
                mol, auxmol, backend, torch.float64, timer, layout="disk", scratch=self.scratch, fit_mb=fit_mb
            )
        elif factor == "split":  # this rank's groups of rows (dfmp2.scf.jk_dist), the SCF's split fit
            if world is None or not distributed.split_scf(world):
                raise ValueError("the JK factor split over the ranks needs several ranks with the split SCF")
            self.split = world
            self.fac, _ = build_jk_factor(mol, auxmol, backend, torch.float64, timer, world=world)
        else:
            self.fac, _ = build_jk_factor(mol, auxmol, backend, torch.float64, timer)
        self.nao, self.naux = self.fac.nao, auxmol.nao_nr()  # naux: all of the factor's rows, on every rank
        if self.fac.metric != "cholesky":
            raise GradientError(
                "the JK-fit metric is not positive definite (the SCF used its "
                "eigen-decomposition); its gradient is not implemented",
                option="auxbasis",
            )

    def _blocks(self):
        """(p0, p1, B^P (p1 - p0, nao, nao)) of the unpacked factor B = L^-1 (P|μν), symmetric,
        over blocks of ``fac.block`` functions (near JK_BLOCK_MB unpacked), each valid until the
        next is made (one reused buffer); p0, p1 are the rows of this rank's share (all of them in
        one process: ``rows``)."""
        return self.fac.blocks()

    @property
    def rows(self) -> tuple[int, int]:
        """(first, end) of the global aux rows this rank's factor holds ((0, naux) unless split)."""
        return self.fac.row0, self.fac.row0 + self.fac.naux

    def group_sum(self, shape, add) -> torch.Tensor:
        """Σ over the factor's fixed groups of rows (dfmp2.scf.jk_dist) of ``add(buf, p0, p1, B^P)``
        into a zero fp64 buffer of ``shape`` per group, the groups' added in group order: over the
        ranks of a split factor (``World.ordered_sum``) the same bits as one process."""
        world = self.split if self.split is not None else distributed.World()
        return world.ordered_sum(self.fac._group_sums(shape, add), shape, torch.float64, self.fac.device, "gradient")

    def all_rows(self, local: torch.Tensor) -> torch.Tensor:
        """(naux, ...) of every rank's rows of ``local`` (this rank's (rows, ...), row ``rows[0]``
        first), on every rank: each rank's rows sent to the others in rank order (exact copies);
        ``local`` itself in one process."""
        if self.split is None:
            return local
        if self.spans is None:  # every rank's (first, end) rows, gathered once
            self.spans = self.split.gather_objects(self.rows, "gradient")
        out = torch.empty((self.naux, *local.shape[1:]), dtype=local.dtype, device=local.device)
        r0, r1 = self.rows
        out[r0:r1] = local
        for r, (a, b) in enumerate(self.spans):
            self.split.broadcast([out[a:b]], r, "gradient")
        return out

    def release(self) -> None:
        """Drop the factor (and any MO factor; a factor on disk: its scratch directory): later
        steps need neither."""
        self.fac, self.mo = None, None
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None

    def use_ao(self, C_o: np.ndarray, C_v: np.ndarray) -> None:
        """The AO forms (``G`` through ``G_ao``, ``ao_hessian``) for these orbitals; no MO factor."""
        self.mo = None
        self.C = (_dev(self.backend, C_o), _dev(self.backend, C_v))

    def G(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """``G_mo`` with the MO factor (``build_mo``), else ``G_ao`` (``use_ao``)."""
        return self.G_mo(P, vir_rows) if self.mo is not None else self.G_ao(P, vir_rows)

    def G_ao(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """``G_mo``'s C^T G[C P C^T] C_o (nmo, nocc) (vir_rows False: C_o^T G C_o (nocc, nocc))
        from the AO factor streamed per aux block, no MO factor: with D = C P C^T (symmetrised),
        ρ_P = Σ B^P_μν D_μν, W^P = B^P C_o, J C_o = Σ_P ρ_P W^P, K C_o = Σ_P B^P (D W^P);
        6 naux nao^2 nocc + 2 naux nao^2 flops."""
        be, nao = self.backend, self.nao
        Co, Cv = self.C
        nocc = Co.shape[1]
        Cd = torch.cat([Co, Cv], dim=1)
        Pd = _dev(be, 0.5 * (P + P.T))
        D = linalg.gemm(linalg.gemm(Cd, Pd, backend=be), Cd, trans_b=True, backend=be)
        D = 0.5 * (D + D.T)

        def add(out, p0, p1, Bb):  # out[0]: J C_o flat [μ k], out[1]: (K C_o)^T [k μ]
            nb, B2 = p1 - p0, Bb.view(-1, nao)
            rho = linalg.gemm(Bb.view(nb, -1), D.view(-1, 1), backend=be)  # (nb, 1)
            W = linalg.gemm(B2, Co, backend=be)  # [(P, μ), k] = (B^P C_o)_μk
            linalg.gemm(rho, W.view(nb, -1), trans_a=True, beta=1.0, out=out[0].view(1, -1), backend=be)
            Wt = W.view(nb, nao, nocc).transpose(1, 2).contiguous()  # [P, k, μ]
            V = linalg.gemm(Wt.view(-1, nao), D, backend=be)  # [(P, k), ν] = (D W^P)_νk
            V = V.view(nb, nocc, nao).transpose(1, 2).contiguous()  # [P, ν, k]
            linalg.gemm(V.view(-1, nocc), B2, trans_a=True, beta=1.0, out=out[1], backend=be)  # Σ_Pν V B^P_νμ

        JK = self.group_sum((2, nocc, nao), add)
        GC = JK[0].view(nao, nocc) - 0.5 * JK[1].T
        rows = Cd if vir_rows else Co
        return linalg.gemm(rows, GC, trans_a=True, backend=be).cpu().numpy()

    def ao_hessian(self):
        """``mo_hessian``'s product z (nvir, nocc) -> 4 (ai|bj) z - (ab|ij) z - (aj|ib) z from the AO
        factor streamed per aux block (``use_ao``; no MO factor): with X = C_v z and, per P,
        W^P = B^P [X, C_o] (nao, 2 nocc), S^P = [X, C_o]^T B^P C_o (A^P_ij = Σ_b z_bj B_ib^P and
        B_oo^P), ρ_P = tr A^P, the sum M = Σ_P W_X^P B_oo^P + W_o^P A^PT - 4 ρ_P W_o^P gives the
        product -C_v^T M. Per product 4 naux nao^2 nocc + 8 naux nao nocc^2 flops and one pass over
        the factor (the MO form: about 2 naux nvir^2 nocc + 8 naux nvir nocc^2, no pass)."""
        be, nao = self.backend, self.nao
        Co, Cv = self.C
        nocc = Co.shape[1]

        def hess(z):
            X = linalg.gemm(Cv, _dev(be, z), backend=be)  # (nao, nocc)
            Yc = torch.cat([X, Co], dim=1)  # (nao, 2 nocc)

            def add(Mt, p0, p1, Bb):  # M^T (nocc, nao)
                nb = p1 - p0
                W = linalg.gemm(Bb.view(-1, nao), Yc, backend=be)  # [(P, μ), c] = (B^P Yc)_μc
                Wt = W.view(nb, nao, 2 * nocc).transpose(1, 2).contiguous()  # [P, c, μ]
                S = linalg.gemm(Wt.view(-1, nao), Co, backend=be).view(nb, 2, nocc, nocc)  # [P, h, j, i]
                rho = S[:, 0].diagonal(dim1=-2, dim2=-1).sum(-1)  # Σ_bj B_jb^P z_bj
                R = torch.empty_like(S)  # [P, c, i]: B_oo^P for the X columns, A^PT - 4 ρ_P for C_o's
                R[:, 0], R[:, 1] = S[:, 1], S[:, 0]
                R[:, 1].diagonal(dim1=-2, dim2=-1).sub_(4.0 * rho[:, None])
                linalg.gemm(R.view(-1, nocc), Wt.view(-1, nao), trans_a=True, beta=1.0, out=Mt, backend=be)

            Mt = self.group_sum((nocc, nao), add)
            return -linalg.gemm(Mt, Cv, backend=be).T.cpu().numpy()

        return hess

    def build_mo(self, C_o: np.ndarray, C_v: np.ndarray) -> None:
        """Keep the factor in the MO basis (``mo_factor``) for ``G_mo``, ``mo_hessian`` and
        ``jk_energy_deriv_rhf`` (a whole factor: the MO forms sum over every P at once)."""
        if self.split is not None:
            raise ValueError("the MO forms need the whole JK factor; a split one runs the AO forms")
        self.mo = self.mo_factor(C_o, C_v)

    def G_mo(self, P: np.ndarray, vir_rows: bool = True) -> np.ndarray:
        """C^T G[C P C^T] C_o (nmo, nocc), occupied rows first (vir_rows False: those rows only,
        (nocc, nocc)), for a symmetric MO density P (nmo, nmo), from the MO factor (``build_mo``;
        no AO work): ρ_P = Σ_pq B^P_pq P_pq, J_rk = Σ_P ρ_P B^P_rk, F^P = P B^P_{:,o} and K_rk =
        Σ_P (B^P F^P)_rk, each sum over P one GEMM on a [P, ·, ·] layout (B_oo, B_vv symmetric in
        their MO indices). The vv block of P costs about 2 naux nvir^2 nocc flops, the virtual rows
        as much again; the rest is o^2 v naux."""
        be = self.backend
        B_ov, B_oo, B_vv = self.mo
        naux, nocc, nvir = B_ov.shape
        Pd = _dev(be, 0.5 * (P + P.T))
        Poo, Pov, Pvv = Pd[:nocc, :nocc], Pd[:nocc, nocc:], Pd[nocc:, nocc:]
        has_vv = bool(torch.count_nonzero(Pvv))
        oo, ov = B_oo.view(-1, nocc), B_ov.view(-1, nvir)  # [(P, ·), ·]
        rho = linalg.gemm(B_oo.view(naux, -1), Poo.reshape(-1, 1), backend=be)
        linalg.gemm(B_ov.view(naux, -1), Pov.reshape(-1, 1), alpha=2.0, beta=1.0, out=rho, backend=be)
        if has_vv:  # Σ_ab B_vv[a, P, b] P_ab, batched over a
            rho += linalg.gemm(B_vv, Pvv[:, :, None], backend=be).sum(0)
        F_o = linalg.gemm(oo, Poo, backend=be)  # [P, k, p] = Σ_q B_kq P_qp, p occupied
        linalg.gemm(ov, Pov, trans_b=True, beta=1.0, out=F_o, backend=be)
        F_v = linalg.gemm(oo, Pov, backend=be)  # [P, k, a], a virtual
        if has_vv:
            linalg.gemm(ov, Pvv, beta=1.0, out=F_v, backend=be)
        F_o = F_o.view(naux, nocc, nocc).transpose(1, 2).contiguous()  # [P, p, k]
        F_v = F_v.view(naux, nocc, nvir).transpose(1, 2).contiguous()  # [P, a, k]
        G_o = linalg.gemm(B_oo.view(naux, -1), rho, trans_a=True, backend=be).view(nocc, nocc)
        G_o -= 0.5 * linalg.gemm(oo, F_o.view(-1, nocc), trans_a=True, backend=be)
        G_o -= 0.5 * linalg.gemm(B_ov, F_v, backend=be).sum(0)  # Σ_P B_ov^P F_v^P, batched over P
        if not vir_rows:
            return G_o.cpu().numpy()
        G_v = linalg.gemm(B_ov.view(naux, -1), rho, trans_a=True, backend=be).view(nocc, nvir).T
        G_v = G_v - 0.5 * linalg.gemm(ov, F_o.view(-1, nocc), trans_a=True, backend=be)
        G_v -= 0.5 * linalg.gemm(B_vv.view(nvir, -1), F_v.view(-1, nocc), backend=be)  # [a, (P b)] [(P b), k]
        return torch.cat([G_o, G_v]).cpu().numpy()

    def mo_factor(self, C_o: np.ndarray, C_v: np.ndarray):
        """The factor in the MO basis on the device: B_ov [P, i, a] (naux, nocc, nvir), B_oo
        [P, i, j] (naux, nocc, nocc) and B_vv as [a, P, b] (nvir, naux, nvir): in that layout the
        Hessian's (ab|ij) product is two plain GEMMs, the first over (a P) rows (``mo_hessian``).
        Per aux block, three GEMMs over the whole block (B^P is symmetric): Z = C^T B [r, (P, μ)],
        then Z's occupied rows times C ([(i, P), r]) and its virtual rows times C_v ([(a, P), b],
        copied into B_vv's [:, P, :]). Only the oo, ov and vv blocks: 2 naux nao^2 nmo + 2 naux nao
        (nocc nmo + nvir^2) flops. An earlier form (C^T B^P batched over P, and one GEMM per P into
        B_vv's strided columns) ran at about a third of the DGEMM rate at (H2O)16's shapes."""
        be, naux = self.backend, self.fac.naux
        nao, nocc, nvir = self.nao, C_o.shape[1], C_v.shape[1]
        nmo = nocc + nvir
        Cd = _dev(be, np.hstack([C_o, C_v]))
        B_ov, B_oo, B_vv = (
            torch.empty(shape, dtype=torch.float64, device=Cd.device)
            for shape in ((naux, nocc, nvir), (naux, nocc, nocc), (nvir, naux, nvir))
        )
        Cv = Cd[:, nocc:]
        buf = memory.Buffers(device=Cd.device)
        for p0, p1, Bb in self._blocks():
            nb = p1 - p0
            Z = buf.get("Z", (nmo, nb * nao))  # [r, (P, μ)] = (C^T B^P)_rμ
            linalg.gemm(Cd, Bb.reshape(-1, nao), trans_a=True, trans_b=True, out=Z, backend=be)
            mo = linalg.gemm(Z[:nocc].view(-1, nao), Cd, out=buf.get("o", (nocc * nb, nmo)), backend=be)
            mo = mo.view(nocc, nb, nmo)  # [i, P, r]
            B_oo[p0:p1], B_ov[p0:p1] = mo[:, :, :nocc].transpose(0, 1), mo[:, :, nocc:].transpose(0, 1)
            vv = linalg.gemm(Z[nocc:].view(-1, nao), Cv, out=buf.get("v", (nvir * nb, nvir)), backend=be)
            B_vv[:, p0:p1] = vv.view(nvir, nb, nvir)
        return B_ov, B_oo, B_vv

    def mo_hessian(self):
        """z (nvir, nocc) -> (C_v^T G[2(C_v z C_o^T + h.c.)] C_o) in the MO basis of the factor:
        4 Σ_P B_ai^P Σ_bj B_bj^P z_bj - Σ_P Σ_bj (B_ab^P B_ij^P + B_aj^P B_ib^P) z_bj, i.e.
        4 (ai|bj) - (ab|ij) - (aj|ib) (DF-HF's orbital Hessian), from the factor ``build_mo`` kept:
        (ab|ij) as X[j, (a P)] = Σ_b z_bj B_vv[(a P), b] (one wide GEMM streaming B_vv, the largest
        operand: o v^2 naux flops; the SCF's K shape; X one buffer for every product) then
        Σ_j X[j] B_oo[:, j, :] (batched over j, from a [j, P, i] copy of B_oo); (aj|ib) through
        U[P, j, i] = Σ_b z_bj B_ib^P (batched over P) and B_ov[(P j), a]^T U; B_vv, B_oo symmetric
        in their MO indices. Why this order: the tall X[(a P), j] = B_vv z with its nocc columns ran
        at half the wide one's rate, and an earlier order (z B_oo^P batched over P, then
        B_vv[(P b), a]^T W) streamed B_vv through a transposed operand (measurements:
        scripts/results/2026-11-28-session10-amd.md, 2026-11-28-session11-amd.md)."""
        B_ov, B_oo, B_vv = self.mo
        naux, nocc, nvir = B_ov.shape
        be = self.backend
        ov, ov2, vv2 = B_ov.view(naux, -1), B_ov.view(-1, nvir), B_vv.view(-1, nvir)
        oo_j = B_oo.permute(1, 0, 2).contiguous()  # [j, P, i]: read through strides, 1.4x slower there
        X = torch.empty((nocc, nvir * naux), dtype=torch.float64, device=B_ov.device)  # reused: no page faults

        def hess(z):
            zd = _dev(be, z)
            v = linalg.gemm(ov, zd.T.reshape(-1, 1), backend=be)  # Σ_bj B_jb^P z_bj
            J = linalg.gemm(ov, v, trans_a=True, alpha=4.0, backend=be).view(nocc, nvir).T
            linalg.gemm(zd, vv2, trans_a=True, trans_b=True, out=X, backend=be)  # [j, (a, P)] = Σ_b z_bj B_ab^P
            U = linalg.gemm(zd, B_ov, trans_a=True, trans_b=True, backend=be)  # [P, j, i] = Σ_b z_bj B_ib^P
            out = J - linalg.gemm(X.view(nocc, nvir, naux), oo_j, backend=be).sum(0)
            out -= linalg.gemm(ov2, U.view(naux * nocc, nocc), trans_a=True, backend=be)
            return out.cpu().numpy()

        return hess


def jk_energy_deriv_rhf(jk: _DFJK, C: np.ndarray, nocc: int, P: np.ndarray) -> np.ndarray:
    """``jk_energy_deriv_blocked(jk, [C], [nocc], [2], [P/2])`` of an RHF (C (nao, nmo), the first
    ``nocc`` columns occupied; P (nmo, nmo) the relaxed density in the MO basis): (2, natm, 3)
    Eh/bohr, E_G^x(D/2, D) and E_G^x(P, D), from the factor in the MO basis the Z-vector kept
    (``_DFJK.build_mo``: B_oo, B_ov) rather than from the AO factor. With ckm^P = C^T ck^P =
    L^-T [B_oo; B_vo]^P (nmo, nocc), held transposed as [P, k, r] so that every product below is
    a 2-D GEMM: for D1 = D/4 = C_o C_o^T/2, Y1 = C_o cko/2 and m = cko cko^T (cko = ckm's
    occupied rows: naux nocc^2 per product rather than naux nao nocc); for P, Y1m = P ckm / 2
    in the MO basis, m = 2 ckm Y1m^T and Y1 = C Y1m. The fitted densities d from the packed
    factor (one GEMV per density)."""
    be, nao, naux = jk.backend, jk.fac.nao, jk.fac.naux
    B_ov, B_oo = jk.mo[:2]
    L = _dev(be, _cholesky(jk.auxmol.intor("int2c2e"), "JK"))
    Cd, Pm = _dev(be, C), _dev(be, 0.5 * (P + P.T))
    Co = Cd[:, :nocc]
    D = linalg.gemm(Co, Co, trans_b=True, alpha=2.0, backend=be)
    P_ao = linalg.gemm(linalg.gemm(Cd, Pm, backend=be), Cd, trans_b=True, backend=be)
    D1t = [0.5 * D, 0.5 * (P_ao + P_ao.T)]
    pack = _PairPack.get(nao, D.device)
    dens = torch.stack([pack.pack(x) for x in [D] + D1t])  # (3, npair), pair-weighted
    d = linalg.trsm(L, linalg.gemm(jk.fac.B, dens, trans_b=True, backend=be), trans=True, backend=be).T
    nmo = Cd.shape[1]
    ckm = torch.cat([B_oo, B_ov], dim=2)  # [P, k, r] = (C_o^T B^P C)_kr, ckm^P transposed
    ckm = linalg.trsm(L, ckm.view(naux, -1), trans=True, backend=be).contiguous().view(naux, nocc, nmo)
    cko = ckm[:, :, :nocc].reshape(naux, -1)  # [P, (k l)], symmetric in k, l
    Y1m = linalg.gemm(ckm.view(-1, nmo), Pm, alpha=0.5, backend=be)  # [P, k, r] = (P ckm^P / 2)_rk
    Y1 = [  # [P, μ, k] of [P, k, μ]: C_o cko^P / 2 and C Y1m^P
        linalg.gemm(cko.view(-1, nocc), Co, trans_b=True, alpha=0.5, backend=be),
        linalg.gemm(Y1m.view(-1, nmo), Cd, trans_b=True, backend=be),
    ]
    Y1 = [[y.view(naux, nocc, nao).transpose(1, 2).contiguous()] for y in Y1]
    ms = [linalg.gemm(cko, cko, trans_b=True, backend=be)]
    m = linalg.gemm(ckm.view(naux, -1), Y1m.view(naux, -1), trans_b=True, alpha=2.0, backend=be)
    ms.append(0.5 * (m + m.T))
    g2 = [-0.5 * (torch.outer(d[n + 1], d[0]) + torch.outer(d[0], d[n + 1])) + ms[n] for n in range(2)]
    return _jk_deriv_3c(jk, [Co], [2.0], D, D1t, d, Y1, g2)


def jk_energy_deriv_blocked(
    jk: _DFJK, C: list, nocc: list, w: list, M: list, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """d/dR of E_G(D1) = Σ_σ w_σ D1^σ·(J[D] - K[D^σ]) at fixed densities, D^σ = C_o^σ C_o^σT,
    D = Σ_σ w_σ D^σ, for D1_hf^σ = D^σ / 2 and D1_m^σ = C^σ M^σ C^σT: (2, natm, 3) Eh/bohr, for the
    spins σ of C (each (nao, nmo), its first nocc_σ columns occupied) with weights w_σ and M^σ
    (nmo, nmo) symmetric in the MO basis. RHF: w = [2], M = P/2 (E_G(D1, D), G = J - K/2; the
    DF-RHF's two-electron gradient for D1 = D/2); UHF: w = [1, 1], M^σ = P^σ. With c = (μν|Q)
    (Q|P)^-1 = L^-T B the fitted coefficients (from the JK factor, never held whole): d0 = Σ D c,
    d1 = Σ D1t c with D1t = Σ_σ w_σ D1^σ, ck^σ_PλK = Σ_ν c_λνP C_νk, Y1^σ_PμK = Σ_λ D1^σ_μλ
    ck^σ_PλK; the weights of (μν|P)^x are D1t d0 + D d1 - Σ_σ w_σ (M^σ + M^σT)/2 with M^σ_PμN = 2
    Σ_k Y1^σ_PμK C_νk, those of (P|Q)^x -(d1 d0^T + d0 d1^T)/2 + Σ_σ w_σ (m^σ + m^σT)/4 with m^σ =
    2 Σ_μk ck^σ_PμK Y1^σ_QμK (``_jk_deriv_3c``), all in the MO basis below.

    Only the fitted MO coefficients are held whole: one pass over the AO factor gives the fitted
    densities' ρ and each spin's ckm's right-hand side [P, k, r] = (C_o^T B^P C)_kr (naux nocc_σ
    nmo; a factor split over ranks: each rank's rows, then sent to every rank, ``_DFJK.all_rows``),
    then the factor is released (``_DFJK.release``) and ckm = L^-T (that) is solved in place,
    column block by column block; with cko = ckm's occupied columns, Y1 = C_o cko / 2 (D1_hf) and
    C M ckm (D1_m), and the metric weights Σ_σ w_σ cko cko^T / 2 and m = Σ_σ w_σ ckm (M ckm)^T,
    are made per aux block (m column block by column block, Y1 inside the derivative integrals'
    blocks) instead of held (two of naux nao nocc and one of naux nocc nmo in
    ``jk_energy_deriv_rhf``). A spin with no occupied orbital has no exchange term."""
    be, nao, naux = jk.backend, jk.nao, jk.naux
    L = _dev(be, _cholesky(jk.auxmol.intor("int2c2e"), "JK"))
    Cd, Md = [_dev(be, c) for c in C], [_dev(be, m) for m in M]
    D = D1m = None
    for wi, c, no, m in zip(w, Cd, nocc, Md):
        Co = c[:, :no]
        D = linalg.gemm(Co, Co, trans_b=True, alpha=wi, beta=float(D is not None), out=D, backend=be)
        P_ao = linalg.gemm(linalg.gemm(c, m, backend=be), c, trans_b=True, alpha=wi, backend=be)
        D1m = P_ao if D1m is None else D1m + P_ao
    D1t = [0.5 * D, 0.5 * (D1m + D1m.T)]
    keep = [s for s, no in enumerate(nocc) if no]  # a spin with no electron has no exchange
    w, Cd, nocc, Md = [w[s] for s in keep], [Cd[s] for s in keep], [nocc[s] for s in keep], [Md[s] for s in keep]
    Co = [c[:, :no] for c, no in zip(Cd, nocc)]
    dens = torch.stack([D] + D1t).view(3, nao * nao)
    mine = jk.rows[1] - jk.rows[0]  # this rank's rows of a split factor (all in one process)
    rho = torch.empty((mine, 3), dtype=torch.float64, device=D.device)
    ckm = [torch.empty((mine, no, c.shape[1]), dtype=torch.float64, device=D.device) for c, no in zip(Cd, nocc)]
    for p0, p1, Bb in jk._blocks():
        nb = p1 - p0
        rho[p0:p1] = linalg.gemm(Bb.view(nb, -1), dens, trans_b=True, backend=be)
        for c, co, out in zip(Cd, Co, ckm):  # [P, k, r] of C_o^T B^P C
            ho = linalg.gemm(Bb.view(-1, nao), co, backend=be).view(nb, nao, -1).transpose(1, 2).contiguous()
            out[p0:p1] = linalg.gemm(ho.view(-1, nao), c, backend=be).view(nb, co.shape[1], -1)
    rho, ckm = jk.all_rows(rho).T, [jk.all_rows(x) for x in ckm]  # a split factor's shares on every rank
    jk.release()
    d = linalg.trsm(L, rho.T, trans=True, backend=be).T  # (3, naux)
    for x in ckm:
        _trsm_columns(L, x.view(naux, -1), be)
    cko = [x[:, :, :no].reshape(naux, -1) for x, no in zip(ckm, nocc)]  # [P, (k l)], symmetric in k, l
    step = max(1, min(naux, int(block_mb * 1e6 // (3 * nao * nao * 8))))
    m = torch.empty((naux, naux), dtype=torch.float64, device=D.device)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        for s, (wi, x, mm) in enumerate(zip(w, ckm, Md)):
            Y1m = linalg.gemm(x[p0:p1].view(-1, x.shape[2]), mm, backend=be)  # [P, k, r] = (M ckm^P)_rk
            blk = linalg.gemm(x.view(naux, -1), Y1m.view(p1 - p0, -1), trans_b=True, alpha=wi, backend=be)
            if s:
                m[:, p0:p1] += blk
            else:
                m[:, p0:p1] = blk
    hf = torch.empty((naux, naux), dtype=torch.float64, device=D.device)
    for s, (wi, x) in enumerate(zip(w, cko)):
        linalg.gemm(x, x, trans_b=True, alpha=wi / 2, beta=float(s > 0), out=hf, backend=be)
    ms = [hf, 0.5 * (m + m.T)]
    del m
    g2 = [-0.5 * (torch.outer(d[n + 1], d[0]) + torch.outer(d[0], d[n + 1])) + ms[n] for n in range(2)]

    def y1(p0, p1):  # per density, each spin's [P, μ, k] of C_o cko^P / 2 and C M ckm^P, this block of P only
        nb, out = p1 - p0, [[], []]
        for c, co, no, x, xo, mm in zip(Cd, Co, nocc, ckm, cko, Md):
            y0 = linalg.gemm(xo[p0:p1].reshape(-1, no), co, trans_b=True, alpha=0.5, backend=be)
            Y1m = linalg.gemm(x[p0:p1].view(-1, x.shape[2]), mm, backend=be)
            yp = linalg.gemm(Y1m, c, trans_b=True, backend=be)
            for n, y in enumerate((y0, yp)):
                out[n].append(y.view(nb, no, nao).transpose(1, 2).contiguous())
        return out

    return _jk_deriv_3c(jk, Co, w, D, D1t, d, y1, g2, block_mb)


def _trsm_columns(L: torch.Tensor, X: torch.Tensor, backend, block_mb: float = 64.0) -> None:
    """X <- L^-T X in place for lower-triangular L (n, n) and X (n, m), column block by column
    block (about block_mb each): no second X beside it."""
    n, m = X.shape
    step = max(1, int(block_mb * 1e6 // (8 * n)))
    for c0 in range(0, m, step):
        c1 = min(m, c0 + step)
        X[:, c0:c1] = linalg.trsm(L, X[:, c0:c1].contiguous(), trans=True, backend=backend)


def _jk_deriv_3c(
    jk: _DFJK, Cd: list, w: list, D, D1t: list, d, Y1, g2: list, block_mb: float = AUX_BLOCK_MB
) -> np.ndarray:
    """``jk_energy_deriv_blocked``'s contraction with the derivative integrals (``df_deriv``), from its
    intermediates on the device: each spin's C_o (``Cd``) and weight, D, the D1t and Y1 of each
    density, d (1 + n, naux) and the metric weights g2 (n of (naux, naux)). Y1: per density a list
    of each spin's [P, μ, k] (naux, nao, nocc_σ), or a function (p0, p1) -> that list for the
    block of P in [p0, p1) (made per block, never held whole)."""
    be, nao = jk.backend, jk.nao
    if not callable(Y1):
        Y1_all = Y1
        Y1 = lambda p0, p1: [[y[p0:p1] for y in ys] for ys in Y1_all]  # noqa: E731
    buf = memory.Buffers(device=D.device)
    pack = _PairPack.get(nao, D.device)
    dens_p = [torch.stack([pack.pack(x), pack.pack(D)]) for x in D1t]  # (2, npair) each, pair-weighted

    def g3(p0, p1):  # -(M + M^T)/2 + D1t d0 + D d1, packed with the pair weights
        nb = p1 - p0
        out, M = buf.get("out", (len(D1t), nb, pack.npair)), buf.get("M", (nb * nao, nao))
        for n, ys in enumerate(Y1(p0, p1)):
            for k, (wi, c, y) in enumerate(zip(w, Cd, ys)):
                linalg.gemm(
                    y.reshape(-1, c.shape[1]), c, trans_b=True, alpha=2.0 * wi, beta=float(k > 0), out=M, backend=be
                )
            pack.sym(M.view(nb, nao, nao), out[n], buf.get("M2", (nb, pack.npair)))
            coef = torch.stack([d[0, p0:p1], d[n + 1, p0:p1]], dim=1)  # (nb, 2)
            linalg.gemm(coef, dens_p[n], beta=-1.0, out=out[n], backend=be)  # minus the exchange part
        return out

    return df_deriv(jk.mol, jk.auxmol, g3, torch.stack(g2).cpu().numpy(), block_mb=block_mb, world=jk.world)


# ---------------------------------------------------------------------------- derivative integrals
def _atom_of(mol) -> np.ndarray:
    """(nao,) the atom of each basis function."""
    out = np.empty(mol.nao_nr(), dtype=int)
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        out[p0:p1] = a
    return out


class _PairPack:
    """Symmetric [.., μ, ν] arrays in PySCF's s2ij pair order (μ >= ν, row by row) with each pair's
    weight w (2 off the diagonal, 1 on it), so that Σ_μν W_μν X_μν = Σ_pairs (w W)_pair X_pair for a
    symmetric X: ``sym`` of a (nb, nao, nao) block, ``pack`` of one (nao, nao) matrix. One per
    (nao, device), kept (index tensors of nao^2/2 int64)."""

    _cache: dict = {}

    def __init__(self, nao: int, device):
        rows, cols = np.tril_indices(nao)
        dev = lambda x: torch.from_numpy(x).to(device)  # noqa: E731
        self.npair = len(rows)
        self.lower, self.upper = dev(rows * nao + cols), dev(cols * nao + rows)
        self.diag = dev(np.flatnonzero(rows == cols))
        self.weight = dev(np.where(rows == cols, 1.0, 2.0))

    @classmethod
    def get(cls, nao: int, device) -> "_PairPack":
        key = (nao, str(device))
        if key not in cls._cache:
            cls._cache.clear()
            cls._cache[key] = cls(nao, device)
        return cls._cache[key]

    def sym(self, M: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """w (M + M^T)/2 at μ >= ν: M_μν + M_νμ off the diagonal, M_μμ on it, for a contiguous M
        (nb, nao, nao), into ``out`` (nb, npair) (``scratch`` alike, for a device). In host memory
        (fp64) PySCF's C hermi_sum (M overwritten by M + M^T, cache-blocked) and pack_tril: about
        2.5 times faster there than torch's two gathers, whose second one strides by nao."""
        if M.is_cpu and M.dtype == torch.float64 and M.is_contiguous():
            pyscf_lib.hermi_sum(M.numpy(), axes=(0, 2, 1), inplace=True)
            pyscf_lib.pack_tril(M.numpy(), out=out.numpy())
        else:
            flat = M.reshape(M.shape[0], -1)
            torch.index_select(flat, 1, self.lower, out=out)
            out.add_(torch.index_select(flat, 1, self.upper, out=scratch))
        out[:, self.diag] *= 0.5
        return out

    def pack(self, D: torch.Tensor) -> torch.Tensor:
        """w D at μ >= ν (npair,) for a symmetric D (nao, nao)."""
        return D.reshape(-1)[self.lower] * self.weight


def df_deriv(mol, auxmol, g3_block, g2: np.ndarray, block_mb: float = AUX_BLOCK_MB, world=None) -> np.ndarray:
    """Σ_μνP g3_PμN d(μν|P)/dR + Σ_PQ g2_PQ d(P|Q)/dR for n weight sets at once: (n, natm, 3)
    Eh/bohr. ``g3_block(p0, p1)``: the weights g3 symmetric in μν, packed at μ >= ν with the
    pair's weight w (2 off the diagonal: ``_PairPack``), a tensor (n, p1 - p0, nao(nao+1)/2) on any
    device (brought to the host); g2 (n, naux, naux) symmetric. libcint's int3c2e_ip1
    (∇μ ν|P) and int3c2e_ip2 (μν|∇P), both for the pairs μ >= ν only (PySCF's s2ij, half of
    int3c2e_ip1's full square), in aux-shell blocks contracted on the host (torch), and
    int2c2e_ip1 (∇P|Q). The derivative on ν's centre comes from translational invariance,
    (μ ∇ν|P) = -(∇μ ν|P) - (μν|∇P), so that with w W the pair's weight (w = 2 off the diagonal)
        dE/dR_A = Σ_P Σ_μ>=ν w W_PμN [(δ_A,at(ν) - δ_A,at(μ)) (∇μ ν|P) + (δ_A,at(ν) - δ_A,at(P)) (μν|∇P)]
    (the identity holds to rounding: the gradient moves by ~1e-15 relative).

    The aux blocks fall in DERIV_GROUPS fixed groups (fewer where there are fewer blocks), each
    group's per-pair sums added up from zero; the groups' sums are added in group order
    (``World.ordered_sum``). Over several ranks (``world``) each rank makes the groups
    ``block_owners`` gives it: the same bits as one process."""
    nao, naux, n = mol.nao_nr(), auxmol.nao_nr(), g2.shape[0]
    world = world if world is not None else distributed.World()
    rows, cols = np.tril_indices(nao)  # PySCF's s2ij order: μ >= ν, row by row
    step = max(1, int(block_mb * 1e6 // (3 * nao * nao * 8)))  # ip1 and ip2 packed: 3 nao^2 together
    blocks = integrals.aux_shell_blocks(auxmol, step)
    ngroup = min(len(blocks), DERIV_GROUPS)
    group_of = block_owners(len(blocks), ngroup)
    own = block_owners(ngroup, world.size)
    buf = memory.Buffers()  # the products' scratch, reused: a fresh temporary of this size is page faults
    m = n * 3 * len(rows)
    shape = (2 * m + n * 3 * naux,)  # [a1 | a2 | g_aux]

    def views(flat):  # a1, a2 (n, 3, npair): Σ_P w W (∇μ ν|P), Σ_P w W (μν|∇P) per pair; g_aux (n, 3, naux) per P
        return flat[:m].view(n, 3, -1), flat[m : 2 * m].view(n, 3, -1), flat[2 * m :].view(n, 3, naux)

    def group_sums(g):
        flat = torch.zeros(shape, dtype=torch.float64)
        a1, a2, g_aux = views(flat)
        for s0, s1, p0, p1 in (blk for blk, gb in zip(blocks, group_of) if gb == g):
            distributed.fault("gradient")
            sl = (0, mol.nbas, 0, mol.nbas, s0, s1)
            Wp = g3_block(p0, p1).to("cpu", torch.float64)  # (n, nb, npair), w W at μ >= ν
            for name, acc in (("int3c2e_ip1", a1), ("int3c2e_ip2", a2)):
                ip = torch.from_numpy(
                    df_incore.aux_e2(mol, auxmol, name, aosym="s2ij", comp=3, shls_slice=sl).transpose(0, 2, 1)
                )  # [x, P, μ>=ν]
                prod = buf.get("prod", ip.shape[1:])
                for k in range(n):
                    for x in range(3):
                        torch.mul(ip[x], Wp[k], out=prod)
                        acc[k, x] += prod.sum(0)
                        if acc is a2:
                            g_aux[k, x, p0:p1] = prod.sum(1)
                del ip
        return flat

    mine = (group_sums(g) for g in range(ngroup) if own[g] == world.rank)
    a1, a2, g_aux = views(world.ordered_sum(mine, shape, torch.float64, "cpu", "gradient"))
    return _assign_to_atoms(mol, auxmol, rows, cols, a1, a2, g_aux, g2)


def _assign_to_atoms(mol, auxmol, rows, cols, a1, a2, g_aux, g2) -> np.ndarray:
    """``df_deriv``'s per-pair and per-P sums (a1, a2 (n, 3, npair); g_aux (n, 3, naux)) and the
    metric's weights g2 (n, naux, naux) to (n, natm, 3) Eh/bohr: a1 to at(ν) minus at(μ), a2 to
    at(ν), -g_aux and -2 Σ_Q g2_PQ (∇P|Q) to at(P)."""
    at_mu, at_nu = _atom_of(mol)[rows], _atom_of(mol)[cols]
    ip = auxmol.intor("int2c2e_ip1")  # (3, naux, naux)
    g = np.zeros((a1.shape[0], mol.natm, 3))
    for k in range(a1.shape[0]):
        s1, s2 = a1[k].numpy().T, a2[k].numpy().T
        np.add.at(g[k], at_nu, s1 + s2)
        np.add.at(g[k], at_mu, -s1)
        np.add.at(g[k], _atom_of(auxmol), -g_aux[k].numpy().T - 2.0 * np.einsum("xpq,pq->px", ip, g2[k], optimize=True))
    return g


def _one_electron_deriv(mol, pairs) -> list:
    """[Σ D dh/dR - Σ W dS/dR (natm, 3) Eh/bohr for each (D, W) in ``pairs``] (symmetric D, W
    (nao, nao)): PySCF's hcore generator (kinetic, nuclear attraction, ECP) and -int1e_ipovlp,
    each atom's integrals made once."""
    mf_grad = pyscf_grad_rhf.Gradients(pyscf_hf.RHF(mol))
    hcore_deriv = mf_grad.hcore_generator(mol)
    s1 = mf_grad.get_ovlp(mol)  # -(∇μ|ν)
    out = [np.zeros((mol.natm, 3)) for _ in pairs]
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        h1 = hcore_deriv(a)
        for g, (D, W) in zip(out, pairs):
            g[a] += np.einsum("xij,ij->x", h1, D) - 2.0 * np.einsum("xij,ij->x", s1[:, p0:p1], W[p0:p1])
    return out
