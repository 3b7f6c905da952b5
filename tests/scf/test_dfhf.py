"""Our DF-RHF (dfmp2.scf.rhf, ``--scf df``) against PySCF's DF-RHF with the same JK-fit basis and
thresholds (pyscf_scf.run_rhf 'pyscf-df', computed here: an independent code), and what it records."""

from pathlib import Path

import pytest
import torch
from channels import heavy_cases

from dfmp2 import linalg
from dfmp2.df import basis
from dfmp2.errors import MemoryLimitError, SCFNotConvergedError
from dfmp2.interfaces.api import run
from dfmp2.io import molecule as io_molecule
from dfmp2.io.xyz import parse_xyz, read_xyz
from dfmp2.memory import human
from dfmp2.options import RunOptions
from dfmp2.scf import driver, jk, pyscf_scf, rhf
from dfmp2.scf import precision as scf_precision
from dfmp2.scf.settings import SCFSettings
from dfmp2.timing import Timer

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
H8_CUBE = "\n".join(f"H {x} {y} {z}" for x in (0, 0.35) for y in (0, 0.35) for z in (0, 0.35))
LIH = "Li 0 0 0\nH 0 0 1.595"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def geometry(atoms: str, name: str):
    lines = atoms.strip().splitlines()
    return parse_xyz(f"{len(lines)}\n\n" + "\n".join(lines) + "\n", name)


def molecule(case):
    if case == "h8_cube_lindep":  # aug-cc-pVDZ on an H8 cube of edge 0.35 Å: 4 of 72 dropped
        return io_molecule.build_molecule(geometry(H8_CUBE, "h8.xyz"), "aug-cc-pvdz")
    if case == "lih_fallback":  # cc-pVDZ-JKFIT lacks Li: def2-universal-jkfit for it
        return io_molecule.build_molecule(geometry(LIH, "lih.xyz"))
    return io_molecule.build_molecule(read_xyz(INPUTS / case))


@pytest.mark.parametrize(
    "case", ["water.xyz", "ammonia.xyz", "h8_cube_lindep", "lih_fallback", "water_clusters/h2o_02.xyz"]
)
def test_e_hf_matches_pyscf_df_rhf(case):
    mol = molecule(case)
    theirs = pyscf_scf.run_rhf(mol, "pyscf-df")
    ours = driver.run_scf(mol, linalg.get_backend("cpu"), SCFSettings(precision="fp64"))
    assert abs(ours.e_hf - theirs.e_hf) <= 1e-10, ours.e_hf - theirs.e_hf
    (o,), (t,) = ours.channels, theirs.channels
    assert o.mo_coeff.shape == t.mo_coeff.shape and o.nocc == t.nocc
    assert ours.jk_auxbasis == theirs.jk_auxbasis
    # orbital energies of a converged SCF agree to the gradient threshold's order
    assert abs(o.mo_energy - t.mo_energy).max() < 1e-7
    # the same guess and thresholds; our DIIS's scaled solve (dfmp2.scf.diis.DIIS) takes no more cycles
    assert ours.scf.iterations <= theirs.scf.iterations, (ours.scf.iterations, theirs.scf.iterations)
    if case == "h8_cube_lindep":
        assert o.mo_coeff.shape == (72, 68)
    if case == "lih_fallback":
        assert "def2-universal-jkfit" in ours.jk_auxbasis


@pytest.mark.parametrize(
    "case",
    heavy_cases(
        ["water.xyz", "ammonia.xyz", "h8_cube_lindep", "lih_fallback", "water_clusters/h2o_04.xyz"],
        {"water_clusters/h2o_04.xyz"},
    ),
)
def test_mixed_precision_scf_gives_the_fp64_energy(case):
    """The mixed SCF (fp32 K in the first cycles, then fp64) against our all-fp64 SCF (the
    independent cross-check: no fp32 anywhere) and PySCF's DF-RHF: E(HF) within 1e-10 and 1e-9
    Eh, the orbital energies to the gradient threshold's order; some cycles were fp32, the switch
    happened, and every cycle is counted in one precision."""
    mol = molecule(case)
    cpu = linalg.get_backend("cpu")
    fp64 = driver.run_scf(mol, cpu, SCFSettings(precision="fp64"))
    mixed = driver.run_scf(mol, cpu, SCFSettings(precision="mixed"))
    theirs = pyscf_scf.run_rhf(mol, "pyscf-df")
    assert abs(mixed.e_hf - fp64.e_hf) < 1e-10, mixed.e_hf - fp64.e_hf
    assert abs(mixed.e_hf - theirs.e_hf) < 1e-9, mixed.e_hf - theirs.e_hf
    assert abs(mixed.channels[0].mo_energy - fp64.channels[0].mo_energy).max() < 1e-7
    cp = mixed.scf.cycle_precision
    assert cp["mode"] == "mixed" and cp["requested"] == "mixed" and cp["fp32_device"] == "cpu"
    assert 0 < cp["fp32_cycles"] < mixed.scf.iterations
    assert cp["fp32_cycles"] + cp["fp64_cycles"] == mixed.scf.iterations
    assert cp["switch_cycle"] == cp["fp32_cycles"] and cp["switch_gnorm"] > 0
    nao = mol.nao_nr()
    assert cp["fp32_factor_mb"] == pytest.approx(mixed.scf.jk_factor["naux"] * nao * nao * 4 / 1e6)
    assert mixed.scf.precision["jk"] == "fp32, then fp64"
    f = fp64.scf.cycle_precision
    assert (f["mode"], f["fp32_cycles"], f["fp64_cycles"], f["switch_cycle"], f["fp32_factor_mb"]) == (
        "fp64",
        0,
        fp64.scf.iterations,
        None,
        None,
    )


def test_scf_precision_fp64_is_the_all_fp64_scf_and_progress_says_each_cycles_precision():
    """precision 'fp64' runs every cycle's J/K in fp64: the cycles and energy of the SCF with the
    fp32 phase switched off at its start (the same code path as before mixed precision); the
    progress callback gets each cycle's precision, fp32 ones first in a mixed SCF."""
    mol = molecule("water.xyz")
    cpu = linalg.get_backend("cpu")
    seen = {}
    refs = {
        p: driver.run_scf(mol, cpu, SCFSettings(precision=p), progress=lambda *a, p=p: seen.setdefault(p, []).append(a))
        for p in ("fp64", "mixed")
    }
    h = rhf.DFRHF(mol, cpu, SCFSettings(precision="mixed"), timer=Timer(cpu))
    h.fp32_phase = False  # mixed, fp32 phase off: the fp64 SCF
    cycles, _D, _G, _F = h.iterate(pyscf_scf.SCF_MAX_CYCLE)
    assert cycles == refs["fp64"].scf.iterations
    assert [c[4] for c in seen["fp64"]] == ["fp64"] * cycles
    n32 = refs["mixed"].scf.cycle_precision["fp32_cycles"]
    assert [c[4] for c in seen["mixed"]] == ["fp32"] * n32 + ["fp64"] * (refs["mixed"].scf.iterations - n32)


def test_scf_precision_choice_and_refusals():
    """auto is mixed where the device has fp64 and fast fp32 (cuda) and the factor's fp32 copy
    fits, else fp64 (the cpu: measured not to pay there); fp64 and mixed are refused on a device
    without fp64 (one line naming the option)."""
    from dataclasses import replace

    from dfmp2.errors import InputError

    cpu, cuda, trn = (linalg.device_capabilities(d) for d in ("cpu", "cuda", "trn1"))
    assert (
        scf_precision.resolve_precision(cuda, "auto")[0]
        == scf_precision.resolve_precision(replace(cpu, fast_fp32=True), "auto")[0]
        == "mixed"
    )
    mode, why = scf_precision.resolve_precision(cpu, "auto")
    assert mode == "fp64" and "not faster" in why
    # on a CPU auto follows this machine's measured SGEMM/DGEMM ratio (the BLAS probe), not its name
    pays = scf_precision.FP32_PAYS
    mode, why = scf_precision.resolve_precision(cpu, "auto", fp32_speedup=pays + 0.1)
    assert mode == "mixed" and "measured" in why and f"{pays + 0.1:.2f}x" in why
    mode, why = scf_precision.resolve_precision(cpu, "auto", fp32_speedup=pays - 0.1)
    assert mode == "fp64" and "measured" in why
    assert scf_precision.resolve_precision(cpu, "auto", fp32_copy=False, fp32_speedup=2.0)[0] == "fp64"
    assert scf_precision.resolve_precision(cpu, "fp64", fp32_speedup=2.0)[0] == "fp64"
    assert scf_precision.resolve_precision(cpu, "mixed")[0] == "mixed"
    assert scf_precision.resolve_precision(cpu, "fp64")[0] == "fp64"
    mode, why = scf_precision.resolve_precision(cuda, "auto", fp32_copy=False)
    assert mode == "fp64" and "memory" in why
    assert scf_precision.resolve_precision(trn, "auto")[0] == "fp32"
    for p in ("fp64", "mixed"):
        with pytest.raises(InputError, match="needs fp64") as e:
            scf_precision.resolve_precision(trn, p)
        assert e.value.option == "scf_precision"
        with pytest.raises(InputError, match="needs fp64") as e:
            RunOptions(device="trn1", scf_precision=p).check_choices()
        assert e.value.option == "scf_precision"
    with pytest.raises(InputError, match="unknown scf precision") as e:
        RunOptions(scf_precision="fp16").check_choices()
    assert e.value.option == "scf_precision"
    # the memory plan counts the fp32 copy (unpacked: about the factor's size), and drops it rather
    # than shrink the exchange block when the limit fits the SCF only without it ((H2O)16/cc-pVDZ's
    # shapes: the unpacked factor, tried first, needs more than the packed one without the copy)
    shape = (384, 1856, 80, 8)
    with_copy = driver.memory_mb(*shape, fp32_copy=True)
    without = driver.memory_mb(*shape)
    assert with_copy["fp32_copy"] == pytest.approx(1856 * 384 * 384 * 4 / 1e6) and without["fp32_copy"] == 0
    assert with_copy["peak"] > without["peak"]
    assert driver.memory_mb(*shape, layout="unpacked")["peak"] > without["peak"]
    fits = driver.check_memory(*shape, without["peak"], fp32_copy=True)
    assert fits["fp32_copy"] == 0 and fits["block_mb"] == jk.JK_BLOCK_MB and fits["layout"] == "packed"
    fits = driver.check_memory(*shape, with_copy["peak"], fp32_copy=True)
    assert fits["fp32_copy"] > 0 and fits["layout"] == "packed"


def test_mixed_scf_with_the_unpacked_factor_unpacks_it_when_fp32_ends():
    """With the unpacked layout the mixed SCF keeps its fp64 factor packed through the fp32
    cycles, its fp32 copy in the unpacked factor's buffer (jk.deferred_unpacked), and unpacks the
    fp64 factor over it at the switch: E(HF) as the fp64 SCF's on the same layout (1e-10 Eh), the
    factor recorded unpacked, the fp32 copy's size recorded after it was dropped."""
    mol = molecule("water_clusters/h2o_02.xyz")
    cpu = linalg.get_backend("cpu")
    fp64 = driver.run_scf(mol, cpu, SCFSettings(precision="fp64", layout="unpacked"))
    mixed = driver.run_scf(mol, cpu, SCFSettings(precision="mixed", layout="unpacked"))
    assert abs(mixed.e_hf - fp64.e_hf) < 1e-10, mixed.e_hf - fp64.e_hf
    cp, fac = mixed.scf.cycle_precision, mixed.scf.jk_factor
    assert cp["mode"] == "mixed" and 0 < cp["fp32_cycles"] < mixed.scf.iterations
    nao = mol.nao_nr()
    assert fac["layout"] == "unpacked" and fac["shape"] == [fac["naux"], nao, nao]
    assert cp["fp32_factor_mb"] == pytest.approx(fac["naux"] * nao * nao * 4 / 1e6)


def test_memory_plan_prefers_the_unpacked_factor_where_it_fits():
    """The unpacked fp64 factor (naux nao^2 8 B, twice the packed one) is the plan's first choice;
    its peak is the fit's packed solution beside it; an fp32 factor (no fp64) stays packed."""
    nao, naux, nocc = 384, 1856, 80
    unp = driver.memory_mb(nao, naux, nocc, 8, layout="unpacked")
    assert unp["factor"] == pytest.approx(naux * nao * nao * 8 / 1e6)
    assert unp["peak"] >= (naux * nao * nao * 8 + naux * jk.npair(nao) * 8) / 1e6
    fits = driver.check_memory(nao, naux, nocc, 8, unp["peak"])
    assert fits["layout"] == "unpacked" and fits["block_mb"] == jk.JK_BLOCK_MB
    assert driver.check_memory(nao, naux, nocc, 8, unp["peak"] - 1)["layout"] == "packed"
    assert driver.check_memory(nao, naux, nocc, 4, 1e9)["layout"] == "packed"


def test_a_gpu_plans_larger_exchange_blocks_and_takes_the_smaller_before_the_packed_layout():
    """On a GPU (caps.cuda_memory) the plan asks for JK_BLOCK_MB_GPU blocks (launches bound small
    blocks there); where they do not fit, the unpacked factor with JK_BLOCK_MB blocks comes before
    the packed one. The CPU keeps JK_BLOCK_MB."""
    assert jk.exchange_block_mb(linalg.device_capabilities("cuda")) == jk.JK_BLOCK_MB_GPU > jk.JK_BLOCK_MB
    assert jk.exchange_block_mb(linalg.device_capabilities("cpu")) == jk.JK_BLOCK_MB
    nao, naux, nocc = 384, 1856, 80
    big = driver.memory_mb(nao, naux, nocc, 8, jk.JK_BLOCK_MB_GPU, layout="unpacked")
    small = driver.memory_mb(nao, naux, nocc, 8, jk.JK_BLOCK_MB, layout="unpacked")
    assert big["peak"] > small["peak"]
    fits = driver.check_memory(nao, naux, nocc, 8, big["peak"], block_mb=jk.JK_BLOCK_MB_GPU)
    assert (fits["layout"], fits["block_mb"]) == ("unpacked", jk.JK_BLOCK_MB_GPU)
    fits = driver.check_memory(nao, naux, nocc, 8, big["peak"] - 1, block_mb=jk.JK_BLOCK_MB_GPU)
    assert (fits["layout"], fits["block_mb"]) == ("unpacked", jk.JK_BLOCK_MB)
    assert jk.jk_block(nao, naux, 8, jk.JK_BLOCK_MB_GPU) > jk.jk_block(nao, naux, 8, jk.JK_BLOCK_MB)


@pytest.mark.parametrize("precision", ["fp64", "mixed"])
def test_the_gpus_block_sizes_give_the_same_scf(precision):
    """The blocks a GPU plans (JK_BLOCK_MB_GPU: one fixed group of the factor a block, unpacked;
    a mixed SCF's fp32 copy in blocks as large) give the E(HF) and cycles of blocks of a few rows:
    only the order of the exchange sums changes. (H2O)2 here (whose 64 MB blocks already hold a
    whole group); on the GPU itself, scripts/gpu_acceptance.py."""
    mol = io_molecule.build_molecule(read_xyz(INPUTS / "water_clusters" / "h2o_02.xyz"), "cc-pvdz")
    cpu = linalg.get_backend("cpu")
    runs = {
        mb: driver.run_scf(mol, cpu, SCFSettings(precision=precision, layout="unpacked", block_mb=mb))
        for mb in (0.05, jk.JK_BLOCK_MB_GPU)
    }
    small, big = runs[0.05], runs[jk.JK_BLOCK_MB_GPU]
    assert big.scf.jk_factor["exchange_block"] > small.scf.jk_factor["exchange_block"]
    assert abs(big.e_hf - small.e_hf) < 1e-10 and big.scf.iterations == small.scf.iterations


def test_unpacked_factor_gives_the_packed_factors_j_and_k():
    """JKFactor.jk over the unpacked factor (J and K in one pass, γ from the exchange GEMMs) equals
    coulomb + exchange over the packed one, with a split (ΔD-like) factor and two factors (UHF)."""
    cpu = linalg.get_backend("cpu")
    nao, naux = 24, 70
    g = torch.Generator().manual_seed(3)
    packed = jk.JKFactor(torch.randn((naux, jk.npair(nao)), generator=g, dtype=torch.float64), nao, cpu, 9, "cholesky")
    unp = jk.unpacked(packed, block_mb=0.05)
    assert unp.layout == "unpacked" and unp.B.shape == (naux, nao, nao) and 1 < unp.block < naux
    Ca, Cb = (
        torch.randn((nao, 7), generator=g, dtype=torch.float64),
        torch.randn((nao, 4), generator=g, dtype=torch.float64),
    )
    Da = Ca[:, :3] @ Ca[:, :3].T - Ca[:, 3:] @ Ca[:, 3:].T
    J, K = unp.jk([(Ca, 3), (Cb, None)])
    assert torch.allclose(J, packed.coulomb(Da + Cb @ Cb.T), rtol=0, atol=1e-11)
    assert torch.allclose(K[0], packed.exchange(Ca, 3), rtol=0, atol=1e-11)
    assert torch.allclose(K[1], packed.exchange(Cb), rtol=0, atol=1e-11)
    assert torch.equal(K[1], K[1].T) and torch.allclose(unp.coulomb(Da), packed.coulomb(Da), rtol=0, atol=1e-11)
    # an independent K: Σ_P B_P D B_P from the unpacked tensor
    ref = torch.einsum("pmn,nl,plk->mk", unp.B, Cb @ Cb.T, unp.B)
    assert torch.allclose(K[1], ref, rtol=0, atol=1e-10)


def test_pipeline_records_the_scf_precision(tmp_path):
    """``ran.scf.cycle_precision`` of a run: mixed (fp32 cycles, the switch), fp64 none; auto on
    the CPU is fp64 (measured); the same MP2 energies to 1e-9 Eh."""
    path = INPUTS / "water.xyz"
    auto = run(path, RunOptions())
    assert auto.ran["scf"]["cycle_precision"]["mode"] == "fp64"  # the cpu's capabilities (no measured rule yet)
    auto, fp64 = run(path, RunOptions(scf_precision="mixed")), run(path, RunOptions(scf_precision="fp64"))
    a, f = auto.ran["scf"]["cycle_precision"], fp64.ran["scf"]["cycle_precision"]
    assert a["mode"] == "mixed" and a["requested"] == "mixed" and a["fp32_cycles"] > 0 and a["switch_cycle"]
    assert f["mode"] == "fp64" and f["requested"] == "fp64" and f["fp32_cycles"] == 0
    assert auto.memory["stages_mb"]["scf"] > fp64.memory["stages_mb"]["scf"]  # the fp32 copy, planned
    assert abs(auto.e_hf - fp64.e_hf) < 1e-10 and abs(auto.e_corr - fp64.e_corr) < 1e-9


def test_incremental_fock_build_equals_full_build_in_fp64():
    """The fp32 devices' Fock build (J/K of ΔD from its eigenvectors, Fock summed) is exact
    arithmetic: in fp64 it gives the full build's energy."""
    mol = molecule("water_clusters/h2o_02.xyz")
    cpu = linalg.get_backend("cpu")
    full = driver.run_scf(mol, cpu, SCFSettings(incremental=False, precision="fp64"))
    inc = driver.run_scf(mol, cpu, SCFSettings(incremental=True, precision="fp64"))
    assert abs(full.e_hf - inc.e_hf) < 1e-10
    assert inc.scf.precision["fock_build"].startswith("incremental")


def test_jk_match_pyscf_on_a_density():
    """J and K of one density (not an SCF one) against PySCF's DF-J/K with the same factor."""
    import numpy as np

    from dfmp2.timing import Timer

    mol = molecule("water.xyz")
    ref = pyscf_scf.run_rhf(mol, "pyscf-df")
    cpu = linalg.get_backend("cpu")
    aux = basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    fac, fac64 = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu))
    assert fac64 is None
    C = np.random.default_rng(7).standard_normal((mol.nao_nr(), 6))
    D = C @ C.T
    vj, vk = ref.mf.get_jk(mol, D)
    J = fac.coulomb(torch.from_numpy(D)).numpy()
    K = fac.exchange(torch.from_numpy(C)).numpy()
    K2 = fac.exchange(torch.from_numpy(np.hstack([C, C[:, :2]])), split=6).numpy()  # C C^T - c c^T
    vk2 = ref.mf.get_jk(mol, D - C[:, :2] @ C[:, :2].T)[1]
    assert abs(J - vj).max() < 1e-11 * abs(vj).max()
    assert abs(K - vk).max() < 1e-11 * abs(vk).max()
    assert abs(K2 - vk2).max() < 1e-11 * abs(vk2).max()


def test_trn1_simulate_water_runs_the_jk_on_nki_kernels():
    """Trainium (NKI kernels on this CPU): the cycles' J/K in fp32 on the kernels, the Fock matrix
    in fp64 on the host, the final energy with the fp64 factor on the host (recorded). Measured:
    E(HF) 3e-11 Eh from CPU fp64; with the fp32-built Fock matrix alone 2.3e-7 Eh."""
    mol = molecule("water.xyz")
    cpu = driver.run_scf(mol, linalg.get_backend("cpu"))
    be = linalg.get_backend("trn1", simulate=True)
    trn = driver.run_scf(mol, be)
    assert abs(trn.e_hf - cpu.e_hf) < 1e-8, trn.e_hf - cpu.e_hf
    ran = trn.scf.to_dict()
    assert ran["device"] == "trn1" and ran["precision"]["jk"] == "fp32"
    assert set(ran["kernels"]) == {"gemm:nki.gemm", "syrk:nki.syrk"}, ran["kernels"]
    assert ran["kernels"]["syrk:nki.syrk"] >= trn.scf.iterations  # K each cycle on the device
    # what ran on the host is listed as such: the fp64 fit, the dense algebra, the final J/K
    for k in ("cholesky:torch.linalg.cholesky_ex", "trsm:torch.linalg.solve_triangular", "eigh:torch.linalg.eigh"):
        assert k in ran["host_kernels"], ran["host_kernels"]
    assert "host" in ran["final_energy"] and "scf_final_fp64_host" in ran["times"]
    # the fp32 Fock matrix's own energy: honest, off by more than the final one
    assert 1e-9 < abs(ran["e_hf_device_fock"] - cpu.e_hf) < 1e-5


def test_scaled_diis_takes_fewer_cycles_to_the_same_energy():
    """The scaled DIIS solve (the default) against PySCF's unscaled one in the same code: the
    same E(HF), fewer cycles ((H2O)2: the unscaled solve stalls once |e| < 1e-7)."""
    from dfmp2.timing import Timer

    class Unscaled(rhf.DFRHF):
        diis_scaled = False

    mol = molecule("water_clusters/h2o_02.xyz")
    cpu = linalg.get_backend("cpu")
    scaled = driver.run_scf(mol, cpu)
    unscaled = Unscaled(mol, cpu, SCFSettings(max_cycle=100), timer=Timer(cpu)).run()
    assert abs(scaled.e_hf - unscaled.e_hf) < 1e-10
    assert scaled.scf.iterations < unscaled.scf.iterations - 3, (scaled.scf.iterations, unscaled.scf.iterations)


def test_not_converged_raises():
    with pytest.raises(SCFNotConvergedError, match="did not converge in 3 cycles"):
        driver.run_scf(molecule("water.xyz"), linalg.get_backend("cpu"), SCFSettings(max_cycle=3))


def test_memory_estimate_and_refusal():
    need = driver.memory_mb(nao=384, naux=1856, nocc=80, itemsize=8)
    assert need["factor"] == pytest.approx(1856 * 384 * 385 / 2 * 8 / 1e6)
    assert need["peak"] >= 2 * need["factor"]  # the fit holds raw integrals and solution
    with pytest.raises(MemoryLimitError, match=r"the JK factor 1\.1 GB in memory.*limit is 1 GB.*pyscf-df"):
        driver.check_memory(384, 1856, 80, 8, limit_mb=1000)  # without the disk: the caller did not allow it
    assert driver.check_memory(384, 1856, 80, 8, limit_mb=1000, disk=True)["layout"] == "disk"
    # a limit below the default exchange block's peak: one auxiliary function per block
    small = driver.memory_mb(24, 116, 5, 8, block_mb=1e-9)["peak"]  # water
    assert small < driver.memory_mb(24, 116, 5, 8)["peak"]
    assert driver.check_memory(24, 116, 5, 8, small)["block_mb"] < 1e-6


def test_pipeline_records_the_scf_and_pyscf_modes_still_work():
    path = INPUTS / "water.xyz"
    ours = run(path, RunOptions())
    s = ours.ran["scf"]
    assert (
        s["engine"] == rhf.ENGINE
        and s["device"] == "cpu"
        and s["iterations"] == ours.to_dict()["ran"]["scf"]["iterations"]
    )
    for op in ("gemm", "syrk", "trsm", "cholesky", "eigh"):
        assert any(k.startswith(op + ":") for k in s["kernels"]), s["kernels"]
    assert {"scf_integrals", "scf_fit", "scf"} <= set(ours.timings)
    assert ours.memory["stages_mb"]["scf"] > 0 and ours.memory["shapes"]["naux_jk"] == 116
    for mode in ("pyscf-df", "exact"):
        r = run(path, RunOptions(scf_mode=mode))
        assert r.ran["scf"]["engine"] == "pyscf" and r.scf_mode == mode
        assert "scf" in r.timings and "scf_fit" not in r.timings
        if mode == "pyscf-df":
            assert abs(r.e_hf - ours.e_hf) < 1e-10 and abs(r.e_corr - ours.e_corr) < 1e-10
            assert r.jk_auxbasis == ours.jk_auxbasis == "cc-pvdz-jkfit"
        else:
            assert r.jk_auxbasis is None and abs(r.e_hf - ours.e_hf) > 1e-6


def test_the_guess_is_named_counted_and_timed_apart():
    """The SCF's start in its record: which guess, how many cycles from it, and its own seconds
    ('scf_guess', host work: no flops; not inside 'scf_integrals'), for PySCF's minao guess (RHF
    and UHF) and for a given density. Why minao stays the default: scripts/results/scf_guess.md."""
    mol, cpu = molecule("water.xyz"), linalg.get_backend("cpu")
    timer = Timer(cpu)
    ref = driver.run_scf(mol, cpu, SCFSettings(precision="fp64"), timer=timer)
    assert ref.scf.guess.startswith("minao") and ref.scf.iterations > 0
    assert ref.scf.times["scf_guess"] > 0 and timer.flops["scf_guess"] == 0
    again = driver.run_scf(mol, cpu, SCFSettings(precision="fp64"), dm0=ref.density())
    assert again.scf.guess.startswith("given density") and again.scf.times["scf_guess"] > 0
    assert again.scf.iterations < ref.scf.iterations and abs(again.e_hf - ref.e_hf) < 1e-10
    cation = io_molecule.build_molecule(read_xyz(INPUTS / "water.xyz"), charge=1, multiplicity=2)
    u = driver.run_scf(cation, cpu, SCFSettings(precision="fp64", unrestricted=True))
    assert u.scf.guess.startswith("minao") and u.scf.times["scf_guess"] > 0


def test_scf_memory_refused_before_the_scf(monkeypatch):
    """A limit that the MP2 plan fits but the JK factor does not: one error before any SCF."""
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF must not start"))
    need = driver.memory_mb(nao=24, naux=116, nocc=5, itemsize=8, block_mb=1e-9)["peak"]  # the smallest
    geom = read_xyz(INPUTS / "water.xyz")
    with pytest.raises(MemoryLimitError, match="the DF-SCF needs"):
        run(geom, RunOptions(memory_mb=need * 0.99, storage="disk"))


def test_scf_progress_one_call_per_cycle_from_both_engines():
    """Our DF-RHF and PySCF's SCF report every cycle (cycle, E, ΔE, |g|) to ``progress``; the last
    one is the converged state (the thresholds of pyscf_scf.SCF_CONV_TOL and SCF_CONV_TOL_GRAD)."""
    mol = molecule("water.xyz")
    for run_engine in (
        lambda p: driver.run_scf(mol, linalg.get_backend("cpu"), progress=p),
        lambda p: pyscf_scf.run_rhf(mol, "pyscf-df", progress=p),
    ):
        calls = []
        ref = run_engine(lambda *a: calls.append(a))
        assert [c[0] for c in calls] == list(range(1, ref.scf.iterations + 1))
        _cycle, e_tot, d_e, gnorm, precision = calls[-1]
        assert precision == "fp64"
        assert abs(d_e) < pyscf_scf.SCF_CONV_TOL and abs(e_tot - ref.e_hf) < 1e-9 and gnorm < 1e-6


def test_cycle_log_holds_lines_of_a_short_scf_and_prints_a_long_one():
    from dfmp2.timing import CycleLog

    out = []
    log = CycleLog(out.append, "RHF", after=3600)
    log(1, -76.0, -1e-3, 0.1)
    assert out == []  # a short SCF prints nothing
    log.after, log.t0 = 0.0, log.t0 - 1.0  # the SCF has now run longer than 'after'
    log(2, -76.1, -1e-1, 0.01, "fp32")
    assert len(out) == 2 and out[0].startswith("RHF cycle   1: E = -76.0000000000 Eh")
    assert out[1].startswith("RHF cycle   2 [fp32]: E = -76.1000000000 Eh")
    assert "ΔE = -1.00e-01 Eh" in out[1] and "|g| = 1.00e-02" in out[1]


def test_not_converged_says_what_did_not_converge_and_a_looser_threshold_helps():
    """An SCF whose energy has converged but whose gradient stalls above the threshold is told so
    (option: the gradient threshold), not blamed on the input; a looser threshold converges."""
    import dfmp2

    water = str(INPUTS / "water.xyz")
    for mode in ("df", "pyscf-df"):
        with pytest.raises(SCFNotConvergedError, match=r"energy change .* \(below the threshold 1e-12\)") as e:
            dfmp2.energy(water, scf_mode=mode, scf_conv_tol_grad=1e-15, scf_max_cycle=40)
        assert e.value.option == "scf_conv_tol_grad" and "geometry" not in str(e.value)
    with pytest.raises(SCFNotConvergedError, match=r"\(above the threshold 1e-12\).*raise the cycle limit") as e:
        dfmp2.energy(water, scf_max_cycle=3)
    assert e.value.option == "scf_max_cycle"
    loose, tight = dfmp2.energy(water, scf_conv_tol_grad=1e-6), dfmp2.energy(water)
    assert loose.ran["scf"]["conv_tol_grad"] == 1e-6 and tight.ran["scf"]["conv_tol_grad"] == 1e-9
    assert loose.ran["scf"]["iterations"] < tight.ran["scf"]["iterations"]
    assert abs(loose.e_hf - tight.e_hf) < 1e-9


def test_memory_refusal_gives_the_whole_runs_minimum(no_scf):
    """--memory 5MB on benzene said 5.85 MB (the MP2 stage), then at 6 MB that the SCF needs more:
    the first refusal now gives the whole run's minimum."""
    path = INPUTS / "benzene.xyz"
    with pytest.raises(MemoryLimitError) as e:
        run(path, RunOptions(memory_mb=5.0))
    scf_min = e.value.need_mb
    assert str(e.value).startswith(f"this run needs at least {human(scf_min)} (the DF-SCF; the MP2 stage after it")
    assert scf_min > 20 and e.value.limit_mb == 5.0  # the JK factor on disk: about 33 MB
    with pytest.raises(MemoryLimitError, match="the DF-SCF needs at least"):  # just above the MP2 stage's
        run(path, RunOptions(memory_mb=6.0))
    with pytest.raises(MemoryLimitError, match=r"^this run needs at least 5.85 MB \(with B on disk"):
        run(path, RunOptions(memory_mb=5.0, scf_mode="pyscf-df"))  # no DF-SCF of ours: the MP2 stage's


@pytest.mark.parametrize("ratio,mode", [(2.0, "mixed"), (1.2, "fp64")])
def test_auto_scf_precision_follows_the_measured_ratio_of_the_blas_table(tmp_path, monkeypatch, ratio, mode):
    """``dfmp2 run`` with --scf-precision auto (the default) on a CPU reads this machine's SGEMM/DGEMM
    ratio from its BLAS table (not the device's name): mixed from FP32_PAYS (1.5x), fp64 below. In
    a process of its own with a cache holding a table whose large GEMM rates give ``ratio``."""
    import json
    import subprocess
    import sys

    from blas_cache import fixed_table, write_cache

    table = fixed_table()
    for dt, gf in (("fp32", 100.0 * ratio), ("fp64", 100.0)):
        table["gflops"][f"gemm/{dt}/large"] = {"torch": gf, "openblas": gf / 2}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this test's cache, its child's too
    write_cache(table)
    out = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "dfmp2", "run", str(INPUTS / "water.xyz"), "-q", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    cp = json.loads(out.read_text())["ran"]["scf"]["cycle_precision"]
    assert cp["mode"] == mode and f"{ratio:.2f}x" in cp["why"] and "measured" in cp["why"]
