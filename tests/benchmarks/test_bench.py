"""``dfmp2 bench`` (dfmp2/cli/bench.py, dfmp2/benchmarks/): tiny shapes only, numbers not judged.

What is checked: rows record what ran; a device that cannot run is 'not run' with its reason and
no times; Trainium rows are estimates kept apart from measured rows; the JSON, markdown and PNG
are written; flop counts; the Trainium work model against the NKI emulator's own counters; the
PySCF pair baseline computes the same energies as ours; the exponent fit.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dfmp2.benchmarks import ops, report, shapes, timing, trn_estimate, waters
from dfmp2.benchmarks import plot as bench_plot
from dfmp2.benchmarks.run import BenchOptions, run_bench

TINY = "4,20,60"


def _tiny_opts(**kw):
    base = dict(
        shapes=[shapes.parse_shape(TINY)],
        devices=["cpu", "cuda", "trn1", "trn2"],
        precisions=["fp64"],
        ops=["gemm", "cholesky", "inv_sqrt_eigh", "inv_sqrt_newton_schulz", "mp2_pair_energy"],
        waters=[],
        warmup=0,
        repeats=1,
        min_time=0.0,
        max_time=0.5,
        peak_n=64,
        trn_validate=False,
    )
    base.update(kw)
    return BenchOptions(**base)


@pytest.fixture(scope="module")
def tiny_report():
    with pytest.MonkeyPatch.context() as mp:  # cuda 'not run' on any machine (checked below)
        mp.setattr(torch.cuda, "is_available", lambda: False)
        return run_bench(_tiny_opts(), log=lambda m: None)


def test_rows_record_what_ran(tiny_report):
    ran = [r for r in tiny_report["ops"] if r["status"] == "ran"]
    assert {r["op"] for r in ran} == {"gemm", "cholesky", "inv_sqrt_eigh", "inv_sqrt_newton_schulz", "mp2_pair_energy"}
    for r in ran:
        assert r["device"] == "cpu" and r["engine"] == "torch" and r["kind"] == "measured"
        assert r["kernels"], r  # the kernel that ran, per call
        assert r["linalg"]["median_s"] > 0 and r["linalg"]["repeats"] >= 1
        assert r["flops"] == ops.flops(r["op"], r["args"], r.get("iterations"))
    ns = next(r for r in ran if r["op"] == "inv_sqrt_newton_schulz")
    assert ns["iterations"] > 3 and ns["residual"] < 1e-6
    assert "inv_sqrt_eigh row" in ns["torch"]["note"] and ns["torch"]["gflops"] > 0
    pair = next(r for r in ran if r["op"] == "mp2_pair_energy")
    assert any(
        k in pair["kernels"]
        for k in (  # the tiles' GEMM: torch's or OpenBLAS, as measured
            "mp2_pair_energy:torch.matmul(tiles)+pair_epilogue.c(fp64 sums)",
            "mp2_pair_energy:openblas.dgemm(numpy.matmul, tiles)+pair_epilogue.c(fp64 sums)",
        )
    )
    assert pair["pyscf"]["median_s"] > 0 and pair["pyscf_over_this"] > 0
    peak = tiny_report["gemm_peak"][0]
    assert peak["device"] == "cpu" and peak["n"] == 64 and peak["gflops"] > 0
    # the best GEMM of any library here, not torch's alone (numpy's OpenBLAS beside it)
    assert set(peak["by_library"]) == {"torch.matmul", "numpy.matmul (OpenBLAS)"}
    assert peak["gflops"] == max(peak["by_library"].values()) == peak["by_library"][peak["library"]]
    assert peak["before"] == f"ops {TINY}"
    for r in ran:  # % of peak against the peak measured before its block
        assert r["peak_gflops"] == peak["gflops"]
        assert r["linalg"]["pct_peak"] == pytest.approx(100 * r["linalg"]["gflops"] / peak["gflops"])
    m = tiny_report["meta"]
    for key in ("date", "machine", "versions", "load_average_before", "load_average_after", "command"):
        assert key in m
    assert m["machine"]["cpu"] and m["versions"]["torch"] and m["versions"]["pyscf"]


def test_unavailable_device_is_not_run_without_times(tiny_report):
    dev = {d["device"]: d for d in tiny_report["devices"]}
    assert dev["cuda"]["status"] == "not run" and "CUDA" in dev["cuda"]["reason"]
    cuda_rows = [r for r in tiny_report["ops"] if r["device"] == "cuda"]
    assert len(cuda_rows) == 5
    for r in cuda_rows:
        assert r["status"] == "not run" and r["reason"]
        assert not any(k in r for k in ("linalg", "torch", "scipy", "pyscf", "flops", "gflops"))
    assert all(r["device"] == "cpu" for r in tiny_report["gemm_peak"])


def test_trn_rows_are_estimates_kept_apart(tiny_report):
    # No Trainium here: the measured table has trn rows only as 'not run'.
    for r in tiny_report["ops"]:
        if r["device"] in ("trn1", "trn2"):
            assert r["status"] == "not run" and "linalg" not in r
    est = tiny_report["trn_estimate"]["rows"]
    assert {r["device"] for r in est} == {"trn1", "trn2"}
    for r in est:
        assert r["kind"] == "estimate" and r["status"] in ("estimate", "not estimated")
        assert "linalg" not in r and "median_s" not in r
    chol = [r for r in est if r["op"] == "cholesky"]
    assert chol and all(r["status"] == "not estimated" and "host" in r["reason"] for r in chol)
    pair = next(r for r in est if r["op"] == "mp2_pair_energy" and r["device"] == "trn1")
    assert pair["status"] == "estimate" and pair["estimate_s"] > 0
    assert pair["estimate_s"] == max(pair["tensor_engine_s"], pair["vector_engine_s"], pair["dma_s"])
    md = report.markdown(tiny_report)
    measured, estimates = md.split("## Trainium ESTIMATES (not measured)")
    assert "(estimate)" not in measured and "(estimate)" in estimates
    assert "**not run**" in measured


@pytest.mark.heavy
def test_cli_writes_json_markdown_png(tmp_path):
    pytest.importorskip("matplotlib")
    r = CliRunner().invoke(
        __import__("dfmp2.cli.main", fromlist=["main"]).main,
        [
            "bench",
            "--shapes",
            TINY,
            "--ops",
            "gemm,trsm,mp2_pair_energy",
            "--precisions",
            "fp32",
            "--waters",
            "1",
            "--water-precisions",
            "fp32",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--min-time",
            "0",
            "--peak-n",
            "64",
            "--no-trn-validate",
            "--fit-min-nbasis",
            "1",
            "--out",
            str(tmp_path),
            "--name",
            "b",
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["schema"] == "dfmp2-bench/1" and data["plot"].endswith("b.png")
    assert (tmp_path / "b.png").stat().st_size > 1000
    md = (tmp_path / "b.md").read_text()
    assert "## Per-shape ops (measured)" in md and "## Water clusters" in md and "![time vs size](b.png)" in md
    row = data["waters"]["rows"][0]
    assert row["waters"] == 1 and row["nbasis"] == 24
    ours = next(x for x in row["runs"] if x["who"] == "dfmp2")
    pyscf = next(x for x in row["runs"] if x["who"] == "pyscf")
    assert ours["engine"] == "torch" and ours["precision"] == "fp32" and set(waters.STAGES) <= set(ours["stages_s"])
    assert abs(ours["e_corr"] - pyscf["e_corr"]) < 1e-6


def test_cli_bad_option_is_one_line(tmp_path):
    main = __import__("dfmp2.cli.main", fromlist=["main"]).main
    r = CliRunner().invoke(main, ["bench", "--devices", "tpu", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown device 'tpu'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["bench", "--waters", "5", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "h2o_05" in r.output
    assert not list(tmp_path.iterdir())


def test_flop_counts_known_cases():
    assert ops.flops("gemm", (2, 3, 4)) == 48
    assert ops.flops("syrk", (3, 5)) == 3 * 4 * 5
    assert ops.flops("trsm", (4, 7)) == 16 * 7
    assert ops.flops("cholesky", (3,)) == 9
    assert ops.flops("inv_sqrt_newton_schulz", (10,), iterations=4) == 14 * 2000
    assert ops.flops("mp2_pair_energy", (3, 40, 200)) == 6 * 2 * 1600 * 200  # 6 pairs i >= j
    assert ops.flops("mp2_pair_energy", (2, 3, 40, 200)) == 6 * 2 * 1600 * 200  # a 2 x 3 block
    # The Trainium model issues exactly the GEMM's flops when nothing is padded.
    w = trn_estimate.op_work("gemm", (256, 128, 512), "trn1")
    assert w.matmul_flops == ops.flops("gemm", (256, 128, 512)) and w.matmuls == 2
    # A full 128x128x512 fp32 tile stream runs at the published FP32 peak.
    t = w.times("trn1")
    assert math.isclose(w.matmul_flops / t["tensor_engine_s"], 47.5e12 / 2, rel_tol=1e-12)


@pytest.mark.parametrize(
    "op,shape",
    [
        ("gemm", (300, 70, 90)),
        ("syrk", (200, 150)),
        ("trsm", (300, 600)),
        ("mp2_pair_energy", (3, 40, 200)),
        ("mp2_pair_energy", (2, 3, 140, 130)),
    ],
)
def test_trn_work_model_matches_emulator_counters(op, shape):
    c = trn_estimate.check_against_emulator(op, shape, "trn1")
    assert c["engine"] == "nki-numpy-emulator"
    assert c["match"], (c["model"], c["emulator"])


def test_pair_kernel_limit_is_not_estimated():
    r = trn_estimate.estimate("mp2_pair_energy", (16, 16, 896, 3072), "trn1")
    assert r["status"] == "not estimated" and "SBUF" in r["reason"] and "estimate_s" not in r


def test_pyscf_pair_baseline_matches_ours():
    from dfmp2 import linalg
    from dfmp2.linalg import synthetic_problem

    p = synthetic_problem(5, 30, 70, seed=3)
    B = p.B.numpy()
    eo, ev = p.eps_occ.numpy(), p.eps_vir.numpy()
    ours = linalg.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    theirs = ops.pyscf_pair_energy(B, B, eo, eo, ev, symmetric=True)
    assert ours == pytest.approx(theirs, rel=1e-12)
    ours = linalg.mp2_pair_energy(p.B[2:], p.B[:2], p.eps_occ[2:], p.eps_occ[:2], p.eps_vir)
    theirs = ops.pyscf_pair_energy(B[2:].copy(), B[:2].copy(), eo[2:], eo[:2], ev, symmetric=False)
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_exponent_fit_recovers_known_exponent():
    sizes = [100, 200, 300, 400, 800]
    times = [3e-9 * s**4.3 * (1 + 0.01 * (-1) ** k) for k, s in enumerate(sizes)]
    f = waters.fit_exponent(sizes, times)
    assert f["p"] == pytest.approx(4.3, abs=0.02) and f["r2"] > 0.999 and f["points"] == 5
    assert waters.fit_exponent([100], [1.0])["p"] is None


def test_timer_single_run_rule_and_shapes():
    calls = []
    t = timing.Timer(warmup=2, repeats=3, min_time=0.0, single_above_s=1.0)
    r = t(lambda: calls.append(1), expected_s=5.0)
    assert r["repeats"] == 1 and r["warmup"] == 0 and len(calls) == 1
    r = t(lambda: calls.append(1), expected_s=0.1)
    assert r["repeats"] == 3 and r["warmup"] == 2
    s = shapes.parse_shapes("small,large;32,200,800")
    assert [x.name for x in s] == ["small", "large", "32,200,800"]
    assert (s[1].nbasis, s[1].nocc, s[1].nvir, s[1].naux) == (768, 96, 672, 2304)
    sizes = shapes.op_sizes(s[1])
    assert sizes["mp2_pair_energy"][0] == (16, 16, 672, 2304) and sizes["gemm"][0] == (256 * 96, 768, 672)
    assert shapes.op_sizes(s[0])["mp2_pair_energy"][0] == (16, 112, 384)  # nocc 16: one diagonal block


def test_shared_inputs_are_bit_identical_to_per_precision_ones():
    from dfmp2.linalg import random_spd, synthetic_problem

    inputs = ops.Inputs()
    assert torch.equal(inputs.spd(40, 1e3, 4, torch.float32, "cpu"), random_spd(40, 1e3, 4, dtype=torch.float32))
    p = inputs.problem(3, 20, 40, 8, torch.float32, "cpu")
    q = synthetic_problem(3, 20, 40, seed=8, dtype=torch.float32)
    assert torch.equal(p.B, q.B) and torch.equal(p.eps_occ, q.eps_occ) and torch.equal(p.eps_vir, q.eps_vir)


def test_rerender_rewrites_markdown_without_timing(tmp_path, tiny_report):
    path = tmp_path / "r.json"
    report.write_json(tiny_report, path)
    main = __import__("dfmp2.cli.main", fromlist=["main"]).main
    r = CliRunner().invoke(main, ["bench", "--rerender", str(path)])
    assert r.exit_code == 0, r.output
    assert "## Headline: per shape" in (tmp_path / "r.md").read_text()


def test_other_cpu_counts_other_processes_not_this_one():
    """The 'loaded' rule: a busy loop in THIS process is not other load; the arithmetic of
    timing.OtherCPU.cores on known readings; the report states the measured figure."""
    a = {"wall": 0.0, "busy": 10.0, "steal": 1.0, "own": 5.0}
    b = {"wall": 2.0, "busy": 14.0, "steal": 1.2, "own": 7.0}  # 4 s busy, 2 s ours -> 1 core other
    assert timing.OtherCPU.cores(a, b) == {"other_cores": 1.0, "steal_cores": 0.1, "wall_s": 2.0}
    assert timing.OtherCPU.cores(b, a) is None and timing.OtherCPU.cores(None, b) is None
    m0 = timing.OtherCPU.mark()
    if m0 is None:
        pytest.skip("no /proc/stat on this system")
    import time

    x, c0 = 0, time.process_time()
    while time.process_time() - c0 < 0.3:  # 0.3 s of our own CPU (CPU time: a loaded machine
        x += 1  # stretches the wall time, not this)
    m1 = timing.OtherCPU.mark()
    assert m1["own"] - m0["own"] >= 0.1  # our CPU time was counted as ours
    c = timing.OtherCPU.cores(m0, m1)
    assert c["other_cores"] >= 0 and c["wall_s"] >= 0.3


def test_report_says_measured_other_load(tiny_report):
    m = tiny_report["meta"]
    assert m["other_cpu"] is None or set(m["other_cpu"]) == {"other_cores", "steal_cores", "wall_s"}
    assert m["machine_loaded"] == (
        m["other_cpu"]["other_cores"] > m["other_cores_threshold"] if m["other_cpu"] else m["machine_loaded"]
    )
    text = report.markdown(tiny_report)
    assert ("Other processes took" in text) == (m["other_cpu"] is not None)
    loaded = {**m, "other_cpu": {"other_cores": 1.3, "steal_cores": 0.0, "wall_s": 9.0}, "machine_loaded": True}
    assert "times are pessimistic" in report._load_text(loaded) and "1.30" in report._load_text(loaded)


@pytest.mark.parametrize(
    "text,message",
    [
        ("5-1", "reversed"),
        ("1-", "cannot read"),
        ("-3", "cannot read"),
        ("1-2-3", "cannot read"),
        ("100-200", "no water cluster in 100-200"),
        ("1,,2", "cannot read"),
        ("7", "h2o_07"),
    ],
)
def test_waters_ranges_that_give_nothing_are_errors(text, message):
    from dfmp2.errors import InputError

    with pytest.raises(InputError, match=message):
        waters.parse_waters(text)


def test_waters_ranges_select_available_clusters():
    have = waters.available_clusters()
    assert waters.parse_waters("1-4") == [n for n in have if n <= 4]
    assert waters.parse_waters("4,1, 2") == [1, 2, 4] and waters.parse_waters("none") == []


@pytest.mark.parametrize(
    "args,message",
    [
        (["--waters", "5-1"], "reversed"),
        (["--min-time", "nan"], "--min-time must be a finite"),
        (["--max-time", "inf"], "--max-time must be a finite"),
        (["--single-above", "-1"], "--single-above"),
        (["--threads", "0"], "'--threads'"),
        (["--peak-n", "1000000"], "'--peak-n'"),
        (["--shapes", "100000,100000,100000"], "needs about"),  # B alone 8e15 bytes: refused, not allocated
    ],
)
def test_cli_bad_numbers_are_one_line(tmp_path, args, message):
    main = __import__("dfmp2.cli.main", fromlist=["main"]).main
    r = CliRunner().invoke(main, ["bench", *args, "--out", str(tmp_path / "out")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content,message",
    [
        ("not json at all", "cannot read it as JSON"),
        ('{"references": {}}', 'no "schema"'),
        ("[1, 2]", 'no "schema"'),
        ('{"schema": "dfmp2-bench/1", "meta": {}}', "damaged dfmp2 bench report"),
        ('{"schema": "dfmp2-bench/1", "meta": {"versions": {}, "machine": {}}, "ops": 3}', "damaged"),
    ],
)
def test_rerender_refuses_what_is_not_a_bench_report(tmp_path, content, message):
    """One error line, exit 2, and no .md or .png written next to it (JSONDecodeError)."""
    main = __import__("dfmp2.cli.main", fromlist=["main"]).main
    path = tmp_path / "r.json"
    path.write_text(content)
    r = CliRunner().invoke(main, ["bench", "--rerender", str(path)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.heavy
def test_bench_tables_to_a_full_or_closed_stdout(tmp_path):
    """`dfmp2 bench` printed through a plain rich Console: a full stdout was a traceback.
    Its tables now go through the commands' printing: one error line, or a quiet end for a pipe."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "scripts" / "results" / "dfmp2_bench_cpu.json", tmp_path / "r.json")
    cmd = [sys.executable, "-m", "dfmp2.cli.main", "bench", "--rerender", str(tmp_path / "r.json")]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with open("/dev/full", "w") as full:
        p = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: cannot write to standard output")
    q = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    q.stdout.close()
    err = q.stderr.read()
    assert q.wait(timeout=120) == 0 and "Traceback" not in err, err


# ---- the report's terminal tables and plot ------------------------------------------
SAVED = Path(__file__).resolve().parents[2] / "scripts" / "results" / "dfmp2_bench_cpu_waters1-32.json"


def _rendered(rep, width):
    from rich.console import Console

    c = Console(width=width, record=True, force_terminal=False, file=__import__("io").StringIO())
    report.terminal(rep, c)
    return c.export_text()


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_tables_fit_80_columns(tiny_report, width):
    """Nothing cut to '…' and no line wider than the terminal, for the tiny report here and a
    saved full one (every op, both precisions, estimates, water clusters up to 32)."""
    for rep in (tiny_report, json.loads(SAVED.read_text())):
        text = _rendered(rep, width)
        assert "…" not in text
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width  # prose wraps at the width
    for line in _rendered(json.loads(SAVED.read_text()), width).splitlines():
        if "─" in line:  # a table's header rule: the table's width
            assert len(line.rstrip()) <= report.TERMINAL_WIDTH
    full = _rendered(json.loads(SAVED.read_text()), 80)
    # the abbreviations are explained under the tables that use them
    assert "pair = mp2_pair_energy" in full and "isqrt-NS = inv_sqrt_newton_schulz" in full
    assert "speedup = PySCF" in full and "(est.)" in full


def test_plot_one_colour_per_series_and_titles_match_what_is_drawn(tiny_report):
    rep = json.loads(SAVED.read_text())
    ops, waters = bench_plot.plot_series(rep)
    colors = bench_plot.series_colors(ops, waters)
    # the same series in both panels is the same colour (one entry per series), and no two series share one
    assert set(waters) <= {k for k, _ in ops} and len(set(colors.values())) == len(colors)
    assert ("dfmp2", "cpu", "fp64") in waters and ("pyscf", "cpu", "fp64") in waters
    left, right = bench_plot.panel_titles(rep, ops, waters)
    assert "dashed" in left and "dotted" in right  # estimates and fits are drawn here
    # a CPU run with neither estimates nor fits: the titles promise no line style it does not draw
    cpu = dict(rep, trn_estimate=None, waters=dict(rep["waters"], fits={}))
    ops, waters = bench_plot.plot_series(cpu)
    left, right = bench_plot.panel_titles(cpu, ops, waters)
    assert "dashed" not in left and "estimate" not in left.lower() and "dotted" not in right
    assert all(k[0] != "estimate" for k, _ in ops)
    ops, waters = bench_plot.plot_series(tiny_report)  # no water clusters: no right panel series
    assert waters == {} and "dotted" not in bench_plot.panel_titles(tiny_report, ops, waters)[1]


def test_uhf_opposite_spin_op_matches_its_einsum_and_counts_its_flops():
    """The UMP2 opposite-spin op row: ours (the rectangular pair kernel) and the einsum baseline
    give one E_OS on the same inputs; its flops; its size at a named shape; not estimated on trn."""
    from dfmp2.linalg import TorchBackend

    assert ops.flops("mp2_pair_energy_os", (2, 3, 40, 41, 200)) == 6 * 2 * 40 * 41 * 200
    case = ops.make_case("mp2_pair_energy_os", (3, 2, 20, 21, 60), torch.float64, TorchBackend("cpu"))
    e_os, _ = case.ours()
    assert e_os == pytest.approx(case.baselines["torch"](), rel=1e-12)
    assert e_os < 0 and isinstance(case.baselines["pyscf"], str)
    args, what = shapes.op_sizes(shapes.parse_shape("small"))["mp2_pair_energy_os"]
    assert args[2:] == (112, 113, 384) and "alpha x beta" in what, (args, what)
    with pytest.raises(trn_estimate.NotEstimable, match="opposite-spin"):
        trn_estimate.op_work("mp2_pair_energy_os", args, "trn1")


@pytest.mark.heavy
def test_radical_series_against_pyscfs_dfump2():
    """One molecule of the open-shell series (OH): our DF-UMP2 stage and PySCF's DFUMP2 (fair
    baseline subprocesses) on the same UHF orbitals agree; the row and both report views render."""
    from rich.console import Console

    from dfmp2 import linalg
    from dfmp2.benchmarks import radicals
    from dfmp2.errors import InputError

    assert radicals.parse_radicals("none") == [] and "hydroxyl" in radicals.parse_radicals("default")
    with pytest.raises(InputError, match="unknown nope"):
        radicals.parse_radicals("hydroxyl,nope")
    row = radicals.run_radical(
        "hydroxyl",
        [("cpu", lambda: linalg.get_backend("cpu"))],
        ["fp64"],
        pyscf=True,
        repeats=1,
        single_above_s=3.0,
        peak_gflops={},
        log=lambda m: None,
    )
    assert row["nocc"] == [5, 4] and row["multiplicity"] == 2 and row["our_dfuhf_cycles"] > 0
    ours, theirs = row["runs"]
    assert ours["status"] == theirs["status"] == "ran" and theirs["who"] == "pyscf"
    assert abs(ours["e_corr_minus_pyscf"]) < 1e-10 and ours["pyscf_over_this"] > 0
    rep = {"radicals": {"what": "x", "rows": [row]}}
    assert "| hydroxyl | 2 | 19 | 5/4 |" in "\n".join(report._radicals_lines(rep))
    report._radicals_table(rep, Console(file=None, width=80, record=True, quiet=True))


def test_plot_has_a_panel_per_op_family_and_a_legend_of_every_series(tiny_report):
    """One panel per op family with data (every op of the report drawn, not a chosen few), the
    water panel when there are water runs, and one legend naming every series; with one shape
    each panel still shows its points (one tick, the shape's name)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    rep = json.loads(SAVED.read_text())
    first = rep["shapes"][0]["name"]
    one = dict(rep, shapes=rep["shapes"][:1], ops=[o for o in rep["ops"] if o["shape"] == first], waters=None)
    for r in (rep, dict(one, trn_estimate=None)):
        ops, waters = bench_plot.plot_series(r)
        fig = bench_plot.figure(r)
        drawn = [ax for ax in fig.axes if ax.get_visible()]
        families = {f for f, members in bench_plot.OP_FAMILIES.items() if any(op in members for _, op in ops)}
        assert {o["op"] for o in r["ops"] if o["status"] == "ran"} <= {op for _, op in ops}
        assert len(drawn) == len(families) + bool(waters)
        legend = {t.get_text() for t in fig.legends[0].get_texts()}
        assert legend == {bench_plot._series_label(k) for k in bench_plot.series_colors(ops, waters)}
        for ax in drawn[: len(families)]:
            assert len(ax.get_xticks()) == len(r["shapes"]) and ax.lines
