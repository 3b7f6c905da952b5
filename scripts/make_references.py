#!/usr/bin/env python
"""Reference DF-MP2 energies from an independent code: PySCF's own DF-MP2.

    python scripts/make_references.py                    # (re)compute every case -> inputs/references.json
    python scripts/make_references.py --subset fast      # only the fast cases (others kept as stored)
    python scripts/make_references.py --check            # recompute and compare with the stored file
    python scripts/make_references.py --check water      # ... only the cases of molecule 'water'

The molecule and the RHF come from the program's own PySCF bridge (``dfmp2.io.xyz.read_xyz``,
``dfmp2.io.molecule.build_molecule``, ``dfmp2.scf.pyscf_scf.run_rhf``), so both codes start from the same SCF set-up
(PySCF's RHF, same thresholds). The MP2 energy itself comes from ``pyscf.mp.dfmp2.DFMP2``, never
from this program's pipeline. Because a density-fitted SCF would hand DFMP2 its JK-fit basis, the
MP2-fit basis is set explicitly: ``pt.with_df = pyscf.df.DF(mol, auxbasis=...)``.

Open shells (inputs/open_shell/, charge and multiplicity on the XYZ comment line) start from the
program's UHF (``dfmp2.scf.pyscf_scf.run_uhf``: PySCF's DF-UHF, or UHF with exact integrals) and take the
energy from ``pyscf.mp.dfump2.DFUMP2`` on the same MP2-fit basis; their entries add the reference
('UHF'), the beta shapes and <S^2>. PySCF's DIIS UHF stops at the program's gradient threshold
(1e-9), which for some radicals (NO, CN) leaves E_corr about 1e-9 Eh from its converged value, so
each UHF is then polished with PySCF's own second-order machinery (``polish_uhf``: Newton steps on
``mf.newton()``'s orbital gradient and Hessian, same JK-fit set) to an orbital-gradient norm below
``POLISH_CONV_TOL_GRAD``, checked with PySCF's ``mf.get_grad``; the entry's ``scf.polish`` says
what was done and what was reached.

Each case is keyed ``molecule|basis|auxbasis|scf_mode|ae|fc`` (see ``case_key``) and stores
E_HF, E_OS, E_SS, E_corr, E_MP2 (Hartree) with the basis, auxiliary bases, SCF mode and
thresholds, frozen-core setting, shapes, PySCF version, date and seconds taken.

Subsets: ``fast`` (seconds; the default test channel), ``full`` (the slow channel: everything
else that is checked against the program), ``large`` (reference only, for benchmarks; not part of
the regression run). ``--subset all`` means every case.
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

DEFAULT_OUTPUT = ROOT / "inputs" / "references.json"
CHECK_TOL = 1e-10  # Hartree: regenerated references must reproduce the stored ones
POLISH_CONV_TOL_GRAD = 1e-11  # orbital-gradient norm the open-shell (UHF) references are polished to
POLISH_MAX_STEPS = 10
ENERGY_FIELDS = ("e_hf", "e_os", "e_ss", "e_corr", "e_mp2")
SCHEMA = 1

# ---------------------------------------------------------------------------------------------
# The cases. (path relative to the repository, scf_mode, frozen_core, subset); basis cc-pVDZ and
# its MP2-fit auxiliary basis unless stated.
# ---------------------------------------------------------------------------------------------
SMALL = [
    "water",
    "ammonia",
    "methane",
    "hydrogen_fluoride",
    "dinitrogen",
    "carbon_monoxide",
    "ethylene",
    "formaldehyde",
    "benzene",
    "glycine",
    "hydrogen_cyanide",
    "acetylene",
    "methanol",
    "hydrogen_chloride",
    "hydrogen_sulfide",
    "pyridine",
    "acetamide",
    "formic_acid",
]
# Cluster sizes checked against the program in the slow channel; LARGE_CLUSTERS are reference-only.
CLUSTERS = [1, 2, 3, 4, 6, 8, 12, 16]
LARGE_CLUSTERS = [24, 32]

FAST = [  # (molecule path, scf_mode, frozen_core): both SCF modes, both frozen-core settings
    ("inputs/water.xyz", "df", False),
    ("inputs/water.xyz", "df", True),
    ("inputs/water.xyz", "exact", False),
    ("inputs/water.xyz", "exact", True),
    ("inputs/ammonia.xyz", "df", False),
    ("inputs/methane.xyz", "df", False),
    ("inputs/hydrogen_fluoride.xyz", "df", False),
    ("inputs/hydrogen_chloride.xyz", "df", True),  # second row: 5 frozen core orbitals
    ("inputs/hydrogen_chloride.xyz", "exact", False),
]
FULL_VARIANTS = [  # non-default settings on larger molecules
    ("inputs/ammonia.xyz", "exact", True),
    ("inputs/hydrogen_sulfide.xyz", "df", True),
    ("inputs/hydrogen_sulfide.xyz", "exact", True),
    ("inputs/glycine.xyz", "df", True),
    ("inputs/glycine.xyz", "exact", False),
    ("inputs/benzene.xyz", "df", True),
    ("inputs/benzene.xyz", "exact", True),
    ("inputs/s22/s22_02_water_dimer.xyz", "exact", False),
    ("inputs/s22/s22_02_water_dimer.xyz", "df", True),
    ("inputs/water_clusters/h2o_04.xyz", "exact", True),
]


# Open shells (UHF + DF-UMP2): doublet radicals, a vertical cation and anion, triplets, and larger
# doublets. FAST_OPEN are seconds each; the rest go to the slow channel.
FAST_OPEN = [
    ("inputs/open_shell/hydroxyl.xyz", "df", False),
    ("inputs/open_shell/hydroxyl.xyz", "df", True),
    ("inputs/open_shell/hydroxyl.xyz", "exact", False),
    ("inputs/open_shell/methylene_triplet.xyz", "df", False),
    ("inputs/open_shell/water_cation.xyz", "df", False),
    ("inputs/open_shell/superoxide.xyz", "df", False),
]
FULL_OPEN = ["methyl", "nitric_oxide", "cyano", "dioxygen_triplet", "allyl", "tert_butyl", "glycyl"]


def _s22_paths() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "inputs" / "s22").glob("s22_*.xyz"))


def all_cases(basis: str = "cc-pvdz", auxbasis: str | None = None) -> list[dict]:
    """Every reference case, in a fixed order, as dicts with path/molecule/options/subset."""
    seen, out = set(), []

    def add(path, scf_mode, frozen_core, subset):
        key = (path, scf_mode, frozen_core)
        if key in seen:
            return
        seen.add(key)
        out.append(
            {
                "molecule": Path(path).stem,
                "path": path,
                "basis": basis,
                "auxbasis_requested": auxbasis,
                "scf_mode": scf_mode,
                "frozen_core": frozen_core,
                "subset": subset,
            }
        )

    for path, mode, fc in FAST:
        add(path, mode, fc, "fast")
    for name in SMALL:
        add(f"inputs/{name}.xyz", "df", False, "full")
    for path in _s22_paths():
        add(path, "df", False, "full")
    for n in CLUSTERS:
        add(f"inputs/water_clusters/h2o_{n:02d}.xyz", "df", False, "full")
    for path, mode, fc in FULL_VARIANTS:
        add(path, mode, fc, "full")
    for path, mode, fc in FAST_OPEN:
        add(path, mode, fc, "fast")
    for name in FULL_OPEN:
        add(f"inputs/open_shell/{name}.xyz", "df", False, "full")
    for n in LARGE_CLUSTERS:
        add(f"inputs/water_clusters/h2o_{n:02d}.xyz", "df", False, "large")
    return out


def case_key(molecule: str, basis: str, auxbasis: str, scf_mode: str, frozen_core: bool) -> str:
    """The key of a reference: 'molecule|basis|auxbasis|scf_mode|fc' (or '|ae'), names lower-case."""
    return "|".join([molecule, basis.lower(), auxbasis.lower(), scf_mode, "fc" if frozen_core else "ae"])


# ---------------------------------------------------------------------------------------------
def compute_reference(case: dict) -> dict:
    """Run PySCF RHF + PySCF DF-MP2 (UHF + DF-UMP2 for an open shell) for one case; returns the
    stored entry (energies in Hartree)."""
    import numpy as np
    import pyscf
    from pyscf import df
    from pyscf.mp.dfmp2 import DFMP2
    from pyscf.mp.dfump2 import DFUMP2

    from dfmp2.df import basis as df_basis
    from dfmp2.io import molecule as io_molecule
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf import pyscf_scf

    t0 = time.perf_counter()
    geom = read_xyz(ROOT / case["path"])
    mol = io_molecule.build_molecule(geom, case["basis"])
    auxbasis = df_basis.mp2_auxbasis(mol, case["auxbasis_requested"])
    aux_name = df_basis.describe_auxbasis(auxbasis)
    uhf = io_molecule.resolve_reference("auto", geom) == "uhf"
    ref = (pyscf_scf.run_uhf if uhf else pyscf_scf.run_rhf)(mol, case["scf_mode"])
    mf = ref.mf
    polish = None
    if uhf:  # the DIIS UHF at the program's 1e-9 gradient is not converged enough (see polish_uhf)
        polish = polish_uhf(mf)
        ref = pyscf_scf.from_pyscf(mf, scf=ref.scf, jk_auxbasis=ref.jk_auxbasis)
    t_scf = time.perf_counter() - t0

    nfrozen = io_molecule.frozen_core_count(mol) if case["frozen_core"] else 0
    pt = (DFUMP2 if uhf else DFMP2)(mf, frozen=nfrozen if nfrozen else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt.with_df = df.DF(mol, auxbasis=auxbasis)  # the MP2-fit basis, not the SCF's JK-fit one
    pt.verbose = 0
    e_corr, _ = pt.kernel(with_t2=False)
    e_os, e_ss = float(pt.e_corr_os), float(pt.e_corr_ss)
    if abs(e_os + e_ss - float(e_corr)) > 1e-12:
        raise RuntimeError(f"{case['path']}: PySCF E_OS + E_SS != E_corr")
    naux = pt.with_df.get_naoaux()
    occ = np.asarray(mf.mo_occ)
    nmo = int(np.asarray(mf.mo_coeff).shape[-1])
    nocc_all = int(np.count_nonzero((occ[0] if uhf else occ) > 0))
    entry = {
        "key": case_key(case["molecule"], case["basis"], aux_name, case["scf_mode"], case["frozen_core"]),
        "molecule": case["molecule"],
        "path": case["path"],
        "subset": case["subset"],
        "natm": mol.natm,
        "nelectron": mol.nelectron,
        "basis": case["basis"].lower(),
        "auxbasis": aux_name.lower(),
        "auxbasis_requested": case["auxbasis_requested"],
        "scf_mode": case["scf_mode"],
        "scf_jk_auxbasis": ref.jk_auxbasis,
        "scf": {
            "conv_tol": mf.conv_tol,
            "conv_tol_grad": mf.conv_tol_grad,
            "max_cycle": mf.max_cycle,
            "init_guess": mf.init_guess,
            "cycles": ref.scf.iterations,
            "converged": bool(mf.converged),
        },
        "frozen_core": case["frozen_core"],
        "nfrozen": nfrozen,
        "nbasis": mol.nao_nr(),
        "nmo": nmo,
        "nocc": nocc_all - nfrozen,
        "nvir": nmo - nocc_all,
        "naux": int(naux),
        "e_hf": float(ref.e_hf),
        "e_os": e_os,
        "e_ss": e_ss,
        "e_corr": float(e_corr),
        "e_mp2": float(ref.e_hf) + float(e_corr),
        "units": "hartree",
        "method": "pyscf.scf.RHF (via dfmp2.scf.pyscf_scf.run_rhf) + pyscf.mp.dfmp2.DFMP2, "
        "with_df = pyscf.df.DF(mol, auxbasis=<MP2-fit basis>)",
        "reference": "RHF",
        "pyscf_version": pyscf.__version__,
        "numpy_version": np.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": {"scf": round(t_scf, 2), "total": round(time.perf_counter() - t0, 2)},
    }
    if uhf:
        nocc_b = int(np.count_nonzero(occ[1] > 0))
        entry.update(
            {
                "reference": "UHF",
                "charge": mol.charge,
                "multiplicity": mol.spin + 1,
                "nocc_beta": nocc_b - nfrozen,
                "nvir_beta": nmo - nocc_b,
                "s2": ref.s2,
                "s2_exact": ref.s2_exact,
                "method": "pyscf.scf.UHF (via dfmp2.scf.pyscf_scf.run_uhf) polished by pyscf.soscf Newton steps "
                "(polish_uhf) + pyscf.mp.dfump2.DFUMP2, "
                "with_df = pyscf.df.DF(mol, auxbasis=<MP2-fit basis>)",
            }
        )
        entry["scf"].update(polish)
    return entry


def _gradient_norm(mf, mo_coeff, mo_occ) -> float:
    """PySCF's own orbital-gradient norm (``mf.get_grad``, as its SCF kernel measures it)."""
    import numpy as np

    fock = mf.get_fock(dm=mf.make_rdm1(mo_coeff, mo_occ))
    return float(np.linalg.norm(mf.get_grad(mo_coeff, mo_occ, fock)))


def polish_uhf(mf, conv_tol_grad: float = POLISH_CONV_TOL_GRAD, max_steps: int = POLISH_MAX_STEPS) -> dict:
    """Converge PySCF's UHF ``mf`` (DIIS-converged, density-fitted or not) further, in place, with
    PySCF's second-order solver: Newton steps on the orbital gradient g and exact orbital Hessian H
    of ``mf.newton()`` (``pyscf.soscf.newton_ah``: ``gen_g_hop``, ``update_rotate_matrix``,
    ``rotate_mo``; the same J/K as ``mf``, so the same JK-fit set), H x = -g solved by MINRES
    (scipy), until PySCF's ``mf.get_grad`` norm is below ``conv_tol_grad``; then canonicalised
    (``mf.canonicalize``) as PySCF's SCF ends. Its own kernel (``mf.newton().kernel``) is not used
    because its augmented-Hessian Davidson cannot start from a gradient this small: its first
    trial vector's overlap |g|^2 (~1e-18) is below ``ah_lindep`` and it takes no step (with
    ``ah_lindep`` lowered it stalls at |g| ~ 4e-10 for NO, the 1-vs-|g|^2 scales of its subspace
    matrices losing the step). A Krylov solve of H x = -g is scale-free. RuntimeError if the
    threshold is not reached or the energy rises. Returns the record stored as ``scf.polish``."""
    import numpy as np
    import scipy.sparse.linalg as sla

    newton = mf.newton()
    newton.verbose, newton.callback = 0, None
    mo, occ = mf.mo_coeff, mf.mo_occ
    # both energies from the same call (mf.e_tot of the DIIS may differ by ~1e-12 Eh: incremental J/K)
    e_start, g_start = float(mf.energy_tot(mf.make_rdm1(mo, occ))), _gradient_norm(mf, mo, occ)
    gnorm, steps = g_start, 0
    while gnorm >= conv_tol_grad:
        if steps == max_steps:
            raise RuntimeError(
                f"UHF polish: orbital gradient {gnorm:.1e} after {steps} Newton steps (target {conv_tol_grad:g})"
            )
        fock = mf.get_fock(dm=mf.make_rdm1(mo, occ))
        g, h_op, h_diag = newton.gen_g_hop(mo, occ, fock)
        n = g.size
        hess = sla.LinearOperator((n, n), matvec=h_op, dtype=float)
        precond = sla.LinearOperator((n, n), matvec=lambda x: x / np.maximum(np.abs(h_diag), 1e-2), dtype=float)
        x, info = sla.minres(hess, -g, M=precond, rtol=1e-8, maxiter=200)
        if info != 0:
            raise RuntimeError(f"UHF polish: MINRES did not converge (info {info})")
        mo = newton.rotate_mo(mo, newton.update_rotate_matrix(x, occ, mo_coeff=mo))
        steps += 1
        gnorm = _gradient_norm(mf, mo, occ)
    dm = mf.make_rdm1(mo, occ)
    fock = mf.get_fock(dm=dm)
    e_tot = float(mf.energy_tot(dm))
    if e_tot - e_start > 1e-11:  # a rise beyond rounding: not the same minimum
        raise RuntimeError(f"UHF polish raised the energy by {e_tot - e_start:.1e} Eh")
    mo_energy, mo = mf.canonicalize(mo, occ, fock)
    mf.mo_coeff, mf.mo_energy, mf.e_tot = mo, mo_energy, e_tot
    return {
        "polish": "pyscf newton (SOSCF): Newton steps on mf.newton().gen_g_hop (orbital "
        "gradient and exact Hessian), H x = -g by scipy MINRES, then mf.canonicalize",
        "polish_conv_tol_grad": conv_tol_grad,
        "polish_steps": steps,
        "conv_tol_grad_start": g_start,
        "conv_tol_grad_reached": _gradient_norm(mf, mo, occ),
        "polish_e_hf_change": e_tot - e_start,
    }


def load(path: Path) -> dict:
    """The stored reference file ({'meta': ..., 'references': {key: entry}}), or an empty one."""
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "references": {}}


def save(data: dict, path: Path) -> None:
    """Write atomically (temp file + rename): never a half-written reference file."""
    import pyscf

    data["meta"] = {
        "schema": SCHEMA,
        "description": "DF-MP2 reference energies from PySCF's own DF-MP2 (pyscf.mp.dfmp2.DFMP2), "
        "an independent code; written by scripts/make_references.py",
        "units": "hartree",
        "generator": "scripts/make_references.py",
        "pyscf_version": pyscf.__version__,
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "key": "molecule|basis|auxbasis|scf_mode|ae-or-fc",
        "subsets": {
            "fast": "default test channel",
            "full": "slow channel",
            "large": "reference only (benchmarks), not in the regression run",
        },
    }
    data["references"] = dict(sorted(data["references"].items(), key=lambda kv: _order(kv[1])))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _order(entry: dict):
    return ({"fast": 0, "full": 1, "large": 2}.get(entry.get("subset"), 3), entry.get("nbasis", 0), entry["key"])


def select(cases: list[dict], subset: str, names: list[str]) -> list[dict]:
    """Cases in ``subset`` ('fast', 'full', 'large', 'all'; 'full' includes 'fast'), filtered by
    molecule names (exact name or shell-style pattern)."""
    from fnmatch import fnmatch

    wanted = {"fast": {"fast"}, "full": {"fast", "full"}, "large": {"large"}, "all": {"fast", "full", "large"}}[subset]
    out = [c for c in cases if c["subset"] in wanted]
    if names:
        out = [c for c in out if any(c["molecule"] == n or fnmatch(c["molecule"], n) for n in names)]
    return out


def compare(stored: dict, new: dict, tol: float = CHECK_TOL) -> list[str]:
    """Mismatches between a stored entry and a recomputed one ([] when they agree)."""
    bad = []
    for f in ENERGY_FIELDS:
        d = new[f] - stored[f]
        if not abs(d) <= tol:
            bad.append(f"{f}: stored {stored[f]:.12f}, recomputed {new[f]:.12f}, diff {d:+.2e}")
    for f in ("nbasis", "naux", "nocc", "nvir", "nfrozen", "auxbasis", "scf_jk_auxbasis", "nocc_beta", "nvir_beta"):
        if stored.get(f) != new.get(f):
            bad.append(f"{f}: stored {stored.get(f)!r}, recomputed {new.get(f)!r}")
    for f in ("conv_tol", "conv_tol_grad"):  # the program's SCF thresholds changed: regenerate
        if stored["scf"].get(f) != new["scf"].get(f):
            bad.append(
                f"scf.{f}: stored with {stored['scf'].get(f)!r}, the program now uses "
                f"{new['scf'].get(f)!r}; regenerate the references"
            )
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("molecules", nargs="*", help="molecule names or patterns (default: all in subset)")
    ap.add_argument("--subset", choices=("fast", "full", "large", "all"), default="all")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="reference file")
    ap.add_argument("--check", action="store_true", help="recompute and compare with the stored file; write nothing")
    ap.add_argument("--tol", type=float, default=CHECK_TOL, help="--check tolerance (Hartree)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    args = ap.parse_args(argv)

    cases = select(all_cases(), args.subset, args.molecules)
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    if args.list:
        for c in cases:
            print(f"{c['subset']:5s} {c['scf_mode']:5s} {'fc' if c['frozen_core'] else 'ae'} {c['path']}")
        return 0
    data = load(args.output)
    stored_by_case = {
        (e["path"], e["basis"], e["auxbasis_requested"], e["scf_mode"], e["frozen_core"]): e
        for e in data["references"].values()
    }
    failures, t_all = 0, time.perf_counter()
    for n, case in enumerate(cases, 1):
        entry = compute_reference(case)
        tag = f"[{n}/{len(cases)}] {entry['key']}"
        info = (
            f"nbasis {entry['nbasis']:4d} naux {entry['naux']:5d}  E_HF {entry['e_hf']:.10f}  "
            f"E_corr {entry['e_corr']:.10f}  {entry['seconds']['total']:.1f} s"
        )
        if args.check:
            stored = stored_by_case.get(
                (case["path"], case["basis"].lower(), case["auxbasis_requested"], case["scf_mode"], case["frozen_core"])
            )
            if stored is None:
                print(f"{tag}: MISSING from {args.output}")
                failures += 1
                continue
            bad = compare(stored, entry, args.tol)
            print(f"{tag}: {'ok' if not bad else 'MISMATCH'}  {info}")
            for b in bad:
                print(f"    {b}")
            failures += bool(bad)
        else:
            data["references"][entry["key"]] = entry
            save(data, args.output)  # after each case: an interrupted run keeps what it did
            print(f"{tag}  {info}", flush=True)
    print(
        f"{len(cases)} case(s) in {time.perf_counter() - t_all:.1f} s"
        + (f", {failures} failed the check (tol {args.tol:.0e} Eh)" if args.check else f", written to {args.output}")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
