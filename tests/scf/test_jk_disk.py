"""The DF-SCF's JK factor on disk (layout 'disk': dfmp2.scf.jk.fit_to_disk, DiskJKFactor): the
blocked fit to a scratch file gives the in-memory factor, its J and K are the unpacked factor's,
the memory plan picks it only when nothing in memory fits, a run through it gives the in-memory
run's energies (and PySCF's E(HF)), a mixed-precision SCF reads it as fp32 blocks, and it
leaves no file behind, whatever happens."""

import itertools
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis, fitting
from dfmp2.df.outofcore import Scratch
from dfmp2.errors import InputError, MemoryLimitError
from dfmp2.interfaces.api import run
from dfmp2.io import molecule as io_molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.memory import human
from dfmp2.options import RunOptions
from dfmp2.scf import driver, jk, pyscf_scf
from dfmp2.timing import Timer

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
DIMER = INPUTS / "water_clusters" / "h2o_02.xyz"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dimer():
    mol = io_molecule.build_molecule(read_xyz(DIMER))
    return mol, basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))


@pytest.mark.parametrize("fit_mb", [0.3, 1.0, 100.0])
def test_fit_to_disk_gives_the_in_memory_factor(dimer, tmp_path, fit_mb):
    """Row blocks of the left-looking fit (8 or more, 2 to 4, or 1) give the in-memory TRSM's factor,
    and one pass over the file gives the unpacked factor's J and K (a split factor and a plain one),
    read in several blocks; the scratch directory is gone when its owner closes."""
    mol, aux = dimer
    cpu = linalg.get_backend("cpu")
    mem, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu))
    with Scratch(tmp_path) as scratch:
        disk, none = jk.build_jk_factor(
            mol, aux, cpu, torch.float64, Timer(cpu), layout="disk", scratch=scratch, fit_mb=fit_mb
        )
        assert none is None and disk.layout == "disk" and disk.naux == mem.naux
        lo, hi = {0.3: (8, 12), 1.0: (2, 4), 100.0: (1, 1)}[fit_mb]  # 2.18 MB: the engine's blocks are 1/8 of it
        assert lo <= disk.fit_blocks <= hi
        B = torch.from_numpy(disk.ds[...])
        assert torch.allclose(B, mem.B, rtol=0, atol=1e-12)
        g = torch.Generator().manual_seed(5)
        Ca = torch.randn((mol.nao_nr(), 7), generator=g, dtype=torch.float64)
        Cb = torch.randn((mol.nao_nr(), 4), generator=g, dtype=torch.float64)
        disk.read_rows = 37  # several reads per pass, the last one short
        J0, K0 = jk.unpacked(mem).jk([(Ca, 3), (Cb, None)])
        assert disk.mapped and disk.offset is not None
        for access in ("mmap (no copy)", "h5py read"):  # the file mapped, then read through h5py
            if access == "h5py read":
                disk.offset = None
            J, K = disk.jk([(Ca, 3), (Cb, None)])
            assert torch.allclose(J, J0, rtol=0, atol=1e-11) and torch.allclose(K, K0, rtol=0, atol=1e-11)
            assert disk.describe()["access"] == access
        rec = disk.describe()
        assert rec["passes"] == 2 and disk.stats["read_bytes"] == 2 * disk.naux * jk.npair(mol.nao_nr()) * 8
        assert list(tmp_path.iterdir())
    assert not list(tmp_path.iterdir())


def test_fit_to_disk_refuses_a_metric_without_cholesky(dimer, tmp_path, monkeypatch):
    """The eigh fallback needs every raw row at once: refused with one line, before any 3-center
    integral and without a file."""
    mol, aux = dimer
    cpu = linalg.get_backend("cpu")
    monkeypatch.setattr(jk, "fit_metric", lambda j2c, be: (j2c, "eigh", {"dropped": 1}))
    engine = jk.integrals.HostEngine(mol, cpu)
    monkeypatch.setattr(engine, "blocks", lambda *a, **k: pytest.fail("3-center integrals computed"))
    with Scratch(tmp_path) as scratch, pytest.raises(InputError, match="not positive definite") as e:
        jk.build_jk_factor(
            mol, aux, cpu, torch.float64, Timer(cpu), engine=engine, layout="disk", scratch=scratch, fit_mb=1
        )
    assert e.value.option == "memory_mb" and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())
    assert fitting.fit_metric is not jk.fit_metric  # the patch stayed in jk


def test_memory_plan_puts_the_factor_on_disk_only_when_memory_cannot_hold_it():
    """(H2O)24/cc-pVDZ's shapes: in memory from 7.5 GB up; with 2 GB the factor goes to disk with
    fit blocks as large as the limit and the run's other stages leave room for; without permission to use the disk, or
    below the disk plan's minimum, one line in human units naming the least that runs."""
    nao, naux, nocc = 576, 2784, 120
    packed = driver.memory_mb(nao, naux, nocc, 8)
    assert driver.check_memory(nao, naux, nocc, 8, packed["peak"] + 1, disk=True)["layout"] == "packed"
    plan = driver.check_memory(nao, naux, nocc, 8, 2000, disk=True, other_mb=1272)  # the MP2 stage's peak
    assert plan["layout"] == "disk" and plan["factor"] == 0 and plan["peak"] == pytest.approx(1272)
    assert plan["disk"] == pytest.approx(naux * jk.npair(nao) * 8 / 1e6)
    assert 300 < plan["fit_mb"] < 400  # within the other stage's peak, not the limit's 2 GB
    alone = driver.check_memory(nao, naux, nocc, 8, 2000, disk=True)  # the fit's smallest block
    assert alone["fit_mb"] == pytest.approx(64 * jk.npair(nao) * 8 / 1e6) and alone["peak"] < plan["peak"]
    assert driver.check_memory(nao, naux, nocc, 8, 1000, disk=True, other_mb=1272)["peak"] <= 1000
    least = driver.min_memory_mb(nao, naux, nocc, 8, disk=True)
    assert least < 1000 and driver.check_memory(nao, naux, nocc, 8, least + 1, disk=True)["layout"] == "disk"
    with pytest.raises(MemoryLimitError) as e:
        driver.check_memory(nao, naux, nocc, 8, least - 1, disk=True)
    msg = str(e.value)
    assert f"at least {human(least)}" in msg and "on disk" in msg and "MB" in msg and "e+0" not in msg
    with pytest.raises(MemoryLimitError, match=r"at least 7\.4\d GB \(the JK factor 3\.7 GB in memory") as e:
        driver.check_memory(nao, naux, nocc, 8, 2000, disk=False)
    assert e.value.need_mb == pytest.approx(driver.min_memory_mb(nao, naux, nocc, 8))


def test_run_with_the_factor_on_disk_matches_the_in_memory_run(tmp_path):
    """A memory limit that leaves the JK factor no room in memory: the run goes through the disk
    layout (recorded with what streaming it cost), E(HF) equals PySCF's DF-RHF to 1e-10 Eh and
    the energies the in-memory run's; the scratch directory is left empty."""
    disk = run(DIMER, RunOptions(memory_mb=4.0, scratch_dir=str(tmp_path)))
    mem = run(DIMER, RunOptions())
    jf = disk.ran["scf"]["jk_factor"]
    assert jf["layout"] == "disk" and jf["passes"] == disk.ran["scf"]["iterations"] + 2
    assert jf["read_gb"] > 0 and jf["disk_mb"] == pytest.approx(2.18, rel=0.01)
    assert "streamed from the scratch disk" in disk.ran["scf"]["jk"]
    assert mem.ran["scf"]["jk_factor"]["layout"] != "disk"
    theirs = pyscf_scf.run_rhf(io_molecule.build_molecule(read_xyz(DIMER)), "pyscf-df")
    assert abs(disk.e_hf - theirs.e_hf) < 1e-10
    assert abs(disk.e_hf - mem.e_hf) < 1e-10 and abs(disk.e_corr - mem.e_corr) < 1e-10
    assert not list(tmp_path.iterdir())


def test_full_scratch_disk_mid_scf_is_one_error_line_and_no_files(tmp_path):
    """The factor's file fills the scratch disk during the fit: one error line naming the scratch
    file, exit 2, nothing left in the scratch directory (the disk check told the disk is huge)."""
    import collections
    import shutil
    from unittest import mock

    from tmpfs import tmpfs

    huge = collections.namedtuple("usage", "total used free")(10**12, 0, 10**12)
    with tmpfs(tmp_path, 1024) as disk, mock.patch.object(shutil, "disk_usage", lambda p: huge):
        res = CliRunner().invoke(main, ["run", str(DIMER), "-q", "--memory", "4MB", "--scratch", str(disk)])
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(err) == 1 and err[0].startswith("error: cannot write the scratch file")
        assert not list(disk.iterdir())


def test_disk_factor_read_as_fp32_blocks_is_the_fp64_factor_rounded(dimer, tmp_path):
    """``DiskJKFactor.fp32`` (a mixed SCF's fp32 cycles on disk): every block is the fp64 block
    rounded to fp32, bit for bit, mapped or read through h5py, screened or not; the view shares
    the file's statistics, and its J and K are the fp64 ones to fp32's rounding."""
    mol, aux = dimer
    cpu = linalg.get_backend("cpu")
    for pairs in (None, jk.significant_pairs(mol, 1e-4)):
        with Scratch(tmp_path) as scratch:
            disk, _ = jk.build_jk_factor(
                mol, aux, cpu, torch.float64, Timer(cpu), layout="disk", scratch=scratch, fit_mb=1, pairs=pairs
            )
            disk.read_rows = 37
            f32 = disk.fp32()
            assert f32.dtype == torch.float32 and disk.dtype == torch.float64 and f32.stats is disk.stats
            want = torch.cat([b.reshape(q1 - q0, -1).clone() for q0, q1, b in disk.blocks()]).to(torch.float32)
            for access in ("mmap (no copy)", "h5py read"):
                if access == "h5py read":
                    disk.offset = f32.offset = None
                got = torch.cat([b.reshape(q1 - q0, -1).clone() for q0, q1, b in f32.blocks()])
                assert got.dtype == torch.float32 and torch.equal(got, want)
            assert disk.stats["passes"] == 3
            C = torch.randn((mol.nao_nr(), 5), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
            (J64, K64), (J32, K32) = disk.jk([(C, None)]), f32.jk([(C, None)])
            assert J32.dtype == K32.dtype == torch.float64
            assert 0 < float((K32 - K64).abs().max()) < 1e-5 * float(K64.abs().max())
            assert float((J32 - J64).abs().max()) < 1e-5 * float(J64.abs().max())


def test_mixed_precision_scf_with_the_factor_on_disk(tmp_path):
    """A mixed-precision SCF whose factor is on disk runs its first cycles from fp32 blocks of
    the file (no fp32 copy: none recorded) and ends with the fp64 run's energies to 1e-10 Eh;
    every pass over the file is counted."""
    opts = dict(memory_mb=4.0, scratch_dir=str(tmp_path))
    mixed = run(DIMER, RunOptions(scf_precision="mixed", **opts))
    fp64 = run(DIMER, RunOptions(scf_precision="fp64", **opts))
    cp, jf = mixed.ran["scf"]["cycle_precision"], mixed.ran["scf"]["jk_factor"]
    assert jf["layout"] == "disk" and fp64.ran["scf"]["jk_factor"]["layout"] == "disk"
    assert cp["mode"] == "mixed" and cp["fp32_cycles"] > 0 and cp["fp64_cycles"] > 0 and cp["fp32_factor_mb"] is None
    assert cp["fp32_cycles"] + cp["fp64_cycles"] == mixed.ran["scf"]["iterations"]
    assert jf["passes"] == mixed.ran["scf"]["iterations"] + 2
    assert fp64.ran["scf"]["cycle_precision"]["fp32_cycles"] == 0
    assert abs(mixed.e_hf - fp64.e_hf) < 1e-10 and abs(mixed.e_corr - fp64.e_corr) < 1e-10
    assert not list(tmp_path.iterdir())


def test_disk_factor_reads_are_checked_against_the_file(dimer, tmp_path):
    """What the reader hands out is the file's rows, in order, each once per pass."""
    mol, aux = dimer
    cpu = linalg.get_backend("cpu")
    with Scratch(tmp_path) as scratch:
        disk, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), layout="disk", scratch=scratch, fit_mb=1)
        disk.read_rows, disk.block = 50, 20
        seen = [(p0, p1, b.clone()) for p0, p1, b in disk.blocks()]
        want = [q0 for p0 in range(0, disk.naux, 50) for q0 in range(p0, min(p0 + 50, disk.naux), 20)]
        assert [p0 for p0, _, _ in seen] == want
        assert seen[-1][1] == disk.naux and all(a[1] == b[0] for a, b in itertools.pairwise(seen))
        full = torch.cat([b.reshape(b.shape[0], -1) for _, _, b in seen])
        rows = torch.from_numpy(disk.ds[...])
        assert torch.equal(full, jk.integrals.unpack(rows, mol.nao_nr()).reshape(disk.naux, -1))


def test_uhf_and_a_checkpoint_with_the_factor_on_disk(tmp_path):
    """An open shell (allyl, DF-UHF: J of the total and K of each spin in one pass over the file)
    gives the in-memory energies to 1e-10 Eh; a run with a checkpoint whose SCF streamed the
    factor resumes to the same energies (the resumed run reads the SCF, no factor)."""
    allyl = INPUTS / "open_shell" / "allyl.xyz"
    disk = run(allyl, RunOptions(memory_mb=11.0, scratch_dir=str(tmp_path)))
    mem = run(allyl, RunOptions())
    assert disk.ran["scf"]["jk_factor"]["layout"] == "disk" and disk.ran["scf"]["reference"] == "UHF"
    assert abs(disk.e_hf - mem.e_hf) < 1e-10 and abs(disk.e_corr - mem.e_corr) < 1e-10
    ck = tmp_path / "ck.h5"
    first = run(DIMER, RunOptions(memory_mb=4.0, checkpoint=str(ck)))
    again = run(DIMER, RunOptions(memory_mb=4.0, resume=str(ck)))
    assert first.ran["scf"]["jk_factor"]["layout"] == "disk"
    assert again.e_hf == first.e_hf and again.e_corr == first.e_corr
    assert {p.name for p in tmp_path.iterdir()} == {"ck.h5"}


def test_a_scf_that_waited_for_the_disk_says_so():
    """More than a quarter of the SCF's time waiting for the factor's reads: one warning line
    naming the wait, the rate and the factor's size; less, or a factor in memory: none."""
    from types import SimpleNamespace

    from dfmp2.drivers.energy import slow_disk_warning

    jf = {"layout": "disk", "read_wait_s": 30.0, "read_gb_per_s": 0.2, "disk_mb": 3700.0}
    w = slow_disk_warning(SimpleNamespace(jk_factor=jf, times={"scf": 100.0}))
    assert "waited 30.0 s of its 100.0 s" in w and "0.2 GB/s" in w and "3.7 GB" in w and "\n" not in w
    assert slow_disk_warning(SimpleNamespace(jk_factor={**jf, "read_wait_s": 20.0}, times={"scf": 100.0})) is None
    assert slow_disk_warning(SimpleNamespace(jk_factor={**jf, "layout": "packed"}, times={"scf": 100.0})) is None
