"""dfmp2/benchmarks/fair_baseline.py: the PySCF baseline runs in two subprocesses, one with the environment
as set and one without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, each records which BLAS it ran, the
faster is the baseline, and a child that fails is an error entry, not an exception.
The variables are never set by the tests: the 'unset' environment is checked on a copy."""

import sys
from pathlib import Path

import pytest

from dfmp2.benchmarks import fair_baseline as fb

ROOT = Path(__file__).resolve().parents[2]


def test_unset_environment_drops_both_variables_only():
    base = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576", "OMP_NUM_THREADS": "2"}
    assert fb.env_for("unset", base) == {"OMP_NUM_THREADS": "2"}
    assert fb.env_for("as_set", base) == base


def test_blas_info_and_peaks_name_what_ran():
    import torch  # noqa: F401  (its BLAS line is read when torch is loaded)

    info = fb.blas_info()
    assert set(info["env"]) == set(fb.BLAS_VARS)
    assert isinstance(info["threadpools"], list) and any(p["user_api"] == "blas" for p in info["threadpools"])
    assert info["torch"]["blas"] and "thr" in fb.blas_summary(info)
    peaks = fb.gemm_peaks([64], repeats=1)
    assert {r["library"] for r in peaks["rows"]} == {"numpy", "torch (cpu)"}
    assert peaks["fp64"]["gflops"] == max(r["gflops"] for r in peaks["rows"] if r["precision"] == "fp64")


@pytest.mark.heavy
def test_pyscf_baseline_runs_both_settings_and_takes_the_faster():
    base = fb.pyscf_baseline(["whole"], ROOT / "inputs/water.xyz", threads=1, timeout=120, peak_sizes=[64])
    assert set(base["runs"]) == {"as_set", "unset"}
    for _s, r in base["runs"].items():
        assert "error" not in r, r
        assert r["blas"]["threadpools"] and abs(r["tasks"]["whole"]["e_mp2"] - (-76.2307749879)) < 1e-8
    secs = {s: r["tasks"]["whole"]["seconds"] for s, r in base["runs"].items()}
    assert base["best"] == min(secs, key=secs.get)
    assert base["peaks"]["fp64"]["gflops"] > 0
    md = "\n".join(fb.markdown_lines(base, fb.blas_info(), base["peaks"]))
    assert "faster PySCF setting" in md and "DGEMM peak" in md


def test_once_when_same_runs_one_setting_only_where_the_variables_are_unset(monkeypatch):
    """Opt-in: the default still runs both settings; with once_when_same and neither variable set,
    one child, the other setting recorded as not run (the same environment)."""
    calls = []

    def run_child(spec, env, timeout):
        calls.append(env)
        return {"tasks": {"dfrhf": {"seconds": 1.0}}, "peaks": {"rows": []}, "blas": {"env": {}}}

    monkeypatch.setattr(fb, "run_child", run_child)
    for v in fb.BLAS_VARS:
        monkeypatch.delenv(v, raising=False)
    assert fb.same_setting() and len(fb.pyscf_baseline(["dfrhf"], "w.xyz")["runs"]) == 2 and len(calls) == 2
    base = fb.pyscf_baseline(["dfrhf"], "w.xyz", once_when_same=True)
    assert len(calls) == 3 and base["best"] == "as_set" and base["runs"]["unset"]["same_as"] == "as_set"
    md = fb.markdown_lines(base, {"env": {}}, {})
    assert "run once" in md[2] and any("unset: not run: same as as_set" in ln for ln in md)
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    base = fb.pyscf_baseline(["dfrhf"], "w.xyz", once_when_same=True)  # a variable set: both settings run
    assert not fb.same_setting() and len(calls) == 5 and all("tasks" in r for r in base["runs"].values())


@pytest.mark.heavy
def test_failing_child_is_an_error_entry(tmp_path):
    base = fb.pyscf_baseline(["dfrhf"], tmp_path / "missing.xyz", timeout=60, peak_sizes=[64], settings=("unset",))
    assert base["best"] is None and base["runs"]["unset"]["error"].startswith("exit ")


def _script(name, *args, tmp):
    import json
    import subprocess

    out = tmp / name
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / f"{name}.py"),
            str(ROOT / "inputs/water.xyz"),
            *args,
            "--peak-sizes",
            "64",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


@pytest.mark.heavy
def test_bench_vs_pyscf_and_bench_scf_use_the_fair_baseline(tmp_path):
    doc, md = _script("bench_vs_pyscf", "--repeats", "1", tmp=tmp_path)
    assert set(doc["pyscf_baseline"]["runs"]) == {"as_set", "unset"}
    assert doc["times_s"]["pyscf_fp64"]["setting"] == doc["pyscf_baseline"]["best"]
    assert abs(doc["e_corr_diff_vs_pyscf"]["ours_fp64"]) < 1e-10  # same SCF orbitals on both sides
    assert doc["gemm_peak"]["fp64"]["gflops"] > 0 and doc["blas"]["ours"]["threadpools"]
    assert "## Baseline fairness" in md
    doc, md = _script("bench_scf", "--threads", "1", tmp=tmp_path)
    settings = {r.get("setting") for r in doc["rows"] if r["who"].startswith("pyscf DF-RHF (")}
    assert settings == {"as_set", "unset"} and doc["gemm_peak"]["fp32"]["gflops"] > 0
    assert "faster PySCF / this" in md and "## Baseline fairness" in md


@pytest.mark.heavy
def test_bench_water_series_takes_pyscf_from_both_settings():
    """dfmp2 bench's water series: PySCF's DF-MP2 stage on our orbitals runs in the two settings'
    subprocesses, the faster is the baseline, each setting's BLAS is recorded, and PySCF's E_corr
    (an independent code) agrees with ours."""
    from dfmp2 import linalg
    from dfmp2.benchmarks import waters

    row = waters.run_cluster(
        1,
        [("cpu", lambda: linalg.get_backend("cpu"))],
        ["fp64"],
        pyscf=True,
        repeats=1,
        single_above_s=100.0,
        peak_gflops={},
        log=lambda *a: None,
    )
    ours = next(r for r in row["runs"] if r["who"] == "dfmp2")
    theirs = next(r for r in row["runs"] if r["who"] == "pyscf")
    assert theirs["status"] == "ran", theirs
    assert set(theirs["settings"]) == set(fb.SETTINGS) and theirs["best_setting"] in fb.SETTINGS
    assert all("OpenBLAS" in s["blas"] or "openblas" in s["blas"] for s in theirs["settings"].values())
    assert theirs["time"]["median_s"] == min(s["seconds"] for s in theirs["settings"].values())
    assert abs(ours["e_corr"] - theirs["e_corr"]) < 1e-10
    assert ours["pyscf_over_this"] == theirs["time"]["median_s"] / ours["time"]["median_s"]
