"""The ``dfmp2 bench`` driver: devices, GEMM peaks, per-shape ops, Trainium estimates, water series.

Rules it keeps (ARCHITECTURE.md, "Rules the code keeps"):
- every measured row names the device, engine and kernels that ran it;
- a device that cannot run is reported as 'not run' with the reason and has no times;
- Trainium rows are estimates in their own section, never measured columns, and a CPU run of
  the NKI kernels is never timed as Trainium;
- baselines run in the same process, on identical inputs, with the same timer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from dfmp2 import linalg
from dfmp2.benchmarks import ops as ops_mod
from dfmp2.benchmarks import radicals as radicals_mod
from dfmp2.benchmarks import report, timing, trn_estimate
from dfmp2.benchmarks import shapes as shapes_mod
from dfmp2.benchmarks import waters as waters_mod

TRN = ("trn1", "trn2")
PEAK_N = {"cpu": 2048, "cuda": 8192}
OTHER_CORES_THRESHOLD = 0.25  # other processes' mean CPU cores above which the report says "loaded"
LOADED_THRESHOLD = 1.5  # without /proc/stat: 1-minute load average above which it says "loaded"


@dataclass
class BenchOptions:
    shapes: list = field(default_factory=lambda: [shapes_mod.parse_shape(s) for s in shapes_mod.DEFAULT_SHAPES])
    devices: list = field(default_factory=lambda: ["cpu", "cuda", "trn1", "trn2"])
    precisions: list = field(default_factory=lambda: ["fp64", "fp32"])
    ops: list = field(default_factory=lambda: list(ops_mod.OPS))
    waters: list = field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 12, 16, 24])
    water_precisions: list = field(default_factory=lambda: ["fp64"])
    pyscf_max_waters: int = 24
    radicals: list = field(default_factory=list)  # open-shell series (radicals.parse_radicals); none by default
    fit_min_nbasis: int = 192
    warmup: int = 1
    repeats: int = 3
    min_time: float = 0.2
    max_time: float = 2.0
    single_above_s: float = 3.0
    water_repeats: int = 3
    peak_n: int | None = None
    trn_validate: bool = True
    command: str = "dfmp2 bench"


def device_status(name: str):
    """(backend or None, status dict). Never raises for a device that cannot run."""
    from dfmp2 import linalg

    try:
        be = linalg.get_backend(name)
    except linalg.DeviceUnavailableError as e:
        from dfmp2.errors import error_line

        return None, {"device": name, "status": "not run", "reason": error_line(e)}
    d = be.describe()
    return be, {"device": name, "status": "ran", "engine": d["engine"], **({"gpu": d["gpu"]} if "gpu" in d else {})}


def _kernels_delta(before: dict, after: dict, calls: int) -> dict:
    out = {}
    for k, v in after.items():
        dv = v - before.get(k, 0)
        if dv:
            out[k] = round(dv / max(calls, 1), 2)
    return out


@dataclass
class _State:
    """What one run shares between rows: why devices did not run, measurements reused by later rows."""

    reasons: dict = field(default_factory=dict)  # device -> why it cannot run
    t0: float = field(default_factory=time.perf_counter)
    loads: list = field(default_factory=list)  # per phase: start time, 1-min load, other processes' cores
    cpu_marks: list = field(default_factory=list)  # timing.OtherCPU readings at each phase start
    pyscf: dict = field(default_factory=dict)  # (shape, args) -> PySCF fp64 pair timing
    eigh_rows: dict = field(default_factory=dict)  # (shape, device, precision) -> inv_sqrt_eigh row
    inputs: ops_mod.Inputs | None = None  # the current shape's Philox inputs
    peaks: list = field(default_factory=list)  # every GEMM peak measured, in order
    peak_timer: timing.Timer = field(default_factory=lambda: timing.Timer(warmup=1, repeats=3, min_time=0.5))

    def sample_load(self, phase: str) -> None:
        """Start a phase: record the time and load, and the CPU other processes took during the
        phase that just ended (timing.OtherCPU; the load average counts this run's own threads)."""
        mark = timing.OtherCPU.mark()
        if self.loads:
            c = timing.OtherCPU.cores(self.cpu_marks[-1], mark)
            if c is not None:
                self.loads[-1].update(other_cores=c["other_cores"], steal_cores=c["steal_cores"])
        self.cpu_marks.append(mark)
        self.loads.append({"phase": phase, "t_s": round(time.perf_counter() - self.t0, 1), "load1": os.getloadavg()[0]})

    def other_cpu(self) -> dict | None:
        """Other processes' mean CPU cores over the whole run (first to last phase mark)."""
        return timing.OtherCPU.cores(self.cpu_marks[0], self.cpu_marks[-1]) if self.cpu_marks else None


def measure_peak(dev: str, be, prec: str, opts: BenchOptions, state: _State, when: str, log) -> dict:
    """The GEMM peak of ``dev`` in ``prec`` now (a square GEMM, the faster of torch's and, on the
    CPU, numpy's OpenBLAS: timing.gemm_peak), recorded in state.peaks."""
    dtype = torch.float64 if prec == "fp64" else torch.float32
    n = opts.peak_n or PEAK_N.get(be.device.type, 2048)
    p = {
        "device": dev,
        "precision": prec,
        "before": when,
        **timing.gemm_peak(
            be.device, dtype, n, state.peak_timer, sync=be.synchronize, host=linalg.device_capabilities(dev).is_host
        ),
    }
    state.peaks.append(p)
    log(
        f"GEMM peak {dev} {prec} (before {when}): n={n} {p['gflops']:.1f} GFLOP/s ({p['library']}; "
        + ", ".join(f"{lib} {g:.1f}" for lib, g in p["by_library"].items())
        + ")"
    )
    return p


def run_ops(opts: BenchOptions, backends: dict, state: _State, log) -> list[dict]:
    """Each shape's ops per device and precision. The GEMM peak that a row's % of peak uses is
    measured right before that (shape, device, precision) block, so a machine whose load
    changes during the run is compared against its capacity at the time."""
    rows = []
    for shp in opts.shapes:
        sizes = shapes_mod.op_sizes(shp)
        state.sample_load(f"ops {shp.name}")
        state.inputs = ops_mod.Inputs()  # one shape's inputs at a time in memory
        for dev, be in backends.items():
            for prec in opts.precisions:
                peak = None
                if be is not None and be.caps.torch_device:
                    peak = measure_peak(dev, be, prec, opts, state, f"ops {shp.name}", log)
                for op in opts.ops:
                    args, call = sizes[op]
                    base = {
                        "shape": shp.name,
                        "dims": shp.dims(),
                        "op": op,
                        "call": call,
                        "args": list(args),
                        "device": dev,
                        "precision": prec,
                        "kind": "measured",
                    }
                    if be is None:
                        rows.append({**base, "status": "not run", "reason": state.reasons[dev]})
                        continue
                    if be.caps.precision_problem(prec):
                        rows.append(
                            {**base, "status": "not run", "reason": f"{dev}: {be.caps.precision_problem(prec)}"}
                        )
                        continue
                    rows.append(run_case(base, op, args, prec, be, peak, state, opts, log))
    return rows


def run_case(  # noqa: PLR0913
    base: dict, op: str, args, prec: str, be, peak: dict | None, state: _State, opts: BenchOptions, log
) -> dict:
    dtype = torch.float64 if prec == "fp64" else torch.float32
    want_pyscf = op == "mp2_pair_energy" and be.caps.is_host
    key = (base["shape"], tuple(args))
    case = ops_mod.make_case(op, args, dtype, be, pyscf_baseline=want_pyscf and prec == "fp64", inputs=state.inputs)
    timer = timing.Timer(
        be.synchronize,
        opts.warmup,
        opts.repeats,
        opts.min_time,
        max_time=opts.max_time,
        single_above_s=opts.single_above_s,
    )
    expected = case.flops / (peak["gflops"] * 1e9) if peak else None
    before = dict(be.kernels_used)
    t = timer(case.ours, expected_s=expected)
    kernels = _kernels_delta(before, dict(be.kernels_used), t["repeats"] + t["warmup"])
    case.settle()
    row = {
        **base,
        "status": "ran",
        "engine": be.engine,
        "kernels": kernels,
        "flops": case.flops,
        "linalg": t,
        "note": case.note,
        **case.extra,
        "peak_gflops": peak["gflops"] if peak else None,
    }
    if case.baseline_flops:
        row["baseline_flops"] = case.baseline_flops
    _time_baselines(row, base, case, timer, op, prec, peak, state, want_pyscf, key)
    ops_mod.derive(row, peak["gflops"] if peak else None)
    if op == "inv_sqrt_eigh":
        state.eigh_rows[(base["shape"], base["device"], prec)] = row
    if isinstance(row.get("pyscf"), dict) and "median_s" in row["pyscf"]:
        row["pyscf_over_this"] = row["pyscf"]["median_s"] / t["median_s"]
    _log_row(log, base, op, be.name, prec, args, row)
    del case
    return row


def _time_baselines(  # noqa: PLR0913
    row: dict, base: dict, case, timer, op: str, prec: str, peak: dict | None, state: _State, want_pyscf: bool, key
):
    """Time the case's baselines into ``row`` (one entry per ops_mod.BASELINES name it has): an
    inv_sqrt_newton_schulz row reuses the inv_sqrt_eigh row's torch and scipy times, an fp32 row
    PySCF's fp64 time on the same shape."""
    eigh_row = state.eigh_rows.get((base["shape"], base["device"], prec)) if op == "inv_sqrt_newton_schulz" else None
    for name in ops_mod.BASELINES:
        fn = case.baselines.get(name)
        if (
            eigh_row is not None
            and name in ("torch", "scipy")
            and isinstance(eigh_row.get(name), dict)
            and "median_s" in eigh_row[name]
        ):
            # Same matrix, same eigh-based computation as the inv_sqrt_eigh row: not timed twice.
            row[name] = {
                **{k: v for k, v in eigh_row[name].items() if k not in ("gflops", "pct_peak")},
                "note": "the inv_sqrt_eigh row's measurement (same matrix, same computation)",
            }
            continue
        if name == "pyscf" and want_pyscf and prec == "fp32":
            cached = state.pyscf.get(key)
            if cached:
                row["pyscf"] = {
                    **cached,
                    "precision": "fp64",
                    "note": "PySCF has no fp32 path: its fp64 time on the same shape",
                }
            else:
                row["pyscf"] = {"status": "not run", "reason": "PySCF has no fp32 path and its fp64 row did not run"}
            continue
        if fn is None:
            continue
        if isinstance(fn, str):
            row[name] = {"status": "not run", "reason": fn}
            continue
        exp_b = (row.get("baseline_flops", {}).get(name, case.flops)) / (peak["gflops"] * 1e9) if peak else None
        row[name] = {**timer(fn, expected_s=exp_b), "precision": "fp64" if name == "pyscf" else prec}
        if name == "pyscf":
            state.pyscf[key] = dict(row[name])


def _log_row(log, base: dict, op: str, be_name: str, prec: str, args, row: dict) -> None:
    """One progress line of a measured row: time, rate, share of the peak, PySCF's ratio."""
    lr = row["linalg"]
    log(
        f"{base['shape']:>8s} {op:24s} {be_name} {prec} {'x'.join(map(str, args)):>18s} "
        f"{lr['median_s'] * 1e3:10.3f} ms {lr['gflops']:8.1f} GFLOP/s "
        f"{(lr['pct_peak'] or 0):5.0f}% peak"
        + (f"  PySCF/this {row['pyscf_over_this']:.2f}" if "pyscf_over_this" in row else "")
    )


def run_trn_estimates(opts: BenchOptions, op_rows: list[dict], log) -> dict:
    targets = [d for d in opts.devices if d in TRN]
    if not targets:
        return {}
    ns_iters = {
        r["shape"]: r["iterations"]
        for r in op_rows
        if r["op"] == "inv_sqrt_newton_schulz" and r["status"] == "ran" and r["precision"] == "fp32"
    }
    rows = []
    for shp in opts.shapes:
        sizes = shapes_mod.op_sizes(shp)
        for target in targets:
            for op in opts.ops:
                args, call = sizes[op]
                f = None if op == "inv_sqrt_newton_schulz" else ops_mod.flops(op, args)
                it = ns_iters.get(shp.name)
                if op == "inv_sqrt_newton_schulz" and it is not None:
                    f = ops_mod.flops(op, args, it)
                r = trn_estimate.estimate(op, args, target, flops=f, iterations=it)
                if op == "inv_sqrt_newton_schulz" and it is not None:
                    r["iterations"] = it
                    r["iterations_from"] = "the measured cpu fp32 run of the same matrix"
                if op == "inv_sqrt_newton_schulz" and it is None and r["status"] != "estimate":
                    r["reason"] = "needs the Newton-Schulz iteration count of a cpu fp32 run (not run)"
                rows.append({"shape": shp.name, "call": call, **r})
    out = {
        "method": trn_estimate.describe_method(),
        "rows": rows,
        "rate_lines": [trn_estimate.fmt_rate_line(t) for t in targets],
    }
    if opts.trn_validate:
        shp = min(opts.shapes, key=lambda s: s.nbasis * s.naux)
        if shp.nbasis * shp.naux <= 128 * 384:
            sizes = shapes_mod.op_sizes(shp)
            checks = []
            for op in ("gemm", "syrk", "trsm", "mp2_pair_energy"):
                if op in opts.ops:
                    t0 = time.perf_counter()
                    checks.append(trn_estimate.check_against_emulator(op, sizes[op][0], targets[0]))
                    checks[-1]["seconds"] = time.perf_counter() - t0
            out["validation"] = checks
            out["validation_shape"] = shp.label()
            log(
                f"trn work model vs NKI emulator at {shp.label()}: "
                + ", ".join(f"{c['op']} {'ok' if c['match'] else 'MISMATCH'}" for c in checks)
            )
        else:
            out["validation_note"] = "skipped: the smallest shape is larger than 'small' (emulator too slow)"
    return out


def run_waters(opts: BenchOptions, backends: dict, state: _State, log) -> dict:
    if not opts.waters:
        return {}
    from dfmp2 import linalg

    devs = [(d, (lambda d=d: linalg.get_backend(d))) for d, be in backends.items() if be is not None]
    not_run = [{"device": d, "reason": state.reasons[d]} for d, be in backends.items() if be is None]
    # Only for the expected stage time (single-run rule): the latest CPU peak per precision,
    # measured now when no op section ran.
    peak = {p["precision"]: p["gflops"] for p in state.peaks if linalg.device_capabilities(p["device"]).is_host}
    if "cpu" in backends and backends["cpu"] is not None:
        for prec in opts.water_precisions:
            if prec not in peak:
                peak[prec] = measure_peak("cpu", backends["cpu"], prec, opts, state, "water clusters", log)["gflops"]
    rows = []
    for n in opts.waters:
        state.sample_load(f"(H2O){n}")
        rows.append(
            waters_mod.run_cluster(
                n,
                devs,
                opts.water_precisions,
                pyscf=n <= opts.pyscf_max_waters,
                repeats=opts.water_repeats,
                single_above_s=opts.single_above_s,
                peak_gflops=peak,
                log=log,
            )
        )
    what = (
        "Each row: one (H2O)n cluster, cc-pVDZ / cc-pVDZ-RI, DF-RHF once (SCF s, not part of the stage), "
        "then the stage after the SCF (integrals, metric, transform, fit, pair energies) timed per device "
        "and precision, and PySCF's DFMP2 kernel (its own integrals, fit and pair energies: the same stage) on "
        "the same SCF and auxiliary basis. Clusters whose stage is expected to take more than "
        f"{opts.single_above_s:g} s run once without warm-up; smaller ones take the median of "
        f"{opts.water_repeats} runs after a warm-up. PySCF runs for clusters up to {opts.pyscf_max_waters} waters, "
        "each time in two subprocesses (the OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE variables as set, and unset: "
        "dfmp2/benchmarks/fair_baseline.py), and the fastest setting is the baseline; the JSON gives each with "
        "their BLAS."
    )
    return {
        "what": what,
        "rows": rows,
        "not_run": not_run,
        "fit_min_nbasis": opts.fit_min_nbasis,
        "fits": waters_mod.fits(rows, opts.fit_min_nbasis),
    }


def run_radicals(opts: BenchOptions, backends: dict, state: _State, log) -> dict:
    """The open-shell series (dfmp2.benchmarks.radicals), PySCF's DFUMP2 beside every molecule."""
    if not opts.radicals:
        return {}
    from dfmp2 import linalg

    devs = [(d, (lambda d=d: linalg.get_backend(d))) for d, be in backends.items() if be is not None]
    peak = {p["precision"]: p["gflops"] for p in state.peaks if linalg.device_capabilities(p["device"]).is_host}
    rows = []
    for name in opts.radicals:
        state.sample_load(name)
        rows.append(
            radicals_mod.run_radical(
                name,
                devs,
                opts.water_precisions,
                pyscf=True,
                repeats=opts.water_repeats,
                single_above_s=opts.single_above_s,
                peak_gflops=peak,
                log=log,
            )
        )
    what = (
        "Each row: one open-shell molecule of inputs/open_shell/ (charge and multiplicity from its XYZ "
        "comment), cc-pVDZ / cc-pVDZ-RI, PySCF's DF-UHF once (SCF s and cycles, not part of the stage; our "
        "DF-UHF's cycles at the same thresholds beside them), then the DF-UMP2 stage after the SCF (integrals, "
        "metric, transform, fit, the αα, ββ and αβ pair steps) per device and precision, and PySCF's DFUMP2 "
        "kernel on the same orbitals and auxiliary basis, by the water series' timing and fair-baseline rules."
    )
    return {"what": what, "rows": rows}


def run_bench(opts: BenchOptions, log=print) -> dict:
    """Run everything ``opts`` asks for and return the report dict (nothing written here)."""
    t_start = time.perf_counter()
    load_before = list(os.getloadavg())
    backends: dict = {}
    state = _State()
    state.sample_load("devices")
    devices = []
    for d in opts.devices:
        if d in TRN:
            be, st = device_status(d)
            if be is None:
                st["estimate"] = "see the Trainium ESTIMATES section (not measured)"
        else:
            be, st = device_status(d)
        backends[d] = be
        if be is None:
            state.reasons[d] = st["reason"]
        devices.append(st)
        log(f"{d}: {st['status']}" + (f" ({st['engine']})" if be is not None else f" — {st['reason']}"))

    op_rows = run_ops(opts, backends, state, log)
    trn = run_trn_estimates(opts, op_rows, log)
    wat = run_waters(opts, backends, state, log)
    rad = run_radicals(opts, backends, state, log)
    load_after = list(os.getloadavg())
    state.sample_load("end")
    other = state.other_cpu()
    if other is not None:
        loaded = other["other_cores"] > OTHER_CORES_THRESHOLD
    else:
        loaded = max([load_before[0], load_after[0]] + [x["load1"] for x in state.loads]) > LOADED_THRESHOLD
    meta = {
        "date": timing.now(),
        "command": opts.command,
        "machine": timing.machine(),
        "versions": timing.versions(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "machine_loaded": loaded,
        "other_cpu": other,
        "other_cores_threshold": OTHER_CORES_THRESHOLD,
        "loaded_threshold": LOADED_THRESHOLD,
        "load_samples": state.loads,
        "wall_s": time.perf_counter() - t_start,
        "single_above_s": opts.single_above_s,
        "timer": {
            "warmup": opts.warmup,
            "min_repeats": opts.repeats,
            "min_time_s": opts.min_time,
            "max_time_s": opts.max_time,
            "single_above_s": opts.single_above_s,
        },
        "aux_block": shapes_mod.AUX_BLOCK,
        "occ_block": shapes_mod.OCC_BLOCK,
    }
    return {
        "schema": report.SCHEMA,
        "meta": meta,
        "devices": devices,
        "shapes": [{"name": s.name, **s.dims()} for s in opts.shapes],
        "gemm_peak": state.peaks,
        "ops": op_rows,
        "trn_estimate": trn,
        "waters": wat,
        "radicals": rad,
    }


__all__ = ["BenchOptions", "device_status", "run_bench"]
