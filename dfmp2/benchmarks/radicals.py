"""The open-shell series of ``dfmp2 bench`` (``--radicals``): the DF-UMP2 stage after the SCF on the
radicals, triplets and ions of inputs/open_shell/, ours against PySCF's DFUMP2 on the same orbitals,
by the water series' rules (``waters.stage_runs``, ``waters.time_pyscf_fair``).

For each molecule (cc-pVDZ / cc-pVDZ-RI, all-electron, charge and multiplicity from its XYZ
comment): the UHF once (PySCF's DF-UHF with the water series' thresholds, as the water series
takes PySCF's RHF; its seconds and cycles reported, not part of the stage, and our DF-UHF's
cycles on the same molecule beside them), then the stage (integrals, metric, transform, fit, and
the αα, ββ and αβ pair steps) per device and precision, and PySCF's ``mp.dfump2.DFUMP2`` kernel
in the fair baseline's subprocesses (dfmp2/benchmarks/fair_baseline.py), the fastest counted.
"""

from __future__ import annotations

import time

from dfmp2.benchmarks import waters as waters_mod
from dfmp2.errors import InputError
from dfmp2.io import INPUTS

OPEN_SHELL_DIR = INPUTS / "open_shell"
# by size: nbasis 19 (OH) to 95 (glycyl); 'all' takes every file of inputs/open_shell/
DEFAULT = ("hydroxyl", "methyl", "nitric_oxide", "allyl", "tert_butyl", "glycyl")


def available() -> list[str]:
    return sorted(p.stem for p in OPEN_SHELL_DIR.glob("*.xyz"))


def parse_radicals(text: str) -> list[str]:
    """'none', 'default' (DEFAULT), 'all' (every inputs/open_shell/ molecule) or a comma list of
    their names (file stems); InputError for an unknown name."""
    text = text.strip()
    if text == "none":
        return []
    if text in ("default", "all"):
        return list(DEFAULT) if text == "default" else available()
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in available()]
    if bad or not names:
        raise InputError(
            f"--radicals: unknown {', '.join(bad) or 'list'}; use none, default, all or names "
            f"from inputs/open_shell/ ({', '.join(available())})"
        )
    return names


def run_radical(
    name: str,
    devices: list,
    precisions: list[str],
    *,
    pyscf: bool,
    repeats: int,
    single_above_s: float,
    peak_gflops: dict,
    log=print,
) -> dict:
    """One open-shell molecule: its UHF once, our DF-UMP2 stage per (device backend factory,
    precision) of ``devices``, PySCF's DFUMP2 stage (``pyscf``). Times in s, energies in Hartree."""
    from dfmp2 import linalg
    from dfmp2.df import basis
    from dfmp2.io import molecule
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf import driver, pyscf_scf
    from dfmp2.scf.settings import SCFSettings

    path = OPEN_SHELL_DIR / f"{name}.xyz"
    mol = molecule.build_molecule(read_xyz(path), "cc-pvdz")
    auxbasis = basis.mp2_auxbasis(mol)
    auxmol = basis.make_auxmol(mol, auxbasis)
    t0 = time.perf_counter()
    with waters_mod.scf_tolerance():  # the same thresholds for both SCFs
        ref = pyscf_scf.run_uhf(mol, "pyscf-df", max_cycle=300)
        scf_s = time.perf_counter() - t0
        same = SCFSettings(
            max_cycle=300,
            conv_tol=waters_mod.SCF_CONV_TOL,
            conv_tol_grad=waters_mod.SCF_CONV_TOL_GRAD,
            unrestricted=True,
        )
        ours = driver.run_scf(mol, linalg.get_backend("cpu"), same)
    a, b = ref.channels
    naux = auxmol.nao_nr()
    flops = (
        sum(waters_mod.pair_flops(c.nocc, c.nvir_active, naux) for c in (a, b))
        + 2.0 * a.nocc * b.nocc * a.nvir_active * b.nvir_active * naux
    )
    row = {
        "radical": name,
        "molecule": f"inputs/open_shell/{path.name}",
        "charge": mol.charge,
        "multiplicity": mol.spin + 1,
        "basis": "cc-pvdz",
        "auxbasis": basis.describe_auxbasis(auxbasis),
        "nbasis": mol.nao_nr(),
        "nocc": [a.nocc, b.nocc],
        "nvir": [a.nvir_active, b.nvir_active],
        "naux": naux,
        "s2": ref.s2,
        "pair_flops": flops,
        "scf_s": scf_s,
        "scf_cycles": ref.scf.iterations,
        "scf": "PySCF DF-UHF (cpu)",
        "our_dfuhf_cycles": ours.scf.iterations,
        "scf_conv_tol": [waters_mod.SCF_CONV_TOL, waters_mod.SCF_CONV_TOL_GRAD],
        "runs": [],
    }
    log(
        f"{name}: nbasis {row['nbasis']}, nocc {a.nocc}/{b.nocc}, naux {naux}; UHF {scf_s:.1f} s, "
        f"{ref.scf.iterations} cycles (ours {ours.scf.iterations})"
    )

    def single(prec):
        return flops / ((peak_gflops.get(prec) or 10.0) * 1e9) > single_above_s

    row["runs"] += waters_mod.stage_runs(mol, auxmol, ref, devices, precisions, repeats=repeats, single=single, log=log)
    if pyscf:
        one = single("fp64")
        row["runs"].append(
            waters_mod.time_pyscf_fair(path, ref, repeats=1 if one else repeats, warmup=0 if one else 1, log=log)
        )
        waters_mod.compare_with_pyscf(row["runs"])
    return row
