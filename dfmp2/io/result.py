"""The result of a run: energies (Hartree), shapes, timings (s), what ran; table and JSON."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

# of the result JSON: 2 = typed 'ran' (same keys for RHF and UHF); 3 = the geometry as run,
# multiplicity, wall_s, no '.' in any key (kernel maps as lists of {op, kernel, calls}); 4 = flops
# per stage beside timings (the gradient's too); 5 = ``properties`` (null, or what --properties asked
# for: the dipole moments with their units and origin, and the densities' record) and
# ran.scf.jk_factor.screening (the JK factor's kept pairs); 6 = ``double_hybrid`` (null, or a double
# hybrid's functional, energy parts, dispersion and KS grid: docs/double_hybrids.md) and, for a double
# hybrid, ``energies`` holding its parts (e_dft, e_corr_os, e_corr_ss, e_pt2, e_disp, e_total) only;
# 7 = ``peak_rss_mb`` beside ``timings`` (the process's measured peak resident memory, MB, when each
# stage ended), also in the gradient's record; 8 = ``memory.allocator`` (how freed heap memory goes
# back to the OS: glibc's malloc_trim at each stage's end, or the C library's own way) and
# ``memory.process_mb`` (the process's resident memory when the plan was made, outside the plan);
# 9 = ``energies.e_tot`` in every result (the method's total energy: E(MP2), or a double hybrid's
# E_DFT + E_PT2 + E_disp, the same number as its ``e_total``); 10 = ``gradient.double_hybrid``;
# 11 = ``properties`` typed (its dipole record) and a double hybrid's: ``properties.dipole`` with
# ``ks`` and ``relaxed`` (no HF or MP2 dipole), ``properties.densities.double_hybrid``; 12 = ``profile``
# (null, or dfmp2 run --profile's record: per stage and per part of the SCF's cycles the wall, host
# and device seconds, bytes moved, ops and host waits; the top kernels: dfmp2.timing.Profile)
SCHEMA_VERSION = "12"
SCS_OS, SCS_SS = 1.2, 1.0 / 3.0  # Grimme's SCS-MP2
SOS_OS = 1.3  # Head-Gordon's SOS-MP2
# (c_os, c_ss) of each method's energy E_HF + c_os E_OS + c_ss E_SS (what dfmp2 gradient differentiates)
METHOD_SCALES = {"mp2": (1.0, 1.0), "scs-mp2": (SCS_OS, SCS_SS), "sos-mp2": (SOS_OS, 0.0)}


def software_versions() -> dict:
    import numpy
    import pyscf
    import torch

    import dfmp2

    return {
        "dfmp2": dfmp2.__version__,
        "pyscf": pyscf.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "platform": platform.platform(),
    }


def kernel_records(calls: dict) -> list:
    """{'gemm:torch.matmul': 3} (a backend's count per 'op:kernel') -> [{'op': 'gemm', 'kernel':
    'torch.matmul', 'calls': 3}]: kernel names hold dots, which JSON keys must not (jq, pandas and
    document stores read a dot as a path)."""
    out = []
    for key, n in calls.items():
        op, _, kernel = key.partition(":")
        out.append({"op": op, "kernel": kernel, "calls": int(n)})
    return out


def json_ran(ran: dict) -> dict:
    """``ran`` (provenance.RunRecord.to_dict() or a backend's describe()) as the JSON writes it:
    its kernel maps (``kernels``; ``scf.kernels``, ``scf.host_kernels``) as ``kernel_records``."""
    out = dict(ran)
    if isinstance(out.get("kernels"), dict):
        out["kernels"] = kernel_records(out["kernels"])
    if isinstance(out.get("scf"), dict):
        out["scf"] = dict(out["scf"])
        for k in ("kernels", "host_kernels"):
            if isinstance(out["scf"].get(k), dict):
                out["scf"][k] = kernel_records(out["scf"][k])
    return out


def geometry_record(symbols, coords_angstrom, ghost=()) -> dict:
    """The geometry as run, for the JSON: element symbols, coordinates in Ångström (natm lists of
    3 floats) and, per atom, whether it is a ghost atom (basis functions only, no charge)."""
    return {
        "symbols": [str(s) for s in symbols],
        "coordinates_angstrom": [[float(x) for x in row] for row in coords_angstrom],
        "ghost": [bool(ghost[i]) if ghost else False for i in range(len(symbols))],
    }


@dataclass
class Result:
    molecule: str
    natm: int
    formula: str
    charge: int
    multiplicity: int  # 2S+1, closed shells too
    geometry: dict  # geometry_record: symbols, coordinates in Ångström, ghost atoms (as run)
    basis: str
    auxbasis: str
    scf_mode: str
    jk_auxbasis: str | None
    frozen_core: bool
    nbasis: int
    nmo: int
    nocc: int  # active occupied
    nfrozen: int
    nvir: int
    naux: int
    # Hartree: the SCF's energy, E(HF) of an MP2 run or E_DFT of a double hybrid's KS-SCF (``e_hf`` and
    # ``e_ks`` read it, each only where it is what its name says)
    e_scf: float
    e_os: float  # opposite-spin correlation, Hartree (a double hybrid: its PT2 term's, unscaled)
    e_ss: float  # same-spin correlation, Hartree (a double hybrid: its PT2 term's, unscaled)
    timings: dict  # seconds per stage
    # flops per stage (the stages of timings) executed through dfmp2.linalg (counted as linalg.flops
    # says; libcint, PySCF and host numpy work not counted: 0 where a stage ran none)
    flops: dict
    wall_s: float  # seconds, the whole run (checks, SCF, MP2, result)
    ran: dict  # device, engine, kernels, precision, metric factorisation
    memory: dict
    versions: dict
    warnings: list = field(default_factory=list)  # one line each: what to check before trusting this
    # per stage of timings: the process's peak resident memory (MB, getrusage's high-water mark) when
    # the stage last ended (dfmp2.timing.Timer.stage_rss), what the memory plan is held against
    peak_rss_mb: dict = field(default_factory=dict)
    ecp: dict | None = None  # scf.ecp_info: the effective core potential and its elements; None: all-electron
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    # open shell (UHF reference): reference, multiplicity, <S^2> and S(S+1), alpha/beta nocc and
    # nvir, E_corr per spin block (aa, bb, ab; Hartree); nocc/nvir above are then the alpha ones.
    # None: a closed-shell RHF reference.
    spin: dict | None = None
    # after the energy (RunOptions.properties; dfmp2.props.stage.record): {'dipole': {...}, 'densities':
    # {...}}; None: none asked for
    properties: dict | None = None
    # a double hybrid (RunOptions.method; dfmp2.mp2.double_hybrids.record): functional, e_dft, e_pt2,
    # e_disp, e_total (Hartree), dispersion, ks_scf (grid, fitting set); None: MP2. Its E_DFT is e_scf
    double_hybrid: dict | None = None
    # dfmp2 run --profile (dfmp2.timing.Profile.report): where the time and the bytes went; None: not asked
    profile: dict | None = None

    @property
    def _hf(self) -> str:
        if self.double_hybrid:  # the KS-SCF of a double hybrid
            return self.double_hybrid["ks_scf"]["kind"]
        return "UHF" if self.spin else "RHF"

    # The energies by name (Hartree). ``e_tot`` is every run's total: E(MP2) = E(HF) + E_corr of an MP2
    # run (PySCF's MP2 ``e_tot``), E_DFT + E_PT2 + E_disp of a double hybrid. The MP2 names (e_hf,
    # e_corr, e_mp2, e_corr_scs, e_corr_sos) exist only for MP2, the double hybrid's (e_ks, e_pt2,
    # e_disp) only for a double hybrid: reading one on the other run is an AttributeError naming what
    # to read instead, never a number of another method (docs/double_hybrids.md).
    @property
    def method(self) -> str:
        """What ran: 'MP2' (DF-MP2 on HF orbitals), or the double hybrid's name ('B2PLYP')."""
        return self.double_hybrid["functional"]["name"] if self.double_hybrid else "MP2"

    @property
    def e_tot(self) -> float:
        """The method's total energy (Hartree): E(MP2) of an MP2 run, E(B2PLYP) of B2PLYP's."""
        return self.double_hybrid["e_total"] if self.double_hybrid else self.e_scf + (self.e_os + self.e_ss)

    def _mp2_only(self, name: str) -> None:
        if self.double_hybrid:
            m = self.method
            raise AttributeError(
                f"Result.{name}: {m} is a double hybrid, its result has no HF or MP2 energies (its PT2 term is "
                f"MP2-like sums on Kohn-Sham orbitals, scaled); read e_tot (E({m})), e_ks (E_DFT of its KS-SCF), "
                "e_pt2 (the scaled PT2 term), e_disp, or energies()"
            )

    def _double_hybrid_only(self, name: str) -> dict:
        """The double hybrid's record; AttributeError on an MP2 run (its names are e_hf, e_corr, e_mp2)."""
        if not self.double_hybrid:
            raise AttributeError(
                f"Result.{name}: this is an MP2 run, not a double hybrid; read e_hf, e_corr, e_mp2 (= e_tot)"
            )
        return self.double_hybrid

    @property
    def e_hf(self) -> float:
        self._mp2_only("e_hf")
        return self.e_scf

    @property
    def e_corr(self) -> float:
        self._mp2_only("e_corr")
        return self.e_os + self.e_ss

    @property
    def e_mp2(self) -> float:
        self._mp2_only("e_mp2")
        return self.e_scf + (self.e_os + self.e_ss)

    @property
    def e_corr_scs(self) -> float:
        self._mp2_only("e_corr_scs")
        return SCS_OS * self.e_os + SCS_SS * self.e_ss

    @property
    def e_corr_sos(self) -> float:
        self._mp2_only("e_corr_sos")
        return SOS_OS * self.e_os

    @property
    def e_ks(self) -> float:
        """A double hybrid's E_DFT: its KS-SCF's energy (the functional's hybrid part), Hartree."""
        self._double_hybrid_only("e_ks")
        return self.e_scf

    @property
    def e_pt2(self) -> float:
        """A double hybrid's PT2 term, scaled: c_OS E_OS + c_SS E_SS, Hartree."""
        dh = self._double_hybrid_only("e_pt2")
        return dh["e_pt2"]

    @property
    def e_disp(self) -> float:
        """A double hybrid's dispersion energy (0 where its definition has none), Hartree."""
        dh = self._double_hybrid_only("e_disp")
        return dh["e_disp"]

    def energies(self) -> dict:
        """Hartree. MP2: E(HF), the spin components, MP2, SCS- and SOS-MP2, e_tot (= e_mp2). A double
        hybrid: its parts only (E(DFT), the unscaled spin components, the scaled PT2 term, E_disp, the
        total as e_total and e_tot): MP2 energies on Kohn-Sham orbitals mean nothing."""
        if self.double_hybrid:
            dh = self.double_hybrid
            return {
                "e_dft": self.e_scf,
                "e_corr_os": self.e_os,
                "e_corr_ss": self.e_ss,
                "e_pt2": dh["e_pt2"],
                "e_disp": dh["e_disp"],
                "e_total": dh["e_total"],
                "e_tot": self.e_tot,
            }
        return {
            "e_hf": self.e_hf,
            "e_corr_os": self.e_os,
            "e_corr_ss": self.e_ss,
            "e_corr": self.e_corr,
            "e_mp2": self.e_mp2,
            "e_corr_scs": self.e_corr_scs,
            "e_scs_mp2": self.e_hf + self.e_corr_scs,
            "e_corr_sos": self.e_corr_sos,
            "e_sos_mp2": self.e_hf + self.e_corr_sos,
            "e_tot": self.e_tot,
        }

    def to_dict(self) -> dict:
        d = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        for k in ("e_scf", "e_os", "e_ss"):
            d.pop(k)
        d["energies"] = self.energies()
        d["ran"] = json_ran(d["ran"])
        d["units"] = {
            "energies": "hartree",
            "timings": "s",
            "flops": "floating-point operations",
            "wall_s": "s",
            "memory": "MB",
            "peak_rss_mb": "MB",
            "geometry": "angstrom",
        }
        if (self.properties or {}).get("dipole"):
            d["units"]["dipole"] = "debye and e*bohr (properties.dipole: 'debye' and 'au' of each kind)"
            d["units"]["dipole_origin"] = "bohr"
        d["shapes"] = {k: d.pop(k) for k in ("nbasis", "nmo", "nocc", "nfrozen", "nvir", "naux")}
        return d

    def write_json(self, path) -> None:
        """Write atomically (dfmp2.io.outputs.write_text: a half-written file never appears under
        ``path``, and a device such as /dev/null is written into, not replaced)."""
        from dfmp2.io.outputs import write_json

        write_json(path, self.to_dict(), indent=2)

    def render(self, console, quiet: bool = False, verbose: bool = False) -> None:
        """Print the human-readable tables with rich; ``quiet`` (``-q``): the energies table and
        any notes, without the 'problem and what ran' table; ``verbose`` (``-v``): that table
        also gives each stage's GF/s (its flops through dfmp2.linalg over its seconds)."""
        from rich.markup import escape  # user text (file names, basis names) is not markup

        console.print(double_hybrid_table(self) if self.double_hybrid else self._energies_table())
        s = self._problem_table(verbose)
        if not quiet:
            console.print(s)
        dipole = (self.properties or {}).get("dipole")
        if dipole:
            console.print(dipole_table(dipole))
        if self.profile:
            for table in profile_tables(self.profile):
                console.print(table)
        self.render_warnings(console)
        if self.ran.get("simulated"):
            console.print(
                f"[bold yellow]note:[/] {escape(self.ran['device'])} was simulated on this CPU "
                f"({escape(self.ran['engine'])}); the timings are not Trainium timings."
            )

    def _energies_table(self):
        """The rich Table of the HF, MP2, SCS- and SOS-MP2 energies (Hartree)."""
        from rich.markup import escape
        from rich.table import Table

        e = self.energies()
        method = "DF-UMP2" if self.spin else "DF-MP2"
        t = Table(title=f"{method}  {self.formula}  ({escape(self.molecule)})", title_justify="left")
        t.add_column("quantity")
        t.add_column("energy / Eh", justify="right")
        rows = [
            ("E(HF)", "e_hf"),
            ("E_corr opposite-spin", "e_corr_os"),
            ("E_corr same-spin", "e_corr_ss"),
            ("E_corr MP2", "e_corr"),
            ("E(MP2)", "e_mp2"),
            ("E_corr SCS-MP2", "e_corr_scs"),
            ("E(SCS-MP2)", "e_scs_mp2"),
            ("E_corr SOS-MP2", "e_corr_sos"),
            ("E(SOS-MP2)", "e_sos_mp2"),
        ]
        for label, key in rows:
            t.add_row(label, f"{e[key]:.10f}")
        return t

    def _problem_table(self, verbose: bool):
        """The rich Table 'problem and what ran': basis sets, SCF, reference and shapes, device,
        kernels, integrals, timings (and ``verbose``: GF/s), memory."""
        from rich.markup import escape
        from rich.table import Table

        from dfmp2.io.molecule import describe_ecp

        s = Table(title="problem and what ran", title_justify="left", show_header=False)
        s.add_column("k", no_wrap=True)  # a label stays whole however long its value (it is searched for)
        s.add_column("v")
        scf = (
            f"DF-{self._hf} ({escape(str(self.jk_auxbasis))})" if self.jk_auxbasis else f"{self._hf} (exact integrals)"
        )
        s.add_row("basis / aux (MP2) / SCF", escape(f"{self.basis} / {self.auxbasis} / ") + scf)
        sr = self.ran.get("scf") or {}
        if sr:
            where = sr.get("device", "host")
            s.add_row(
                "SCF",
                escape(
                    f"{sr.get('engine')} on {where}, {sr.get('iterations')} iterations"
                    + (", from the checkpoint" if sr.get("source") == "checkpoint" else "")
                ),
            )
        if self.double_hybrid:
            s.add_row("double hybrid", escape(double_hybrid_summary(self.double_hybrid)))
        s.add_row("ECP", escape(describe_ecp(self.ecp)))
        self._add_reference_rows(s)
        s.add_row(
            "device / engine / precision",
            escape(f"{self.ran['device']} / {self.ran['engine']} / {self.ran['precision']}"),
        )
        s.add_row("metric", self.ran.get("metric", ""))
        if self.ran.get("cpu_blas"):
            s.add_row("cpu BLAS", escape(cpu_blas_summary(self.ran["cpu_blas"])))
        s.add_row("kernels", escape(", ".join(f"{k}×{n}" for k, n in self.ran["kernels"].items())))
        if self.ran.get("integrals"):
            i = self.ran["integrals"]
            text = f"{i['engine']} ({i.get('note') or i.get('why', '')})"
            jk = (self.ran.get("scf") or {}).get("integrals") or {}
            if jk.get("engine") and jk["engine"] != i["engine"]:  # integrals.select_jk_engine
                text = f"MP2: {text}; JK factor: {jk['engine']} ({jk.get('why', '')})"
            s.add_row("integrals", escape(text))
        s.add_row(
            "timings / s",
            ", ".join(f"{k} {v:.3f}" for k, v in self.timings.items()) + f"; total {sum(self.timings.values()):.3f}",
        )
        if verbose:
            s.add_row("GF/s (linalg flops / s)", self.rates())
        s.add_row("memory / MB", self.memory_summary())
        return s

    def _add_reference_rows(self, s) -> None:
        """The reference's rows of the 'problem and what ran' table: UHF's multiplicity and <S²>,
        the shapes (per spin for a UHF), a UHF's correlation energy per spin pair."""
        if self.spin:
            sp = self.spin
            s.add_row(
                "reference", f"UHF, multiplicity {sp['multiplicity']}, <S²> {sp['s2']:.4f} (exact {sp['s2_exact']:.4f})"
            )
            s.add_row(
                "shapes",
                f"nbasis {self.nbasis}, nocc α {sp['nocc_alpha']} β {sp['nocc_beta']} "
                f"(+{self.nfrozen} frozen each), nvir α {sp['nvir_alpha']} β {sp['nvir_beta']}, "
                f"naux {self.naux}",
            )
            s.add_row(
                "E_corr αα / ββ / αβ", f"{sp['e_corr_aa']:.10f} / {sp['e_corr_bb']:.10f} / {sp['e_corr_ab']:.10f}"
            )
        else:
            s.add_row(
                "shapes",
                f"nbasis {self.nbasis}, nocc {self.nocc} (+{self.nfrozen} frozen), nvir {self.nvir}, naux {self.naux}",
            )

    def memory_summary(self) -> str:
        """'plan's peak 631 of 1000, +315 resident before; process peak RSS 1117': the plan's
        estimate of its arrays against the limit, what the process held besides when the plan was
        made (``memory.process_mb``), then what the whole process used (``peak_rss_mb``: per stage)."""
        text = f"plan's peak {self.memory['peak_mb']:.0f} of {self.memory['limit_mb']:.0f}"
        if self.memory.get("process_mb"):
            text += f", +{self.memory['process_mb']:.0f} resident before"
        if self.peak_rss_mb:
            text += f"; process peak RSS {max(self.peak_rss_mb.values()):.0f}"
        return text

    def rates(self) -> str:
        """'whole run 21.4; scf 1.2, pair 40.3, ...': the whole run's GF/s (all flops over wall_s)
        first, where a narrow table cell never wraps it, then each timed stage's that ran linalg work."""
        parts = [f"{k} {self.flops[k] / v / 1e9:.3g}" for k, v in self.timings.items() if self.flops.get(k) and v > 0]
        whole = sum(self.flops.values()) / self.wall_s / 1e9 if self.wall_s > 0 else 0.0
        return f"whole run {whole:.3g}; " + ", ".join(parts)

    def render_warnings(self, console) -> None:
        """One 'warning:' line per entry of ``warnings`` (user text escaped for rich)."""
        from rich.markup import escape

        for w in self.warnings:
            console.print(f"[bold yellow]warning:[/] {escape(w)}")


def double_hybrid_table(result):
    """The energies of a double hybrid (``Result.double_hybrid``) as a rich table: E(DFT), the
    unscaled PT2 spin components, the scaled PT2 term, E_disp and the total, in Hartree."""
    from rich.markup import escape
    from rich.table import Table

    dh, e = result.double_hybrid, result.energies()
    f = dh["functional"]
    ks = dh["ks_scf"]["kind"]
    t = Table(
        title=f"double hybrid {escape(f['name'])} (DF-{ks} + DF-PT2)  {result.formula}  ({escape(result.molecule)})",
        title_justify="left",
    )
    t.add_column("quantity")
    t.add_column("energy / Eh", justify="right")
    disp = dh["dispersion"]
    for label, key in (
        (f"E(DFT) ({ks}, the functional's hybrid part)", "e_dft"),
        ("E_corr opposite-spin (unscaled)", "e_corr_os"),
        ("E_corr same-spin (unscaled)", "e_corr_ss"),
        (f"E_PT2 = {f['c_os']:g} OS + {f['c_ss']:g} SS", "e_pt2"),
        (f"E_disp ({disp['label']})" if disp else "E_disp (none in its definition)", "e_disp"),
        (f"E({escape(f['name'])})", "e_total"),
    ):
        t.add_row(label, f"{e[key]:.10f}")
    return t


def double_hybrid_summary(dh: dict) -> str:
    """One line of ``Result.double_hybrid``: the xc definition, the KS grid and fitting set, the
    dispersion's parameters (the 'problem and what ran' table)."""
    f, ks, disp = dh["functional"], dh["ks_scf"], dh["dispersion"]
    g = ks["grid"]
    return (
        f"{f['xc']}; KS on the host ({ks['engine']}), grid level {g['level']} ({g['points']} points, "
        f"{g['prune']}), SCF fitting {ks['jk_auxbasis'] or 'none (exact J/K)'}; dispersion "
        + (f"{disp['label']}, {disp['parameters']} ({disp['package']})" if disp else "none")
    )


def dipole_table(dip: dict):
    """``properties.dipole`` as a rich table: x, y, z and |μ| in debye of the HF, unrelaxed and
    relaxed densities (a double hybrid's KS and relaxed ones), |μ| in e·bohr too; the caption
    names the method and the origin."""
    from rich.table import Table

    t = Table(title=f"dipole moment / D  ({dip['method'].upper()} densities)", title_justify="left")
    for col in ("density", "x", "y", "z", "|μ| / D", "|μ| / e·bohr"):
        t.add_column(col, justify="left" if col == "density" else "right")
    rows: tuple[tuple[str, str], ...] = (("HF", "hf"), ("MP2 unrelaxed", "unrelaxed"), ("MP2 relaxed", "relaxed"))
    if "ks" in dip:  # a double hybrid's: its KS determinant's and its relaxed dipole
        rows = (("KS", "ks"), (f"{dip['method'].upper()} relaxed", "relaxed"))
    for label, key in rows:
        v = dip[key]
        t.add_row(label, *(f"{x:.6f}" for x in v["debye"]), f"{v['norm_debye']:.6f}", f"{v['norm_au']:.6f}")
    t.caption = f"about {dip['origin_rule']}" + (
        "; the molecule is charged: the dipole depends on the origin" if dip.get("origin_dependent") else ""
    )
    return t


def cpu_blas_summary(blas: dict) -> str:
    """One line of ``ran.cpu_blas`` (linalg.cpu_blas.CpuBlas.describe()): the library of each op
    and where the choice came from ('problem and what ran')."""
    if blas["mode"] != "auto":
        return f"{blas['mode']} for every op (--cpu-blas {blas['mode']})"
    ob = sorted(e for e, lib in blas["choice"].items() if lib == "openblas")
    which = f"openblas for {', '.join(ob)}; torch for the rest" if ob else "torch for every op"
    where = "measured by this run" if blas["source"] == "probe" else "from the cache"
    if blas.get("deferred"):
        where += ", not measured again: the machine was busy"
    return f"auto, {where} ({blas['status']}, {blas['probe_date'][:10]}): {which}"


def cpu_blas_table(blas: dict):
    """``ran.cpu_blas`` as a rich table (``dfmp2 run -v``, ``dfmp2 bench --blas``): per op, dtype
    and size class the choice, each library's GF/s (the best sample), the spread of its samples
    (2nd-best / best - 1), the samples taken and other processes' cores during the entry; the
    caption says where the table came from, its status and why, and the probe's load and time.
    None when the user forced a library (nothing was measured)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if blas.get("probe") is None:
        return None
    t = Table(
        title="cpu BLAS choice (--cpu-blas auto): GF/s of the best sample, spread % = 2nd-best / best - 1, "
        "n samples, other processes' cores",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("op/dtype/class", "choice", "torch", "OpenBLAS", "spread % t/o", "n", "other"):
        t.add_column(col, justify="left" if col in ("op/dtype/class", "choice") else "right", no_wrap=True)
    for e, r in blas["probe"]["measured"].items():
        g, s = r["gflops"], r["spread"]
        oc = r.get("other_cores")
        t.add_row(
            e,
            blas["choice"][e],
            f"{g['torch']:.1f}",
            f"{g['openblas']:.1f}",
            f"{100 * s['torch']:.1f}/{100 * s['openblas']:.1f}",
            str(r["samples"]),
            "-" if oc is None else f"{oc:.2f}",
        )
    load = blas["probe"]["load"]
    where = (
        f"measured by this run ({blas['remeasured_because']})"
        if blas["source"] == "probe"
        else f"from the cache {blas['cache']}" + (f" ({blas['deferred']})" if blas.get("deferred") else "")
    )
    other = load.get("other_cores")
    t.caption = escape(
        f"{where}; {blas['status']}"
        + (f": {blas['status_why']}" if blas["status_why"] else "")
        + f"; probe {blas['probe_seconds']:.1f} s on {blas['probe_date']}, other processes "
        + ("unknown" if other is None else f"{other:.2f} cores")
        + f" ({load['method']}); openblas only when faster by more than {blas['probe']['method']['margin']:.0%}"
        " plus both spreads" + (f"; cache not written: {blas['cache_error']}" if blas.get("cache_error") else "")
    )
    return t


def profile_tables(p: dict) -> list:
    """dfmp2 run --profile's tables (``Result.profile``): per stage, per part of the SCF's cycles,
    the top kernels. Seconds, MB (1e6 bytes); 'waits': the host waiting on a device result."""
    from rich.markup import escape
    from rich.table import Table

    def sec(x):
        return "—" if x is None else f"{x:.3f}"

    def mb(n):
        return f"{n / 1e6:.1f}"

    cols = ("wall s", "host CPU s", "device busy s", "H→D MB", "D→H MB", "ops", "waits")
    out: list = []  # rich Tables, and a note line (str)
    for title, rows, extra in (
        (
            f"profile on {p['device']}: stages (outside them {p['outside_stages_s']:.2f} s: {_set_up(p)})",
            p["stages"],
            False,
        ),
        (f"the SCF's {p['scf_cycles'] or '?'} cycles by part (each part synchronised)", p["scf_regions"], True),
    ):
        if not rows:
            continue
        t = Table(title=escape(title), title_justify="left")
        for c in ("part" if extra else "stage", *(("calls",) if extra else ()), *cols):
            t.add_column(c, justify="left" if c in ("stage", "part") else "right")
        for name, r in rows.items():
            t.add_row(
                escape(name),
                *((str(r["calls"]),) if extra else ()),
                sec(r["wall_s"]),
                sec(r["host_cpu_s"]),
                sec(r["device_busy_s"]),
                mb(r["h2d_bytes"]),
                mb(r["d2h_bytes"]),
                str(r["ops"]),
                str(r["host_waits"]),
            )
        out.append(t)
    if p.get("note"):
        out.append(f"[yellow]note:[/] {escape(p['note'])}")
    t = Table(title=escape(f"top kernels by {p['top_kernels_by']}"), title_justify="left")
    for c in ("kernel", "calls", "s"):
        t.add_column(c, justify="left" if c == "kernel" else "right")
    for r in p["top_kernels"]:
        t.add_row(escape(r["name"][:70]), str(r["calls"]), f"{r['seconds']:.3f}")
    out.append(t)
    return out


def _set_up(p: dict) -> str:
    """The seconds outside the stages, by part (Profile.report's ``set_up``)."""
    names = {
        "prepare_s": "prepare",
        "profiler_start_s": "the profiler's start",
        "until_first_stage_s": "plan",
        "after_last_stage_s": "after",
        "profiler_stop_s": "the profiler's stop",
    }
    return ", ".join(f"{names[k]} {v:.2f}" for k, v in p["set_up"].items() if v is not None)
