"""The DF-SCF's screened JK factor (dfmp2.scf.jk.significant_pairs): the kept pairs are exactly
those the Schwarz bound keeps (checked against PySCF's exact (μν|μν)), every layout of the
screened factor gives the same J and K, within the bound of the unscreened ones, the memory plan
counts the kept pairs only, and a run's energies stay within 1e-9 Eh of the unscreened run's and
of PySCF's DF-RHF, with what was kept in the result."""

import itertools

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.df.outofcore import Scratch
from dfmp2.interfaces.api import run
from dfmp2.io import molecule as io_molecule
from dfmp2.io.xyz import Geometry
from dfmp2.options import RunOptions
from dfmp2.scf import driver, jk, pyscf_scf
from dfmp2.timing import Timer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = (
    ("O", (0.0, 0.0, 0.0)),
    ("H", (0.58588228, 0.53524471, 0.53524471)),
    ("H", (0.58588228, -0.53524471, -0.53524471)),
)


def chain(n: int, spacing: float) -> Geometry:
    """n waters on a line, ``spacing`` Å apart (O to O): a molecule whose far pairs vanish."""
    atoms = [(s, np.array(x) + [k * spacing, 0.0, 0.0]) for k in range(n) for s, x in WATER]
    return Geometry(tuple(s for s, _ in atoms), np.array([x for _, x in atoms]), 0, 1, "water chain", "chain")


@pytest.fixture(scope="module")
def far():
    mol = io_molecule.build_molecule(chain(3, 6.0), "cc-pvdz")
    return mol, basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))


def test_kept_pairs_are_the_schwarz_bound_s(far):
    """Kept: exactly the pairs of shell pairs whose largest exact sqrt((μν|μν)) (PySCF's int2e,
    not the screening's own code) reaches the threshold; None with threshold 0 or nothing dropped;
    a lower threshold keeps a superset."""
    mol, _ = far
    nao = mol.nao_nr()
    eri = mol.intor("int2e_sph", aosym="s1").reshape(nao * nao, nao * nao)
    diag = np.sqrt(np.abs(np.diag(eri))).reshape(nao, nao)
    loc = mol.ao_loc_nr()
    q = np.array([[diag[a:b, c:d].max() for c, d in itertools.pairwise(loc)] for a, b in itertools.pairwise(loc)])
    shell = np.repeat(np.arange(mol.nbas), np.diff(loc))
    rows, cols = np.tril_indices(nao)
    bound = q[shell[rows], shell[cols]]
    for th in (1e-12, 1e-8, 1e-4):
        kept = jk.significant_pairs(mol, th)
        assert kept is not None and 0 < len(kept) < jk.npair(nao)
        margin = (bound > th * 1.000001) | (bound < th * 0.999999)  # ties at the threshold: either way
        assert np.array_equal(np.isin(np.arange(len(bound)), kept)[margin], (bound >= th)[margin])
    assert set(jk.significant_pairs(mol, 1e-4)) <= set(jk.significant_pairs(mol, 1e-8))
    assert jk.significant_pairs(mol, 0.0) is None
    near = io_molecule.build_molecule(chain(1, 0.0), "cc-pvdz")
    assert jk.significant_pairs(near, 1e-12) is None  # one water: every pair kept


def test_screened_layouts_agree_and_stay_within_the_bound(far, tmp_path):
    """The screened factor packed, unpacked, in fp32 and on disk gives one J and K (to rounding),
    each a dropped pair's column zero; against the unscreened factor J and K move by less than the
    bound allows (threshold x the largest column norm x |D|, summed over the dropped pairs)."""
    mol, aux = far
    cpu = linalg.get_backend("cpu")
    th = 1e-6  # coarse, so that the difference is well above rounding
    pairs = jk.significant_pairs(mol, th)
    full, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu))
    scr, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), pairs=pairs)
    assert scr.B.shape == (aux.nao_nr(), len(pairs)) and scr.npairs == len(pairs)
    assert torch.equal(scr.B, full.B[:, torch.as_tensor(pairs)])  # the kept columns, bit for bit
    nao = mol.nao_nr()
    g = torch.Generator().manual_seed(3)
    C = torch.randn((nao, 5), generator=g, dtype=torch.float64)
    D = C @ C.T
    J0, K0 = full.coulomb(D), full.exchange(C)
    J1, K1 = scr.coulomb(D), scr.exchange(C)
    dropped = np.setdiff1d(np.arange(jk.npair(nao)), pairs)
    colmax = float(full.B.norm(dim=0).max())
    bound = len(dropped) * th * colmax * float(D.abs().max()) * 4
    assert 0 < float((J1 - J0).abs().max()) < bound and 0 < float((K1 - K0).abs().max()) < bound
    Ju, Ku = jk.unpacked(scr).jk([(C, None)])
    assert torch.allclose(Ju, J1, rtol=0, atol=1e-12) and torch.allclose(Ku[0], K1, rtol=0, atol=1e-12)
    r, c = np.tril_indices(nao)
    U = jk.unpacked(scr).B
    assert (
        float(U[:, r[dropped], c[dropped]].abs().max()) == 0.0 and float(U[:, c[dropped], r[dropped]].abs().max()) == 0
    )
    K32 = jk.fp32_unpacked(scr).exchange(C)
    assert torch.allclose(K32, K1, rtol=0, atol=1e-4 * float(K1.abs().max()))
    with Scratch(tmp_path) as scratch:
        disk, _ = jk.build_jk_factor(
            mol, aux, cpu, torch.float64, Timer(cpu), layout="disk", scratch=scratch, fit_mb=0.3, pairs=pairs
        )
        assert disk.ds.shape == (aux.nao_nr(), len(pairs)) and disk.disk_mb == pytest.approx(scr.B.numel() * 8e-6)
        assert torch.allclose(torch.from_numpy(disk.ds[...]), scr.B, rtol=0, atol=1e-12)
        disk.read_rows = 41
        for mapped in (True, False):
            if not mapped:
                disk.offset = None
            Jd, Kd = disk.jk([(C, None)])
            assert torch.allclose(Jd, J1, rtol=0, atol=1e-11) and torch.allclose(Kd[0], K1, rtol=0, atol=1e-11)
        assert disk.stats["read_bytes"] == 2 * scr.B.numel() * 8


def test_the_memory_plan_counts_the_kept_pairs():
    """The packed and disk factors are the kept pairs' size; a limit that only the screened
    factor fits in memory is met in memory, and the refusal names the screened pairs."""
    nao, naux, nocc = 400, 2000, 40
    kept = jk.npair(nao) // 3
    full = driver.memory_mb(nao, naux, nocc, 8)
    scr = driver.memory_mb(nao, naux, nocc, 8, pairs=kept)
    assert scr["factor"] == pytest.approx(naux * kept * 8e-6) and full["factor"] == pytest.approx(
        naux * jk.npair(nao) * 8e-6
    )
    disk = driver.memory_mb(nao, naux, nocc, 8, layout="disk", fit_mb=50.0, pairs=kept)
    assert disk["disk"] == pytest.approx(scr["factor"])
    limit = (scr["peak"] + full["peak"]) / 2
    assert driver.check_memory(nao, naux, nocc, 8, limit, pairs=kept)["layout"] == "packed"
    with pytest.raises(driver.MemoryLimitError, match=f"{kept} screened pairs"):
        driver.check_memory(nao, naux, nocc, 8, scr["peak"] / 2, pairs=kept)
    with pytest.raises(driver.MemoryLimitError, match=r"nbasis 400\(400\+1\)/2"):
        driver.check_memory(nao, naux, nocc, 8, limit)


@pytest.mark.heavy
def test_a_screened_run_gives_the_unscreened_energies_and_pyscf_s():
    """A water chain with pairs to drop: the default threshold keeps fewer pairs (recorded with
    the threshold and the MB saved), and E(HF) and E_corr are within 1e-9 Eh of every pair kept,
    E(HF) within 1e-9 Eh of PySCF's DF-RHF; the packed layout (a small memory limit) gives the
    unpacked one's energies."""
    geom = chain(3, 4.0)
    scr = run(geom, RunOptions())
    every = run(geom, RunOptions(scf_screen=0.0))
    packed = run(geom, RunOptions(memory_mb=20.0))
    s = scr.ran["scf"]["jk_factor"]["screening"]
    assert s["threshold"] == 1e-12 and 0 < s["pairs_kept"] < s["pairs_total"] and s["kept_mb"] < s["unscreened_mb"]
    assert every.ran["scf"]["jk_factor"]["screening"]["pairs_kept"] == s["pairs_total"]
    assert packed.ran["scf"]["jk_factor"]["layout"] == "packed"
    assert packed.ran["scf"]["jk_factor"]["shape"] == [scr.ran["scf"]["jk_factor"]["naux"], s["pairs_kept"]]
    assert abs(scr.e_hf - every.e_hf) < 1e-9 and abs(scr.e_corr - every.e_corr) < 1e-9
    assert abs(packed.e_hf - scr.e_hf) < 1e-10 and abs(packed.e_corr - scr.e_corr) < 1e-10
    theirs = pyscf_scf.run_rhf(io_molecule.build_molecule(geom), "pyscf-df")
    assert abs(scr.e_hf - theirs.e_hf) < 1e-9


def test_a_bad_threshold_is_one_error_line(tmp_path):
    xyz = tmp_path / "w.xyz"
    xyz.write_text("3\n\nO 0 0 0\nH 0.586 0.535 0.535\nH 0.586 -0.535 -0.535\n")
    for bad in ("-1", "1.5", "nan"):
        res = CliRunner().invoke(main, ["run", str(xyz), "-q", "--scf-screen", bad])
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(err) == 1 and err[0].startswith("error:") and "--scf-screen" in err[0]
    with pytest.raises(Exception, match="scf_screen"):
        RunOptions(scf_screen=-1e-3)
