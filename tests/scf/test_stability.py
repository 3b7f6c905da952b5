"""The internal stability check of a converged UHF (dfmp2.scf.stability, --scf-stability): the lowest
orbital-Hessian eigenvalue of our DF-UHF's products against PySCF's own products
(pyscf.soscf.newton_ah.gen_g_hop_uhf) and PySCF's verdict (pyscf.scf.stability.uhf_internal) on
the same orbitals: H2 stretched to 2.5 A, whose singlet UHF from PySCF's guess stays on the
restricted solution (a saddle point: unstable), and H2 at 0.74 A (stable)."""

import numpy as np
import pytest
from click.testing import CliRunner
from pyscf import scf as pyscf_scf
from pyscf.scf import stability as pyscf_stability

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.xyz import parse_xyz
from dfmp2.options import RunOptions
from dfmp2.scf import driver, stability
from dfmp2.scf.settings import SCFSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def h2(r):
    return parse_xyz(f"2\nH2 at {r} A, singlet\nH 0 0 0\nH 0 0 {r}\n", "h2.xyz")


def pyscf_on(mol, ref):
    """PySCF's DF-UHF object (our JK-fit set) carrying our converged orbitals."""
    mf = pyscf_scf.UHF(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.verbose = 0
    mf.mo_coeff = np.stack([c.mo_coeff for c in ref.channels])
    mf.mo_energy = np.stack([c.mo_energy for c in ref.channels])
    mf.mo_occ = np.stack([(np.arange(c.nmo) < c.nocc).astype(float) for c in ref.channels])
    return mf


@pytest.mark.parametrize("r,stable", [(2.5, False), (0.74, True)])
def test_h2_lowest_eigenvalue_matches_pyscf(r, stable):
    mol = molecule.build_molecule(h2(r), multiplicity=1)
    ref = driver.run_scf(mol, linalg.get_backend("cpu"), SCFSettings(unrestricted=True, stability=True))
    ours = ref.scf.stability
    mf = pyscf_on(mol, ref)
    theirs = stability.lowest_root(*stability.pyscf_product(mf), ran="PySCF")
    _, pyscf_stable = pyscf_stability.uhf_internal(mf, return_status=True, verbose=0)
    assert abs(ours["lowest"] - theirs.lowest) < 1e-6, (ours["lowest"], theirs.lowest)
    assert ours["stable"] is stable is pyscf_stable
    assert (ours["lowest"] < -0.1) if not stable else (ours["lowest"] > 0.1)  # far from the threshold
    assert ours["ran"].startswith("ours") and ours["products"] > 0


def test_pipeline_warns_of_an_instability_and_records_it():
    r = run(h2(2.5), RunOptions(reference="uhf", multiplicity=1))
    s = r.ran["scf"]["stability"]
    assert s["stable"] is False and s["threshold"] == stability.STABLE_ABOVE
    (w,) = [w for w in r.warnings if w.startswith("internal instability")]
    assert f"{s['lowest']:.3e}" in w and "stability" in r.timings
    ok = run(h2(0.74), RunOptions(reference="uhf", multiplicity=1))
    assert ok.ran["scf"]["stability"]["stable"] is True
    assert not any(w.startswith("internal instability") for w in ok.warnings)
    off = run(h2(2.5), RunOptions(reference="uhf", multiplicity=1, scf_stability=False))
    assert off.ran["scf"]["stability"] is None and "stability" not in off.timings
    assert not any(w.startswith("internal instability") for w in off.warnings)
    assert run(h2(0.74), RunOptions()).ran["scf"]["stability"] is None  # RHF: no check


def test_pyscf_scf_is_checked_with_pyscfs_products_on_the_host():
    """--scf pyscf-df: PySCF's UHF, checked with PySCF's products (recorded as such); the same
    lowest eigenvalue as ours on our UHF (triplet O2, unstable toward a symmetry-broken UHF
    0.13 mEh lower, as PySCF's own uhf_internal finds on its UHF) to the Davidson's tolerance."""
    path = "inputs/open_shell/dioxygen_triplet.xyz"
    ours = run(path, RunOptions()).ran["scf"]["stability"]
    theirs = run(path, RunOptions(scf_mode="pyscf-df")).ran["scf"]["stability"]
    assert theirs["ran"].startswith("PySCF on the host") and ours["ran"].startswith("ours")
    assert abs(ours["lowest"] - theirs["lowest"]) < 1e-4 and not ours["stable"] and not theirs["stable"]


def test_cli_turns_the_check_off(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main, ["run", "inputs/open_shell/hydroxyl.xyz", "--no-scf-stability", "--json", str(out), "-q"]
    )
    assert res.exit_code == 0, res.output
    import json

    assert json.loads(out.read_text())["ran"]["scf"]["stability"] is None
