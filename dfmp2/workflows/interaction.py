"""Interaction energies with and without the counterpoise correction: ``dfmp2 interaction``.

    dfmp2 interaction inputs/s22/s22_02_water_dimer.xyz --fragments 1-3,4-6
    dfmp2 interaction dimer.xyz              # fragments from '--' lines in the XYZ (Psi4's way)

For N fragments it runs, on one backend (device) and with the same options:
  1. the full system;
  2. each fragment in the full basis: the other fragments' atoms are ghost atoms (no charge, no
     electrons, their orbital basis and both fitting sets: JK-fit for the DF-SCF, MP2-fit for
     the MP2 stage; Boys-Bernardi counterpoise as Psi4's ``bsse_type='cp'`` does it);
  3. each fragment in its own basis.

    ΔE(CP)   = E(full) - Σ_k E(fragment k in the full basis)
    ΔE(noCP) = E(full) - Σ_k E(fragment k in its own basis)

for E = E(HF), E(MP2) and E(SCS-MP2), in Eh and kcal/mol (``HARTREE_TO_KCAL``).

Fragments: ``--fragments 1-3,4-6`` (1-based atoms; a comma separates fragments, '+' joins ranges
and atoms of one fragment: ``1-3+7,4-6+8``), or ``--`` lines in the XYZ (``dfmp2.io.xyz``). Every
atom belongs to exactly one fragment. Charges and multiplicities per fragment come from
``--fragment-charges`` and ``--fragment-multiplicities`` (default: 0 and 1 each), or from Psi4's
``charge multiplicity`` line opening each '--' fragment in the XYZ; the total charge (``--charge``
or the XYZ comment, else the sum of the fragments') must be their sum.
Everything is checked, and every molecule of the 2N+1 runs is built, before the first SCF.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from dfmp2.df import basis
from dfmp2.errors import InputError, shown
from dfmp2.io import molecule as io_molecule
from dfmp2.io.result import SCHEMA_VERSION, Result, json_ran, software_versions
from dfmp2.io.xyz import Geometry

# kcal/mol per hartree: CODATA 2018 E_h = 4.3597447222071e-18 J, N_A = 6.02214076e23 /mol,
# 1 kcal = 4184 J (thermochemical calorie)
HARTREE_TO_KCAL = 627.5094740631
METHODS = {"HF": "e_hf", "MP2": "e_mp2", "SCS-MP2": "e_scs_mp2"}  # label -> Result.energies() key
KINDS = ("full", "cp", "own")  # full system; fragment in the full basis; in its own basis
_ITEM_RE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?", re.ASCII)
_INT_RE = re.compile(r"[+-]?[0-9]{1,6}", re.ASCII)


@dataclass(frozen=True)
class Fragments:
    """Atoms (0-based indices into the full geometry), charge and multiplicity of each fragment,
    and the full system's charge and multiplicity."""

    atoms: tuple
    charges: tuple
    multiplicities: tuple
    total_charge: int
    total_multiplicity: int
    source: str  # '--fragments' or 'XYZ (-- lines)'

    def __len__(self) -> int:
        return len(self.atoms)

    def label(self, k: int) -> str:
        """'fragment 2 (atoms 4-6)', atoms 1-based, consecutive runs as ranges."""
        atoms = self.atoms[k]
        return f"fragment {k + 1} (atom{'s' if len(atoms) > 1 else ''} {format_atoms(atoms)})"


def format_atoms(atoms) -> str:
    """0-based indices -> '1-3+7' (1-based, the --fragments syntax)."""
    out, run = [], []
    for a in sorted(atoms):
        if run and a == run[-1] + 1:
            run.append(a)
            continue
        if run:
            out.append(_range(run))
        run = [a]
    out.append(_range(run))
    return "+".join(out)


def _range(run) -> str:
    return f"{run[0] + 1}" if len(run) == 1 else f"{run[0] + 1}-{run[-1] + 1}"


def parse_fragments(text: str, natm: int) -> tuple:  # noqa: C901
    """'1-3,4-6' (1-based) -> ((0, 1, 2), (3, 4, 5)). Refuses (InputError) a malformed item, an
    empty range, an atom out of range, an atom in two fragments, an atom in none, one fragment."""

    def bad(msg):
        return InputError(f"fragments '{shown(text)}': {msg}", option="fragments")

    out = []
    owner: dict = {}
    for k, part in enumerate(text.split(",")):
        atoms = []
        if not part.strip():
            raise bad(f"fragment {k + 1} is empty; give atom ranges separated by commas, e.g. 1-3,4-6")
        for item in part.split("+"):
            m = _ITEM_RE.fullmatch(item.strip())
            if m is None:
                raise bad(
                    f"'{shown(item, 20)}' is not an atom number or range (1-based, e.g. 1-3,4-6; "
                    "'+' joins parts of one fragment: 1-3+7,4-6)"
                )
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if hi < lo:
                raise bad(f"range '{shown(item, 20)}' is empty; write it low-high")
            for a in (lo, hi):
                if not 1 <= a <= natm:
                    raise bad(f"atom {a} is out of range; the molecule has {natm} atoms (atoms are numbered from 1)")
            for a in range(lo - 1, hi):
                if a in owner:
                    where = (
                        f"twice in fragment {k + 1}" if owner[a] == k else f"in fragments {owner[a] + 1} and {k + 1}"
                    )
                    raise bad(f"atom {a + 1} is {where}; each atom belongs to exactly one fragment")
                owner[a] = k
                atoms.append(a)
        out.append(tuple(sorted(atoms)))
    missing = [a for a in range(natm) if a not in owner]
    if missing:
        raise bad(
            f"atom{'s' if len(missing) > 1 else ''} {format_atoms(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} in no fragment; every atom must belong to one"
        )
    if len(out) < 2:
        raise bad("only one fragment; an interaction energy needs two or more (e.g. 1-3,4-6)")
    return tuple(out)


def parse_int_list(text: str, option: str, n: int) -> tuple:
    """'0,-1' -> (0, -1): exactly ``n`` integers (one per fragment). ``option``: the parameter
    the text came from ('fragment_charges'), for the InputError."""
    values = [v.strip() for v in text.split(",")]
    what = f"{option.replace('_', ' ')} '{shown(text)}'"
    bad = next((v for v in values if not _INT_RE.fullmatch(v)), None)
    if bad is not None:
        raise InputError(
            f"{what}: '{shown(bad, 20)}' is not an integer; give one integer per fragment, separated by commas",
            option=option,
        )
    if len(values) != n:
        raise InputError(
            f"{what}: {len(values)} value{'s' if len(values) > 1 else ''} for {n} fragments; give one per fragment",
            option=option,
        )
    return tuple(int(v) for v in values)


def resolve_fragments(
    geom: Geometry,
    fragments: str | None = None,
    charges: str | None = None,
    multiplicities: str | None = None,
    charge: int | None = None,
    multiplicity: int | None = None,
) -> Fragments:
    """The fragments of ``geom`` from ``fragments`` text ('1-3,4-6') or the XYZ's '--' lines (not
    both), with their charges and multiplicities (text: '0,0', '1,1'). ``charge`` /
    ``multiplicity``: the full system's (options), else the XYZ comment's, else the sum of the
    fragments' charges and the high-spin coupling of their spins. Raises InputError (one line,
    ``option`` 'fragments', 'fragment_charges', 'fragment_multiplicities', 'charge' or
    'multiplicity') for anything inconsistent."""
    atoms, how = _fragment_atoms(geom, fragments)
    n = len(atoms)
    charges, multiplicities, named = _fragment_states(geom, charges, multiplicities)
    qs, total = _fragment_charges(geom, charges, charge, n, named)
    ms, mult = _fragment_multiplicities(geom, multiplicities, multiplicity, n)
    return Fragments(
        atoms=tuple(atoms), charges=qs, multiplicities=ms, total_charge=total, total_multiplicity=mult, source=how
    )


def _fragment_atoms(geom: Geometry, fragments: str | None) -> tuple:
    """(atoms per fragment, where they came from): the ``fragments`` text or the XYZ's '--'
    lines, exactly one of them."""
    if fragments is not None and geom.fragments:
        raise InputError(
            f"{geom.source}: the fragments are given twice, by '--' lines in the file "
            f"and as '{shown(fragments)}'; give one",
            option="fragments",
        )
    if fragments is not None:
        atoms, how = parse_fragments(fragments, geom.natm), "--fragments"
    elif geom.fragments:
        atoms, how = geom.fragments, "XYZ (-- lines)"  # two or more (dfmp2.io.xyz)
    else:
        raise InputError(
            f"{geom.source}: no fragments; give them as atom ranges (e.g. 1-3,4-6, "
            "1-based) or separate the fragments by '--' lines in the XYZ file",
            option="fragments",
        )
    return atoms, how


def _fragment_states(geom: Geometry, charges: str | None, multiplicities: str | None) -> tuple:
    """(charges text, multiplicities text, how the charges are named in a message): the options'
    or the XYZ's 'charge multiplicity' lines (Psi4's), not both."""
    given = tuple(
        o for o, v in (("fragment_charges", charges), ("fragment_multiplicities", multiplicities)) if v is not None
    )
    if geom.fragment_states and given:
        raise InputError(
            f"{geom.source}: the fragment charges and multiplicities are given twice, "
            "by 'charge multiplicity' lines in the file and as options; give one",
            option=given,
        )
    named = f"the fragment charges {charges}"
    if geom.fragment_states:  # Psi4's 'charge multiplicity' lines opening each fragment
        named = "the fragments' 'charge multiplicity' lines"
        charges = ",".join(str(q) for q, _ in geom.fragment_states)
        multiplicities = ",".join(str(m) for _, m in geom.fragment_states)
    return charges, multiplicities, named


def _fragment_charges(geom: Geometry, charges: str | None, charge: int | None, n: int, named: str) -> tuple:
    """(charge per fragment, total charge): the fragments' charges must add up to the total
    (the option's, else the XYZ comment's, else their sum); a charged system needs them."""
    total = charge if charge is not None else geom.charge
    if charges is not None:
        qs = parse_int_list(charges, "fragment_charges", n)
    elif total:
        raise InputError(
            f"the total charge is {_signed(total)}; say which fragments carry it with "
            f"fragment charges (one integer per fragment, adding up to {_signed(total)})",
            option="fragment_charges",
        )
    else:
        qs = (0,) * n
    if total is None:
        total = sum(qs)
    if sum(qs) != total:
        where = "the given charge" if charge is not None else "the XYZ comment line"
        raise InputError(
            f"{named} add up to {_signed(sum(qs))}, but the total "
            f"charge is {_signed(total)} ({where}); the fragment charges must add up to it",
            option=tuple(
                o
                for o, typed in (("fragment_charges", not geom.fragment_states), ("charge", charge is not None))
                if typed
            ),
        )
    return qs, total


def _fragment_multiplicities(geom: Geometry, multiplicities: str | None, multiplicity: int | None, n: int) -> tuple:
    """(multiplicity per fragment, total multiplicity): the total (the option's, else the XYZ
    comment's, else high-spin coupling) must be one the fragments' spins can couple to."""
    ms = parse_int_list(multiplicities, "fragment_multiplicities", n) if multiplicities else (1,) * n
    bad = next((m for m in ms if m < 1), None)
    if bad is not None:
        raise InputError(
            f"fragment multiplicities: {bad} is not a multiplicity (2S+1, 1 or more)", option="fragment_multiplicities"
        )
    unpaired = sum(m - 1 for m in ms)
    mult = multiplicity if multiplicity is not None else geom.multiplicity
    if mult is None:
        mult = unpaired + 1
    elif mult < 1 or mult - 1 > unpaired or (unpaired - (mult - 1)) % 2:
        raise InputError(
            f"total multiplicity {mult} cannot come from fragments of multiplicities "
            f"{','.join(map(str, ms))} (possible: "
            f"{', '.join(str(u + 1) for u in range(unpaired % 2, unpaired + 1, 2))}); "
            "check the total multiplicity and the fragments' multiplicities",
            option=("multiplicity", "fragment_multiplicities"),
        )
    return ms, mult


def _signed(n: int) -> str:
    return f"{n:+d}" if n else "0"


def run_geometries(geom: Geometry, frags: Fragments) -> list[tuple[str, int | None, Geometry]]:
    """The 2N+1 runs as (kind, fragment index or None, geometry): the full system, then per
    fragment the full basis (the other atoms as ghosts, in the full system's order) and its own
    basis (its atoms only). Each geometry carries its charge and multiplicity."""
    out = [
        (
            "full",
            None,
            replace(geom, charge=frags.total_charge, multiplicity=frags.total_multiplicity, fragments=(), ghost=()),
        )
    ]
    for k, atoms in enumerate(frags.atoms):
        mine = set(atoms)
        what = dict(charge=frags.charges[k], multiplicity=frags.multiplicities[k], fragments=())
        out.append(
            (
                "cp",
                k,
                replace(
                    geom,
                    source=f"{geom.source} {frags.label(k)} in the full basis",
                    ghost=tuple(i not in mine for i in range(geom.natm)),
                    **what,
                ),
            )
        )
        out.append(
            (
                "own",
                k,
                replace(
                    geom,
                    source=f"{geom.source} {frags.label(k)}",
                    symbols=tuple(geom.symbols[i] for i in atoms),
                    coords_angstrom=geom.coords_angstrom[list(atoms)],
                    ghost=(),
                    **what,
                ),
            )
        )
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(out, key=lambda r: (order[r[0]], -1 if r[1] is None else r[1]))


@dataclass
class Run:
    """One of the 2N+1 runs: kind ('full', 'cp': fragment in the full basis, 'own': fragment in
    its own basis), fragment index (0-based; None for the full system) and its Result."""

    kind: str
    fragment: int | None
    result: Result
    seconds: float


@dataclass
class InteractionResult:
    """Interaction energies (``deltas``: Eh) and the runs they come from."""

    molecule: str
    fragments: Fragments
    runs: list
    deltas: dict  # {'cp'|'nocp': {method: Eh}}
    seconds: float
    ran: dict
    versions: dict
    warnings: list = field(default_factory=list)
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def to_dict(self) -> dict:
        f = self.fragments
        frags = []
        for k, atoms in enumerate(f.atoms):
            e = {r.kind: r.result.energies() for r in self.runs if r.fragment == k}
            frags.append(
                {
                    "atoms": [a + 1 for a in atoms],
                    "charge": f.charges[k],
                    "multiplicity": f.multiplicities[k],
                    "energies_full_basis": e["cp"],
                    "energies_own_basis": e["own"],
                }
            )
        full = next(r for r in self.runs if r.kind == "full").result
        return {
            "schema_version": SCHEMA_VERSION,
            "molecule": self.molecule,
            "date": self.date,
            "interaction_energies": {
                key: {m: {"hartree": v, "kcal_per_mol": v * HARTREE_TO_KCAL} for m, v in d.items()}
                for key, d in self.deltas.items()
            },
            "full_system": {
                "charge": f.total_charge,
                "multiplicity": f.total_multiplicity,
                "energies": full.energies(),
            },
            "fragments": frags,
            "fragments_from": f.source,
            "method": {
                "basis": full.basis,
                "cbs": _cbs(full),
                "auxbasis": full.auxbasis,
                "scf_mode": full.scf_mode,
                "jk_auxbasis": full.jk_auxbasis,
                "frozen_core": full.frozen_core,
                "counterpoise": "Boys-Bernardi: fragments in the full basis with ghost "
                "atoms carrying the orbital, JK-fit and MP2-fit sets",
            },
            "runs": [
                {
                    "kind": r.kind,
                    "fragment": None if r.fragment is None else r.fragment + 1,
                    "seconds": r.seconds,
                    "result": r.result.to_dict(),
                }
                for r in self.runs
            ],
            "seconds": self.seconds,
            "ran": json_ran(self.ran),
            "versions": self.versions,
            "warnings": self.warnings,
            "units": {
                "energies": "hartree",
                "kcal_per_mol": f"hartree x {HARTREE_TO_KCAL} (CODATA 2018, thermochemical kcal)",
                "timings": "s",
            },
        }

    def write_json(self, path) -> None:
        from dfmp2.io.outputs import write_json

        write_json(path, self.to_dict(), indent=2)

    def render(self, console, quiet: bool = False) -> None:
        from rich.markup import escape
        from rich.table import Table

        full = next(r for r in self.runs if r.kind == "full").result
        t = Table(
            title=f"interaction energy  {escape(full.formula)}  ({escape(self.molecule)}), "
            f"{len(self.fragments)} fragments",
            title_justify="left",
        )
        t.add_column("method")
        for col in ("CP-corrected / Eh", "kcal/mol", "uncorrected / Eh", "kcal/mol"):
            t.add_column(col, justify="right")
        for m in METHODS:
            cp, nocp = self.deltas["cp"][m], self.deltas["nocp"][m]
            t.add_row(m, f"{cp:.10f}", f"{cp * HARTREE_TO_KCAL:.4f}", f"{nocp:.10f}", f"{nocp * HARTREE_TO_KCAL:.4f}")
        t.caption = f"1 Eh = {HARTREE_TO_KCAL} kcal/mol (CODATA 2018)"
        console.print(t)
        if not quiet:
            self._render_fragments(console)
            console.print(self._runs_table(full))
            _render_cbs(console, full)
        for w in self.warnings:
            console.print(f"[bold yellow]warning:[/] {escape(w)}")
        if self.ran.get("simulated"):
            console.print(
                f"[bold yellow]note:[/] {escape(self.ran['device'])} was simulated on this CPU "
                f"({escape(self.ran['engine'])}); the timings are not Trainium timings."
            )

    def _render_fragments(self, console) -> None:
        """One line: each fragment's atoms, charge and multiplicity."""
        f = self.fragments
        console.print(
            "fragments: "
            + "; ".join(
                f"{k + 1} = atoms {format_atoms(a)} (charge {_signed(f.charges[k])}, multiplicity "
                f"{f.multiplicities[k]})"
                for k, a in enumerate(f.atoms)
            ),
            highlight=False,
        )

    def _runs_table(self, full):
        """The rich Table of the runs (full system, each fragment in the full and its own basis):
        sizes, energies (Hartree), seconds; the caption says what ran."""
        from rich.markup import escape
        from rich.table import Table

        r = Table(title="runs", title_justify="left")
        for col, just in (
            ("run", "left"),
            ("nbasis", "right"),
            ("naux", "right"),
            ("E(HF) / Eh", "right"),
            ("E(MP2) / Eh", "right"),
            ("E(SCS-MP2) / Eh", "right"),
            ("time / s", "right"),
        ):
            r.add_column(col, justify=just)
        for run in self.runs:
            e, res = run.result.energies(), run.result
            short = (
                "full system"
                if run.kind == "full"
                else f"fragment {run.fragment + 1}, {'full' if run.kind == 'cp' else 'own'} basis"
            )
            r.add_row(
                short,
                str(res.nbasis),
                str(res.naux),
                f"{e['e_hf']:.10f}",
                f"{e['e_mp2']:.10f}",
                f"{e['e_scs_mp2']:.10f}",
                f"{run.seconds:.2f}",
            )
        r.caption = escape(
            f"{full.basis} / {full.auxbasis} / "
            f"{'DF-RHF (' + str(full.jk_auxbasis) + ')' if full.scf_mode == 'df' else 'RHF'}"
            f"; {'frozen core' if full.frozen_core else 'all electrons correlated'}"
            f"{'; ECP ' + full.ecp['name'] if full.ecp else ''}; "
            f"{self.ran['device']} / {self.ran['engine']} / {self.ran['precision']}; "
            f"total {self.seconds:.2f} s"
        )
        return r

    def run_label(self, run: Run) -> str:
        return run_label(self.fragments, run.kind, run.fragment)


def _render_cbs(console, full) -> None:
    """A CBS run's line: the schemes and bases its energies were extrapolated from."""
    from rich.markup import escape

    c = _cbs(full)
    if c:
        console.print(
            escape(
                f"CBS: every run's energies extrapolated; SCF {c['scf']['scheme']} "
                f"({', '.join(c['scf']['bases'])}), correlation {c['corl']['scheme']} "
                f"({', '.join(c['corl']['bases'])}); nbasis and naux of the largest basis"
            ),
            highlight=False,
        )


def _cbs(result) -> dict | None:
    """The CBS scheme of a run's result (dfmp2.workflows.cbs.Scheme.to_dict()); None for one basis."""
    sch = getattr(result, "scheme", None)
    return sch.to_dict() if sch is not None else None


def run_label(frags: Fragments, kind: str, k: int | None) -> str:
    """'full system', 'fragment 1 (atoms 1-3), full basis (ghosts)', '..., own basis'."""
    if kind == "full":
        return "full system"
    return f"{frags.label(k)}, {'full basis (ghosts)' if kind == 'cp' else 'own basis'}"


def interaction_energies(runs) -> dict:
    """{'cp': {method: ΔE}, 'nocp': {...}} in Eh from the runs (see the module docstring)."""
    full = next(r for r in runs if r.kind == "full").result.energies()
    out = {}
    for key, kind in (("cp", "cp"), ("nocp", "own")):
        parts = [r.result.energies() for r in runs if r.kind == kind]
        out[key] = {m: full[e] - sum(p[e] for p in parts) for m, e in METHODS.items()}
    return out


def check_runs(jobs, options) -> None:
    """Build every run's molecule and MP2-fit basis now (io_molecule.build_molecule refuses what the
    program cannot run: electron counts that do not fit the spin, coincident atoms, basis
    sets lacking an element), so a fragment that cannot run stops the command before any SCF.
    A basis bracket (cc-pv[dt]z): every basis of it (dfmp2.workflows.cbs.check_bases)."""
    from dfmp2.workflows import cbs

    if cbs.is_bracket(options.basis):
        cbs.check_bases(cbs.scheme(options.basis, options.cbs_scf), [g for _, _, g in jobs], options)
        return
    for _, _, g in jobs:
        mol = io_molecule.build_molecule(g, options.basis, g.charge, g.multiplicity, ecp=options.ecp)
        basis.mp2_auxbasis(mol, options.auxbasis)


def agreed_content(geom: Geometry, frags: Fragments, options) -> dict:
    """What the ranks agree on before any run (``World.agree``): the molecule and options
    (``dfmp2.drivers.energy.request_content``), the fragments' atoms, and each fragment's charge and
    multiplicity and the whole system's as resolved (from the options or the XYZ's lines), as
    'option <parameter>' (the flag in a refusal). A rank with other charges would run other
    fragments into the sums."""
    from dfmp2.drivers.energy import request_content

    content = request_content(geom, options)
    content["the fragments"] = [list(a) for a in frags.atoms]
    content["option fragment_charges"] = ",".join(map(str, frags.charges))  # shown as given: '0,0'
    content["option fragment_multiplicities"] = ",".join(map(str, frags.multiplicities))
    content["option charge"] = frags.total_charge
    content["option multiplicity"] = frags.total_multiplicity
    return content


def run_interaction(
    geom: Geometry, frags: Fragments, options, log=None, progress=None, world=None
) -> InteractionResult:
    """Run the 2N+1 DF-MP2 calculations and form the interaction energies.
    ``options`` (dfmp2.options.RunOptions): charge and multiplicity are taken from ``frags``;
    no checkpoint. ``log(msg)`` gets a line as each run starts. A basis bracket (cc-pv[dt]z):
    each of the 2N+1 runs is a CBS extrapolation (dfmp2.workflows.cbs.run_cbs) and the interaction
    energies are differences of extrapolated energies, as Psi4 forms them. ``world``: the process
    group (default ``distributed.current()``): one process runs them in turn on one backend; over
    several ranks the runs are dealt to the ranks, each a whole one-process run
    (``dfmp2.workflows.tasks``), and every rank gets every run (the same numbers as one process)."""
    from dfmp2 import distributed
    from dfmp2.drivers.energy import make_backend
    from dfmp2.workflows import tasks
    from dfmp2.workflows.cbs import run_point, summed_kernels

    say = log or (lambda msg: None)
    world = world if world is not None else distributed.current()
    with world.agreeing():  # over several ranks: every rank refuses together, before any work
        if options.checkpoint or options.resume:
            raise InputError(
                "interaction energies are not checkpointed; run without a checkpoint",
                option=tuple(o for o in ("checkpoint", "resume") if getattr(options, o)),
            )
        if options.properties:
            raise InputError(
                f"interaction energies do not carry properties ({', '.join(options.properties)}); ask for them "
                "in a run of one molecule (dfmp2 run --properties)",
                option="properties",
            )
        options = replace(options, charge=None, multiplicity=None)
        options.resolved_precision()
        jobs = run_geometries(geom, frags)
        check_runs(jobs, options)
        # one device for all runs (no fallback in between); open-shell runs need the backend's
        # opposite-spin pair path (cuda: gemm+epilogue)
        unrestricted = any(io_molecule.resolve_reference(options.reference, g) == "uhf" for _, _, g in jobs)
        mine = distributed.rank_options(options, world)  # each rank's runs on its own device
        backend = make_backend(mine, unrestricted=unrestricted)
        group_size = distributed.check_groups(options, world)  # each run over a group of ranks
    world.agree(None, agreed_content(geom, frags, options))  # every rank the same molecule, options and fragments
    t0 = time.perf_counter()

    def one_run(n, single):
        kind, k, g = jobs[n]
        label = f"run {n + 1}/{len(jobs)} ({run_label(frags, kind, k)})"
        say(f"{label}" + (f" on rank {world.rank}" if world.distributed else "") + " ...")
        t1 = time.perf_counter()
        try:  # each run's ran['kernels']: its own calls on the shared backend
            res = run_point(g, mine, progress=progress, backend=backend, checked=True, world=single)
        except InputError as e:  # which of the 2N+1 runs failed, with the same option
            raise type(e)(f"{label}: {e}", option=getattr(e, "option", None)) from None
        return Run(kind, k, res, time.perf_counter() - t1)

    runs = tasks.deal(len(jobs), one_run, world, stage="interaction", group_size=group_size)  # one process: in turn
    warnings = []
    for run in runs:
        warnings += [w for w in run.result.warnings if w not in warnings]
    # what ran, for all runs; the metric and where B lived are per run, in 'runs'
    ran = {k: v for k, v in runs[0].result.ran.items() if k not in ("metric", "storage")}
    ran["kernels"] = summed_kernels([r.result for r in runs])
    if world.distributed:
        dealt = tasks.per_group(len(jobs), world, group_size)
        ran["ranks"] = {"world_size": world.size} | (
            {"ranks_per_run": group_size, "runs_per_group": dealt} if group_size > 1 else {"runs_per_rank": dealt}
        )
    return InteractionResult(
        molecule=geom.source,
        fragments=frags,
        runs=runs,
        deltas=interaction_energies(runs),
        seconds=time.perf_counter() - t0,
        ran=ran,
        versions=software_versions(),
        warnings=warnings,
    )
