"""Out-of-core B: the block layout, the HDF5 store and its threads, and the pipeline forced out of
core on small molecules, bitwise equal to the in-memory path; temporary files removed on success,
failure and interrupt."""

import json
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import outofcore
from dfmp2.df.outofcore import HDF5B, InMemoryB, OccBlocks
from dfmp2.errors import InputError
from dfmp2.interfaces.api import run
from dfmp2.linalg.reference import mp2_pair_energy_reference
from dfmp2.options import RunOptions
from dfmp2.scf import driver, pyscf_scf

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
DIMER = INPUTS / "water_clusters" / "h2o_02.xyz"
CPU = linalg.get_backend("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def synthetic(nocc=7, nvir=9, naux=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn((nocc, nvir, naux), generator=g, dtype=torch.float64) * 0.1
    eo = -1.0 - torch.rand(nocc, generator=g, dtype=torch.float64)
    ev = 0.5 + torch.rand(nvir, generator=g, dtype=torch.float64)
    return B, eo, ev


def memory_store(B, occ_block):
    """B (nocc, nvir, naux) as an InMemoryB of occupied blocks."""
    nocc, nvir, naux = B.shape
    blocks = OccBlocks(nocc, nvir, naux, occ_block)
    st = InMemoryB(blocks, B.dtype, "cpu", allocate=False)
    for k in range(blocks.count):
        o0, o1 = blocks.orbitals(k)
        st.set_block(k, B[o0:o1].permute(2, 0, 1).reshape(naux, -1).contiguous())
    return st


# ------------------------------------------------------------------ layout and stores
def test_blocks_tile_the_flat_layout_and_pair_order_is_by_row_diagonal_first():
    b = OccBlocks(nocc=11, nvir=3, naux=5, occ_block=4)
    assert b.count == 3 and b.orbitals(2) == (8, 11) and b.shape(2) == (5, 9)
    spans = [b.span(k) for k in range(b.count)]
    assert spans[0][0] == 0 and spans[-1][1] == b.size == 5 * 11 * 3
    assert all(spans[k][1] == spans[k + 1][0] for k in range(b.count - 1))
    assert b.pairs() == [(0, 0), (1, 1), (1, 0), (2, 2), (2, 0), (2, 1)]


def pair_energies(B, eps_occ, eps_vir, backend, occ_block: int):
    """E_OS, E_SS (Hartree) of a (nocc, nvir, naux) tensor B through the stage's blocked store and
    pair loop (outofcore.pair_block_sums over blocks of ``occ_block``, combined in pair order)."""
    nocc, nvir, naux = B.shape
    blocks = OccBlocks(nocc, nvir, naux, occ_block)
    store = InMemoryB(blocks, B.dtype, B.device, allocate=False)
    for k in range(blocks.count):
        o0, o1 = blocks.orbitals(k)
        store.set_block(k, B[o0:o1].permute(2, 0, 1).reshape(naux, (o1 - o0) * nvir).contiguous())
    return outofcore.combine(outofcore.pair_block_sums(store, eps_occ, eps_vir, backend), blocks.pairs())


@pytest.mark.parametrize("occ_block", [1, 3, 7])
def test_pair_sums_match_einsum_reference(occ_block):
    B, eo, ev = synthetic()
    e_os, e_ss = pair_energies(B, eo, ev, CPU, occ_block)
    r_os, r_ss = mp2_pair_energy_reference(B, B, eo, eo, ev)
    assert e_os == pytest.approx(r_os, rel=1e-12) and e_ss == pytest.approx(r_ss, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hdf5_store_gives_the_same_bits_as_memory(tmp_path, dtype):
    B, eo, ev = synthetic(nocc=10, nvir=6, naux=11)
    mem = memory_store(B.to(dtype), 3)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        disk = HDF5B(outofcore.create_flat(f, "B", mem.blocks, dtype), mem.blocks)
        for k in range(mem.blocks.count):
            disk.set_block(k, mem.data[k])
        disk.flush()
        ref = outofcore.pair_block_sums(mem, eo, ev, CPU)
        got = outofcore.pair_block_sums(disk, eo, ev, CPU)
        disk.close()
    assert ref.tobytes() == got.tobytes()
    pairs = mem.blocks.pairs()
    assert outofcore.combine(ref, pairs) == outofcore.combine(got, pairs)


def test_finished_pairs_are_not_recomputed_or_read(tmp_path, monkeypatch):
    B, eo, ev = synthetic(nocc=9, nvir=5, naux=7)
    mem = memory_store(B, 2)
    full = outofcore.pair_block_sums(mem, eo, ev, CPU)
    done = np.zeros(len(full), dtype=bool)
    done[:6] = True  # rows 0..2 of block pairs
    calls, reads = [], []
    orig = linalg.mp2_pair_energy
    monkeypatch.setattr(linalg, "mp2_pair_energy", lambda *a, **k: calls.append(1) or orig(*a, **k))
    orig_iter = mem.iter_blocks
    mem.iter_blocks = lambda order, be: (reads.extend(order), orig_iter(order, be))[1]
    seen = []
    got = outofcore.pair_block_sums(mem, eo, ev, CPU, done=(done, full), progress=lambda d, t: seen.append(d))
    assert got.tobytes() == full.tobytes()
    assert len(calls) == len(full) - 6
    assert 0 not in reads[:1] and reads[0] == 3  # the first unfinished row is block 3
    assert seen[0] == 6 and seen[-1] == len(full)


def test_fit_blocks_in_place_and_cross_dtype_match_memory(tmp_path):
    g = torch.Generator().manual_seed(3)
    naux, nocc, nvir = 12, 5, 4
    A = torch.randn((naux, naux), generator=g, dtype=torch.float64)
    L = torch.linalg.cholesky(A @ A.T + naux * torch.eye(naux, dtype=torch.float64))
    pia = torch.randn((naux, nocc * nvir), generator=g, dtype=torch.float64)
    blocks = OccBlocks(nocc, nvir, naux, 2)
    results = {}
    for out_dtype in (torch.float64, torch.float32):
        src = InMemoryB(blocks, torch.float64, "cpu")
        src.write_rows(0, naux, pia)
        dst = InMemoryB(blocks, out_dtype, "cpu", allocate=False)
        outofcore.fit_blocks(L, "cholesky", src, dst, CPU, out_dtype)
        mem = [dst.data[k] for k in range(blocks.count)]
        with h5py.File(tmp_path / f"f{out_dtype}.h5", "w") as f:
            d64 = outofcore.create_flat(f, "Pia", blocks, torch.float64)
            src_d = HDF5B(d64, blocks)
            for p0 in range(0, naux, 5):  # rows arrive in aux blocks
                src_d.write_rows(p0, min(naux, p0 + 5), pia[p0 : p0 + 5])
            dst_d = (
                src_d if out_dtype == torch.float64 else HDF5B(outofcore.create_flat(f, "B", blocks, out_dtype), blocks)
            )
            outofcore.fit_blocks(L, "cholesky", src_d, dst_d, CPU, out_dtype)
            disk = [dst_d.read_block(k) for k in range(blocks.count)]
            src_d.close(), dst_d.close()
        assert all(torch.equal(a, b) for a, b in zip(mem, disk))
        results[out_dtype] = torch.cat(mem, dim=1)
    whole = torch.linalg.solve_triangular(L, pia, upper=False)
    assert torch.allclose(results[torch.float64], whole, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ the pipeline out of core
SMALL = dict(occ_block_max=2, j3c_block_mb=0.05)  # several occupied and auxiliary blocks


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_tiny_memory_limit_goes_out_of_core_bitwise_equal(tmp_path, monkeypatch, precision):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # PySCF's DF-SCF: ours keeps its JK factor in memory (about 10 MB here, above this MP2 limit).
    # PySCF honours --memory too (its blocking, its DF tensor on disk), which changes its SCF in the
    # last bits; given its default memory in both runs, both share one SCF and the MP2 stage is
    # what is compared
    run_rhf = pyscf_scf.run_rhf
    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: run_rhf(*a, **{**k, "memory_mb": None}))
    im = run(DIMER, RunOptions(**SMALL, precision=precision, scf_mode="pyscf-df"))
    assert not im.memory["out_of_core"]
    limit = run_plan_limit(precision)
    ooc = run(
        DIMER, RunOptions(**SMALL, precision=precision, memory_mb=limit, scratch_dir=str(scratch), scf_mode="pyscf-df")
    )
    assert ooc.memory["out_of_core"] and ooc.memory["peak_mb"] <= limit < im.memory["peak_mb"]
    assert (ooc.memory["aux_block"], ooc.memory["occ_block"]) == (im.memory["aux_block"], im.memory["occ_block"])
    assert ooc.ran["storage"]["B"] == "disk (HDF5)" and ooc.ran["storage"]["occ_blocks"] == [5]
    assert ooc.e_os.hex() == im.e_os.hex() and ooc.e_ss.hex() == im.e_ss.hex()
    assert list(scratch.iterdir()) == []  # temporary files removed


def run_plan_limit(precision):
    """The out-of-core peak of the dimer's plan: below the in-memory peak, same blocks."""
    from dfmp2.memory import plan_memory

    shapes = dict(nao=48, nocc=10, nvir=38, naux=168, itemsize=8 if precision == "fp64" else 4)
    return plan_memory(**shapes, **SMALL, limit_mb=1e6, storage="disk", aux_shell_max=7).peak_mb


def test_forced_disk_on_eigh_metric_is_bitwise_equal(monkeypatch):

    def failing_cholesky(a, *, backend=None):
        raise linalg.NotPositiveDefiniteError("forced eigh")

    monkeypatch.setattr(linalg, "cholesky", failing_cholesky)
    a = run(WATER, RunOptions(**SMALL, storage="memory"))
    b = run(WATER, RunOptions(**SMALL, storage="disk"))
    assert a.ran["metric"].startswith("eigh") and b.memory["out_of_core"]
    assert (a.e_os, a.e_ss) == (b.e_os, b.e_ss)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_temporary_files_removed_on_failure_and_interrupt(tmp_path, monkeypatch, exc):
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise exc("stop")
        return orig(*a, **k)

    orig = linalg.mp2_pair_energy
    monkeypatch.setattr(linalg, "mp2_pair_energy", failing)
    seen = []
    monkeypatch.setattr(
        outofcore.Scratch, "open", lambda self, name, _o=outofcore.Scratch.open: seen.append(name) or _o(self, name)
    )
    with pytest.raises(exc):
        run(WATER, RunOptions(**SMALL, storage="disk", precision="fp32", scratch_dir=str(tmp_path)))
    assert seen == ["B", "Pia"] and list(tmp_path.iterdir()) == []
    assert not any(t.name.startswith("dfmp2-") and t.is_alive() for t in threading.enumerate())


def test_not_enough_disk_fails_before_scf(tmp_path, monkeypatch):
    import shutil

    from dfmp2.scf import pyscf_scf

    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("SCF must not start"))
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("SCF must not start"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("SCF must not start"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(InputError, match=r"needs .* MB of disk in .* only 0.001 MB are free"):
        run(WATER, RunOptions(storage="disk", scratch_dir=str(tmp_path)))


def test_cli_verbose_prints_plan_and_json_records_storage(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main, ["run", str(WATER), "--storage", "disk", "-v", "--scratch", str(tmp_path), "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "memory plan" in res.output and "on disk (HDF5)" in res.output and "smallest feasible" in res.output
    d = json.loads(out.read_text())
    assert d["memory"]["out_of_core"] is True and d["memory"]["storage"] == "disk"
    assert d["ran"]["storage"]["B"] == "disk (HDF5)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_cli_memory_below_minimum_names_the_minimum(tmp_path):
    """The MP2 stage's own minimum (PySCF's SCF: no DF-SCF of ours in the plan); with our DF-SCF
    the line names the larger, the whole run's (tests/scf/test_dfhf.py)."""
    res = CliRunner().invoke(main, ["run", str(WATER), "--memory", "0.01MB", "--scf", "pyscf-df"])
    assert res.exit_code == 2
    assert "needs at least 0.235 MB (with B on disk" in res.output and "--memory" in res.output
    res = CliRunner().invoke(main, ["run", str(WATER), "--memory", "0.01MB"])
    assert res.exit_code == 2 and "needs at least 0.667 MB (the DF-SCF; the MP2 stage after it 0.235 MB)" in res.output


@pytest.mark.heavy
def test_benchmark_script_smoke(tmp_path):
    """scripts/bench_outofcore.py end to end on (H2O)2 (seconds): bitwise check passes, files written."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "b"
    p = subprocess.run(
        [
            sys.executable,
            "scripts/bench_outofcore.py",
            "--waters",
            "2",
            "--occ-block",
            "3",
            "--threads",
            "1",
            "--scratch",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(out.with_suffix(".json").read_text())
    assert [r["kind"] for r in d["runs"]] == ["memory", "disk", "memory"]
    assert all(r["bitwise_equal_to_first"] for r in d["runs"])
    assert d["problem"]["occ_blocks"] == 3 and d["runs"][1]["block_reads"] == 6
    assert "| B in memory" in out.with_suffix(".md").read_text()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["b.json", "b.md"]
