"""Energy regression against independent references: ``dfmp2 regress``.

The references (``inputs/references.json``, written by ``scripts/make_references.py``) are PySCF's
own DF-MP2 energies, never this program's output. Each case reruns the molecule through the
program's pipeline with the reference's settings (basis, auxiliary basis, SCF mode, frozen core) and
compares E_HF and E_corr (Hartree) within a tolerance that depends on the working precision.

    dfmp2 regress --device cpu --precision fp32            # the fast subset
    dfmp2 regress --subset full --json regress.json        # fast + slow cases
    dfmp2 regress 'h2o_*' s22_02_water_dimer               # by molecule name or pattern
    torchrun --standalone --nproc-per-node 4 -m dfmp2 regress --subset full   # cases over 4 ranks

Over several ranks (torchrun, Slurm) the cases are dealt to the ranks (``run_cases``: case k on
rank k mod N, each a one-process run there, dfmp2.workflows.tasks) and every rank gets every
result: the same energies, bit for bit, as one process at the same threads per process.
The command itself (options, progress, printing) is dfmp2.cli.regress; this module is its library.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from fnmatch import fnmatch
from pathlib import Path

from dfmp2.errors import InputError
from dfmp2.io import INPUTS
from dfmp2.options import RunOptions

REFERENCES = INPUTS / "references.json"
TOLERANCES = {"fp64": 1e-9, "fp32": 1e-6}  # Hartree, on E_corr and E_HF
SUBSETS = {"fast": ("fast",), "full": ("fast", "full"), "all": ("fast", "full", "large")}
ENERGY_FIELDS = ("e_hf", "e_os", "e_ss", "e_corr", "e_mp2")


# ---------------------------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------------------------
def load_references(path=None) -> dict:
    """{key: entry} from a reference file; a missing or unreadable file is an InputError."""
    p = Path(path) if path is not None else REFERENCES
    if not p.exists():
        raise InputError(f"{p}: no reference file; generate it with scripts/make_references.py")
    try:
        data = json.loads(p.read_text())
        refs = data["references"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{p}: not a reference file ({e.__class__.__name__}: {e})") from None
    _check_references(p, refs)
    base = p.resolve().parent.parent  # entry paths ('inputs/...') are relative to the folder holding inputs/
    for entry in refs.values():
        entry["_xyz"] = str(base / entry["path"])
    return refs


# what every entry must hold (as scripts/make_references.py writes it) for select_cases and run_case
_ENTRY_FIELDS = {
    "key": str,
    "molecule": str,
    "path": str,
    "basis": str,
    "auxbasis": str,
    "scf_mode": str,
    "subset": str,
    "frozen_core": bool,
    **{f: int for f in ("nbasis", "naux", "nocc", "nvir")},
    **{f: float for f in ENERGY_FIELDS},
}


def _check_references(p: Path, refs) -> None:
    """Valid JSON of the wrong shape is an InputError naming the first entry and field that is
    wrong, not a KeyError half-way through the run."""

    def bad(what):
        return InputError(f"{p}: not a dfmp2 reference file: {what}; see scripts/make_references.py")

    if not isinstance(refs, dict) or not refs:
        raise bad("'references' must be a non-empty object of entries")
    for name, e in refs.items():
        if not isinstance(e, dict):
            raise bad(f"entry {json.dumps(name)[:60]} is not an object")
        for f, kind in _ENTRY_FIELDS.items():
            v = e.get(f)
            ok = (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                if kind is float
                else isinstance(v, kind) and (kind is not int or not isinstance(v, bool))
            )
            if not ok:
                raise bad(
                    f"entry {json.dumps(name)[:60]} field '{f}' must be {kind.__name__}, found {json.dumps(v)[:40]}"
                )
        if not (e.get("auxbasis_requested") is None or isinstance(e.get("auxbasis_requested"), str)):
            raise bad(f"entry {json.dumps(name)[:60]} field 'auxbasis_requested' must be a string or null")


def find_reference(
    refs: dict,
    molecule: str,
    basis: str = "cc-pvdz",
    auxbasis: str | None = None,
    scf_mode: str = "df",
    frozen_core: bool = False,
) -> dict:
    """The entry for (molecule, basis, auxbasis, scf_mode, frozen_core).

    ``auxbasis=None`` means the default MP2-fit basis for ``basis`` (as the program picks it).
    """
    for e in refs.values():
        if (
            e["molecule"] == molecule
            and e["basis"] == basis.lower()
            and e["scf_mode"] == scf_mode
            and e["frozen_core"] == frozen_core
            and (e["auxbasis_requested"] is None if auxbasis is None else e["auxbasis"] == auxbasis.lower())
        ):
            return e
    raise KeyError(
        f"no reference for {molecule} {basis}/{auxbasis or 'default aux'} scf={scf_mode} frozen_core={frozen_core}"
    )


def select_cases(refs: dict, subset: str = "fast", names=()) -> list[dict]:
    """Entries of ``subset`` ('fast'; 'full' = fast + slow channel; 'all' adds the reference-only
    large cases), filtered by molecule names or shell patterns (matched on name or key), in
    file order (small first)."""
    if subset not in SUBSETS:
        raise InputError(f"unknown subset '{subset}'; use one of {', '.join(SUBSETS)}")
    out = [e for e in refs.values() if e.get("subset") in SUBSETS[subset]]
    if names:
        out = [
            e
            for e in out
            if any(e["molecule"] == n or fnmatch(e["molecule"], n) or fnmatch(e["key"], n) for n in names)
        ]
    return out


# ---------------------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    key: str
    molecule: str
    scf_mode: str
    frozen_core: bool
    nbasis: int
    naux: int
    precision: str
    tolerance: float
    reference: dict  # Hartree
    ours: dict = field(default_factory=dict)
    diff: dict = field(default_factory=dict)
    passed: bool = False
    error: str | None = None
    seconds: float = 0.0
    ran: dict = field(default_factory=dict)

    @property
    def max_abs_diff(self) -> float:
        """Largest |ours - reference| over E_HF and E_corr (inf when the case did not run)."""
        if self.error or not self.diff:
            return float("inf")
        return max(abs(self.diff["e_hf"]), abs(self.diff["e_corr"]))


def run_case(
    entry: dict, options: RunOptions | None = None, tolerance: float | None = None, progress=None, world=None
) -> CaseResult:
    """Run the pipeline on one reference case and compare E_HF and E_corr within ``tolerance``
    (default ``TOLERANCES[precision]``). ``options``: the device, precision and resources (default
    RunOptions(): cpu, fp64); the molecule, basis sets, SCF mode and frozen core are the
    reference's. Errors of the case (SCF not converged, ...) are recorded in the result, not
    raised; a device that cannot run raises before any work. ``world``: the process group of the
    run (default ``distributed.current()``; a case dealt to a rank: a one-process World)."""
    from dfmp2.drivers.energy import prepare, run_energy
    from dfmp2.io.xyz import read_xyz

    options = replace(
        options or RunOptions(),
        basis=entry["basis"],
        auxbasis=entry["auxbasis_requested"],
        frozen_core=entry["frozen_core"],
        scf_mode=entry["scf_mode"],
    )
    precision = options.resolved_precision()
    tol = TOLERANCES[precision] if tolerance is None else tolerance
    cr = CaseResult(
        key=entry["key"],
        molecule=entry["molecule"],
        scf_mode=entry["scf_mode"],
        frozen_core=entry["frozen_core"],
        nbasis=entry["nbasis"],
        naux=entry["naux"],
        precision=precision,
        tolerance=tol,
        reference={f: entry[f] for f in ENERGY_FIELDS},
    )
    t0 = time.perf_counter()
    try:
        res = run_energy(prepare(read_xyz(entry["_xyz"]), options, world=world), progress=progress).result
    except InputError as e:  # the case failed; the run goes on with the next one
        cr.error = str(e)
        cr.seconds = time.perf_counter() - t0
        return cr
    cr.seconds = time.perf_counter() - t0
    cr.ran = dict(res.ran)
    cr.ours = {"e_hf": res.e_hf, "e_os": res.e_os, "e_ss": res.e_ss, "e_corr": res.e_corr, "e_mp2": res.e_mp2}
    cr.diff = {f: cr.ours[f] - cr.reference[f] for f in ENERGY_FIELDS}
    setup = {
        "nbasis": (res.nbasis, entry["nbasis"]),
        "naux": (res.naux, entry["naux"]),
        "nocc": (res.nocc, entry["nocc"]),
        "nvir": (res.nvir, entry["nvir"]),
        "auxbasis": (str(res.auxbasis).lower(), entry["auxbasis"]),
        "reference": ("UHF" if res.spin else "RHF", entry.get("reference", "RHF")),
    }
    if res.spin and "nocc_beta" in entry:  # an open shell: the beta shapes too
        setup.update({f: (res.spin[f], entry[f]) for f in ("nocc_beta", "nvir_beta")})
    mismatched = [f"{k} {a} vs reference {b}" for k, (a, b) in setup.items() if a != b]
    if mismatched:
        cr.error = "set-up differs from the reference: " + "; ".join(mismatched)
    cr.passed = not mismatched and abs(cr.diff["e_corr"]) <= tol and abs(cr.diff["e_hf"]) <= tol
    return cr


def cases_content(cases: list[dict], options: RunOptions, tolerance: float) -> dict:
    """What the ranks agree on before their cases (``World.agree``): the cases in order (each
    reference entry but its local path), each case's molecule file (a hash of its bytes: a node's
    copy that differs is caught, though only one rank reads it), every RunOptions field (the device
    without its GPU index: NCCL gives each rank its own) and the tolerance. Keys 'option <field>'
    are RunOptions fields (the CLI names their flags)."""
    import dataclasses
    import hashlib

    def file_hash(path: str) -> str:
        try:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError as e:  # the case records it when it runs; every rank must meet the same
            return f"unreadable ({e.strerror})"

    content = {
        "the cases": [{k: v for k, v in e.items() if k != "_xyz"} for e in cases],
        "the molecule files (bytes)": [file_hash(e["_xyz"]) for e in cases],
        "the tolerance": tolerance,
    }
    for f in dataclasses.fields(RunOptions):
        value = getattr(options, f.name)
        content[f"option {f.name}"] = value.split(":")[0] if f.name == "device" else value
    return content


def run_cases(
    cases: list[dict], options: RunOptions, tolerance: float, world=None, on_case=None, group_size: int = 1
) -> list[CaseResult]:
    """``run_case`` of every case, in order, on every rank of ``world`` (default
    ``distributed.current()``). One process: the cases in turn. Several ranks: case k on rank
    k mod N as a one-process run (``dfmp2.workflows.tasks.deal``), or with ``group_size`` G > 1
    on group k mod (N / G) as a G-rank run, each rank on its own device (``rank_options``), every
    rank gets every result; the ranks must have agreed on ``cases_content`` before.
    ``on_case(k, entry)``: as case k starts on this rank."""
    from dfmp2 import distributed
    from dfmp2.workflows import tasks

    world = world if world is not None else distributed.current()
    mine = rank_options(options, world)

    def one_case(k, single):
        if on_case is not None:
            on_case(k, cases[k])
        return run_case(cases[k], mine, tolerance=tolerance, world=single)

    return tasks.deal(len(cases), one_case, world, stage="regress", group_size=group_size)


def rank_options(options: RunOptions, world) -> RunOptions:
    """``options`` for this rank's cases: one process, themselves; over several ranks the device
    this rank runs them on (cpu itself, cuda this rank's own GPU, cuda:LOCAL_RANK; a GPU index
    given by hand or Trainium refused, InputError naming --device), whatever device the group
    itself talks over (a task-parallel command gathers its results over gloo)."""
    from dfmp2 import distributed

    if not world.distributed:
        return options
    return replace(options, device=distributed.rank_device(options.device, world.local_rank)[0])


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def summary(results: list[CaseResult]) -> dict:
    ran = [r for r in results if not r.error and r.diff]
    worst = max(ran, key=lambda r: abs(r.diff["e_corr"]), default=None)
    worst_hf = max(ran, key=lambda r: abs(r.diff["e_hf"]), default=None)
    return {
        "cases": len(results),
        "passed": sum(r.passed for r in results),
        "failed": sum(not r.passed for r in results),
        "max_abs_diff_e_corr": abs(worst.diff["e_corr"]) if worst else None,
        "max_abs_diff_e_corr_case": worst.key if worst else None,
        "max_abs_diff_e_hf": abs(worst_hf.diff["e_hf"]) if worst_hf else None,
        "max_abs_diff_e_hf_case": worst_hf.key if worst_hf else None,
        "seconds": sum(r.seconds for r in results),
    }


def render(
    results: list[CaseResult], console, device: str, precision: str, tolerance: float, world_size: int = 1
) -> None:
    """The rich table: molecule, settings, reference, ours, difference, pass/fail. ``world_size``
    > 1: the cases ran dealt over that many ranks, which the title and the times say."""
    from rich.markup import escape  # names and messages from the reference file are not markup
    from rich.table import Table

    over = f", cases dealt over {world_size} ranks" if world_size > 1 else ""
    t = Table(
        title=f"DF-MP2 regression vs PySCF references — device {escape(device)}, {precision}, "
        f"tolerance {tolerance:.0e} Eh{over}",
        title_justify="left",
    )
    t.add_column("molecule")
    t.add_column("SCF")
    t.add_column("core")
    t.add_column("nbf", justify="right")
    t.add_column("E_corr reference", justify="right")
    t.add_column("E_corr ours", justify="right")
    t.add_column("ΔE_corr", justify="right")
    t.add_column("ΔE_HF", justify="right")
    t.add_column("s", justify="right")
    t.add_column("result")
    for r in results:
        core = "frozen" if r.frozen_core else "all-e"
        if r.diff:
            ours, dc, dh = f"{r.ours['e_corr']:.10f}", f"{r.diff['e_corr']:+.2e}", f"{r.diff['e_hf']:+.2e}"
        else:
            ours = dc = dh = "—"
        status = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
        if r.error:
            status += f" [red]{escape(r.error)}[/red]"
        t.add_row(
            escape(r.molecule),
            r.scf_mode,
            core,
            str(r.nbasis),
            f"{r.reference['e_corr']:.10f}",
            ours,
            dc,
            dh,
            f"{r.seconds:.1f}",
            status,
        )
    console.print(t)
    s = summary(results)
    engines = sorted(
        {
            f"{r.ran.get('device', '?')}/{r.ran.get('engine', '?')}/{r.ran.get('precision', '?')}"
            for r in results
            if r.ran
        }
    )
    took = f"in {s['seconds']:.1f} s"
    if world_size > 1:  # each case timed on its rank while the others ran: not one process's times
        took = (
            f"({s['seconds']:.1f} s of runs over {world_size} ranks: each case's s timed on its rank while "
            "the other ranks ran)"
        )
    line = f"{s['passed']}/{s['cases']} passed {took}; ran on {escape(', '.join(engines)) or 'nothing'}"
    if s["max_abs_diff_e_corr"] is not None:
        line += (
            f"; largest |ΔE_corr| {s['max_abs_diff_e_corr']:.2e} Eh ({escape(s['max_abs_diff_e_corr_case'])}), "
            f"largest |ΔE_HF| {s['max_abs_diff_e_hf']:.2e} Eh"
        )
    console.print(("[green]" if s["failed"] == 0 else "[red]") + line)


def write_json(path, results: list[CaseResult], meta: dict) -> None:
    """Write the run (meta, summary, one record per case) atomically."""
    from dfmp2.io.result import json_ran, software_versions

    doc = {
        "meta": {
            **meta,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": software_versions(),
            "units": {"energies": "hartree", "seconds": "s"},
        },
        "summary": summary(results),
        "cases": [{**asdict(r), "ran": json_ran(r.ran)} for r in results],
    }
    from dfmp2.io.outputs import write_json

    write_json(path, doc, indent=1, default=str)


def choose_cases(refs: dict, subset: str | None, names=()) -> list[dict]:
    """The cases ``dfmp2 regress`` runs: ``subset`` (default 'fast') filtered by ``names``; with
    names and no subset, 'full', plus the large reference-only cases named exactly (patterns stay
    within 'full'). InputError when nothing matches."""
    if subset or not names:
        cases = select_cases(refs, subset or "fast", names)
    else:  # patterns stay within 'full'; an exact name also finds a large reference-only case
        cases = select_cases(refs, "full", names) + [
            e
            for e in select_cases(refs, "all", names)
            if e["subset"] == "large" and (e["molecule"] in names or e["key"] in names)
        ]
    if not cases:
        raise InputError(f"no reference case matches {' '.join(names) or 'the subset'}; see --list")
    return cases
