"""The Python API: dfmp2.DFMP2(mf) as a drop-in for pyscf.mp.dfmp2.DFMP2 on the same
converged RHF (PySCF's own DFMP2 is the reference: its default fitting set, or the one both are
given), and dfmp2.energy()."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyscf import df, dft, gto
from pyscf import scf as pyscf_scf
from pyscf.mp.dfmp2 import DFMP2 as PySCFDFMP2

import dfmp2
from dfmp2.errors import InputError, MemoryLimitError

ROOT = Path(__file__).resolve().parents[2]
WATER = "O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477"


def converged_rhf(atom, basis="cc-pvdz", density_fit=True, **kw):
    mol = gto.M(atom=atom, basis=basis, verbose=0, **kw)
    mf = pyscf_scf.RHF(mol)
    if density_fit:
        mf = mf.density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    assert mf.converged
    return mf


def pyscf_dfmp2(mf, frozen, auxbasis):
    pt = PySCFDFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.verbose = 0
    pt.kernel()
    return pt


@pytest.mark.parametrize(
    "atom, basis, density_fit, frozen, auxbasis, kw",
    [
        (WATER, "cc-pvdz", True, None, None, {}),  # DF-RHF, default aux
        (
            "N 0 0 0.1; H 0 0.94 -0.27; H 0.81 -0.47 -0.27; H -0.81 -0.47 -0.27",
            "cc-pvdz",
            False,
            1,
            "cc-pvdz-ri",
            {},
        ),  # exact RHF, frozen int
        (
            "Cl 0 0 0.071; H 0 0 -1.207",
            "cc-pvdz",
            True,
            [0, 1, 2, 3, 4, 22],
            "def2-tzvpp-ri",
            {},
        ),  # list, a virtual too
        ("H 0 0 0; I 0 0 1.6092", "def2-svp", True, [0, 1, 2, 3], None, {"ecp": "def2-svp"}),  # an ECP on mf.mol
    ],
)
def test_drop_in_matches_pyscf_dfmp2_on_the_same_mf(atom, basis, density_fit, frozen, auxbasis, kw):
    mf = converged_rhf(atom, basis, density_fit, **kw)
    pt = dfmp2.DFMP2(mf, frozen=frozen, auxbasis=auxbasis).run()
    # auxbasis None: PySCF's own default (mf.with_df on a DF mf, else make_auxbasis(mp2fit=True))
    ref = pyscf_dfmp2(mf, frozen, auxbasis) if auxbasis else PySCFDFMP2(mf, frozen=frozen).run(verbose=0)
    for name in ("e_corr", "e_corr_os", "e_corr_ss", "e_tot", "emp2", "emp2_scs", "e_tot_scs"):
        assert abs(getattr(pt, name) - getattr(ref, name)) <= 1e-10, (name, getattr(pt, name) - getattr(ref, name))
    assert pt.e_hf == mf.e_tot and pt.e_corr < -1e-3
    assert pt.e_corr_sos == pytest.approx(1.3 * ref.e_corr_os, abs=1e-12)
    assert pt.ran["device"] == "cpu" and pt.ran["precision"] == "fp64" and pt.naux > 0
    assert (pt.nocc, pt.nmo) == (ref.nocc, ref.nmo)  # active counts, as PySCF's
    assert not pt.warnings  # PySCF's sets cover I (def2-universal-jkfit on the DF mf)


def test_kernel_returns_e_corr_and_pyscfs_amplitudes():
    """kernel() returns (e_corr, t2) as PySCF's does; run() leaves t2 to its first use."""
    mf = converged_rhf(WATER)
    ref = PySCFDFMP2(mf).run(verbose=0)
    e, t2 = dfmp2.DFMP2(mf).kernel()
    assert abs(e - ref.e_corr) <= 1e-10 and t2.shape == ref.t2.shape
    assert abs(t2 - ref.t2).max() <= 1e-10
    pt = dfmp2.DFMP2(mf).run()
    assert pt._t2 is None and abs(pt.t2 - ref.t2).max() <= 1e-10
    assert dfmp2.DFMP2(mf).kernel(with_t2=False)[1] is None
    pt.max_memory = 0.01  # t2 no longer fits: one clear error
    pt.t2 = None
    with pytest.raises(MemoryLimitError, match="do not fit in max_memory"):
        pt.t2  # noqa: B018 (the property's read raises)


def test_kernel_on_given_eris_runs_the_backends_pair_step():
    """kernel(eris=ao2mo()) sums the given ovL on the DFMP2's own device through the pair step,
    to PySCF's number, and ``ran`` names the device and kernel."""
    mf = converged_rhf(WATER)
    ref = PySCFDFMP2(mf).run(verbose=0)
    pt = dfmp2.DFMP2(mf)
    e, _ = pt.kernel(eris=pt.ao2mo(), with_t2=False)
    assert abs(e - ref.e_corr) <= 1e-10, e - ref.e_corr
    assert pt.ran["device"] == "cpu" and "eris.ovL" in pt.ran["path"]
    assert any(k.startswith("mp2_pair_energy:") for k in pt.ran["kernels"]), pt.ran["kernels"]


@pytest.mark.parametrize("frozen", [None, 1])
def test_uhf_reference_runs_dfump2_like_pyscf(frozen):
    """A converged PySCF DF-UHF (OH, doublet): DFMP2(mf) runs our DF-UMP2 on its orbitals and
    matches PySCF's DFUMP2 on the same mf with the same MP2-fit basis to 1e-10 Eh."""
    from pyscf.mp.dfump2 import DFUMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = pyscf_scf.UHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    assert mf.converged
    ours = dfmp2.DFMP2(mf, frozen=frozen, auxbasis="cc-pvdz-ri").run()
    ref = DFUMP2(mf, frozen=frozen)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    assert abs(ours.e_corr - ref.e_corr) <= 1e-10, (ours.e_corr, ref.e_corr)
    assert abs(ours.e_tot - ref.e_tot) <= 1e-10
    default, ref_default = dfmp2.DFMP2(mf, frozen=frozen).run(), DFUMP2(mf, frozen=frozen).run()
    assert abs(default.e_corr - ref_default.e_corr) <= 1e-10  # both: mf.with_df (JK-fit)
    rdm, ref_rdm = default.make_rdm1(), ref_default.make_rdm1()
    assert all(abs(a - b).max() <= 1e-9 for a, b in zip(rdm, ref_rdm))


def test_refusals_are_one_clear_error():
    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    unconverged = pyscf_scf.RHF(mol)
    unconverged.max_cycle = 1
    unconverged.kernel()
    assert not unconverged.converged
    with pytest.raises(InputError, match="has not converged"):
        dfmp2.DFMP2(unconverged).run()
    with pytest.raises(InputError, match="has not converged"):
        dfmp2.DFMP2(pyscf_scf.RHF(mol)).run()  # never run
    oh = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="sto-3g", spin=1, verbose=0)
    with pytest.raises(InputError, match=r"ROHF.* is not supported"):
        dfmp2.DFMP2(pyscf_scf.ROHF(oh).run()).run()
    with pytest.raises(InputError, match="Kohn-Sham"):
        dfmp2.DFMP2(dft.RKS(mol).run()).run()
    with pytest.raises(InputError, match="PySCF SCF object"):
        dfmp2.DFMP2("mf").run()
    mf = pyscf_scf.RHF(mol).run()
    for frozen, msg in (
        (5, "between 0 and 4"),
        (-1, "between 0 and 4"),
        ([7], "within -7..6"),
        ([0.5], "list of orbital indices"),
        (True, "None, an int"),
        ([0, 1, 2, 3, 4], "0 active occupied"),
        ([5, 6], "0 virtual"),
    ):
        with pytest.raises(InputError, match=msg):
            dfmp2.DFMP2(mf, frozen=frozen).run()
    with pytest.raises(InputError, match=r"unknown device|device"):
        dfmp2.DFMP2(mf, device="tpu").run()


def test_energy_from_an_xyz_file_and_a_mole_give_the_reference():
    ref = json.loads((ROOT / "inputs" / "references.json").read_text())["references"]["water|cc-pvdz|cc-pvdz-ri|df|ae"]
    r = dfmp2.energy(str(ROOT / "inputs" / "water.xyz"))
    assert abs(r.e_corr - ref["e_corr"]) <= 1e-9 and abs(r.e_hf - ref["e_hf"]) <= 1e-9
    lines = (ROOT / "inputs" / "water.xyz").read_text().splitlines()[2:]
    mol = gto.M(atom="\n".join(lines), basis="cc-pvdz", unit="Angstrom", verbose=0)
    m = dfmp2.energy(mol)
    assert abs(m.e_corr - r.e_corr) <= 1e-10 and abs(m.e_hf - r.e_hf) <= 1e-10
    assert (m.nbasis, m.naux, m.basis) == (r.nbasis, r.naux, "cc-pvdz")
    bohr = gto.M(
        atom=[(mol.atom_symbol(i), tuple(mol.atom_coords(unit="Bohr")[i])) for i in range(mol.natm)],
        unit="Bohr",
        basis="cc-pvdz",
        verbose=0,
    )
    assert abs(dfmp2.energy(bohr, frozen_core=True).e_hf - r.e_hf) <= 1e-9  # units carried over


def test_energy_of_a_mole_with_its_basis_ecp_matches_the_ecp_reference():
    ref = json.loads((ROOT / "inputs" / "references_ecp.json").read_text())["references"]["hydrogen_iodide|def2-svp|fc"]
    mol = gto.M(atom="H 0 0 0; I 0 0 1.6092", basis="def2-svp", ecp="def2-svp", verbose=0)
    r = dfmp2.energy(mol, frozen_core=True)
    assert r.ecp["elements"] == ["I"] and r.nfrozen == 4
    assert abs(r.e_corr - ref["e_corr"]) <= 1e-9 and abs(r.e_hf - ref["e_hf"]) <= 1e-9


def test_energy_refusals():
    with pytest.raises(InputError, match=r"unknown option.*nonsense"):
        dfmp2.energy("water.xyz", nonsense=1)
    with pytest.raises(InputError, match="no such file"):
        dfmp2.energy("/nonexistent/water.xyz")
    with pytest.raises(InputError, match=r"XYZ file path or a pyscf.gto.Mole"):
        dfmp2.energy(42)
    with pytest.raises(InputError, match="'H1' is not an element symbol"):  # a per-element dict is taken
        dfmp2.energy(
            gto.M(
                atom="O 0 0 0; H1 0 0 0.96; H 0 0.96 0",
                basis={"O": "cc-pvdz", "H1": "sto-3g", "H": "sto-3g"},
                verbose=0,
            )
        )
    with pytest.raises(InputError, match="not the ECP of its basis"):
        dfmp2.energy(gto.M(atom="H 0 0 0; I 0 0 1.61", basis="def2-svp", ecp="lanl2dz", verbose=0))


def test_import_stays_light():
    """``import dfmp2`` does not import torch or PySCF; the API loads on first use."""
    code = "import sys, dfmp2; print('torch' in sys.modules, 'pyscf' in sys.modules, callable(dfmp2.energy))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert out == ["False", "False", "True"]


# --- hardening: the API refuses what it cannot honour ------------
@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(frozen_core="no"), "option frozen_core must be True or False, got 'no'"),
        (dict(frozen_core="false"), "option frozen_core must be True or False"),
        (dict(memory_mb=-5), "option memory_mb must be a finite number above 0, got -5"),
        (dict(memory_mb=float("nan")), "option memory_mb must be a finite number above 0"),
        (dict(memory_mb="4GB"), "option memory_mb must be a number of MB or None, got '4GB'"),
        (dict(charge="1"), "option charge must be an integer or None, got '1'"),
        (dict(charge=True), "option charge must be an integer or None"),
        (dict(basis=123), "option basis must be a basis set name, 'El:name,El:name', or a {element: name"),
        (dict(scf_max_cycle=0), "option scf_max_cycle must be at least 1"),
    ],
)
def test_python_options_are_type_checked_before_any_work(kw, fragment, monkeypatch):
    import dfmp2.drivers.energy

    monkeypatch.setattr(dfmp2.drivers.energy, "prepare", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as e:
        dfmp2.energy(str(ROOT / "inputs" / "water.xyz"), **kw)
    assert e.value.option == next(iter(kw)) and "--" not in str(e.value)


@pytest.mark.parametrize("attr", [dict(cart=True), dict(nucmod="G")])
def test_energy_of_a_mole_refuses_what_it_would_drop_and_dfmp2_honours_it(attr):
    """cart=True gave the spherical result (3.5e-3 Eh off) and nucmod='G' was ignored (1.3e-5 Eh):
    energy(mol) now refuses them, and DFMP2(mf) on such an mf matches PySCF's DFMP2."""
    mf = converged_rhf(WATER, **attr)
    with pytest.raises(InputError, match=f"cannot carry the Mole's {next(iter(attr))}"):
        dfmp2.energy(mf.mol)
    ours = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri").run()
    theirs = pyscf_dfmp2(mf, None, "cc-pvdz-ri")
    assert abs(ours.e_corr - theirs.e_corr) <= 1e-9, (ours.e_corr, theirs.e_corr)
    if "cart" in attr:
        assert ours.nmo == 25


def test_rotated_orbitals_and_a_swapped_mol_are_refused():
    import numpy as np

    mf = converged_rhf(WATER)
    c = mf.mo_coeff.copy()
    i, a, t = 4, 5, 0.3  # HOMO and LUMO rotated by 0.3 rad
    c[:, i], c[:, a] = (
        np.cos(t) * mf.mo_coeff[:, i] + np.sin(t) * mf.mo_coeff[:, a],
        -np.sin(t) * mf.mo_coeff[:, i] + np.cos(t) * mf.mo_coeff[:, a],
    )
    mf.mo_coeff = c
    with pytest.raises(InputError, match="not its canonical SCF solution"):
        dfmp2.DFMP2(mf).run()
    mf = converged_rhf(WATER)
    mf.mol = gto.M(atom="N 0 0 0; H 0 0 1; H 0 1 0; H 1 0 0", basis="cc-pvdz", verbose=0)
    with pytest.raises(InputError, match="do not belong together"):
        dfmp2.DFMP2(mf).run()
    mf = converged_rhf(WATER)
    mf.mol = gto.M(atom="O 0 0 0.2; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="cc-pvdz", verbose=0)
    with pytest.raises(InputError, match="not orthonormal"):  # same size, another geometry
        dfmp2.DFMP2(mf).run()


def test_auxbasis_per_element_dict():
    mf = converged_rhf(WATER)
    per_element = {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}
    ours = dfmp2.DFMP2(mf, auxbasis=per_element).run()
    assert abs(ours.e_corr - pyscf_dfmp2(mf, None, "cc-pvdz-ri").e_corr) <= 1e-10
    path = str(ROOT / "inputs" / "water.xyz")
    assert dfmp2.energy(path, auxbasis=per_element).e_corr == dfmp2.energy(path).e_corr
    with pytest.raises(InputError, match="no entry for H"):
        dfmp2.energy(path, auxbasis={"O": "cc-pvdz-ri"})


def test_frozen_core_that_freezes_nothing_says_so():
    """Li2 has no core orbitals by PySCF's chemcore rule: --frozen-core freezes nothing, and the
    result says so instead of nothing."""
    mol = gto.M(atom="Li 0 0 0; Li 0 0 2.67", basis="cc-pvdz", verbose=0)
    r = dfmp2.energy(mol, frozen_core=True)
    assert r.nfrozen == 0 and any("no core orbitals to freeze" in w for w in r.warnings)
    assert not any(
        "no core orbitals" in w for w in dfmp2.energy(str(ROOT / "inputs" / "water.xyz"), frozen_core=True).warnings
    )


def test_near_degenerate_reference_is_warned():
    """H2 at 5 Å (HOMO-LUMO gap 0.108 Eh): E(MP2) falls below the exact (FCI) energy of the basis,
    with exit 0 and no word before. The regression molecules' gaps are 0.46 Eh
    and up; equilibrium H2 (0.79 Eh) is not warned."""
    from pyscf import fci

    stretched = gto.M(atom="H 0 0 0; H 0 0 5.0", basis="cc-pvdz", verbose=0)
    r = dfmp2.energy(stretched)
    assert any(w.startswith("near-degenerate reference: the HOMO-LUMO gap is 0.108 Eh") for w in r.warnings)
    mf = converged_rhf("H 0 0 0; H 0 0 5.0", density_fit=False)
    assert r.e_mp2 < fci.FCI(mf).kernel()[0]  # the reason for the warning
    assert any("near-degenerate" in w for w in dfmp2.DFMP2(mf).run().warnings)
    assert not any(
        "near-degenerate" in w
        for w in dfmp2.energy(gto.M(atom="H 0 0 0; H 0 0 0.74", basis="cc-pvdz", verbose=0)).warnings
    )


# --- the PySCF drop-in gives PySCF's number and honours PySCF's attributes ----------
DICT_BASIS = {"O": "cc-pvdz", "H": "cc-pvdz"}


@pytest.mark.parametrize("basis", ["cc-pvdz", DICT_BASIS], ids=["name", "dict"])
@pytest.mark.parametrize("density_fit", [True, False], ids=["df-mf", "exact-mf"])
def test_default_is_pyscfs_number(basis, density_fit):
    """No extra argument: dfmp2.DFMP2(mf).run() == pyscf.mp.dfmp2.DFMP2(mf).run() to 1e-10 Eh (on a
    DF mf both fit with mf.with_df, the JK-fit set; on an exact mf with make_auxbasis(mp2fit=True))."""
    mf = converged_rhf(WATER, basis, density_fit)
    ours, ref = dfmp2.DFMP2(mf).run(), PySCFDFMP2(mf).run(verbose=0)
    for name in ("e_corr", "e_corr_os", "e_corr_ss", "e_tot"):
        assert abs(getattr(ours, name) - getattr(ref, name)) <= 1e-10, (name, getattr(ours, name) - getattr(ref, name))
    assert ours.naux == ref.with_df.get_naoaux()
    assert ours.auxbasis_used == ("cc-pvdz-jkfit" if density_fit else "cc-pvdz-ri")


def test_attributes_set_after_construction_are_honoured():
    """with_df, auxbasis, frozen and max_memory set after construction change the run as they do
    in PySCF (they were silently ignored)."""
    mf = converged_rhf(WATER)
    ours, ref = dfmp2.DFMP2(mf), PySCFDFMP2(mf)
    e_jk = ours.run().e_corr
    ours.with_df, ref.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri"), df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    ref.run(verbose=0)
    assert abs(ours.run().e_corr - ref.e_corr) <= 1e-10 and abs(ours.e_corr - e_jk) > 1e-6
    ours.auxbasis, ref.with_df = "cc-pvdz-jkfit", df.DF(mf.mol, auxbasis="cc-pvdz-jkfit")
    assert ours.auxbasis == "cc-pvdz-jkfit" and abs(ours.run().e_corr - e_jk) <= 1e-10
    ours.frozen, ref.frozen = 1, 1
    assert abs(ours.run().e_corr - ref.run(verbose=0).e_corr) <= 1e-10 and ours.nocc == 4
    assert abs(ours.run(frozen=None).e_corr - e_jk) <= 1e-10  # run(**kwargs) sets first
    ours.max_memory = 1e-3
    with pytest.raises(MemoryLimitError):
        ours.run()
    ours.memory_mb = 4000
    assert ours.max_memory == 4000 and ours.run().e_corr == pytest.approx(e_jk, abs=1e-10)
    with pytest.raises(InputError, match="has no attribute nonsense"):
        ours.set(nonsense=1)
    with pytest.raises(InputError, match="not both"):
        dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", with_df=df.DF(mf.mol))
    other = gto.M(atom="O 0 0 0.2; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="cc-pvdz", verbose=0)
    ours.with_df = df.DF(other, auxbasis="cc-pvdz-ri")
    with pytest.raises(InputError, match="with_df belongs to another molecule"):
        ours.run()


def test_logs_through_pyscf_logger_at_the_mfs_verbosity(tmp_path):
    out = tmp_path / "pyscf.log"
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=4, output=str(out))
    mf = pyscf_scf.RHF(mol).density_fit().run()
    dfmp2.DFMP2(mf).run()
    text = out.read_text()
    assert "E(DFMP2) = " in text and "dfmp2: DF-MP2 stage on cpu (fp64" in text
    assert "dfmp2: fitting set cc-pvdz-jkfit" in text and "mf.with_df" in text
    mf.verbose = 0
    size = out.stat().st_size
    dfmp2.DFMP2(mf).run()
    mol.stdout.flush()
    assert out.stat().st_size == size  # verbose 0: nothing


def test_make_rdm1_matches_pyscf():
    mf = converged_rhf(WATER, density_fit=False)
    for frozen in (None, [0, 1, 5]):
        ours, ref = dfmp2.DFMP2(mf, frozen=frozen).run(), PySCFDFMP2(mf, frozen=frozen).run(verbose=0)
        assert abs(ours.make_rdm1() - ref.make_rdm1()).max() <= 1e-9
        assert abs(ours.make_rdm1(ao_repr=True) - ref.make_rdm1(ao_repr=True)).max() <= 1e-9
    # no kernel first (as PySCF's dfmp2_native): the densities come from the gradient's pair loop, no t2
    fresh = dfmp2.DFMP2(mf, frozen=[0, 1, 5])
    assert abs(fresh.make_rdm1() - ours.make_rdm1(t2=ours.t2)).max() <= 1e-9 and fresh.e_corr is None
    with pytest.raises(InputError, match="relaxed density comes from the Z-vector"):
        ours.make_rdm1(t2=ours.t2, relaxed=True)
    with pytest.raises(InputError, match="density-fitted mf"):  # the relaxed one's response is the DF-HF's
        fresh.make_rdm1(relaxed=True)


def test_set_frozen_and_scanner_as_pyscf():
    mf = converged_rhf(WATER)
    ours, ref = dfmp2.DFMP2(mf).set_frozen(), PySCFDFMP2(mf).set_frozen()
    assert ours.frozen == ref.frozen == 1
    assert abs(ours.run().e_corr - ref.run(verbose=0).e_corr) <= 1e-10
    # the reference is PySCF's DFMP2 on a fresh SCF at each geometry: PySCF 2.14's own DFMP2
    # scanner keeps the first geometry's mo_energy (3.6e-3 Eh off at the stretched one)
    scan = dfmp2.DFMP2(mf).as_scanner()
    stretched = "O 0 0 0.119; H 0 0.80 -0.50; H 0 -0.80 -0.50"
    for atom in (stretched, WATER):
        e = scan(gto.M(atom=atom, basis="cc-pvdz", verbose=0))
        fresh = PySCFDFMP2(converged_rhf(atom)).run(verbose=0).e_tot
        assert abs(e - fresh) <= 1e-8, e - fresh
