"""End-to-end DF-MP2 against PySCF's own DF-MP2 on the same basis, auxiliary basis and SCF.

The reference is PySCF's ``mp.dfmp2.DFMP2`` with the MP2-fit auxiliary basis set
explicitly (PySCF would otherwise reuse the SCF's JK-fit basis).
"""

from pathlib import Path

import pytest
from pyscf import df
from pyscf.mp import dfmp2 as pyscf_dfmp2

from dfmp2.df import basis as df_basis
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.result import SCS_OS, SCS_SS, SOS_OS
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.scf import pyscf_scf

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
TOL = {"fp64": 1e-9, "fp32": 1e-6}


def pyscf_reference(path, scf_mode, frozen_core, basis="cc-pvdz"):
    """(E_HF, E_corr, E_OS, E_SS) from PySCF's DF-MP2 with the MP2-fit auxiliary basis."""
    mol = molecule.build_molecule(read_xyz(path), basis)
    ref = pyscf_scf.run_rhf(mol, scf_mode)
    pt = pyscf_dfmp2.DFMP2(ref.mf, frozen=molecule.frozen_core_count(mol) if frozen_core else None)
    pt.with_df = df.DF(mol, auxbasis=df_basis.mp2_auxbasis(mol))
    pt.verbose = 0
    pt.kernel()
    return ref.e_hf, pt.e_corr, pt.e_corr_os, pt.e_corr_ss


def check(path, scf_mode="df", frozen_core=False, precisions=("fp64", "fp32")):
    e_hf, e_corr, e_os, e_ss = pyscf_reference(path, scf_mode, frozen_core)
    for precision in precisions:
        r = run(path, RunOptions(scf_mode=scf_mode, frozen_core=frozen_core, precision=precision))
        tol = TOL[precision]
        assert r.ran["precision"] == precision and r.ran["device"] == "cpu"
        assert abs(r.e_hf - e_hf) <= 1e-9
        assert abs(r.e_corr - e_corr) <= tol, (precision, r.e_corr - e_corr)
        assert abs(r.e_os - e_os) <= tol, (precision, r.e_os - e_os)
        assert abs(r.e_ss - e_ss) <= tol, (precision, r.e_ss - e_ss)
        scs_ref = SCS_OS * e_os + SCS_SS * e_ss
        assert abs(r.e_corr_scs - scs_ref) <= tol
        assert abs(r.e_corr_sos - SOS_OS * e_os) <= tol
        assert r.e_corr < -1e-3, "correlation energy must be negative and non-trivial"


@pytest.mark.parametrize("scf_mode", ["df", "exact"])
@pytest.mark.parametrize("frozen_core", [False, True])
def test_water_all_settings(scf_mode, frozen_core):
    check(INPUTS / "water.xyz", scf_mode, frozen_core)


@pytest.mark.parametrize("name", ["ammonia.xyz", "methane.xyz"])
def test_small_molecules(name):
    check(INPUTS / name, "df", False)


def test_frozen_core_exact_scf_two_heavy_atoms():
    # benzene (9 s) runs in the slow channel (test_benzene_and_larger_cluster_slow)
    check(INPUTS / "formaldehyde.xyz", "exact", True)


@pytest.mark.heavy
def test_water_cluster():
    check(INPUTS / "water_clusters" / "h2o_04.xyz", "df", False)


@pytest.mark.slow
@pytest.mark.parametrize("scf_mode", ["df", "exact"])
def test_benzene_and_larger_cluster_slow(scf_mode):
    check(INPUTS / "benzene.xyz", scf_mode, False)
    check(INPUTS / "water_clusters" / "h2o_08.xyz", scf_mode, True)


def test_small_occ_blocks_give_same_energy():
    """Several occupied blocks (off-diagonal blocks counted twice) equal one block."""
    path = INPUTS / "water_clusters" / "h2o_02.xyz"
    one = run(path, RunOptions())
    many = run(path, RunOptions(occ_block_max=3))
    assert many.memory["occ_block"] == 3
    assert abs(one.e_corr - many.e_corr) < 1e-12


def test_forced_eigh_metric_matches_cholesky(monkeypatch):
    """The near-singular-metric path (eigh, j2c^-1/2) gives the same energy as Cholesky."""
    from dfmp2 import linalg

    path = INPUTS / "water.xyz"
    chol = run(path, RunOptions())

    def failing_cholesky(a, *, backend=None):
        raise linalg.NotPositiveDefiniteError("forced failure to take the eigh path")

    monkeypatch.setattr(linalg, "cholesky", failing_cholesky)
    eig = run(path, RunOptions())
    assert chol.ran["metric"] == "cholesky" and eig.ran["metric"].startswith("eigh")
    assert abs(chol.e_corr - eig.e_corr) < 1e-10


def test_result_records_what_ran(tmp_path):
    r = run(INPUTS / "water.xyz", RunOptions(precision="fp32"))
    d = r.to_dict()
    assert d["ran"]["device"] == "cpu" and d["ran"]["engine"] == "torch"
    assert d["ran"]["precision"] == "fp32"
    assert any(k["op"] == "mp2_pair_energy" and k["calls"] > 0 for k in d["ran"]["kernels"])
    assert d["units"]["energies"] == "hartree"
    assert d["shapes"] == {"nbasis": 24, "nmo": 24, "nocc": 5, "nfrozen": 0, "nvir": 19, "naux": 84}
    assert d["auxbasis"] == "cc-pvdz-ri" and d["jk_auxbasis"] == "cc-pvdz-jkfit"
    assert set(d["timings"]) >= {"scf", "integrals", "metric", "transform", "fit", "pair"}
    assert d["energies"]["e_mp2"] == pytest.approx(d["energies"]["e_hf"] + d["energies"]["e_corr"], abs=1e-12)
