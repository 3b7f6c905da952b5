"""dfmp2/benchmarks/fair_baseline.py: the PySCF baseline runs in a subprocess per BLAS setting (the
environment as set; without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; and without them but
OPENBLAS_CORETYPE=Haswell or SkylakeX where the CPU has their instructions), each records which
BLAS it ran, the fastest is the baseline, and a child that fails is an error entry, not an
exception. The variables are never set by the tests: the environments are checked on a copy."""

ALL_FLAGS = {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"}

import sys
from pathlib import Path

import pytest

from dfmp2.benchmarks import fair_baseline as fb

ROOT = Path(__file__).resolve().parents[2]


def test_each_setting_environment():
    base = {"OPENBLAS_CORETYPE": "Barcelona", "OPENBLAS_L2_SIZE": "1048576", "OMP_NUM_THREADS": "2"}
    assert fb.env_for("unset", base) == {"OMP_NUM_THREADS": "2"}
    assert fb.env_for("as_set", base) == base
    for core in ("Haswell", "SkylakeX"):
        assert fb.env_for(core, base) == {"OMP_NUM_THREADS": "2", "OPENBLAS_CORETYPE": core}
    assert fb.SETTINGS == ("as_set", "unset", "Haswell", "SkylakeX")


def test_a_core_type_the_cpu_lacks_is_not_run(monkeypatch):
    """An AVX2-only CPU (a Zen 3 EPYC): SkylakeX's kernels would die of an illegal instruction, so
    that setting is recorded as not run, naming the missing flags; the others run. The planned
    count follows (a caller divides its time by it)."""
    calls = []

    def run_child(spec, env, timeout):
        calls.append(env.get("OPENBLAS_CORETYPE"))
        return {
            "tasks": {"dfrhf": {"seconds": 2.0 if env.get("OPENBLAS_CORETYPE") else 3.0}},
            "peaks": {},
            "blas": {"env": {}},
        }

    monkeypatch.setattr(fb, "run_child", run_child)
    monkeypatch.setattr(fb, "cpu_flags", lambda: {"sse2", "avx2", "fma"})
    for v in fb.BLAS_VARS:
        monkeypatch.delenv(v, raising=False)
    assert fb.unsupported("SkylakeX").startswith("this CPU lacks avx512f, avx512bw")
    assert fb.unsupported("Haswell") is None
    assert fb.planned_runs() == 3 and fb.planned_runs(once_when_same=True) == 2
    base = fb.pyscf_baseline(["dfrhf"], "w.xyz")
    assert calls == [None, None, "Haswell"] and base["best"] == "Haswell"
    assert "tasks" not in base["runs"]["SkylakeX"] and "avx512f" in base["runs"]["SkylakeX"]["not_run"]
    md = fb.markdown_lines(base, {"env": {}}, {})
    assert any("SkylakeX: not run: this CPU lacks avx512f" in ln for ln in md)
    assert "fastest PySCF setting: **Haswell**" in "\n".join(md)
    monkeypatch.setattr(fb, "cpu_flags", lambda: ALL_FLAGS)
    assert fb.planned_runs() == 4 and fb.unsupported("SkylakeX") is None


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
def test_pyscf_baseline_runs_each_setting_and_takes_the_fastest():
    """Every setting this CPU can run runs (a core type forced: OpenBLAS reports it), and gives
    PySCF's energy; the fastest is the baseline."""
    base = fb.pyscf_baseline(["whole"], ROOT / "inputs/water.xyz", threads=1, timeout=120, peak_sizes=[64])
    assert set(base["runs"]) == set(fb.SETTINGS)
    ran = {s: r for s, r in base["runs"].items() if not fb.unsupported(s)}
    assert {"as_set", "unset"} <= set(ran)
    for s, r in ran.items():
        assert "error" not in r, r
        assert r["blas"]["threadpools"] and abs(r["tasks"]["whole"]["e_mp2"] - (-76.2307749879)) < 1e-8
        if s in fb.CORE_FLAGS:
            assert r["blas"]["env"]["OPENBLAS_CORETYPE"] == s
            pools = [p for p in r["blas"]["threadpools"] if p.get("internal_api") == "openblas"]
            assert any((p.get("architecture") or "").lower() == s.lower() for p in pools)
    secs = {s: r["tasks"]["whole"]["seconds"] for s, r in ran.items()}
    assert base["best"] == min(secs, key=secs.get)
    assert base["peaks"]["fp64"]["gflops"] > 0
    md = "\n".join(fb.markdown_lines(base, fb.blas_info(), base["peaks"]))
    assert "fastest PySCF setting" in md and "DGEMM peak" in md


def test_once_when_same_runs_one_setting_only_where_the_variables_are_unset(monkeypatch):
    """Opt-in: the default runs every setting; with once_when_same and neither variable set,
    'unset' is recorded as not run (the same environment as 'as_set'); the core types still run."""
    calls = []

    def run_child(spec, env, timeout):
        calls.append(env)
        return {"tasks": {"dfrhf": {"seconds": 1.0}}, "peaks": {"rows": []}, "blas": {"env": {}}}

    monkeypatch.setattr(fb, "run_child", run_child)
    monkeypatch.setattr(fb, "cpu_flags", lambda: ALL_FLAGS)
    for v in fb.BLAS_VARS:
        monkeypatch.delenv(v, raising=False)
    assert fb.same_setting() and len(fb.pyscf_baseline(["dfrhf"], "w.xyz")["runs"]) == 4 and len(calls) == 4
    base = fb.pyscf_baseline(["dfrhf"], "w.xyz", once_when_same=True)
    assert len(calls) == 7 and base["best"] == "as_set" and base["runs"]["unset"]["same_as"] == "as_set"
    assert [c.get("OPENBLAS_CORETYPE") for c in calls[4:]] == [None, "Haswell", "SkylakeX"]
    md = fb.markdown_lines(base, {"env": {}}, {})
    assert "run once" in md[2] and any("unset: not run: same as as_set" in ln for ln in md)
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    base = fb.pyscf_baseline(["dfrhf"], "w.xyz", once_when_same=True)  # a variable set: every setting runs
    assert not fb.same_setting() and len(calls) == 11 and all("tasks" in r for r in base["runs"].values())


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
    assert set(doc["pyscf_baseline"]["runs"]) == set(fb.SETTINGS)
    assert doc["times_s"]["pyscf_fp64"]["setting"] == doc["pyscf_baseline"]["best"]
    assert abs(doc["e_corr_diff_vs_pyscf"]["ours_fp64"]) < 1e-10  # same SCF orbitals on both sides
    assert doc["gemm_peak"]["fp64"]["gflops"] > 0 and doc["blas"]["ours"]["threadpools"]
    assert "## Baseline fairness" in md
    doc, md = _script("bench_scf", "--threads", "1", tmp=tmp_path)
    rows = [r for r in doc["rows"] if r["who"].startswith("pyscf DF-RHF (")]
    assert {r["setting"] for r in rows} == set(fb.SETTINGS) and doc["gemm_peak"]["fp32"]["gflops"] > 0
    assert {r["setting"] for r in rows if "seconds" in r} == {s for s in fb.SETTINGS if not fb.unsupported(s)}
    assert "fastest PySCF / this" in md and "## Baseline fairness" in md


@pytest.mark.heavy
def test_bench_water_series_takes_pyscf_from_every_setting():
    """dfmp2 bench's water series: PySCF's DF-MP2 stage on our orbitals runs in each setting's
    subprocess (a core type this CPU lacks recorded as not run), the fastest is the baseline,
    each setting's BLAS is recorded, and PySCF's E_corr (an independent code) agrees with ours."""
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
    ran = {k: v for k, v in theirs["settings"].items() if not fb.unsupported(k)}
    assert all("not_run" in v for k, v in theirs["settings"].items() if k not in ran)
    assert all("OpenBLAS" in s["blas"] or "openblas" in s["blas"] for s in ran.values())
    assert theirs["time"]["median_s"] == min(s["seconds"] for s in ran.values())
    assert abs(ours["e_corr"] - theirs["e_corr"]) < 1e-10
    assert ours["pyscf_over_this"] == theirs["time"]["median_s"] / ours["time"]["median_s"]
