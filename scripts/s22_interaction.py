#!/usr/bin/env python
"""S22 counterpoise-corrected DF-MP2/cc-pVDZ interaction energies: this program against PySCF.

    python scripts/s22_interaction.py                  # S11: the 11 smaller dimers (Psi4's subset)
    python scripts/s22_interaction.py --all            # the whole S22 set, one command
    python scripts/s22_interaction.py --dimers 2,8 --threads 2

For each dimer (inputs/s22; fragments: the atoms of its _A file, then those of its _B file):
``dfmp2 interaction`` (``dfmp2.workflows.interaction.run_interaction``: cc-pVDZ, DF-RHF with cc-pVDZ-JKFIT,
DF-MP2 with cc-pVDZ-RI, all-electron, fp64 on the CPU), and PySCF computed the same way on its
own: ``pyscf.gto`` molecules with PySCF's 'ghost-' atoms, ``scf.RHF().density_fit('cc-pvdz-jkfit')``
and ``pyscf.mp.dfmp2.DFMP2`` with ``df.DF(mol, 'cc-pvdz-ri')``. |Δ| is the largest difference of
the CP-corrected ΔE(HF), ΔE(MP2), ΔE(SCS-MP2) between the two codes (the acceptance bound is
1e-9 Eh).

As information (MP2/cc-pVDZ is not expected to reproduce it): the published CCSD(T)/CBS
benchmark, S22B (Marshall, Burns, Sherrill, J. Chem. Phys. 135, 194102 (2011)), and the original
S22 values (Jurečka, Šponer, Černý, Hobza, Phys. Chem. Chem. Phys. 8, 1985 (2006)), both as
tabulated in Psi4's ``psi4/share/psi4/databases/S22.py`` (BIND_S22B, BIND_S220), kcal/mol.

Writes ``<out>.md`` and ``<out>.json`` (default scripts/results/s22_interaction) with the date,
versions, threads and the time of the whole table. 1 Eh = 627.5094740631 kcal/mol (CODATA 2018).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

S22_DIR = ROOT / "inputs" / "s22"
DEFAULT_OUT = ROOT / "scripts" / "results" / "s22_interaction"
SMALL = (1, 2, 3, 4, 8, 9, 10, 16, 17, 18, 19)  # S11, Psi4's 'smaller systems in S22' (<= 17 atoms)
TOL = 1e-9  # Hartree: |ΔE(this) - ΔE(PySCF)|
# CCSD(T)/CBS interaction energies, kcal/mol, by S22 number (Psi4's S22.py, see the docstring)
S22B = {
    1: -3.133,
    2: -4.989,
    3: -18.753,
    4: -16.062,
    5: -20.641,
    6: -16.934,
    7: -16.660,
    8: -0.527,
    9: -1.472,
    10: -1.448,
    11: -2.654,
    12: -4.255,
    13: -9.805,
    14: -4.524,
    15: -11.730,
    16: -1.496,
    17: -3.275,
    18: -2.312,
    19: -4.541,
    20: -2.717,
    21: -5.627,
    22: -7.097,
}
S220 = {
    1: -3.17,
    2: -5.02,
    3: -18.61,
    4: -15.96,
    5: -20.65,
    6: -16.71,
    7: -16.37,
    8: -0.53,
    9: -1.51,
    10: -1.50,
    11: -2.73,
    12: -4.42,
    13: -10.12,
    14: -5.22,
    15: -12.23,
    16: -1.53,
    17: -3.28,
    18: -2.35,
    19: -4.46,
    20: -2.74,
    21: -5.73,
    22: -7.05,
}
BASIS, JK, RI = "cc-pvdz", "cc-pvdz-jkfit", "cc-pvdz-ri"


def dimer_files() -> dict:
    """{S22 number: dimer path}."""
    out = {}
    for p in sorted(S22_DIR.glob("s22_[0-9][0-9]_*.xyz")):
        if not p.stem.endswith(("_A", "_B")):
            out[int(p.stem.split("_")[1])] = p
    return out


def fragments_of(path: Path) -> list[list[int]]:
    """0-based atoms of monomers A and B: the dimer's atoms in order, checked against the
    _A and _B files (same symbols and coordinates)."""
    from dfmp2.io.xyz import read_xyz

    dimer = read_xyz(path)
    a = read_xyz(path.with_name(path.stem + "_A.xyz"))
    b = read_xyz(path.with_name(path.stem + "_B.xyz"))
    if (
        a.symbols + b.symbols != dimer.symbols
        or (a.coords_angstrom.tolist() + b.coords_angstrom.tolist()) != dimer.coords_angstrom.tolist()
    ):
        raise SystemExit(f"{path}: its _A and _B files are not its atoms in order")
    return [list(range(a.natm)), list(range(a.natm, dimer.natm))]


# ---- PySCF on its own -----------------------------------------------------------------------
def pyscf_totals(atoms: str, charge: int = 0, spin: int = 0) -> dict:
    """E(HF), E(MP2), E(SCS-MP2) in Eh from PySCF alone (DF-RHF cc-pVDZ-JKFIT, DFMP2 cc-pVDZ-RI;
    DF-UHF and DFUMP2 for ``spin`` = 2S > 0; SCF thresholds and cycle limit as dfmp2.scf.pyscf_scf's).
    ``atoms``: PySCF atom text in Ångström, ghosts 'ghost-O'."""
    from pyscf import df, gto, scf
    from pyscf.mp.dfmp2 import DFMP2
    from pyscf.mp.dfump2 import DFUMP2

    from dfmp2.scf.pyscf_scf import SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE

    mol = gto.M(atom=atoms, basis=BASIS, unit="Angstrom", charge=charge, spin=spin, verbose=0)
    mf = (scf.UHF(mol) if spin else scf.RHF(mol)).density_fit(auxbasis=JK)
    mf.conv_tol, mf.conv_tol_grad, mf.max_cycle = SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE
    mf.kernel()
    if not mf.converged:
        raise SystemExit(
            f"PySCF's RHF did not converge in {SCF_MAX_CYCLE} cycles "
            f"({mol.natm} atoms, {mol.nelectron} electrons, nbasis {mol.nao_nr()})"
        )
    pt = DFUMP2(mf) if spin else DFMP2(mf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt.with_df = df.DF(mol, auxbasis=RI)
        pt.kernel()
    os_, ss = pt.e_corr_os, pt.e_corr_ss
    return {"HF": float(mf.e_tot), "MP2": float(mf.e_tot + os_ + ss), "SCS-MP2": float(mf.e_tot + 1.2 * os_ + ss / 3)}


def pyscf_interaction(path: Path, fragments, states=None, total=(0, 0)) -> dict:
    """{'cp': {method: ΔE}, 'nocp': {...}} (Eh) from PySCF for fragments given as 0-based atoms;
    ``states``: each fragment's (charge, 2S), ``total``: the full system's (default all (0, 0))."""
    lines = [ln for ln in path.read_text().splitlines()[2:] if ln.strip()]
    states = states or [(0, 0)] * len(fragments)

    def atoms(keep, ghost=()):
        return "\n".join(("ghost-" if i in ghost else "") + lines[i] for i in sorted(keep))

    every = set(range(len(lines)))
    full = pyscf_totals(atoms(every), *total)
    cp = [pyscf_totals(atoms(every, ghost=every - set(f)), *st) for f, st in zip(fragments, states)]
    own = [pyscf_totals(atoms(f), *st) for f, st in zip(fragments, states)]
    return {key: {m: full[m] - sum(p[m] for p in parts) for m in full} for key, parts in (("cp", cp), ("nocp", own))}


# ---- the table ------------------------------------------------------------------------------
def run_dimer(n: int, path: Path) -> dict:
    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions
    from dfmp2.workflows.interaction import HARTREE_TO_KCAL, resolve_fragments, run_interaction

    frags = fragments_of(path)
    geom = read_xyz(path)
    spec = ",".join(f"{f[0] + 1}-{f[-1] + 1}" for f in frags)
    t0 = time.perf_counter()
    ours = run_interaction(geom, resolve_fragments(geom, spec), RunOptions(basis=BASIS))
    t1 = time.perf_counter()
    ref = pyscf_interaction(path, frags)
    t2 = time.perf_counter()
    full = ours.runs[0].result
    diff = max(abs(ours.deltas["cp"][m] - ref["cp"][m]) for m in ref["cp"])
    kcal = {key: {m: v * HARTREE_TO_KCAL for m, v in d.items()} for key, d in ours.deltas.items()}
    return {
        "n": n,
        "name": path.stem[len("s22_00_") :],
        "file": str(path.relative_to(ROOT)),
        "fragments": spec,
        "natm": geom.natm,
        "nbasis": full.nbasis,
        "naux": full.naux,
        "dfmp2_hartree": ours.deltas,
        "pyscf_hartree": ref,
        "dfmp2_kcal": kcal,
        "max_abs_diff_cp_hartree": diff,
        "within_tol": diff <= TOL,
        "s22b_kcal": S22B[n],
        "s220_kcal": S220[n],
        "seconds": {"dfmp2": t1 - t0, "pyscf": t2 - t1},
    }


def summarise(rows: list[dict]) -> dict:
    def mae(key, method, ref):
        return sum(abs(r["dfmp2_kcal"][key][method] - r[ref]) for r in rows) / len(rows)

    return {
        "dimers": [r["n"] for r in rows],
        "max_abs_diff_cp_hartree": max(r["max_abs_diff_cp_hartree"] for r in rows),
        "all_within_tol": all(r["within_tol"] for r in rows),
        "tol_hartree": TOL,
        "mae_kcal_vs_s22b": {
            f"{m} {'CP' if k == 'cp' else 'uncorrected'}": mae(k, m, "s22b_kcal")
            for k in ("cp", "nocp")
            for m in ("MP2", "SCS-MP2")
        },
        "mae_kcal_vs_s220": {
            f"{m} {'CP' if k == 'cp' else 'uncorrected'}": mae(k, m, "s220_kcal")
            for k in ("cp", "nocp")
            for m in ("MP2", "SCS-MP2")
        },
    }


def markdown(report: dict) -> str:
    s, v = report["summary"], report["versions"]
    out = [
        "# S22: CP-corrected DF-MP2/cc-pVDZ interaction energies, dfmp2 vs PySCF",
        "",
        f"{report['date']}; {report['machine']}; {report['threads']} thread(s); load average "
        f"{report['load_average_1min']['start']:.1f} at the start, "
        f"{report['load_average_1min']['end']:.1f} at the end (timings are this machine's, shared); dfmp2 "
        f"{v['dfmp2']}, PySCF {v['pyscf']}, torch {v['torch']}, numpy {v['numpy']}, Python "
        f"{v['python']}.",
        "",
        f"Command: `{report['command']}`; whole table {report['seconds']:.1f} s "
        f"(dfmp2 {sum(r['seconds']['dfmp2'] for r in report['rows']):.1f} s, PySCF "
        f"{sum(r['seconds']['pyscf'] for r in report['rows']):.1f} s). Dimers: "
        f"{', '.join(map(str, s['dimers']))}{' (the whole S22 set)' if len(s['dimers']) == 22 else ''}"
        f"{' (S11, the smaller half of S22)' if tuple(s['dimers']) == SMALL else ''}.",
        "",
        "cc-pVDZ, DF-RHF (cc-pVDZ-JKFIT), DF-MP2 (cc-pVDZ-RI), all-electron, fp64, CPU. Fragments: "
        "monomer A then B (inputs/s22 `_A`, `_B`). CP: Boys-Bernardi, each monomer in the dimer "
        "basis with ghost atoms carrying the orbital and both fitting sets. PySCF computed the "
        "same way on its own (`ghost-` atoms, `density_fit('cc-pvdz-jkfit')`, `DFMP2` with "
        "cc-pVDZ-RI). |Δ|: the largest difference of CP ΔE(HF), ΔE(MP2), ΔE(SCS-MP2) between the "
        f"two codes. kcal/mol = Eh × {report['hartree_to_kcal']} (CODATA 2018).",
        "",
        "Reference (information only; MP2/cc-pVDZ is not expected to reach it): CCSD(T)/CBS, "
        "S22B (Marshall, Burns, Sherrill, J. Chem. Phys. 135, 194102 (2011)); the original S22 "
        "(Jurečka et al., Phys. Chem. Chem. Phys. 8, 1985 (2006)) in the JSON and the MAE lines; "
        "both as tabulated in Psi4's `databases/S22.py`.",
        "",
        "| # | dimer | atoms | nbasis | CP MP2 kcal/mol | PySCF CP MP2 | largest diff. / Eh | CP SCS-MP2 | "
        "uncorr. MP2 | S22B | CP MP2 − S22B | dfmp2 s | PySCF s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    k = report["hartree_to_kcal"]
    for r in report["rows"]:
        cp = r["dfmp2_kcal"]["cp"]
        out.append(
            f"| {r['n']} | {r['name'].replace('_', ' ')} | {r['natm']} | {r['nbasis']} | "
            f"{cp['MP2']:.3f} | {r['pyscf_hartree']['cp']['MP2'] * k:.3f} | "
            f"{r['max_abs_diff_cp_hartree']:.1e} | {cp['SCS-MP2']:.3f} | "
            f"{r['dfmp2_kcal']['nocp']['MP2']:.3f} | {r['s22b_kcal']:.3f} | "
            f"{cp['MP2'] - r['s22b_kcal']:+.3f} | {r['seconds']['dfmp2']:.1f} | "
            f"{r['seconds']['pyscf']:.1f} |"
        )
    out += [
        "",
        f"Largest |Δ| against PySCF: {s['max_abs_diff_cp_hartree']:.1e} Eh "
        f"({'all within' if s['all_within_tol'] else 'NOT all within'} {TOL:g} Eh).",
        "",
        "MAE / kcal/mol over these dimers (information): "
        + "; ".join(
            f"{m}: {s['mae_kcal_vs_s22b'][m]:.3f} vs S22B, {s['mae_kcal_vs_s220'][m]:.3f} vs S22 (2006)"
            for m in s["mae_kcal_vs_s22b"]
        )
        + ".",
        "",
    ]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="the whole S22 set")
    ap.add_argument("--dimers", default=None, help="S22 numbers, e.g. 1,2,8 [default: S11, the 11 smaller]")
    ap.add_argument("--threads", type=int, default=1, help="torch and PySCF threads [default: 1]")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output stem (.md and .json are written)")
    args = ap.parse_args(argv)
    files = dimer_files()
    if args.all:
        chosen = sorted(files)
    elif args.dimers:
        try:
            chosen = sorted({int(x) for x in args.dimers.split(",")})
        except ValueError:
            ap.error(f"--dimers: give S22 numbers separated by commas, got '{args.dimers}'")
        if not set(chosen) <= set(files):
            ap.error(f"--dimers: S22 numbers are 1-22, got '{args.dimers}'")
    else:
        chosen = list(SMALL)
    import torch
    from pyscf import lib

    from dfmp2.io.outputs import check_output_file, write_text
    from dfmp2.io.result import software_versions
    from dfmp2.workflows.interaction import HARTREE_TO_KCAL

    for ext in (".md", ".json"):
        check_output_file(args.out + ext, "--out")
    torch.set_num_threads(args.threads)
    lib.num_threads(args.threads)
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    rows = []
    for n in chosen:
        row = run_dimer(n, files[n])
        rows.append(row)
        print(
            f"S22 #{n:2d} {row['name']:<40s} CP MP2 {row['dfmp2_kcal']['cp']['MP2']:8.3f} kcal/mol, "
            f"|Δ| vs PySCF {row['max_abs_diff_cp_hartree']:.1e} Eh, "
            f"{row['seconds']['dfmp2']:.1f} s + PySCF {row['seconds']['pyscf']:.1f} s",
            flush=True,
        )
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python scripts/s22_interaction.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.uname().machine}, {os.cpu_count()} cores visible",
        "threads": args.threads,
        "seconds": time.perf_counter() - t0,
        # other processes share this machine: its 1-minute load average at start and end
        "load_average_1min": {"start": load_start[0], "end": os.getloadavg()[0]},
        "hartree_to_kcal": HARTREE_TO_KCAL,
        "units": {"energies": "hartree unless *_kcal", "seconds": "s"},
        "method": {
            "basis": BASIS,
            "jk_auxbasis": JK,
            "mp2_auxbasis": RI,
            "frozen_core": False,
            "precision": "fp64",
            "device": "cpu",
        },
        "benchmark_sources": {
            "s22b_kcal": "Marshall, Burns, Sherrill, J. Chem. Phys. 135, 194102 (2011), CCSD(T)/CBS "
            "(Psi4 databases/S22.py BIND_S22B)",
            "s220_kcal": "Jurecka, Sponer, Cerny, Hobza, Phys. Chem. Chem. Phys. 8, 1985 (2006), "
            "CCSD(T)/CBS (Psi4 databases/S22.py BIND_S220)",
        },
        "summary": summarise(rows),
        "rows": rows,
        "versions": software_versions(),
    }
    write_text(args.out + ".json", json.dumps(report, indent=2) + "\n")
    write_text(args.out + ".md", markdown(report))
    print(
        f"whole table {report['seconds']:.1f} s; largest |Δ| {report['summary']['max_abs_diff_cp_hartree']:.1e} Eh; "
        f"wrote {args.out}.md and .json"
    )
    return 0 if report["summary"]["all_within_tol"] else 1


if __name__ == "__main__":
    sys.exit(main())
