"""A fair PySCF baseline for every benchmark that compares against PySCF: the scripts' and
``dfmp2 bench``'s water series.

Some machines set ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE``; OpenBLAS reads them once, when
it is loaded, and they change numpy's (so PySCF's) speed markedly either way: PySCF's own
OpenBLAS 0.3.3 falls back to generic kernels ("Barcelona", "Prescott") on CPUs newer than it
unless ``OPENBLAS_CORETYPE`` names a core. A user's machine does not set them; the peer gets its
best all the same. So the PySCF side runs in four settings (SETTINGS), each in a fresh subprocess:
the environment as set (``as_set``), both variables removed (``unset``), and each removed with
``OPENBLAS_CORETYPE=Haswell`` (``Haswell``: AVX2 kernels) or ``SkylakeX`` (AVX-512 kernels); a
benchmark compares against the FASTEST. A core type whose instructions this CPU lacks is not run
(recorded with the missing flags: OpenBLAS would execute them and die). Where neither variable is
set ``as_set`` and ``unset`` are the same setting (recorded as such) and the second is a repeat; a
caller short of time passes ``once_when_same=True`` to run it once (recorded as not run, the same
as the first).

Also here, so that no benchmark carries its own copy:
- ``blas_info()``: which BLAS ran in this process: threadpoolctl's ``threadpool_info()`` (library,
  version, internal_api, architecture = OpenBLAS's core type or MKL's, threads), torch's BLAS
  line and MKL version from ``torch.__config__.show()``, and the two variables as set.
- ``gemm_peaks()``: the best DGEMM and SGEMM rate of any library in this process (torch on the
  device, numpy), a few large square shapes, best of 3 calls each; GFLOP/s = 2 n^3 / seconds / 1e9.
  Each PySCF subprocess measures numpy's too, under its own setting; ``merge_peaks`` takes the best.

Use from a benchmark (seconds are wall times; energies in Hartree):

    from dfmp2.benchmarks import fair_baseline as fb
    base = fb.pyscf_baseline(["whole"], xyz, basis="cc-pvdz", threads=2, timeout=600)
    base["best"]                 # 'as_set', 'unset', 'Haswell' or 'SkylakeX': the fastest run
    base["runs"]["unset"]["tasks"]["whole"]["seconds"]

Child, by hand: ``python -m dfmp2.benchmarks.fair_baseline --child '{"tasks": ["dfrhf"], "xyz": ...}'``.
Tasks: ``dfrhf`` (PySCF DF-RHF, the JK-fit set of dfmp2.df.basis.default_auxbasis), ``dfuhf`` (PySCF
DF-UHF, the same set and thresholds), ``whole`` (PySCF DF-RHF + DFMP2 with the MP2-fit set, or
DF-UHF + DFUMP2 for an open shell; ``scf_s`` and ``mp2_s`` beside the total),
``stage`` (PySCF DFMP2, or DFUMP2 for UHF orbitals, alone on the SCF orbitals saved in ``scf_npz``,
``warmup`` untimed calls,
then ``repeats`` timed ones).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding dfmp2/ (a checkout or site-packages)
BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
SETTINGS = ("as_set", "unset", "Haswell", "SkylakeX")
CORE_FLAGS = {  # the instructions each forced OpenBLAS core type executes (/proc/cpuinfo flag names)
    "Haswell": ("avx2", "fma"),
    "SkylakeX": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"),
}
MARK = "FAIR_BASELINE_RESULT "  # the child's last stdout line: MARK + JSON
CPU_PEAK_SIZES = (2048, 3072)  # square GEMM sizes for a CPU peak (short calls on a small CPU)


# ---------------------------------------------------------------------------------------- BLAS info
def blas_info() -> dict:
    """What BLAS this process loaded: threadpoolctl's pools (or why not), torch's BLAS and the
    two OpenBLAS variables as this process sees them (None: not set)."""
    info = {"env": {v: os.environ.get(v) for v in BLAS_VARS}}
    try:
        from threadpoolctl import threadpool_info

        keep = ("user_api", "internal_api", "version", "architecture", "num_threads", "threading_layer", "filepath")
        info["threadpools"] = sorted(
            ({k: p.get(k) for k in keep if k in p} for p in threadpool_info()),
            key=lambda p: (p["user_api"], p.get("filepath") or ""),
        )
    except ImportError as e:
        info["threadpools"] = f"not read: threadpoolctl not installed ({e})"
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        cfg = torch.__config__.show()
        found = {k: re.search(rf"{k}=([^,\s]+)", cfg) for k in ("BLAS_INFO", "LAPACK_INFO")}
        lines = [ln.strip(" -") for ln in cfg.splitlines()]
        info["torch"] = {
            "blas": found["BLAS_INFO"] and found["BLAS_INFO"].group(1),
            "lapack": found["LAPACK_INFO"] and found["LAPACK_INFO"].group(1),
            "mkl": next((ln for ln in lines if "Math Kernel Library" in ln), None),
            "cpu_capability": next(
                (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("CPU capability usage")), None
            ),
            "threads": torch.get_num_threads(),
        }
    return info


def blas_summary(info: dict) -> str:
    """One line: each BLAS pool as 'library version (core type, threads)', torch's BLAS, the vars."""
    pools = info.get("threadpools")
    parts = (
        [
            f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')}, {p.get('num_threads')} thr, "
            f"{Path(p.get('filepath') or '?').name})"
            for p in pools
            if p.get("user_api") == "blas"
        ]
        if isinstance(pools, list)
        else [str(pools)]
    )
    if info.get("torch"):
        t = info["torch"]
        mkl = (
            t["mkl"].split(" for ")[0].replace("Intel(R) oneAPI Math Kernel Library ", "MKL ") if t.get("mkl") else None
        )
        parts.append(
            f"torch: {t['blas']}"
            + (
                f" ({mkl}, {t['cpu_capability']}, {t['threads']} thr)"
                if mkl
                else f" ({t['cpu_capability']}, {t['threads']} thr)"
            )
        )
    env = ", ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) or "OPENBLAS vars not set"
    return "; ".join(parts) + f"; {env}"


# -------------------------------------------------------------------------------------- GEMM peaks
def gemm_peaks(
    sizes=CPU_PEAK_SIZES, repeats: int = 3, torch_device: str | None = "cpu", numpy_too: bool = True
) -> dict:
    """Best GEMM rate per precision: {'fp64': {'gflops', 'library', 'n'}, 'fp32': ..., 'rows': [...]}.
    Square n x n products, ``repeats`` calls each after one warm-up, the fastest call counted
    (best of ``repeats``). torch on ``torch_device`` (None: skip; TF32 off on CUDA), numpy on the host."""
    rows = []
    for n in sizes:
        for prec in ("fp64", "fp32"):
            if numpy_too:
                import numpy as np

                rng = np.random.default_rng(n)
                dt = np.float64 if prec == "fp64" else np.float32
                a, b = rng.standard_normal((n, n)).astype(dt), rng.standard_normal((n, n)).astype(dt)
                rows.append(_best_of(lambda: a @ b, lambda: None, n, prec, "numpy", repeats))  # noqa: B023 (timed now)
            if torch_device is not None:
                import torch

                dt = torch.float64 if prec == "fp64" else torch.float32
                torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (no effect on a CPU)
                a = torch.randn(n, n, dtype=dt, device=torch_device)
                b = torch.randn(n, n, dtype=dt, device=torch_device)
                sync = (lambda: torch.cuda.synchronize(a.device)) if a.is_cuda else (lambda: None)  # noqa: B023 (timed now)
                rows.append(_best_of(lambda: torch.matmul(a, b), sync, n, prec, f"torch ({torch_device})", repeats))  # noqa: B023
    return merge_peaks({"rows": rows})


def _best_of(fn, sync, n, prec, library, repeats) -> dict:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return {"library": library, "precision": prec, "n": n, "best_s": best, "gflops": 2.0 * n**3 / best / 1e9}


def merge_peaks(*peaks: dict) -> dict:
    """One peak table from several (this process's, each subprocess's): all rows, and per
    precision the fastest row of any library and setting."""
    rows = [r for p in peaks if p for r in p.get("rows", [])]
    out = {"rows": rows, "rule": "best of 3 calls per shape; the fastest library and shape"}
    for prec in ("fp64", "fp32"):
        mine = [r for r in rows if r["precision"] == prec]
        if mine:
            out[prec] = max(mine, key=lambda r: r["gflops"])
    return out


# ------------------------------------------------------------------------------ the PySCF baseline
def same_setting(env=None) -> bool:
    """True where neither BLAS_VARS is set in ``env`` (default this process's): 'as_set' and 'unset'
    are then the same environment."""
    env = os.environ if env is None else env
    return all(env.get(v) is None for v in BLAS_VARS)


def env_for(setting: str, base: dict | None = None) -> dict:
    """The subprocess environment of one setting: 'as_set' is this one, 'unset' lacks BLAS_VARS,
    a core type (CORE_FLAGS) lacks them but for ``OPENBLAS_CORETYPE`` = that core."""
    env = dict(os.environ if base is None else base)
    if setting != "as_set":
        for v in BLAS_VARS:
            env.pop(v, None)
    if setting in CORE_FLAGS:
        env["OPENBLAS_CORETYPE"] = setting
    return env


def cpu_flags() -> set | None:
    """The CPU's instruction flags (/proc/cpuinfo's first 'flags' line), None where not readable."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), None)
    except OSError:
        return None
    return set(line.split(":", 1)[1].split()) if line else None


def unsupported(setting: str, flags: set | None = None) -> str | None:
    """Why a core type's setting cannot run on this CPU (the flags it lacks), or None. Unknown
    flags (no /proc/cpuinfo): runs, and a child killed by an illegal instruction is its error."""
    flags = cpu_flags() if flags is None else flags
    need = CORE_FLAGS.get(setting, ())
    missing = [f for f in need if flags is not None and f not in flags]
    return f"this CPU lacks {', '.join(missing)}, which OpenBLAS's {setting} kernels execute" if missing else None


def pyscf_baseline(  # noqa: PLR0913
    tasks,
    xyz,
    basis: str = "cc-pvdz",
    threads: int | None = None,
    timeout: float = 1800,
    repeats: int = 1,
    scf_npz: str | None = None,
    frozen_core: bool = False,
    peak_sizes=CPU_PEAK_SIZES,
    settings=SETTINGS,
    warmup: int = 0,
    charge: int | None = None,
    multiplicity: int | None = None,
    max_cycle: int | None = None,
    max_memory: float | None = None,
    once_when_same: bool = False,
) -> dict:
    """Run ``tasks`` with PySCF in one subprocess per setting (``settings``, in order), each
    given ``timeout`` seconds. Returns {'runs': {setting: child result, {'error': ...} or
    {'not_run': why} (a core type this CPU cannot run: ``unsupported``)}, 'best': the setting
    whose summed task seconds are lowest, 'same_setting': True where the variables were not set
    ('as_set' and 'unset' differ only by noise), 'tasks': the best run's tasks}.
    ``once_when_same``: where the variables are not set, 'unset' is not run after 'as_set': its
    entry is {'not_run': why, 'same_as': 'as_set'} (no 'tasks', no 'error'); ``planned_runs``
    counts the subprocesses beforehand.
    ``charge``, ``multiplicity``: as ``dfmp2 run``'s options (None: the XYZ comment's); ``max_cycle``:
    PySCF's SCF cycle limit in 'dfrhf'/'dfuhf' (None: dfmp2's default); an SCF that does not converge
    by then is timed all the same, its task marked ``converged`` False. ``max_memory`` (MB): PySCF's
    own limit for the SCF and DF-MP2 of 'whole' (None: 16000 for the MP2, keeping it in core). Each
    run records its process's peak resident memory (``max_rss_mb``)."""
    spec = {
        "tasks": list(tasks),
        "xyz": str(xyz),
        "basis": basis,
        "threads": threads,
        "repeats": repeats,
        "scf_npz": scf_npz,
        "frozen_core": frozen_core,
        "peak_sizes": list(peak_sizes),
        "warmup": warmup,
        "charge": charge,
        "multiplicity": multiplicity,
        "max_cycle": max_cycle,
        "max_memory": max_memory,
    }
    runs, same = {}, same_setting()
    for setting in settings:
        lacking = unsupported(setting)
        if lacking:
            runs[setting] = {"not_run": lacking}
        elif once_when_same and same and setting == "unset" and "as_set" in runs:
            why = f"same as as_set: neither {' nor '.join(BLAS_VARS)} is set"
            runs[setting] = {"not_run": why, "same_as": "as_set"}
        else:
            runs[setting] = run_child(spec, env_for(setting), timeout)
        runs[setting]["setting"] = setting
    ok = {s: r for s, r in runs.items() if "tasks" in r}
    best = min(ok, key=lambda s: sum(t["seconds"] for t in ok[s]["tasks"].values())) if ok else None
    return {
        "runs": runs,
        "best": best,
        "tasks": ok[best]["tasks"] if best else None,
        "same_setting": same,
        "peaks": merge_peaks(*(r.get("peaks") for r in ok.values())),
        "rule": "PySCF run with the environment as set, without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, "
        "and without them but OPENBLAS_CORETYPE=Haswell and =SkylakeX (where the CPU has their "
        "instructions), each in its own process; ratios are against the fastest",
    }


def planned_runs(settings=SETTINGS, once_when_same: bool = False) -> int:
    """How many PySCF subprocesses ``pyscf_baseline`` will start for ``settings`` on this CPU and
    in this environment (a caller's time budget divides by it)."""
    run = [s for s in settings if not unsupported(s)]
    if once_when_same and same_setting() and "as_set" in run and "unset" in run:
        run.remove("unset")
    return len(run)


def add_arguments(ap) -> None:
    """The baseline's options of every benchmark script that runs it: ``--baseline-timeout`` (seconds
    for each PySCF subprocess) and ``--peak-sizes`` (the peak GEMM's square sizes, comma list)."""
    ap.add_argument("--baseline-timeout", type=float, default=3600, help="seconds for each PySCF subprocess")
    ap.add_argument(
        "--peak-sizes",
        type=lambda t: [int(x) for x in t.split(",")],
        default=list(CPU_PEAK_SIZES),
        help="square GEMM sizes of the peak, comma list",
    )


def best_or_exit(base: dict, task: str | None = None) -> dict:
    """The fastest setting's tasks of ``pyscf_baseline``'s ``base``; with ``task``, each setting's
    seconds (or error) and BLAS printed first. Exits the script with one error line when PySCF
    failed in every setting."""
    if task is not None:
        for s, r in base["runs"].items():
            done = f"{r['tasks'][task]['seconds']:.2f} s; {blas_summary(r['blas'])}" if "tasks" in r else ""
            print(f"PySCF ({s}): " + (r.get("error") or r.get("not_run") or done), flush=True)
    if base["best"] is None:
        sys.exit(
            "error: the PySCF baseline failed in every setting: "
            + "; ".join(r.get("error") or r.get("not_run", "") for r in base["runs"].values())
        )
    return base["tasks"]


def run_child(spec: dict, env: dict, timeout: float) -> dict:
    """One PySCF subprocess: its result, or {'error': one line} on a failure or timeout."""
    cmd = [sys.executable, "-m", "dfmp2.benchmarks.fair_baseline", "--child", json.dumps(spec)]
    env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    if p.returncode != 0 or not lines:
        tail = " ".join((p.stderr or p.stdout).strip().splitlines()[-1:]) or "no output"
        return {"error": f"exit {p.returncode}: {tail}", "wall_s": time.perf_counter() - t0}
    return json.loads(lines[-1][len(MARK) :])


def child(spec: dict) -> dict:
    """Runs in the subprocess: PySCF only (dfmp2 supplies the molecule and the fitting sets)."""
    from pyscf import lib

    from dfmp2.benchmarks.timing import OtherCPU
    from dfmp2.io import molecule
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf import pyscf_scf

    if spec.get("threads"):
        lib.num_threads(spec["threads"])
    mol = molecule.build_molecule(read_xyz(spec["xyz"]), spec["basis"], spec.get("charge"), spec.get("multiplicity"))
    nfrozen = molecule.frozen_core_count(mol) if spec.get("frozen_core") else 0
    out = {"tasks": {}, "pyscf_threads": lib.num_threads()}

    def mp2(mf):
        return _pyscf_mp2_corr(mf, mol, nfrozen, spec.get("max_memory"))

    for task in spec["tasks"]:
        m0 = OtherCPU.mark()
        if task in ("dfrhf", "dfuhf"):
            r = _timed_scf(pyscf_scf.run_uhf if task == "dfuhf" else pyscf_scf.run_rhf, mol, spec.get("max_cycle"))
        elif task == "whole":
            r = _whole_task(mol, spec, mp2)
        elif task == "stage":
            r = _stage_task(mol, spec, mp2)
        else:
            raise ValueError(f"unknown task {task!r}")
        busy = OtherCPU.cores(m0, OtherCPU.mark())
        r["other_processes_cores"] = busy and busy["other_cores"]
        out["tasks"][task] = r
    out["peaks"] = _child_peaks(spec)
    out["blas"] = blas_info()
    import resource

    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # Linux: kB
    return out


def _pyscf_mp2_corr(mf, mol, nfrozen: int, max_memory) -> float:
    """PySCF's DF-MP2 (DF-UMP2 for an open shell) correlation energy (Hartree) over ``mf``, with
    dfmp2's MP2-fit set."""
    from pyscf import df
    from pyscf.mp import dfmp2 as pyscf_dfmp2
    from pyscf.mp import dfump2 as pyscf_dfump2

    from dfmp2.df import basis as df_basis

    pt = (pyscf_dfump2.DFUMP2 if mol.spin else pyscf_dfmp2.DFMP2)(mf, frozen=nfrozen or None)
    pt.with_df = df.DF(mol, auxbasis=df_basis.mp2_auxbasis(mol))
    # MB: keep PySCF incore by default (4000 MB would go out of core); a benchmark at a fixed limit gives its own
    pt.verbose, pt.max_memory = 0, max_memory or 16000
    pt.kernel(with_t2=False)
    return float(pt.e_corr)


def _whole_task(mol, spec: dict, mp2) -> dict:
    """The 'whole' task: PySCF's DF-SCF then ``mp2`` over it, each timed (seconds)."""
    from dfmp2.scf import pyscf_scf

    run_ref = pyscf_scf.run_uhf if mol.spin else pyscf_scf.run_rhf  # 'whole': UHF + DFUMP2 for an open shell
    t0 = time.perf_counter()
    kw = {"max_cycle": spec["max_cycle"]} if spec.get("max_cycle") else {}
    ref = run_ref(mol, "pyscf-df", memory_mb=spec.get("max_memory"), **kw)
    t1 = time.perf_counter()
    e_corr = mp2(ref.mf)
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "scf_s": t1 - t0,
        "mp2_s": t2 - t1,
        "e_hf": ref.e_hf,
        "e_corr": e_corr,
        "e_mp2": ref.e_hf + e_corr,
        "iterations": ref.scf.iterations,
    }


def _stage_task(mol, spec: dict, mp2) -> dict:
    """The 'stage' task: ``mp2`` alone over the SCF saved in spec['scf_npz'], after the warm-up
    calls, repeated; the median, min and max seconds."""
    import numpy as np
    from pyscf import scf as pscf

    saved = np.load(spec["scf_npz"])
    mf = (pscf.UHF if saved["mo_coeff"].ndim == 3 else pscf.RHF)(mol)  # UHF: both spins saved
    mf.mo_coeff, mf.mo_energy, mf.mo_occ = saved["mo_coeff"], saved["mo_energy"], saved["mo_occ"]
    mf.e_tot, mf.converged = float(saved["e_tot"]), True
    times = []
    for _ in range(spec.get("warmup") or 0):  # untimed: a fresh process's first-call costs
        mp2(mf)
    for _ in range(max(1, spec.get("repeats") or 1)):
        t0 = time.perf_counter()
        e_corr = mp2(mf)
        times.append(time.perf_counter() - t0)
    return {
        "seconds": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "n": len(times),
        "e_corr": e_corr,
    }


def _child_peaks(spec: dict) -> dict:
    """The GEMM peaks measured in the PySCF process, each row naming its BLAS settings."""
    sizes = spec.get("peak_sizes", CPU_PEAK_SIZES)  # [] (dfmp2 bench measures its own): none
    peaks = gemm_peaks(sizes, torch_device=None) if sizes else {"rows": []}
    env = ", ".join(f"{v}={os.environ[v]}" for v in BLAS_VARS if v in os.environ) or "OPENBLAS vars not set"
    for r in peaks["rows"]:
        r["library"] += f" in the PySCF process ({env})"
    return peaks


def _timed_scf(run_scf, mol, max_cycle: int | None) -> dict:
    """PySCF's DF-SCF (``scf.run_rhf`` or ``run_uhf``, mode pyscf-df) timed: seconds, e_hf (Hartree),
    iterations, converged (False: it stopped at ``max_cycle``, timed all the same)."""
    from dfmp2.errors import SCFNotConvergedError

    kw = {"max_cycle": max_cycle} if max_cycle else {}
    t0 = time.perf_counter()
    try:
        ref = run_scf(mol, "pyscf-df", **kw)
    except SCFNotConvergedError as e:
        return {
            "seconds": time.perf_counter() - t0,
            "e_hf": None,
            "iterations": max_cycle,
            "converged": False,
            "note": str(e),
        }
    return {"seconds": time.perf_counter() - t0, "e_hf": ref.e_hf, "iterations": ref.scf.iterations, "converged": True}


def save_scf(mf, path) -> str:
    """Save a converged PySCF RHF's or UHF's orbitals for the 'stage' task (same SCF on both sides)."""
    import numpy as np

    np.savez(path, mo_coeff=mf.mo_coeff, mo_energy=mf.mo_energy, mo_occ=mf.mo_occ, e_tot=mf.e_tot)
    return str(path)


def markdown_lines(base: dict, ours_blas: dict, peaks: dict) -> list[str]:
    """The report's lines on the baseline rule, each side's BLAS and the peaks."""
    lines = [
        "## Baseline fairness",
        "",
        f"- rule: {base['rule']}"
        + (
            (
                " (neither variable is set here: as_set and unset are one setting, run once)"
                if any("same_as" in r for r in base["runs"].values())
                else " (neither variable is set here: as_set and unset are one setting, the second a repeat)"
            )
            if base["same_setting"]
            else ""
        ),
        f"- fastest PySCF setting: **{base['best']}**",
    ]
    for s, r in base["runs"].items():
        if "error" in r:
            lines.append(f"- PySCF, {s}: failed: {r['error']}")
            continue
        if "not_run" in r:
            lines.append(f"- PySCF, {s}: not run: {r['not_run']}")
            continue
        secs = ", ".join(f"{t} {v['seconds']:.2f} s" for t, v in r["tasks"].items())
        lines.append(f"- PySCF, {s}: {secs}; BLAS: {blas_summary(r['blas'])}")
    lines.append(f"- ours: BLAS: {blas_summary(ours_blas)}")
    for prec, name in (("fp64", "DGEMM"), ("fp32", "SGEMM")):
        if prec in peaks:
            p = peaks[prec]
            lines.append(
                f"- {name} peak of this machine (any library): {p['gflops']:.1f} GFLOP/s ({p['library']}, n = {p['n']})"
            )
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(MARK + json.dumps(child(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(
            "usage: python -m dfmp2.benchmarks.fair_baseline --child JSON (a benchmark runs this; see the docstring)"
        )
