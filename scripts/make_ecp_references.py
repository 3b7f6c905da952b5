#!/usr/bin/env python
"""Reference DF-MP2 energies with effective core potentials, from PySCF alone.

    OMP_NUM_THREADS=1 python scripts/make_ecp_references.py          # -> inputs/references_ecp.json
    OMP_NUM_THREADS=1 python scripts/make_ecp_references.py --check  # recompute, compare, write nothing

A sibling of ``make_references.py`` for molecules with heavy elements (HI, I2, CH3I, SnH4 in
def2-SVP / def2-TZVP). Nothing here goes through the program's ECP or auxiliary-basis rules:
the molecule is ``pyscf.gto.M(atom=<xyz file>, basis=B, ecp=B)`` (PySCF attaches the def2 ECP,
28 core electrons, to I and Sn itself), every auxiliary basis is spelled out per element below
(def2-universal-jkfit for the DF-RHF; def2-*-RI for the MP2 fit where PySCF has it, i.e. H and C,
and for I and Sn, which PySCF's def2-*-RI files lack, the published def2-SVP-RIFIT / def2-TZVP-RIFIT
(Hellweg et al. 2007) read from the Basis Set Exchange package by PySCF's basis loader; the
package's version is stored with each entry), and the frozen core is
written out per element below (the chemical core minus the 14 orbitals inside the ECP). The
SCF is PySCF's DF-RHF with the program's thresholds; MP2 is ``pyscf.mp.dfmp2.DFMP2`` with
``with_df = pyscf.df.DF(mol, auxbasis=<MP2 fit>)``. Energies in Hartree.
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

OUTPUT = ROOT / "inputs" / "references_ecp.json"
CHECK_TOL = 1e-10
# (molecule file stem, basis, frozen core, subset): 'fast' runs in the default test channel
CASES = [
    ("hydrogen_iodide", "def2-svp", False, "fast"),
    ("hydrogen_iodide", "def2-svp", True, "fast"),
    ("hydrogen_iodide", "def2-tzvp", True, "full"),
    ("diiodine", "def2-svp", True, "full"),
    ("methyl_iodide", "def2-svp", False, "full"),
    ("stannane", "def2-svp", True, "full"),
    ("stannane", "def2-tzvp", False, "full"),
]
JK_FIT = "def2-universal-jkfit"  # Weigend's, defined H-Rn
MP2_FIT = {"def2-svp": "def2-svp-ri", "def2-tzvp": "def2-tzvp-ri"}
HEAVY = ("I", "Sn")  # def2 ECP, 28 electrons
MP2_FIT_HEAVY = {"def2-svp": "def2-svp-rifit", "def2-tzvp": "def2-tzvp-rifit"}  # the BSE package's
FROZEN = {"H": 0, "C": 1, "Sn": 4, "I": 4}  # 4s4p outside the [Ar]3d10 ECP core


def key(molecule, basis, frozen_core) -> str:
    return f"{molecule}|{basis}|{'fc' if frozen_core else 'ae'}"


def compute(molecule: str, basis: str, frozen_core: bool, subset: str) -> dict:
    import basis_set_exchange
    import numpy as np
    import pyscf
    from pyscf import df, gto, scf
    from pyscf.mp.dfmp2 import DFMP2

    from dfmp2.scf.pyscf_scf import SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE  # the same thresholds

    t0 = time.perf_counter()
    path = ROOT / "inputs" / "ecp" / f"{molecule}.xyz"
    lines = path.read_text().splitlines()
    atoms = "\n".join(lines[2 : 2 + int(lines[0])])
    mol = gto.M(atom=atoms, unit="Angstrom", basis=basis, ecp=basis, verbose=0)
    elements = sorted({mol.atom_pure_symbol(i) for i in range(mol.natm)})
    jk = {el: JK_FIT for el in elements}
    mp2 = {el: (MP2_FIT_HEAVY[basis] if el in HEAVY else MP2_FIT[basis]) for el in elements}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mf = scf.RHF(mol).density_fit(auxbasis=dict(jk))
        mf.conv_tol, mf.conv_tol_grad, mf.max_cycle, mf.verbose = (SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE, 0)
        mf.kernel()
    if not mf.converged:
        raise RuntimeError(f"{molecule}/{basis}: RHF did not converge")
    nfrozen = sum(FROZEN[mol.atom_pure_symbol(i)] for i in range(mol.natm)) if frozen_core else 0
    pt = DFMP2(mf, frozen=nfrozen or None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt.with_df = df.DF(mol, auxbasis=dict(mp2))
    pt.verbose = 0
    e_corr, _ = pt.kernel(with_t2=False)
    nocc_all = int(np.count_nonzero(mf.mo_occ > 0))
    core = {mol.atom_pure_symbol(i): int(mol.atom_nelec_core(i)) for i in range(mol.natm) if mol.atom_nelec_core(i)}
    return {
        "key": key(molecule, basis, frozen_core),
        "molecule": molecule,
        "subset": subset,
        "path": f"inputs/ecp/{molecule}.xyz",
        "basis": basis,
        "ecp": basis,
        "ecp_core_electrons": core,
        "nelectron": mol.nelectron,
        "jk_auxbasis": jk,
        "mp2_auxbasis": mp2,
        "frozen_core": frozen_core,
        "nfrozen": nfrozen,
        "nbasis": mol.nao_nr(),
        "nmo": int(mf.mo_coeff.shape[1]),
        "nocc": nocc_all - nfrozen,
        "nvir": int(mf.mo_coeff.shape[1]) - nocc_all,
        "naux": int(pt.with_df.get_naoaux()),
        "e_hf": float(mf.e_tot),
        "e_os": float(pt.e_corr_os),
        "e_ss": float(pt.e_corr_ss),
        "e_corr": float(e_corr),
        "e_mp2": float(mf.e_tot + e_corr),
        "units": "hartree",
        "scf": {"conv_tol": mf.conv_tol, "conv_tol_grad": mf.conv_tol_grad, "max_cycle": mf.max_cycle},
        "method": "pyscf.gto.M(basis=B, ecp=B); pyscf.scf.RHF(mol).density_fit(jk_auxbasis); "
        "pyscf.mp.dfmp2.DFMP2(mf, frozen=nfrozen), with_df = pyscf.df.DF(mol, mp2_auxbasis)",
        "pyscf_version": pyscf.__version__,
        "numpy_version": np.__version__,
        "basis_set_exchange_version": basis_set_exchange.version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="recompute and compare; write nothing")
    ap.add_argument("--subset", choices=("fast", "all"), default="all")
    args = ap.parse_args(argv)
    stored = json.loads(OUTPUT.read_text())["references"] if OUTPUT.exists() else {}
    out, bad = dict(stored), 0
    for molecule, basis, fc, subset in CASES:
        if args.subset == "fast" and subset != "fast":
            continue
        e = compute(molecule, basis, fc, subset)
        print(
            f"{e['key']:32s} nbasis {e['nbasis']:4d} naux {e['naux']:4d} E_HF {e['e_hf']:.10f} "
            f"E_corr {e['e_corr']:.10f} {e['seconds']:.1f} s",
            flush=True,
        )
        if args.check:
            s = stored.get(e["key"])
            diffs = [f for f in ("e_hf", "e_os", "e_ss") if s is None or abs(s[f] - e[f]) > CHECK_TOL]
            if diffs:
                bad += 1
                print(f"    MISMATCH in {diffs}" if s else "    MISSING")
        out[e["key"]] = e
    if not args.check:
        import pyscf

        doc = {
            "meta": {
                "description": "DF-MP2 with def2 ECPs from PySCF alone (pyscf.mp.dfmp2.DFMP2); "
                "written by scripts/make_ecp_references.py",
                "units": "hartree",
                "pyscf_version": pyscf.__version__,
                "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            },
            "references": out,
        }
        tmp = OUTPUT.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, OUTPUT)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
