"""The gradient stage's memory plan (RHF and UHF): the MB each phase holds (``phase_mb``,
``uhf_phase_mb``), the forms of the Z-vector and of the JK derivative, where the JK factor lives
(``FACTOR_HOMES``), and the fastest plan that fits a limit (``choose_plan``, ``GradientPlan``).

The phases run one after another, each holding its own large arrays only: the densities (B and
Γ, nact nvir naux_mp2 each, freed before Γ~'s half back-transform T_v, naux_mp2 nao nact), the
correlation part's derivative integrals (T_v freed after them), the JK factor's fit (twice the
packed factor), the Z-vector and the JK part's derivative. A plan picks each of the last two
phases' form: the Z-vector with the factor in the MO basis held (B_ov, B_oo, B_vv) or streamed
from the AO factor per aux block (about 2.5 times the flops a product, no MO factor); the JK
derivative with its fitted coefficients' Y1 held, or made per aux block with the factor released
first. The factor itself is in memory (naux_jk nao(nao+1)/2 packed, its fit twice that), on
disk (the smallest plan) or, over ranks with the split SCF, split in the SCF's fixed groups of
rows. The gradient records its plan (``ran['plan']``). Still held whole: B and Γ, T_v and the
fitted MO coefficients (naux_jk nocc nmo). The UHF stage plans the same way with its own phases
(``uhf_phase_mb``) and one in-memory form (UHF_PLANS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfmp2 import memory
from dfmp2.errors import MemoryLimitError
from dfmp2.memory import human
from dfmp2.scf import driver as scf_driver
from dfmp2.scf.jk import JK_BLOCK_MB, jk_block

PAIR_BLOCK_MB = 128.0  # K and θ of one block of the densities' pair loop, at least ...
PAIR_BLOCK_MB_MAX = 512.0  # ... and at most, where that does not raise the stage's peak (make_plan): K = B B_J^T
# runs faster as one wider GEMM over several j than as several narrow ones
AUX_BLOCK_MB = 200.0  # target MB of one block of 3-center derivative integrals (3 nao^2 per function)
DISK_AUX_BLOCK_MB = 50.0  # the same in the plan with the JK factor on disk: a tight limit (the blocks and
# their copies are a large share of that plan's peak, in the second pass over (μν|P))


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
UHF_PLANS = (("ao", "blocked"),)  # the UHF stage's one in-memory plan (dfmp2.grad.ump2, ``uhf_phase_mb``)


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


def phase_mb(  # noqa: PLR0913
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


def uhf_phase_mb(  # noqa: PLR0913
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
    (``phase_mb``; its one form: UHF_PLANS; shapes: ``dfmp2.grad.plan.uhf_shapes``):
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
    have per-spin tuples (``dfmp2.grad.plan.uhf_shapes``), its phases ``uhf_phase_mb``."""
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


def uhf_shapes(mol, ref, mp2_auxmol, jk_auxmol) -> dict:
    """``phase_mb``'s shapes of the UHF ``ref`` on ``mol`` with both fitting sets: nocc, nact and
    nvir per-spin tuples (alpha, beta)."""
    nocc = tuple(int(ch.nocc) for ch in ref.channels)
    nmo = np.asarray(ref.channels[0].mo_coeff).shape[1]
    return dict(
        nao=mol.nao_nr(),
        nocc=nocc,
        nact=tuple(int(np.sum(~np.asarray(ch.frozen)[: ch.nocc])) for ch in ref.channels),
        nvir=tuple(nmo - n for n in nocc),
        naux_mp2=mp2_auxmol.nao_nr(),
        naux_jk=jk_auxmol.nao_nr(),
    )


def default_limit_mb() -> float:
    """The host's default limit (a caller without a limit): ``memory.default_limit_mb``."""
    return memory.default_limit_mb("cpu")
