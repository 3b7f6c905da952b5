"""The CPU pair step by tiles (linalg/cpu_pair.py) and its compiled epilogue (kernels/cpu/):
energies against the einsum reference (linalg/reference.py), the tiling, threads, and a C kernel
that cannot be built (an error, never a quiet switch to the torch path)."""

import math
import os

import numpy as np
import pytest
import torch

from dfmp2 import linalg
from dfmp2.linalg import cpu_pair
from dfmp2.linalg.reference import mp2_pair_energy_reference


def _problem(ni, nj, nvir, nvj, naux, dtype, seed, symmetric):
    """Bi, Bj, eps_i, eps_j, eps_vir (and eps_vir_j for nvj != nvir: opposite spins) with B laid
    out as the pipeline's Bt (naux, nocc*nvir), so the GEMM operands are views."""
    g = torch.Generator().manual_seed(seed)
    Bt = torch.randn(naux, ni * nvir, generator=g, dtype=torch.float64).to(dtype)
    Bi = Bt.view(naux, ni, nvir).permute(1, 2, 0)
    ei = -0.3 - torch.rand(ni, generator=g, dtype=torch.float64) * 2
    ev = 0.1 + torch.rand(nvir, generator=g, dtype=torch.float64) * 3
    if symmetric:
        return Bi, Bi, ei, ei, ev, None
    Bj = torch.randn(naux, nj * nvj, generator=g, dtype=torch.float64).to(dtype).view(naux, nj, nvj).permute(1, 2, 0)
    ej = -0.3 - torch.rand(nj, generator=g, dtype=torch.float64) * 2
    evj = 0.1 + torch.rand(nvj, generator=g, dtype=torch.float64) * 3 if nvj != nvir else None
    return Bi, Bj, ei, ej, ev, evj


CASES = [  # ni, nj, nvir, nvj, naux, symmetric
    (1, 1, 3, 3, 4, True),
    (5, 5, 7, 7, 11, True),
    (16, 16, 33, 33, 40, True),
    (6, 9, 13, 13, 17, False),
    (6, 9, 13, 8, 17, False),
    (3, 1, 70, 70, 5, False),
    (13, 13, 35, 35, 29, True),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_tiles_match_the_reference(case, dtype):
    """Diagonal (i >= j) and off-diagonal blocks, opposite spins, odd sizes, one orbital, nvir
    beyond the epilogue's 32-wide sub-blocks, in fp64 and fp32 K (the reference forms K in the
    same precision, every term in fp64)."""
    ni, nj, nvir, nvj, naux, sym = case
    Bi, Bj, ei, ej, ev, evj = _problem(ni, nj, nvir, nvj, naux, dtype, 7, sym)
    got = cpu_pair.mp2_pair_energy(Bi, Bj, ei, ej, ev, symmetric=sym, eps_vir_j=evj)
    if evj is not None:  # the reference has no opposite-spin form: sum_ab K_ab^2 / D directly
        K = torch.einsum("iap,jbp->iajb", Bi.double(), Bj.double())
        D = ei[:, None, None, None] + ej[None, None, :, None] - ev[None, :, None, None] - evj[None, None, None, :]
        ref = (float((K * K / D).sum()), math.nan)
    else:
        ref = mp2_pair_energy_reference(Bi, Bj, ei, ej, ev, k_dtype=dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert got[0] == pytest.approx(ref[0], rel=tol)
    assert math.isnan(got[1]) if evj is not None else got[1] == pytest.approx(ref[1], rel=tol, abs=1e-12)


def test_the_tiles_cover_each_needed_pair_once():
    """Every tile plan over blocks of 1..17 orbitals computes each pair (i, j) once, and on a
    diagonal block exactly the pairs j <= i (a diagonal tile runs by rows)."""
    for ni in range(1, 18):
        for nj in (ni, max(1, ni - 3), ni + 5):
            for sym in (True, False) if nj == ni else (False,):
                for nvir in (5, 300, 2000):
                    for tile_elems in (1, 4000, cpu_pair.TILE_ELEMS):
                        ic, jc = cpu_pair.tile_shape(ni, nj, nvir, nvir, sym, tile_elems)
                        seen = np.zeros((ni, nj), dtype=int)
                        for i0, i1, j0, j1, by_rows in cpu_pair.tiles(ni, nj, ic, jc, sym):
                            for i in range(i0, i1):
                                seen[i, j0 : (i + 1 if by_rows else j1)] += 1
                        need = np.tril(np.ones((ni, nj), dtype=int)) if sym else np.ones((ni, nj), dtype=int)
                        assert (seen == need).all(), (ni, nj, sym, nvir, tile_elems, ic, jc)
                        if sym:
                            assert ic == jc


def test_tile_shape_aims_at_large_gemms():
    """The bench's block (16 x 16 pairs of nvir 448): 4 x 4 pairs a tile (GEMMs of 1792 x 1792, the
    fastest measured); a small nvir takes the whole block; a diagonal block square tiles; one pair
    over the budget is still one pair."""
    assert cpu_pair.tile_shape(16, 16, 448, 448, False) == (4, 4)
    assert cpu_pair.tile_shape(16, 16, 40, 40, False) == (16, 16)
    assert cpu_pair.tile_shape(16, 16, 672, 300, True) == (3, 3)
    assert cpu_pair.tile_shape(4, 4, 3000, 3000, True) == (1, 1)
    assert cpu_pair.workspace_elems(4, 4, 3000, 3000) == 3000 * 3000
    from dfmp2 import memory  # the memory plan's workspace covers the tile in flight

    for n, nvir in [(1, 10), (16, 448), (16, 700), (16, 1500), (4, 4000)]:
        assert 8 * cpu_pair.workspace_elems(n, n, nvir, nvir) <= memory.pair_workspace_bytes(n, nvir)


def test_energies_do_not_depend_on_threads_or_tiles():
    """The same K gives the same sums bit for bit, whatever the thread count; other tile shapes
    agree to rounding (their GEMMs may order a sum over naux differently)."""
    Bi, Bj, ei, ej, ev, _ = _problem(12, 12, 40, 40, 64, torch.float64, 3, True)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            runs.append(cpu_pair.mp2_pair_energy(Bi, Bj, ei, ej, ev, symmetric=True, tile_elems=4 * 40 * 40))
    finally:
        torch.set_num_threads(threads)
    assert runs[0] == runs[1] == runs[2]
    other = cpu_pair.mp2_pair_energy(Bi, Bj, ei, ej, ev, symmetric=True, tile_elems=40 * 40)
    assert other == pytest.approx(runs[0], rel=1e-13)


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """The kernel loader with an empty cache of its own and its per-process memo cleared (before
    and after: later tests get the real compiler back)."""
    from dfmp2.kernels.cpu import build, pair_epilogue

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build.load.cache_clear()
    pair_epilogue.library.cache_clear()
    yield build
    build.load.cache_clear()
    pair_epilogue.library.cache_clear()


def test_the_epilogue_is_compiled_once_and_recorded(fresh_build):
    """The first load compiles into the cache, the next process (memo cleared) finds it there;
    the backend's record names the library, compiler and flags."""
    _lib, info = fresh_build.load("pair_epilogue")
    assert info["compiled"] and info["cached"] and info["library"].startswith(str(fresh_build.cache_dir()))
    fresh_build.load.cache_clear()
    _, again = fresh_build.load("pair_epilogue")
    assert not again["compiled"] and again["library"] == info["library"]
    d = linalg.get_backend("cpu").describe()
    assert d["pair_path"]["fp64"] == "gemm+epilogue" and d["pair_path_why"]["fp64"].startswith("auto:")
    assert d["pair_epilogue"]["library"] == info["library"] and "-O3" in d["pair_epilogue"]["flags"]


def test_an_unwritable_cache_builds_in_a_private_directory(fresh_build, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    _, info = fresh_build.load("pair_epilogue")
    assert info["compiled"] and not info["cached"] and not info["library"].startswith(str(blocker))
    assert not os.path.exists(info["library"])  # its temporary directory is gone once loaded


def test_no_compiler_is_an_error_not_a_switch(fresh_build, monkeypatch):
    """Without a C compiler, auto and gemm+epilogue refuse at backend creation (KernelError naming
    gemm+torch); gemm+torch, which needs none, runs and says so."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    for kernel in ("auto", "gemm+epilogue"):
        with pytest.raises(linalg.KernelError, match="gemm\\+torch"):
            linalg.get_backend("cpu", pair_kernel=kernel)
    be = linalg.get_backend("cpu", pair_kernel="gemm+torch")
    Bi, Bj, ei, ej, ev, _ = _problem(4, 4, 9, 9, 10, torch.float64, 1, True)
    e = be.mp2_pair_energy(Bi, Bj, ei, ej, ev, symmetric=True)
    assert e == pytest.approx(mp2_pair_energy_reference(Bi, Bj, ei, ej, ev), rel=1e-12)
    assert be.describe()["pair_path"]["fp64"] == "gemm+torch" and "pair_epilogue" not in be.describe()


def test_a_failing_compile_says_why(fresh_build, monkeypatch, tmp_path):
    """A compiler that fails gives its own first error line, and leaves no partial library."""
    cc = tmp_path / "badcc"
    cc.write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'badcc 1.0'; exit 0; fi\n"
        "echo 'pair_epilogue.c:1: error: something is wrong' >&2; exit 1\n"
    )
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(fresh_build.KernelBuildError, match="error: something is wrong"):
        fresh_build.load("pair_epilogue")
    assert not list(fresh_build.cache_dir().glob("*"))


def test_pair_paths_by_device():
    """cpu has gemm+epilogue and gemm+torch, cuda gemm+epilogue and fused; a path of another
    device is refused before any work."""
    with pytest.raises(ValueError, match="not a pair-step path of device 'cpu'"):
        linalg.get_backend("cpu", pair_kernel="fused")
    with pytest.raises(ValueError, match="not a pair-step path of device 'trn1'"):
        linalg.get_backend("trn1", simulate=True, pair_kernel="gemm+torch")
    with pytest.raises(ValueError, match="unknown pair kernel"):
        linalg.get_backend("cpu", pair_kernel="magic")


def test_tile_operands_are_views_in_both_layouts():
    """The pipeline's Bt view and a contiguous (n, nvir, naux) B: every tile's GEMM reads B's own
    memory (no copy per call), and the energies agree."""
    Bi, Bj, ei, ej, ev, _ = _problem(6, 6, 11, 11, 13, torch.float64, 4, False)
    Ci, Cj = Bi.contiguous(), Bj.contiguous()
    for X, Y in ((Bi, Bj), (Ci, Cj)):
        A, B = cpu_pair.tile_operands(X, Y)
        assert A.untyped_storage().data_ptr() == X.untyped_storage().data_ptr()
        assert B.untyped_storage().data_ptr() == Y.untyped_storage().data_ptr()
        assert A.stride(0) == 1 or A.stride(1) == 1
    a = cpu_pair.mp2_pair_energy(Bi, Bj, ei, ej, ev)
    b = cpu_pair.mp2_pair_energy(Ci, Cj, ei, ej, ev)
    assert a == pytest.approx(b, rel=1e-13)


def test_a_read_only_cache_with_the_library_is_used(fresh_build, monkeypatch):
    """A shared cache that holds the library but cannot be written (another user's, a read-only
    home): the library is loaded from it, not built again. (os.access says 'not writable': root
    writes through a chmod.)"""
    _, first = fresh_build.load("pair_epilogue")
    fresh_build.load.cache_clear()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and access(path, mode))
    _, again = fresh_build.load("pair_epilogue")
    assert again["cached"] and not again["compiled"] and again["library"] == first["library"]
