"""Complete-basis-set (CBS) extrapolation with Psi4's bracket syntax: ``--basis cc-pv[dt]z``.

    dfmp2 run water.xyz --basis aug-cc-pv[tq]z --frozen-core
    dfmp2 run water.xyz --basis cc-pv[dt]z --cbs-scf scf_xtpl_helgaker_2
    dfmp2 interaction dimer.xyz --basis aug-cc-pv[dt]z

A bracket names consecutive zeta levels of one basis family (Psi4's ``_expand_bracketed_basis``
in psi4/driver/driver_cbs.py: ``cc-pv[dt]z`` is cc-pVDZ and cc-pVTZ; letters d t q 5 6 or digits
2-6, in any order, no level skipped; def2-[st]zvp, def2-[tq]zvp for the Ahlrichs sets). Every
basis runs through ``dfmp2.drivers.energy.run_energy`` on one backend, and the energies are combined as
Psi4's ``energy("mp2/cc-pv[dt]z")`` combines them (``cbs()`` in psi4/driver/driver_cbs.py, the
formulas in psi4/driver/driver_cbs_helper.py):

- correlation energy, two bases X < Y (``corl_xtpl_helgaker_2``, α = 3; Halkier, Helgaker,
  Jørgensen, Klopper, Koch, Olsen, Wilson, Chem. Phys. Lett. 286 (1998) 243):
      E_corr(CBS) = (Y^α E_corr(Y) − X^α E_corr(X)) / (Y^α − X^α)
  applied to the opposite- and same-spin parts alike (the formula is linear, so MP2, SCS-MP2 and
  SOS-MP2 correlation energies are the same combinations of the extrapolated parts);
- SCF energy, by default at the largest basis (``xtpl_highest_1``: Psi4 adds an SCF stage at
  the last basis of the correlation bracket), or on request (``--cbs-scf``):
  ``scf_xtpl_helgaker_2`` (E_X = E_CBS + β e^(−α X), α = 1.63; Halkier, Helgaker, Jørgensen,
  Klopper, Olsen, Chem. Phys. Lett. 302 (1999) 437) over the two bases of the bracket, or
  ``scf_xtpl_helgaker_3`` (the same form with α fitted to three bases; same reference) over a
  three-level bracket, whose correlation energy then comes from its two largest bases (Psi4's
  ``scf_basis='cc-pv[dtq]z', corl_basis='cc-pv[tq]z'``).

Total energies: E(CBS) = E_SCF(CBS) + E_corr(CBS). Energies in Hartree.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from dfmp2.errors import InputError, shown
from dfmp2.io.result import SCHEMA_VERSION, SCS_OS, SCS_SS, SOS_OS, json_ran, software_versions
from dfmp2.options import CBS_SCF_SCHEMES, RunOptions

ZETA_LETTERS = "dtq56"  # zeta 2..6: the letters of Psi4's zeta_values we have bases for
SCF_SCHEMES = CBS_SCF_SCHEMES  # xtpl_highest_1 (Psi4's default with a correlated method), ...
CORL_SCHEME = "corl_xtpl_helgaker_2"
SCF_ALPHA = 1.63  # scf_xtpl_helgaker_2's default exponent (Psi4)
CORL_ALPHA = 3.0  # corl_xtpl_helgaker_2's default exponent (Psi4)
SOURCE = "Psi4 cbs(): psi4/driver/driver_cbs.py (bracket, default schemes), psi4/driver/driver_cbs_helper.py (formulas)"
FORMULAS = {
    "xtpl_highest_1": "E_SCF(CBS) = E_SCF(Y), Y the largest zeta",
    "scf_xtpl_helgaker_2": "E_SCF(X) = E_SCF(CBS) + beta exp(-alpha X), alpha = 1.63, two bases",
    "scf_xtpl_helgaker_3": "E_SCF(X) = E_SCF(CBS) + beta exp(-alpha X), alpha and beta fitted to three bases",
    CORL_SCHEME: "E_corr(CBS) = (Y^3 E_corr(Y) - X^3 E_corr(X)) / (Y^3 - X^3), X < Y the zetas",
}
_BRACKET = re.compile(r"(?P<pre>[^\[\]]*)\[(?P<zeta>[^\[\]]*)\](?P<post>[^\[\]]*)")
_HELP = "e.g. cc-pv[dt]z, aug-cc-pv[tq]z or def2-[tq]zvp: consecutive zeta levels in one bracket"


def is_bracket(basis) -> bool:
    """Whether the basis option asks for a CBS extrapolation (it holds a square bracket)."""
    return isinstance(basis, str) and ("[" in basis or "]" in basis)


@dataclass(frozen=True)
class Bracket:
    """A parsed bracket: ``text`` as given, ``bases`` (lower case) and their ``zetas``, ascending."""

    text: str
    bases: tuple
    zetas: tuple


def _zeta(ch: str, def2: bool) -> int | None:
    if def2 and ch == "s":  # def2-svp is the double-zeta member (Psi4: s -> d)
        return 2
    if ch in ZETA_LETTERS:
        return ZETA_LETTERS.index(ch) + 2
    if ch.isdigit() and 2 <= int(ch) <= 6:
        return int(ch)
    return None


def _name(pre: str, post: str, zeta: int, def2: bool) -> str:
    if def2 and zeta == 2:
        return pre + "s" + post[1:]  # def2-[st]zvp: def2-svp, def2-tzvp (Psi4's rule)
    return pre + ZETA_LETTERS[zeta - 2] + post


def parse_bracket(text: str) -> Bracket:
    """'cc-pv[dt]z' -> Bracket(bases=('cc-pvdz', 'cc-pvtz'), zetas=(2, 3)) (case-insensitive).
    InputError (option 'basis') for anything else: no or several brackets, a letter that is no
    zeta level, a repeated or skipped level, one level or more than three, a family that is not
    Dunning's (``cc-`` before the bracket, ``z`` after it) or Ahlrichs' def2 (``def2-[tq]zvp``)."""
    t = text.strip().lower()

    def bad(msg):
        return InputError(f"basis bracket '{shown(text)}': {msg}", option="basis")

    m = _BRACKET.fullmatch(t)
    if m is None:
        raise bad(f"write one pair of square brackets around the zeta levels ({_HELP})")
    pre, post = m.group("pre"), m.group("post")
    def2 = pre.endswith("def2-") and post.startswith("zvp")
    if not def2 and not ("cc-p" in pre and post.startswith("z")):
        raise bad(
            "only Dunning's correlation-consistent sets (cc-pv[dt]z, aug-cc-pv[tq]z, cc-pcv[tq]z) "
            "and def2 (def2-[tq]zvp) extrapolate"
        )
    letters = [c for c in m.group("zeta") if c not in ", "]
    zetas = []
    for c in letters:
        z = _zeta(c, def2)
        if z is None:
            raise bad(f"'{shown(c, 5)}' is not a zeta level; use {', '.join(ZETA_LETTERS)} or 2-6 ({_HELP})")
        if z in zetas:
            raise bad(f"zeta level '{c}' is given twice")
        zetas.append(z)
    zetas.sort()
    if not 2 <= len(zetas) <= 3:
        raise bad(
            f"{len(zetas)} zeta level{'s' if len(zetas) != 1 else ''}; an extrapolation takes two "
            f"(or three for the SCF, --cbs-scf scf_xtpl_helgaker_3) ({_HELP})"
        )
    for lo, hi in itertools.pairwise(zetas):
        if hi != lo + 1:
            raise bad(
                f"zeta levels must be consecutive; {_name(pre, post, lo, def2)} to "
                f"{_name(pre, post, hi, def2)} skips {_name(pre, post, lo + 1, def2)}"
            )
    return Bracket(text=text.strip(), bases=tuple(_name(pre, post, z, def2) for z in zetas), zetas=tuple(zetas))


@dataclass(frozen=True)
class Scheme:
    """What is extrapolated from which bases: the SCF (``scf``, a name of SCF_SCHEMES, over
    ``scf_zetas``) and the correlation energy (CORL_SCHEME over ``corl_zetas``)."""

    bracket: Bracket
    scf: str
    scf_zetas: tuple
    corl_zetas: tuple

    def to_dict(self) -> dict:
        b = dict(zip(self.bracket.zetas, self.bracket.bases))
        return {
            "bracket": self.bracket.text,
            "bases": list(self.bracket.bases),
            "zetas": list(self.bracket.zetas),
            "scf": {
                "scheme": self.scf,
                "formula": FORMULAS[self.scf],
                "alpha": SCF_ALPHA if self.scf == "scf_xtpl_helgaker_2" else None,
                "bases": [b[z] for z in self.scf_zetas],
                "zetas": list(self.scf_zetas),
            },
            "corl": {
                "scheme": CORL_SCHEME,
                "formula": FORMULAS[CORL_SCHEME],
                "alpha": CORL_ALPHA,
                "bases": [b[z] for z in self.corl_zetas],
                "zetas": list(self.corl_zetas),
            },
            "source": SOURCE,
        }


def scheme(basis: str, scf: str = "xtpl_highest_1") -> Scheme:
    """The CBS scheme of a bracket and an SCF scheme name (InputError: options 'basis' or
    'cbs_scf'): two levels take xtpl_highest_1 (Psi4's default) or scf_xtpl_helgaker_2; three
    levels take scf_xtpl_helgaker_3, the correlation from the two largest."""
    br = parse_bracket(basis)
    if scf not in SCF_SCHEMES:
        raise InputError(
            f"unknown CBS SCF scheme '{shown(scf)}'; use one of {', '.join(SCF_SCHEMES)}", option="cbs_scf"
        )
    n = len(br.zetas)
    if n == 3 and scf != "scf_xtpl_helgaker_3":
        raise InputError(
            f"basis bracket '{shown(basis)}' has three zeta levels, which only the SCF "
            "extrapolation scf_xtpl_helgaker_3 takes (the correlation energy then from the two "
            "largest); give two levels, or that SCF scheme",
            option=("basis", "cbs_scf"),
        )
    if n == 2 and scf == "scf_xtpl_helgaker_3":
        raise InputError(
            f"scf_xtpl_helgaker_3 needs three zeta levels; '{shown(basis)}' has two", option=("basis", "cbs_scf")
        )
    scf_zetas = br.zetas[-1:] if scf == "xtpl_highest_1" else br.zetas
    return Scheme(bracket=br, scf=scf, scf_zetas=scf_zetas, corl_zetas=br.zetas[-2:])


# ---------------------------------------------------------------------------- formulas (Psi4's)
def xtpl_highest_1(z_hi: int, e_hi: float) -> float:
    """Psi4's ``xtpl_highest_1``: the energy at the largest basis (Hartree)."""
    return e_hi


def scf_xtpl_helgaker_2(z_lo: int, e_lo: float, z_hi: int, e_hi: float, alpha: float = SCF_ALPHA) -> float:
    """Psi4's ``scf_xtpl_helgaker_2`` (driver_cbs_helper.py): E_X = E_CBS + β e^(−α X), α = 1.63
    (Halkier et al., Chem. Phys. Lett. 302 (1999) 437); energies in Hartree."""
    beta = (e_hi - e_lo) / (math.exp(-alpha * z_lo) * (math.exp(-alpha) - 1))
    return e_hi - beta * math.exp(-alpha * z_hi)


def scf_xtpl_helgaker_3(z_lo: int, e_lo: float, z_md: int, e_md: float, z_hi: int, e_hi: float) -> float:
    """Psi4's ``scf_xtpl_helgaker_3`` (driver_cbs_helper.py): E_X = E_CBS + β e^(−α X) through
    three consecutive zetas, α and β fitted; Hartree. InputError when the energies do not
    decrease geometrically (the ratio of the two steps must lie in (0, 1))."""
    ratio = (e_hi - e_md) / (e_md - e_lo) if e_md != e_lo else float("nan")
    if not 0.0 < ratio < 1.0:
        raise InputError(
            f"scf_xtpl_helgaker_3: the SCF energies {e_lo:.10f}, {e_md:.10f}, {e_hi:.10f} Eh "
            "do not converge geometrically with the zeta level (step ratio "
            f"{ratio:.3g}); use xtpl_highest_1 or scf_xtpl_helgaker_2",
            option="cbs_scf",
        )
    alpha = -math.log(ratio)
    beta = (e_hi - e_md) / (math.exp(-alpha * z_md) * (ratio - 1))
    return e_hi - beta * math.exp(-alpha * z_hi)


def corl_xtpl_helgaker_2(z_lo: int, e_lo: float, z_hi: int, e_hi: float, alpha: float = CORL_ALPHA) -> float:
    """Psi4's ``corl_xtpl_helgaker_2`` (driver_cbs_helper.py): E_corr(X) = E_corr(CBS) + β X^−α,
    α = 3 (Halkier et al., Chem. Phys. Lett. 286 (1998) 243), so
    E_corr(CBS) = (Y^α E_Y − X^α E_X) / (Y^α − X^α); Hartree."""
    return (e_hi * z_hi**alpha - e_lo * z_lo**alpha) / (z_hi**alpha - z_lo**alpha)


def extrapolate(sch: Scheme, components: dict) -> dict:
    """The CBS energies (Result.energies()' keys, Hartree) from ``components`` {zeta: Result}."""
    hf = [(z, components[z].e_hf) for z in sch.scf_zetas]
    flat = [v for zh in hf for v in zh]
    e_hf = {
        "xtpl_highest_1": xtpl_highest_1,
        "scf_xtpl_helgaker_2": scf_xtpl_helgaker_2,
        "scf_xtpl_helgaker_3": scf_xtpl_helgaker_3,
    }[sch.scf](*flat)
    (x, lo), (y, hi) = [(z, components[z]) for z in sch.corl_zetas]
    e_os = corl_xtpl_helgaker_2(x, lo.e_os, y, hi.e_os)
    e_ss = corl_xtpl_helgaker_2(x, lo.e_ss, y, hi.e_ss)
    e_scs, e_sos = SCS_OS * e_os + SCS_SS * e_ss, SOS_OS * e_os
    return {
        "e_hf": e_hf,
        "e_corr_os": e_os,
        "e_corr_ss": e_ss,
        "e_corr": e_os + e_ss,
        "e_mp2": e_hf + e_os + e_ss,
        "e_corr_scs": e_scs,
        "e_scs_mp2": e_hf + e_scs,
        "e_corr_sos": e_sos,
        "e_sos_mp2": e_hf + e_sos,
        "e_tot": e_hf + e_os + e_ss,  # E(MP2): every result's total (Result.e_tot)
    }


# ---------------------------------------------------------------------------- runs and result
@dataclass
class CBSResult:
    """A CBS extrapolation: one ``result.Result`` per basis (``components``, ascending zeta) and
    the extrapolated energies (``energies()``, Result.energies()' keys, Hartree). It answers what
    ``dfmp2 interaction`` asks of a Result (energies, basis, shapes and ``ran`` of the largest
    basis), so an interaction energy at the CBS limit is formed from CBS energies, as Psi4 does."""

    scheme: Scheme
    components: list  # Result per basis, ascending zeta
    ran: dict  # what ran all bases: the largest basis's record, kernels of all runs
    wall_s: float  # s, all bases
    warnings: list = field(default_factory=list)
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def largest(self):
        return self.components[-1]

    def by_zeta(self) -> dict:
        return dict(zip(self.scheme.bracket.zetas, self.components))

    def energies(self) -> dict:
        return extrapolate(self.scheme, self.by_zeta())

    @property
    def e_tot(self) -> float:
        """E(MP2) at the basis-set limit, Hartree (``Result.e_tot``'s name)."""
        return self.energies()["e_tot"]

    @property
    def basis(self) -> str:
        return self.scheme.bracket.text

    # what dfmp2 interaction's tables read of a run: the largest basis's
    molecule = property(lambda self: self.largest.molecule)
    formula = property(lambda self: self.largest.formula)
    auxbasis = property(lambda self: self.largest.auxbasis)
    scf_mode = property(lambda self: self.largest.scf_mode)
    jk_auxbasis = property(lambda self: self.largest.jk_auxbasis)
    frozen_core = property(lambda self: self.largest.frozen_core)
    nbasis = property(lambda self: self.largest.nbasis)
    naux = property(lambda self: self.largest.naux)
    ecp = property(lambda self: self.largest.ecp)
    spin = property(lambda self: self.largest.spin)

    def to_dict(self) -> dict:
        big = self.largest
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "cbs",
            "molecule": big.molecule,
            "formula": big.formula,
            "natm": big.natm,
            "charge": big.charge,
            "multiplicity": big.multiplicity,
            "geometry": big.geometry,
            "basis": self.basis,
            "cbs": self.scheme.to_dict(),
            "energies": self.energies(),
            "components": [
                {"basis": r.basis, "zeta": z, "energies": r.energies()}
                for z, r in zip(self.scheme.bracket.zetas, self.components)
            ],
            "runs": [r.to_dict() for r in self.components],
            "wall_s": self.wall_s,
            "ran": json_ran(self.ran),
            "versions": software_versions(),
            "warnings": self.warnings,
            "date": self.date,
            "units": {"energies": "hartree", "wall_s": "s", "geometry": "angstrom"},
        }

    def write_json(self, path) -> None:
        from dfmp2.io.outputs import write_json

        write_json(path, self.to_dict(), indent=2)

    def render(self, console, quiet: bool = False) -> None:
        """The extrapolated energies beside each basis's, the scheme, then the warnings."""
        from rich.markup import escape
        from rich.table import Table

        big, e, s = self.largest, self.energies(), self.scheme
        t = Table(
            title=f"DF-{'U' if big.spin else ''}MP2/CBS  {escape(big.formula)}  ({escape(big.molecule)})",
            title_justify="left",
        )
        t.add_column("quantity")
        for r in self.components:
            t.add_column(escape(r.basis) + " / Eh", justify="right")
        t.add_column("CBS / Eh", justify="right")
        rows = [
            ("E(HF)", "e_hf"),
            ("E_corr MP2", "e_corr"),
            ("E(MP2)", "e_mp2"),
            ("E_corr SCS-MP2", "e_corr_scs"),
            ("E(SCS-MP2)", "e_scs_mp2"),
            ("E_corr SOS-MP2", "e_corr_sos"),
            ("E(SOS-MP2)", "e_sos_mp2"),
        ]
        parts = [r.energies() for r in self.components]
        for label, key in rows:
            t.add_row(label, *(f"{p[key]:.10f}" for p in parts), f"{e[key]:.10f}")
        d = s.to_dict()
        t.caption = escape(
            f"SCF: {s.scf} ({', '.join(d['scf']['bases'])}); correlation: {CORL_SCHEME}, "
            f"alpha 3 ({', '.join(d['corl']['bases'])}); Psi4's formulas; {self.wall_s:.1f} s"
        )
        console.print(t)
        if not quiet:
            console.print(escape(f"SCF: {FORMULAS[s.scf]}"), highlight=False)
            console.print(escape(f"correlation: {FORMULAS[CORL_SCHEME]}"), highlight=False)
        for w in self.warnings:
            console.print(f"[bold yellow]warning:[/] {escape(w)}")
        if self.ran.get("simulated"):
            console.print(
                f"[bold yellow]note:[/] {escape(self.ran['device'])} was simulated on this CPU "
                f"({escape(self.ran['engine'])}); the timings are not Trainium timings."
            )


def check_bases(sch: Scheme, geoms, options) -> None:
    """Every basis of the bracket, with its MP2-fit set, on every geometry, before any SCF (a
    basis PySCF lacks for an element stops the command now, not after the first basis ran)."""
    from dfmp2.df import basis as df_basis
    from dfmp2.io import molecule as io_molecule

    for g in geoms:
        for b in sch.bracket.bases:
            mol = io_molecule.build_molecule(g, b, options.charge, options.multiplicity, ecp=options.ecp)
            df_basis.mp2_auxbasis(mol, options.auxbasis)


def run_cbs(
    geom, options, progress=None, log=None, backend=None, checked: bool = False, on_plan=None, world=None
) -> CBSResult:
    """Run DF-MP2 at every basis of ``options.basis`` (a bracket) on one backend and extrapolate
    (``scheme(options.basis, options.cbs_scf)``). ``checked``: the bases were already checked on
    this geometry (``check_bases``); ``on_plan(plan)`` sees each basis's memory plan. Each
    component's ``ran['kernels']`` counts its own calls. ``world``: the process group (default
    ``distributed.current()``): over several ranks the bases are dealt to the ranks, one whole
    one-process run each (``dfmp2.workflows.tasks``), and every rank gets every component."""
    from dfmp2.drivers.energy import make_backend, request_content
    from dfmp2.io import molecule as io_molecule

    say = log or (lambda msg: None)
    sch = scheme(options.basis, options.cbs_scf)
    if options.checkpoint or options.resume:
        raise InputError(
            "a CBS extrapolation is not checkpointed; run without a checkpoint",
            option=tuple(o for o in ("checkpoint", "resume") if getattr(options, o)),
        )
    if options.properties:
        raise InputError(
            f"properties ({', '.join(options.properties)}) are of one basis: a CBS extrapolation does not "
            "carry them; ask for them in a run with one basis",
            option=("properties", "basis"),
        )
    if options.method != "mp2":
        raise InputError(
            f"a CBS extrapolation here is of MP2 (Helgaker's X^-3 for its correlation energy), not of the double "
            f"hybrid {options.method}; run the double hybrid with one basis",
            option=("method", "basis"),
        )
    from dfmp2 import distributed
    from dfmp2.workflows import tasks

    world = world if world is not None else distributed.current()
    with world.agreeing():  # over several ranks: every rank refuses together, before any work
        options.resolved_precision()
        if not checked:
            check_bases(sch, [geom], options)
        mine = distributed.rank_options(options, world)
        group_size = distributed.check_groups(options, world)  # each basis over a group of ranks
        if backend is None:
            ref = io_molecule.resolve_reference(options.reference, geom, options.charge, options.multiplicity)
            backend = make_backend(mine, unrestricted=ref == "uhf")
    world.agree(None, request_content(geom, options))  # every rank the same molecule and options
    t0 = time.perf_counter()
    bases = sch.bracket.bases

    def one_basis(n, single):
        b = bases[n]
        say(f"CBS basis {n + 1}/{len(bases)}: {b}" + (f" (rank {world.rank})" if world.distributed else "") + " ...")
        one = replace(mine, basis=b, cbs_scf=RunOptions.cbs_scf)  # one basis: no scheme
        try:
            return run_own_kernels(geom, one, backend, progress=progress, log=log, on_plan=on_plan, world=single)
        except InputError as e:  # which basis of the bracket failed, with the same option
            raise type(e)(
                f"{b} (basis {n + 1} of {shown(options.basis)}): {e}", option=getattr(e, "option", None)
            ) from None

    components = tasks.deal(len(bases), one_basis, world, stage="cbs", group_size=group_size)  # one process: in turn
    warnings = [f"{b}: {w}" for b, res in zip(bases, components) for w in res.warnings]
    ran = dict(components[-1].ran)
    ran["kernels"] = summed_kernels(components)
    return CBSResult(scheme=sch, components=components, ran=ran, wall_s=time.perf_counter() - t0, warnings=warnings)


def summed_kernels(results) -> dict:
    """{op:kernel: calls} over ``results`` (each's ``ran['kernels']`` its own calls), sorted."""
    total: dict = {}
    for res in results:
        for k, c in res.ran["kernels"].items():
            total[k] = total.get(k, 0) + c
    return dict(sorted(total.items()))


def run_own_kernels(geom, options, backend, progress=None, log=None, on_plan=None, world=None):
    """``run_energy(prepare(...))`` on a shared backend, its ``ran['kernels']`` this run's own calls
    (the backend counts over its life); ``world`` as ``prepare``'s."""
    from dfmp2.drivers.energy import prepare, run_energy

    if backend is None:  # a backend of its own: its kernels are this run's
        job = prepare(geom, options, log=log, world=world)
        return run_energy(job, progress=progress, log=log, on_plan=on_plan).result
    before = dict(backend.kernels_used)
    job = prepare(geom, options, backend, log, world)
    res = run_energy(job, progress=progress, log=log, on_plan=on_plan).result
    res.ran["kernels"] = {k: c - before.get(k, 0) for k, c in res.ran["kernels"].items() if c - before.get(k, 0)}
    return res


def run_point(geom, options, progress=None, log=None, backend=None, checked: bool = False, world=None):
    """One geometry at ``options.basis``: a Result (one basis) or a CBSResult (a bracket), its
    ``ran['kernels']`` its own calls on a shared ``backend``; ``world`` as ``prepare``'s."""
    if is_bracket(options.basis):
        return run_cbs(geom, options, progress=progress, log=log, backend=backend, checked=checked, world=world)
    return run_own_kernels(geom, options, backend, progress=progress, log=log, world=world)
