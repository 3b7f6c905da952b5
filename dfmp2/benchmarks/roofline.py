"""The roofline of a whole ``dfmp2 run`` (scripts/bench_roofline.py): each stage's executed flops
(the result's ``flops``, counted by dfmp2.linalg as linalg.flops says) beside the analytic useful
work of the algorithm, its GF/s, and its share of the best DGEMM this process measured.

Useful work (flops; the same counts as linalg.flops: GEMM 2mnk, SYRK n(n+1)k, TRSM m n^2,
Cholesky n^3/3), from the result's shapes (nao = nbasis; naux the MP2-fit set's, naux_jk the
JK-fit set's; nocc_s the SCF's occupied orbitals of spin s, frozen core included; o, v the active
occupied and the virtual orbitals of a channel of the MP2 stage):

    scf_fit    naux_jk^3 / 3 + naux_jk^2 npair                   Cholesky of (P|Q), L^-1 (P|μν)
    scf        (iterations + 2) (J + K): one full J/K build per cycle, the guess's and the final
               check's; J = 4 naux_jk npair (two matrix-vector products over the packed factor),
               K = sum_s (2 nocc_s naux_jk nao^2 + nao (nao + 1) nocc_s naux_jk)   (GEMM + SYRK);
               the dense O(nao^3) steps (diagonalisation, DIIS) left out, so executed > model
    metric     naux^3 / 3                                        Cholesky of (P|Q)
    transform  sum_ch 2 naux nao^2 o + 2 naux nao o v            (μν|P) C_occ, then C_vir
    fit        sum_ch naux^2 o v                                 L^-1 (P|ia)
    pair       2 v^2 naux o (o + 1) / 2 (RHF, i >= j); UHF: each spin's same-spin pairs
               o (o + 1) / 2 at 2 v^2 naux, and the o_a o_b opposite-spin pairs at 2 v_a v_b naux

npair = nao (nao + 1) / 2. The SCF's model is the full (fp64, non-incremental) build of the CPU and
CUDA; stages of other work (the integrals, the stability check, checkpoints) have no model.
"""

from __future__ import annotations

# the stages whose model ``useful_flops`` gives, in the order a run times them
MODEL_STAGES = ("scf_fit", "scf", "metric", "transform", "fit", "pair")


def _channels(doc: dict) -> list[tuple[int, int]]:
    """(active nocc, nvir) per channel of the MP2 stage, from a result JSON's shapes and spin."""
    if doc.get("spin"):
        s = doc["spin"]
        return [(s["nocc_alpha"], s["nvir_alpha"]), (s["nocc_beta"], s["nvir_beta"])]
    return [(doc["shapes"]["nocc"], doc["shapes"]["nvir"])]


def scf_build_flops(nao: int, naux_jk: int, nocc: list[int]) -> dict:
    """One full J/K build's flops: {'J', 'K'} (see the module docstring); nocc per spin."""
    npair = nao * (nao + 1) // 2
    k = sum(2 * n * naux_jk * nao * nao + nao * (nao + 1) * n * naux_jk for n in nocc)
    return {"J": 4 * naux_jk * npair, "K": k}


def useful_flops(doc: dict) -> dict:
    """{stage: useful flops} of a result JSON (``Result.to_dict()``) for the stages of
    MODEL_STAGES it timed; the SCF's only where our DF-SCF ran (not PySCF's, not a checkpoint's)."""
    sh, scf, timed = doc["shapes"], doc["ran"].get("scf") or {}, doc["timings"]
    nao, naux, nfrozen = sh["nbasis"], sh["naux"], sh["nfrozen"]
    chans = _channels(doc)
    out = {}
    if scf.get("engine") == "dfmp2.scf" and scf.get("source") == "ran" and scf.get("jk_factor"):
        naux_jk = scf["jk_factor"]["naux"]
        build = scf_build_flops(nao, naux_jk, [o + nfrozen for o, _ in chans])
        out["scf_fit"] = naux_jk**3 // 3 + naux_jk**2 * (nao * (nao + 1) // 2)
        out["scf"] = (scf["iterations"] + 2) * (build["J"] + build["K"])
    out["metric"] = naux**3 // 3
    out["transform"] = sum(2 * naux * nao * nao * o + 2 * naux * nao * o * v for o, v in chans)
    out["fit"] = sum(naux * naux * o * v for o, v in chans)
    pair = sum(o * (o + 1) // 2 * 2 * v * v * naux for o, v in chans)
    if len(chans) == 2:
        (oa, va), (ob, vb) = chans
        pair += oa * ob * 2 * va * vb * naux
    out["pair"] = pair
    return {k: v for k, v in out.items() if k in timed}


def stage_rows(seconds: dict, flops: dict, model: dict, peak_gflops: float) -> list[dict]:
    """One row per stage: seconds, executed flops, GF/s, % of ``peak_gflops`` (the best DGEMM),
    the model's flops and executed / model (None without a model or without flops)."""
    rows = []
    for stage, s in seconds.items():
        f = flops.get(stage, 0)
        gf = f / s / 1e9 if s > 0 else 0.0
        m = model.get(stage)
        rows.append(
            {
                "stage": stage,
                "seconds": s,
                "flops": f,
                "gflops_per_s": gf,
                "pct_of_dgemm_peak": 100.0 * gf / peak_gflops,
                "model_flops": m,
                "executed_over_model": f / m if m else None,
            }
        )
    return rows


def whole_run(wall_s: float, flops: dict, peak_gflops: float) -> dict:
    """The whole run's share of the roofline: flops / (wall x the best DGEMM), with its GF/s."""
    total = sum(flops.values())
    gf = total / wall_s / 1e9
    return {"wall_s": wall_s, "flops": total, "gflops_per_s": gf, "pct_of_dgemm_peak": 100.0 * gf / peak_gflops}


def markdown_table(rows: list[dict], whole: dict) -> list[str]:
    """The per-stage table and the whole run's row, as markdown lines."""

    def opt(x, fmt):
        return "—" if x is None else format(x, fmt)

    lines = [
        "| stage | s | GFLOP executed | GF/s | % of DGEMM peak | GFLOP model | executed / model |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        model = None if r["model_flops"] is None else r["model_flops"] / 1e9
        lines.append(
            f"| {r['stage']} | {r['seconds']:.3f} | {r['flops'] / 1e9:.4g} | {r['gflops_per_s']:.3g} | "
            f"{r['pct_of_dgemm_peak']:.1f} | {opt(model, '.4g')} | {opt(r['executed_over_model'], '.3f')} |"
        )
    lines.append(
        f"| **whole run** (wall) | {whole['wall_s']:.3f} | {whole['flops'] / 1e9:.4g} | "
        f"{whole['gflops_per_s']:.3g} | **{whole['pct_of_dgemm_peak']:.1f}** | | |"
    )
    return lines
