"""Cross-device check: ``dfmp2 compare``. The same problem on each device from identical inputs.

    dfmp2 compare inputs/water.xyz --devices cpu,cuda
    dfmp2 compare --synthetic 16,120,400 --seed 3 --devices cpu,cuda --precision fp32
    dfmp2 compare inputs/water.xyz --devices cpu,trn1 --simulate --precision fp32

For each device: the energies (Hartree), their difference from the first device that ran, whether
the bits are identical to it (float.hex of E_OS, E_SS and E_corr), and whether ``--repeat`` runs on
the same device gave bit-identical energies. Molecules go through the whole pipeline
(``dfmp2.drivers.energy``) from the same parsed geometry; E_HF is compared too, since it is computed on
the host by PySCF and so shows that every device started from the same reference. Synthetic
problems (``linalg.synthetic_problem``, Philox) are generated once on the CPU and copied to each
device exactly, then the pair step runs there (``linalg.mp2_pair_energy``, symmetric over all pairs).

A device that cannot run (no GPU, no Neuron SDK, no fp64 on Trainium) is reported as not run
with the reason; no row is ever filled from another device.

Over several ranks (torchrun) a molecule's runs, device by device and repeat by repeat, are dealt
to the ranks (``compare_molecule``: dfmp2.workflows.tasks), each a one-process run there, cuda on
each rank's own GPU; the energies are one process's bit for bit, the times are not (taken while
the other ranks ran: the table and the JSON say so), and a device that some rank cannot run is
refused before any work (``refuse_unavailable``). ``--synthetic`` stays one process.
Exit status: 0 all ran, agreed within --tol and were run-to-run identical; 1 a difference beyond
--tol or a device whose repeated runs differ in their bits; 2 bad input or a device that could not run.
The command itself (options and printing) is dfmp2.cli.compare; this module is its library.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from dfmp2 import linalg
from dfmp2.errors import InputError, error_line

TOLERANCES = {"fp64": 1e-10, "fp32": 1e-6}  # Hartree, |E_corr(device) - E_corr(first)|
ENERGY_KEYS = ("e_os", "e_ss", "e_corr")
EXIT_DIFFERENT = 1  # a difference beyond --tol, or a device not bit-reproducible


@dataclass
class DeviceRun:
    """One device's outcome. ``energies``: the first run's values (Hartree); ``hex``: float.hex of
    each energy for every repeat; ``reason``: why it did not run (status 'not run'); ``ran_on``:
    the rank and device of each repeat (over several ranks a device's repeats run on several
    ranks: cuda on each rank's own GPU)."""

    device: str
    status: str = "ran"  # 'ran' | 'not run'
    reason: str = ""
    energies: dict = field(default_factory=dict)
    hex: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    ran: dict = field(default_factory=dict)
    ran_on: list = field(default_factory=list)  # per repeat: {'rank', 'device'} that ran it (molecules)
    # filled by compare_runs
    delta: dict = field(default_factory=dict)
    identical_to_first: bool | None = None
    repeat_identical: bool | None = None


def parse_devices(text: str) -> list[str]:
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise InputError("--devices: give a comma-separated list, e.g. cpu,cuda")
    if len(set(devices)) != len(devices):
        raise InputError(f"--devices: a device is listed twice in '{text}'")
    return devices


def parse_synthetic(text: str) -> tuple[int, int, int]:
    try:
        nocc, nvir, naux = (int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise InputError(f"--synthetic: expected NOCC,NVIR,NAUX (e.g. 16,120,400), got '{text}'") from None
    if min(nocc, nvir, naux) < 1:
        raise InputError(f"--synthetic: sizes must be positive, got '{text}'")
    return nocc, nvir, naux


def _hex(energies: dict) -> dict:
    return {k: float.hex(float(energies[k])) for k in energies}


def _pair_kernel(device: str, pair_kernel: str) -> str:
    """--pair-kernel applies to the devices of the list that have that path; the others keep auto."""
    return pair_kernel if pair_kernel in _caps(device).pair_kernels else "auto"


def _caps(device: str):
    """linalg's capabilities of a device name; an unknown name is the user's mistake."""
    try:
        return linalg.device_capabilities(device)
    except ValueError as e:
        raise InputError(str(e), option="devices") from None


def _cpu_blas(device: str, cpu_blas: str) -> str:
    """--cpu-blas applies to the cpu device of the list; the others keep auto (their own kernels)."""
    return cpu_blas if _caps(device).is_host else "auto"


def check_device(device: str, precision: str, simulate: bool, pair_kernel: str = "auto", cpu_blas: str = "auto"):
    """The backend for ``device``, or the one-line reason it cannot run here (never raises for
    that). A precision the device can never run is the user's mistake: InputError, before any
    device runs (``compare --devices cpu,trn1`` at the default fp64 used to fail after the CPU's run)."""
    from dfmp2.linalg import DeviceUnavailableError

    try:
        caps = linalg.device_capabilities(device)
        if caps.precision_problem(precision):
            raise InputError(
                f"{device}: {caps.precision_problem(precision)}; compare every device in "
                "fp32 (energies are still summed in fp64)",
                option="precision",
            )
        return linalg.get_backend(
            device,
            simulate=simulate and caps.simulable,
            pair_kernel=_pair_kernel(device, pair_kernel),
            cpu_blas=_cpu_blas(device, cpu_blas),
        ), ""
    except DeviceUnavailableError as e:
        return None, error_line(e)
    except ValueError as e:  # unknown device name: a user mistake, not a device state
        raise InputError(str(e), option="devices") from None


def _integrals(device: str, engine: str) -> str:
    """--integrals gpu4pyscf applies to the cuda devices of the list; the others keep auto (host)."""
    return engine if engine != "gpu4pyscf" or _caps(device).cuda_memory else "auto"


def _run_options(device: str, options):
    """``options`` for a run on ``device`` (options.device replaced; the options that apply to
    some devices only kept where they apply)."""
    from dataclasses import replace

    return replace(
        options,
        device=device,
        simulate=options.simulate and _caps(device).simulable,
        pair_kernel=_pair_kernel(device, options.pair_kernel),
        integrals=_integrals(device, options.integrals),
        cpu_blas=_cpu_blas(device, options.cpu_blas),
    )


def run_once(device: str, geom, options, world=None) -> dict:
    """One full pipeline run of ``geom`` on ``device``: {'device', 'energies', 'seconds', 'ran'}.
    ``world``: the run's process group (a run dealt to a rank: a one-process World)."""
    from dfmp2.drivers.energy import prepare, run_energy

    t0 = time.perf_counter()
    r = run_energy(prepare(geom, _run_options(device, options), world=world)).result
    seconds = time.perf_counter() - t0
    e = {"e_hf": r.e_hf, "e_os": r.e_os, "e_ss": r.e_ss, "e_corr": r.e_corr}
    return {"device": device, "energies": e, "seconds": seconds, "ran": dict(r.ran)}


def _device_run(device: str, runs: list[dict]) -> DeviceRun:
    """The DeviceRun of ``device`` from its runs (``run_once``'s, with the rank that ran each), in
    repeat order: the first run's energies and record, every run's bits, seconds and rank."""
    out = DeviceRun(device)
    for got in runs:
        out.seconds.append(got["seconds"])
        out.energies = out.energies or got["energies"]
        out.hex.append(_hex(got["energies"]))
        out.ran = out.ran or got["ran"]
        out.ran_on.append({"rank": got["rank"], "device": got["device"]})
    return out


def rank_devices(names: list[str], world) -> dict:
    """{device asked: the device this rank runs it on}: itself in one process; over several ranks
    cpu itself and cuda this rank's own GPU (cuda:LOCAL_RANK, as ``dfmp2 run`` takes it); a GPU
    index given by hand or a device no rank-aware run supports (Trainium) is refused
    (InputError)."""
    from dfmp2 import distributed

    if not world.distributed:
        return {d: d for d in names}
    on_rank = {}
    for d in names:
        _caps(d)  # an unknown name: the user's mistake, named as --devices
        try:
            on_rank[d] = distributed.rank_device(d, world.local_rank)[0]
        except InputError as e:
            raise InputError(str(e), option="devices") from None
    return on_rank


def refuse_unavailable(backends: dict, on_rank: dict, world) -> None:
    """Over several ranks, a device some rank cannot run (``check_device``'s reason) is refused
    before any work: any rank may be dealt any device's runs, so a run could not be reported as
    'not run' by one rank alone. One process: nothing (the device is reported as not run)."""
    if not world.distributed:
        return
    for d, (backend, reason) in backends.items():
        if backend is None:
            here = f" ({on_rank[d]})" if on_rank[d] != d else ""
            raise InputError(
                f"device {d} cannot run on rank {world.rank} of {world.size}{here}: {reason}; over several "
                "ranks every rank runs some of each device's runs: name only devices every rank has "
                "(one GPU per rank), or run one process",
                option="devices",
            )


def run_synthetic(device: str, backend, problem, repeat: int) -> DeviceRun:
    """``repeat`` pair steps of a synthetic problem (host tensors, copied exactly) on ``backend``."""
    from dfmp2 import linalg

    out = DeviceRun(device)
    B = backend.to_device(problem.B)
    eo = backend.to_device(problem.eps_occ)
    ev = backend.to_device(problem.eps_vir)
    for _ in range(repeat):
        backend.synchronize()
        t0 = time.perf_counter()
        e_os, e_ss = linalg.mp2_pair_energy(B, B, eo, eo, ev, symmetric=True, backend=backend)
        backend.synchronize()
        out.seconds.append(time.perf_counter() - t0)
        e = {"e_os": e_os, "e_ss": e_ss, "e_corr": e_os + e_ss}
        out.energies = out.energies or e
        out.hex.append(_hex(e))
    out.ran = backend.describe()
    return out


def compare_runs(runs: list[DeviceRun], tol: float) -> dict:
    """Fill delta / identical_to_first / repeat_identical; return the summary."""
    ran = [r for r in runs if r.status == "ran"]
    first = ran[0] if ran else None
    for r in ran:
        r.repeat_identical = all(h == r.hex[0] for h in r.hex)
        r.delta = {k: r.energies[k] - first.energies[k] for k in r.energies}
        r.identical_to_first = r.hex[0] == first.hex[0]
    beyond = [r.device for r in ran if abs(r.delta["e_corr"]) > tol]
    unstable = [r.device for r in ran if not r.repeat_identical]
    not_run = [r.device for r in runs if r.status != "ran"]
    return {
        "reference_device": first.device if first else None,
        "tolerance": tol,
        "beyond_tolerance": beyond,
        "not_bit_reproducible": unstable,
        "not_run": not_run,
        "passed": bool(ran) and not beyond and not unstable and not not_run,
    }


def render(runs: list[DeviceRun], summary: dict, title: str, console, world_size: int = 1) -> None:
    """The table and verdict; ``title`` and device names and reasons are plain text, not markup.
    ``world_size`` > 1: the runs were dealt over that many ranks, which the title, the run-to-run
    column (the ranks of a device's repeats) and a line under the times say."""
    from rich.markup import escape
    from rich.table import Table

    over = f", runs dealt over {world_size} ranks" if world_size > 1 else ""
    t = Table(title=escape(title + over), title_justify="left")
    for col, just in (
        ("device", "left"),
        ("engine", "left"),
        ("E_corr / Eh", "right"),
        ("ΔE_corr / Eh", "right"),
        ("ΔE_HF / Eh", "right"),
        ("bits = first", "center"),
        ("run-to-run", "center"),
        ("time / s" if world_size == 1 else "time / s (on its rank)", "right"),
    ):
        t.add_column(col, justify=just)
    for r in runs:
        if r.status != "ran":
            t.add_row(escape(r.device), "[red]not run[/red]", "—", "—", "—", "—", "—", "—")
            continue
        dhf = f"{r.delta['e_hf']:+.2e}" if "e_hf" in r.delta else "—"
        t.add_row(
            escape(r.device),
            escape(r.ran.get("engine", "")),
            f"{r.energies['e_corr']:.12f}",
            "(reference)" if r.device == summary["reference_device"] else f"{r.delta['e_corr']:+.2e}",
            dhf if r.device != summary["reference_device"] else "",
            "—" if r.device == summary["reference_device"] else ("yes" if r.identical_to_first else "no"),
            (f"identical ×{len(r.hex)}" if r.repeat_identical else f"[red]DIFFER ×{len(r.hex)}[/red]")
            + _ranks_of(r, world_size),
            f"{min(r.seconds):.3f}",
        )
    console.print(t)
    if world_size > 1:  # the times are not one process's: say so where they are read
        console.print(
            f"[dim]times: each run timed on the rank it was dealt to while the other ranks ran ({world_size} "
            "ranks, sharing the machine where they share a node): not comparable with a one-process "
            "compare's times; run one process to compare devices' speed[/dim]"
        )
    for r in runs:
        if r.status != "ran":
            console.print(f"[red]{escape(r.device)}: not run: {escape(r.reason)}[/red]")
    for r in runs:
        if r.status == "ran" and r.ran.get("kernels"):
            ks = ", ".join(f"{k} ×{n}" for k, n in r.ran["kernels"].items() if "mp2_pair_energy" in k)
            console.print(f"[dim]{escape(r.device)}: {escape(ks)}[/dim]")
    verdict = "[green]PASS[/green]" if summary["passed"] else "[red]FAIL[/red]"
    against = f"against {summary['reference_device']}" if summary["reference_device"] else "(no device ran)"
    console.print(
        f"{verdict}  "
        + escape(
            f"|ΔE_corr| ≤ {summary['tolerance']:.0e} Eh {against}; "
            f"beyond: {summary['beyond_tolerance'] or 'none'}; "
            f"not bit-reproducible: {summary['not_bit_reproducible'] or 'none'}; "
            f"not run: {summary['not_run'] or 'none'}"
        )
    )


def _ranks_of(r: DeviceRun, world_size: int) -> str:
    """Over several ranks, the ranks of a device's repeats (' on ranks 0, 1'); else ''."""
    if world_size == 1 or not r.ran_on:
        return ""
    ranks = sorted({x["rank"] for x in r.ran_on})
    return f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def document(
    problem_doc: dict,
    precision: str,
    repeat: int,
    devices,
    absent: dict,
    summary: dict,
    runs: list[DeviceRun],
    world_size: int = 1,
) -> dict:
    """The JSON document of a comparison: the problem, the settings, the devices asked for
    (``devices``: their text, None: the present ones) and those not present (``absent``), the
    summary and every device's runs (each repeat's rank and device in ``ran_on``).
    ``world_size``: the ranks the runs were dealt over (1: one process); over several, each run's
    seconds were timed on its rank while the others ran, not comparable with one process's."""
    from dfmp2.io.result import json_ran, software_versions

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "problem": problem_doc,
        "precision": precision,
        "repeat": repeat,
        "world_size": world_size,
        "seconds_timed": "in one process"
        if world_size == 1
        else f"each run on its rank of {world_size} while the others ran: not comparable with one process's",
        "devices_requested": devices or "present (default)",
        "devices_not_present": absent,
        "summary": summary,
        "devices": [{**asdict(r), "ran": json_ran(r.ran)} for r in runs],
        "versions": software_versions(),
        "units": {"energies": "hartree"},
    }


def write_json(path, doc: dict) -> None:
    """Atomically: a half-written file never appears under ``path`` (dfmp2.io.outputs.write_text)."""
    from dfmp2.io.outputs import write_json

    write_json(path, doc, indent=1, default=str)


def check_cuda_only(options, names) -> None:
    """A pair kernel or the gpu4pyscf engine asked for devices that include no cuda device is the
    user's mistake (InputError naming the option)."""
    if options.pair_kernel != "auto" and not any(options.pair_kernel in _caps(d).pair_kernels for d in names):
        raise InputError(
            f"pair kernel '{options.pair_kernel}' is a path of none of the devices "
            f"({', '.join(names)}); leave it at auto",
            option="pair_kernel",
        )
    if options.cpu_blas != "auto" and not any(_caps(d).is_host for d in names):
        raise InputError(
            f"cpu BLAS '{options.cpu_blas}' applies only to the cpu device, and the devices "
            f"({', '.join(names)}) do not include it; leave it at auto",
            option="cpu_blas",
        )
    if options.integrals == "gpu4pyscf" and not any(_caps(d).cuda_memory for d in names):
        raise InputError(
            f"integral engine gpu4pyscf applies only to cuda devices, and the devices "
            f"({', '.join(names)}) include none; leave it at auto",
            option="integrals",
        )


def compare_synthetic(text, seed, precision, repeat, backends):
    """(title, problem for the JSON, runs) of a synthetic problem made once on the CPU and run on
    each of ``backends`` ({device: backend})."""
    import torch

    from dfmp2.linalg import synthetic_problem
    from dfmp2.memory import check_synthetic_memory

    nocc, nvir, naux = parse_synthetic(text)
    dtype = torch.float64 if precision == "fp64" else torch.float32
    check_synthetic_memory(f"--synthetic {text}", nocc, nvir, naux, dtype.itemsize, list(backends))
    problem = synthetic_problem(nocc, nvir, naux, seed, dtype=dtype, device="cpu")
    title = f"synthetic nocc={nocc} nvir={nvir} naux={naux} seed={seed}, {precision}, pair step only"
    problem_doc = {"synthetic": {"nocc": nocc, "nvir": nvir, "naux": naux, "seed": seed}}
    return title, problem_doc, [run_synthetic(d, be, problem, repeat) for d, be in backends.items()]


def compare_molecule(xyz_file, options, repeat, devices, world=None, geom=None):
    """(title, problem for the JSON, runs) of the molecule in ``xyz_file`` (``geom``: it parsed
    already), run through the whole pipeline with ``options`` ``repeat`` times on each of
    ``devices`` (a list, or {device: the device this rank runs it on}, ``rank_devices``).
    ``world`` (default ``distributed.current()``): one process runs them in turn; over several
    ranks the runs (device, repeat) are dealt to the ranks, each a one-process run there
    (``dfmp2.workflows.tasks.deal``), and every rank gets every run; the ranks must have agreed on
    their input before (``request_content``)."""
    from dfmp2 import distributed
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows import tasks

    world = world if world is not None else distributed.current()
    geom = geom if geom is not None else read_xyz(xyz_file)
    on_rank = devices if isinstance(devices, dict) else {d: d for d in devices}
    o = options
    title = (
        f"{xyz_file} {o.basis}/{o.auxbasis or 'MP2-fit'}, {o.scf_mode} SCF, "
        f"{'frozen core' if o.frozen_core else 'all-electron'}, {o.precision}"
    )
    problem_doc = {
        "molecule": str(xyz_file),
        "basis": o.basis,
        "auxbasis": o.auxbasis,
        "scf_mode": o.scf_mode,
        "frozen_core": o.frozen_core,
        "ecp": o.ecp,
        "reference": o.reference,
        "charge": o.charge,
        "multiplicity": o.multiplicity,
    }
    jobs = [d for d in on_rank for _ in range(repeat)]  # device by device, its repeats in order

    def one_run(k, single):
        return run_once(on_rank[jobs[k]], geom, options, world=single) | {"rank": world.rank}

    got = tasks.deal(len(jobs), one_run, world, stage="compare")  # one process: in turn
    runs = [_device_run(d, [g for j, g in zip(jobs, got) if j == d]) for d in on_rank]
    return title, problem_doc, runs


def request_content(geom, options, names: list[str], repeat: int, tolerance: float) -> dict:
    """What the ranks agree on before their runs (``World.agree``): the molecule and every option
    (``dfmp2.drivers.energy.request_content``), the devices asked for (by name: cuda is each rank's own GPU),
    the repeats and the tolerance."""
    from dfmp2.drivers import energy as energy_driver

    content = energy_driver.request_content(geom, options)
    content.update({"the devices": list(names), "the repeats": repeat, "the tolerance": tolerance})
    return content
