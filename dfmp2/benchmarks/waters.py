"""The water-cluster scaling series: the whole DF-MP2 stage after the SCF, ours against PySCF's
DF-MP2 in the same process, per cluster size, and the fitted cost exponent of each stage.

For each (H2O)n (inputs/water_clusters/h2o_NN.xyz, cc-pVDZ / cc-pVDZ-RI, DF-RHF, all-electron):
the RHF is run once (its time is reported, not part of the stage); then the stage
(integrals, metric, transform, fit, pair; dfmp2.drivers.energy.mp2_after_scf with its own stage timer)
is timed on each device and precision, and PySCF's ``mp.dfmp2.DFMP2`` kernel (its integrals,
fit and pair energies: the same stage) on the same SCF and auxiliary basis.

Cost exponents: least squares of log(time) on log(nbasis) over the clusters with nbasis >=
``fit_min_nbasis`` (out of the fixed-overhead regime). nbasis = 24 x waters exactly for
cc-pVDZ, so the exponent against the number of waters is the same number.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time

import numpy as np

from dfmp2 import linalg
from dfmp2.io import INPUTS

CLUSTER_DIR = INPUTS / "water_clusters"
STAGES = ("integrals", "metric", "transform", "fit", "pair")
# The series converges the RHF less tightly than ``dfmp2 run`` (dfmp2.scf.pyscf_scf: 1e-12 / 1e-8): the
# SCF is set-up here, not what is timed, and ours and PySCF's stage start from the same orbitals.
SCF_CONV_TOL, SCF_CONV_TOL_GRAD = 1e-10, 1e-6


@contextlib.contextmanager
def scf_tolerance(conv_tol: float = SCF_CONV_TOL, conv_tol_grad: float = SCF_CONV_TOL_GRAD):
    """Run dfmp2.scf.pyscf_scf.run_rhf with these tolerances (its module constants, restored after)."""
    from dfmp2.scf import pyscf_scf

    old = pyscf_scf.SCF_CONV_TOL, pyscf_scf.SCF_CONV_TOL_GRAD
    pyscf_scf.SCF_CONV_TOL, pyscf_scf.SCF_CONV_TOL_GRAD = conv_tol, conv_tol_grad
    try:
        yield
    finally:
        pyscf_scf.SCF_CONV_TOL, pyscf_scf.SCF_CONV_TOL_GRAD = old


def available_clusters() -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in CLUSTER_DIR.glob("h2o_*.xyz"))


def parse_waters(text: str) -> list[int]:
    """'1-24' (every available size in the range), '1,2,4,8' or 'none'. A reversed range (5-1),
    a malformed one (1-, 1-2-3) and a range holding no available cluster are errors, not an
    empty series."""
    from dfmp2.errors import InputError, shown

    t = text.strip().lower()
    if t in ("", "none", "0"):
        return []
    have = available_clusters()
    listed = f"available: {', '.join(map(str, have))}"
    out: list[int] = []
    for part in t.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]{1,6}(-[0-9]{1,6})?", part, re.ASCII):
            raise InputError(f"--waters: cannot read '{shown(part, 30)}'; give e.g. 1-24 or 1,2,4,8")
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            if lo > hi:
                raise InputError(f"--waters: range '{part}' is reversed; write {hi}-{lo}")
            sizes = [n for n in have if lo <= n <= hi]
            if not sizes:
                raise InputError(f"--waters: no water cluster in {part}; {listed}")
            out += sizes
        else:
            n = int(part)
            if n not in have:
                raise InputError(f"--waters: no inputs/water_clusters/h2o_{n:02d}.xyz; {listed}")
            out.append(n)
    return sorted(set(out))


def fit_exponent(sizes, times) -> dict:
    """Least-squares slope of log(time) on log(size): time ~ c * size^p. Returns {p, c, stderr,
    r2, points}; p is None with a reason when fewer than two usable points."""
    pts = [(float(s), float(t)) for s, t in zip(sizes, times) if s and t and t > 0 and s > 0]
    if len(pts) < 2 or len({s for s, _ in pts}) < 2:
        return {"p": None, "points": len(pts), "reason": "fewer than two sizes"}
    x = np.log([s for s, _ in pts])
    y = np.log([t for _, t in pts])
    A = np.vstack([x, np.ones_like(x)]).T
    (p, logc), _res, *_ = np.linalg.lstsq(A, y, rcond=None)
    yhat = A @ np.array([p, logc])
    ss_res = float(((y - yhat) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    n = len(pts)
    stderr = math.sqrt(ss_res / (n - 2) / float(((x - x.mean()) ** 2).sum())) if n > 2 else None
    return {
        "p": float(p),
        "c": float(math.exp(logc)),
        "stderr": stderr,
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        "points": n,
    }


def _stats(xs: list[float]) -> dict:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "repeats": len(xs)}


def pair_flops(nocc: int, nvir: int, naux: int) -> float:
    return nocc * (nocc + 1) / 2 * 2.0 * nvir * nvir * naux


def time_pyscf_fair(xyz, ref, *, repeats: int, warmup: int, timeout: float = 7200, log=print) -> dict:
    """PySCF's DF-MP2 stage (mp.dfmp2.DFMP2 kernel: its 3-index integrals, fit and pair energies)
    on our SCF orbitals and the same MP2-fit set, in the fair baseline's subprocesses (one per
    BLAS setting: fair_baseline.pyscf_baseline), the fastest setting counted. Returns the water
    row's 'pyscf' run: e_corr in Hartree, time in s, each setting's seconds and BLAS, or status
    'failed' with the errors."""
    import tempfile

    from pyscf import lib

    from dfmp2.benchmarks import fair_baseline as fb

    with tempfile.TemporaryDirectory(prefix="dfmp2-bench-") as tmp:
        npz = fb.save_scf(ref.mf, f"{tmp}/scf.npz")
        base = fb.pyscf_baseline(
            ["stage"],
            xyz,
            threads=lib.num_threads(),
            timeout=timeout,
            repeats=repeats,
            warmup=warmup,
            scf_npz=npz,
            peak_sizes=(),
        )
    settings = {
        s: (
            {"seconds": r["tasks"]["stage"]["seconds"], "blas": fb.blas_summary(r["blas"])}
            if "tasks" in r
            else {k: r[k] for k in ("error", "not_run") if k in r}
        )
        for s, r in base["runs"].items()
    }
    run = {
        "who": "pyscf",
        "device": "cpu",
        "precision": "fp64",
        "baseline_rule": base["rule"],
        "same_setting": base["same_setting"],
        "settings": settings,
        "best_setting": base["best"],
    }
    if base["best"] is None:
        log("  PySCF fp64: failed in every setting")
        why = "; ".join(f"{s}: {v['error']}" for s, v in settings.items() if "error" in v)
        return dict(run, status="failed", reason=why)
    task = base["tasks"]["stage"]
    log(f"  PySCF fp64: {task['seconds']:.2f} s (fastest setting: {base['best']})")
    return dict(
        run,
        status="ran",
        engine=f"PySCF DFMP2 (libmp, {lib.num_threads()} OpenMP threads)",
        e_corr=task["e_corr"],
        time={
            "median_s": task["seconds"],
            "min_s": task["min_s"],
            "max_s": task["max_s"],
            "repeats": task["n"],
            "warmup": warmup,
        },
    )


def run_cluster(
    n: int,
    devices: list,
    precisions: list[str],
    *,
    pyscf: bool,
    repeats: int,
    single_above_s: float,
    peak_gflops: dict,
    log=print,
) -> dict:
    """One cluster: SCF once, our stage per (device backend, precision), PySCF's stage.

    ``devices``: [(name, backend factory)] of devices that can run. ``repeats`` timed runs
    (plus one untimed warm-up) for clusters whose expected stage time is below
    ``single_above_s``; a single run (no warm-up) above it."""
    from dfmp2.df import basis
    from dfmp2.io import molecule
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf import pyscf_scf

    path = CLUSTER_DIR / f"h2o_{n:02d}.xyz"
    mol = molecule.build_molecule(read_xyz(path), "cc-pvdz")
    auxbasis = basis.mp2_auxbasis(mol)
    auxmol = basis.make_auxmol(mol, auxbasis)
    t0 = time.perf_counter()
    with scf_tolerance():
        ref = pyscf_scf.run_rhf(mol, "df")
    scf_s = time.perf_counter() - t0
    row = _cluster_row(n, path, mol, auxbasis, auxmol, ref, scf_s)
    nocc, nvir, naux = row["nocc"], row["nvir"], row["naux"]
    log(f"(H2O){n}: nbasis {row['nbasis']}, nocc {nocc}, nvir {nvir}, naux {naux}; SCF {scf_s:.1f} s")

    def expected(prec):
        g = peak_gflops.get(prec) or 10.0
        return row["pair_flops"] / (g * 1e9)

    row["runs"] += stage_runs(
        mol,
        auxmol,
        ref,
        devices,
        precisions,
        repeats=repeats,
        single=lambda prec: expected(prec) > single_above_s,
        log=log,
    )
    row["runs"].append(_pyscf_run(path, ref, pyscf, expected("fp64") > single_above_s, repeats, log))
    if pyscf:
        compare_with_pyscf(row["runs"])
    return row


def _cluster_row(n: int, path, mol, auxbasis, auxmol, ref, scf_s: float) -> dict:
    """A cluster's record before its runs: sizes, the pair step's flops, the SCF's seconds."""
    from dfmp2.df import basis

    nocc, nvir, naux = ref.channels[0].nocc, ref.nmo - ref.channels[0].nocc, auxmol.nao_nr()
    return {
        "waters": n,
        "molecule": f"inputs/water_clusters/{path.name}",
        "basis": "cc-pvdz",
        "auxbasis": basis.describe_auxbasis(auxbasis),
        "nbasis": mol.nao_nr(),
        "nocc": nocc,
        "nvir": nvir,
        "naux": naux,
        "pair_flops": pair_flops(nocc, nvir, naux),
        "scf_s": scf_s,
        "scf_cycles": ref.scf.iterations,
        "scf_conv_tol": [SCF_CONV_TOL, SCF_CONV_TOL_GRAD],
        "runs": [],
    }


def _pyscf_run(path, ref, pyscf: bool, single: bool, repeats: int, log) -> dict:
    """PySCF's fair stage run (one untimed warm-up and ``repeats`` runs, or a single run), or a
    'not run' record when the cluster is above --pyscf-max-waters."""
    if not pyscf:
        return {
            "who": "pyscf",
            "device": "cpu",
            "precision": "fp64",
            "status": "not run",
            "reason": "above --pyscf-max-waters (time budget)",
        }
    return time_pyscf_fair(path, ref, repeats=1 if single else repeats, warmup=0 if single else 1, log=log)


def stage_runs(mol, auxmol, ref, devices, precisions, *, repeats: int, single, log=print) -> list[dict]:
    """Our DF-MP2 stage after the SCF on ``ref`` (RHF or UHF), timed per (device, backend factory)
    of ``devices`` and precision: ``repeats`` runs after an untimed warm-up, or one run without
    warm-up where ``single(precision)``. One run dict each (status 'ran' or 'not run')."""
    from dfmp2.benchmarks.timing import time_mp2_stage
    from dfmp2.options import RunOptions

    runs = []
    for dev_name, make_backend in devices:
        for prec in precisions:
            problem = linalg.device_capabilities(dev_name).precision_problem(prec)
            if problem:
                runs.append(
                    {
                        "who": "dfmp2",
                        "device": dev_name,
                        "precision": prec,
                        "status": "not run",
                        "reason": f"{dev_name}: {problem}",
                    }
                )
                continue
            one = single(prec)
            times, stage_runs_s, e, ran = [], [], None, None
            for k in range((0 if one else 1) + (1 if one else repeats)):
                dt, e_os, e_ss, stage_s, ran = time_mp2_stage(
                    mol, auxmol, ref, RunOptions(device=dev_name, precision=prec), make_backend()
                )
                e = e_os + e_ss
                if one or k > 0:  # k == 0 is the warm-up
                    times.append(dt)
                    stage_runs_s.append(stage_s)
            stages = {s: statistics.median([r.get(s, 0.0) for r in stage_runs_s]) for s in STAGES}
            run = {
                "who": "dfmp2",
                "device": dev_name,
                "precision": prec,
                "status": "ran",
                "engine": ran["engine"],
                "kernels": ran["kernels"],
                "metric": ran.get("metric"),
                "stage_precision": ran.get("stage_precision"),
                "e_corr": e,
                "time": {**_stats(times), "warmup": 0 if one else 1},
                "stages_s": stages,
            }
            runs.append(run)
            log(
                f"  dfmp2 {dev_name} {prec}: {run['time']['median_s']:.2f} s "
                f"({', '.join(f'{s} {v:.2f}' for s, v in stages.items())})"
            )
    return runs


def compare_with_pyscf(runs: list[dict]) -> None:
    """Add 'pyscf_over_this' and 'e_corr_minus_pyscf' (Hartree) to our ran runs, from the last
    run of ``runs`` (PySCF's) when it ran."""
    pyscf_run = runs[-1]
    for run in runs:
        if run["who"] == "dfmp2" and run["status"] == "ran" and pyscf_run["status"] == "ran":
            run["pyscf_over_this"] = pyscf_run["time"]["median_s"] / run["time"]["median_s"]
            run["e_corr_minus_pyscf"] = run["e_corr"] - pyscf_run["e_corr"]


def fits(rows: list[dict], fit_min_nbasis: int) -> dict:
    """Cost exponents vs nbasis per (who, device, precision) and stage, over clusters with
    nbasis >= fit_min_nbasis."""
    out: dict = {}
    keys = sorted(
        {(r["who"], r["device"], r["precision"]) for row in rows for r in row["runs"] if r["status"] == "ran"}
    )
    for who, dev, prec in keys:
        sel = [
            (row["nbasis"], r)
            for row in rows
            for r in row["runs"]
            if (r["who"], r["device"], r["precision"]) == (who, dev, prec)
            and r["status"] == "ran"
            and row["nbasis"] >= fit_min_nbasis
        ]
        label = f"{who} {dev} {prec}" if who == "dfmp2" else "pyscf cpu fp64"
        entry = {
            "total": fit_exponent([s for s, _ in sel], [r["time"]["median_s"] for _, r in sel]),
            "nbasis": [s for s, _ in sel],
        }
        if who == "dfmp2":
            for st in STAGES:
                entry[st] = fit_exponent([s for s, _ in sel], [r["stages_s"].get(st, 0.0) for _, r in sel])
        out[label] = entry
    scf_pts = [(row["nbasis"], row["scf_s"]) for row in rows if row["nbasis"] >= fit_min_nbasis]
    out["scf (DF-RHF, PySCF)"] = {
        "total": fit_exponent([s for s, _ in scf_pts], [t for _, t in scf_pts]),
        "nbasis": [s for s, _ in scf_pts],
    }
    return out
