"""Flop counts (linalg/flops.py): each op through the backend is charged its standard count, and
dfmp2.timing.Timer charges each stage the flops it executed."""

import ast
import os
import subprocess
import sys
import time

import pytest
import torch

from dfmp2 import linalg, memory
from dfmp2.linalg import flops as lf
from dfmp2.timing import Timer

f64 = torch.float64


def _charged(be, op, fn):
    before = be.flops.get(op, 0)
    fn()
    return be.flops.get(op, 0) - before


@pytest.fixture(params=["torch", "openblas"])
def be(request):
    return linalg.get_backend("cpu", cpu_blas=request.param)


def test_gemm_syrk_trsm_are_charged_their_formulas(be):
    m, k, n = 5, 7, 3
    a, b = torch.randn(m, k, dtype=f64), torch.randn(k, n, dtype=f64)
    assert _charged(be, "gemm", lambda: linalg.gemm(a, b, backend=be)) == 2 * m * n * k
    assert _charged(be, "gemm", lambda: linalg.gemm(a.T, b.T, trans_a=True, trans_b=True, backend=be)) == 2 * m * n * k
    ab, bb = torch.randn(2, m, k, dtype=f64), torch.randn(2, k, n, dtype=f64)
    assert _charged(be, "gemm", lambda: linalg.gemm(ab, bb, backend=be)) == 2 * 2 * m * n * k
    big = torch.randn(300, 200, dtype=f64)  # the blocked triangle: charged one triangle all the same
    for x, trans, (nn, kk) in ((a, False, (m, k)), (a, True, (k, m)), (big, False, (300, 200))):
        assert _charged(be, "syrk", lambda: linalg.syrk(x, trans=trans, backend=be)) == nn * (nn + 1) * kk
    L = torch.linalg.cholesky(linalg.random_spd(6, 10.0, 1, dtype=f64))
    for side, rhs in (("left", torch.randn(6, 4, dtype=f64)), ("right", torch.randn(4, 6, dtype=f64))):
        assert _charged(be, "trsm", lambda: linalg.trsm(L, rhs, side=side, backend=be)) == 4 * 6 * 6
    assert _charged(be, "trsm", lambda: linalg.trsm(L, torch.randn(6, dtype=f64), backend=be)) == 6 * 6


def test_factorisations_and_pair_energy_are_charged_their_formulas(be):
    n = 9
    s = linalg.random_spd(n, 100.0, 2, dtype=f64)
    assert _charged(be, "cholesky", lambda: linalg.cholesky(s, backend=be)) == n**3 // 3
    assert _charged(be, "eigh", lambda: linalg.eigh(s, backend=be)) == 10 * n**3 // 3
    got = _charged(be, "inv_sqrt_spd", lambda: linalg.inv_sqrt_spd(s, backend=be))
    assert got == 10 * n**3 // 3 + 2 * n * n * n  # nothing dropped: all n eigenvectors kept
    info = {}
    got = _charged(be, "inv_sqrt_spd", lambda: info.update(linalg.inv_sqrt_spd(s, "newton_schulz", backend=be)[1]))
    assert got == (3 * info["iterations"] + 2) * 2 * n**3
    ni, nj, nvir, nvj, naux = 4, 3, 5, 6, 7
    Bi, Bj = torch.randn(ni, nvir, naux, dtype=f64), torch.randn(nj, nvir, naux, dtype=f64)
    ei, ej = -1 - torch.rand(ni, dtype=f64), -1 - torch.rand(nj, dtype=f64)
    ev, evj = 1 + torch.rand(nvir, dtype=f64), 1 + torch.rand(nvj, dtype=f64)
    pair = lambda *args, **kw: lambda: linalg.mp2_pair_energy(*args, backend=be, **kw)
    one = 2 * nvir * nvir * naux
    assert _charged(be, "mp2_pair_energy", pair(Bi, Bi, ei, ei, ev, symmetric=True)) == ni * (ni + 1) // 2 * one
    assert _charged(be, "mp2_pair_energy", pair(Bi, Bj, ei, ej, ev)) == ni * nj * one
    Bx = torch.randn(nj, nvj, naux, dtype=f64)
    assert _charged(be, "mp2_pair_energy", pair(Bi, Bx, ei, ej, ev, eps_vir_j=evj)) == ni * nj * 2 * nvir * nvj * naux
    assert be.flops_executed() == sum(be.flops.values())


def test_flop_functions_take_shapes():
    assert lf.gemm((2, 4, 3), (3, 5)) == 2 * 2 * 4 * 5 * 3  # a batch against one matrix (broadcast)
    assert lf.trsm((8, 8), 8 * 3) == 3 * 64
    assert lf.inv_sqrt_spd((4, 4), {"method": "eigh", "kept": 3}) == lf.eigh((4, 4)) + 2 * 16 * 3
    assert lf.inv_sqrt_spd((4, 4), {"method": "newton_schulz", "iterations": 2, "residual": float("inf")}) == 12 * 64


def _gemm(be, m=8):
    x = torch.ones(m, m, dtype=f64)
    linalg.gemm(x, x, backend=be)
    return 2 * m**3


def test_timer_charges_each_stage_what_it_executed():
    be = linalg.get_backend("cpu", cpu_blas="torch")
    _gemm(be)  # before the timer: nobody's
    timer = Timer(be)
    t0 = time.perf_counter()
    a = _gemm(be)
    t0 = timer.add("one", t0)
    t_loop = time.perf_counter()
    b = _gemm(be) + _gemm(be, 4)
    timer.add("two", t_loop)
    timer.add("empty", time.perf_counter())
    assert timer.flops == {"one": a, "two": b, "empty": 0}
    # an aside inside an open stage (the DF-SCF's host rebuild): its flops are not the stage's
    t0 = time.perf_counter()
    c = _gemm(be)
    t1, f1 = time.perf_counter(), timer.executed()
    d = _gemm(be, 6)
    timer.add("aside", t1, flops0=f1)
    e = _gemm(be, 5)
    timer.add("outer", t0)
    assert timer.flops["aside"] == d and timer.flops["outer"] == c + e
    # a stage enclosing stages added before it (the gradient's grad_jk_factor): theirs are its too
    t0, f0 = time.perf_counter(), timer.executed()
    g = _gemm(be)
    timer.add("inner", t0)
    h = _gemm(be, 3)
    timer.add("enclosing", t0, flops0=f0)
    timer.add("after", time.perf_counter())
    assert timer.flops["inner"] == g and timer.flops["enclosing"] == g + h and timer.flops["after"] == 0
    # a second backend (the SCF's host backend on a device without fp64) counts once watched
    host = linalg.TorchBackend("cpu", cpu_blas="torch")
    _gemm(host)  # before watch: not counted
    timer.watch(host)
    timer.watch(host)  # twice: once
    t0 = time.perf_counter()
    k = _gemm(host) + _gemm(be)
    timer.add("both", t0)
    assert timer.flops["both"] == k
    timer.seconds["moved"] = 0.1  # seconds moved to a stage without an add (the MP2 stage's integrals)
    assert timer.stage_flops() == {**timer.flops, "moved": 0} and list(timer.stage_flops()) == list(timer.seconds)


def test_timer_records_the_peak_rss_a_stage_reached():
    """Each stage's reading is the process's high-water mark when it ended (MB): a stage that
    touches 300 MB more than the gap between that mark and what is resident raises it by about 300
    MB, the next stage keeps it. In a fresh process, so no earlier test's peak hides the rise."""
    code = (
        "import time, numpy as np\n"
        "from dfmp2 import linalg\n"
        "from dfmp2.memory import resident_mb\n"
        "from dfmp2.timing import Timer\n"
        "t = Timer(linalg.get_backend('cpu', cpu_blas='torch'))\n"
        "t0 = t.add('small', time.perf_counter())\n"
        "resident = resident_mb()\n"
        "a = np.ones(int((t.peak_rss_mb['small'] - resident + 300) * 1e6 / 8))\n"
        "t0 = t.add('big', t0)\n"
        "del a\n"
        "t.add('after', t0)\n"
        "print(repr(t.stage_rss()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    rss = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert list(rss) == ["small", "big", "after"]
    assert 200 < rss["big"] - rss["small"] < 400 and rss["after"] == rss["big"]


@pytest.mark.skipif(memory.allocator().startswith("the C library"), reason="not glibc: no malloc_trim to test")
def test_a_stage_end_hands_freed_heap_memory_back():
    """glibc keeps freed blocks below its mmap threshold in its heap, resident; a stage's end
    (``Timer.add`` -> ``memory.release_freed``) hands their pages back. In a fresh process with
    the threshold fixed at 32 MB (glibc's dynamic maximum, what a long run reaches), 300 blocks of
    1 MB, each followed by a 4 KB block that stays (malloc's, not Python's small-object arenas, so
    the heap's top cannot shrink), are freed: still resident before the stage ends, about 315 MB
    (300 MiB) fewer after. What the imports freed is handed back before, so only the blocks count."""
    code = (
        "import time\n"
        "from dfmp2 import linalg\n"
        "from dfmp2.memory import release_freed, resident_mb as rss\n"
        "from dfmp2.timing import Timer\n"
        "t = Timer(linalg.get_backend('cpu', cpu_blas='torch'))\n"
        "release_freed()  # what the imports freed goes now, not with the stage\n"
        "big, keep = [], []\n"
        "for _ in range(300):\n"
        "    big.append(bytearray(1 << 20))\n"
        "    big[-1][::4096] = bytes(256)  # touch every page\n"
        "    keep.append(bytearray(4096))\n"
        "before_free = rss()\n"
        "del big\n"
        "freed = rss()\n"
        "t.add('stage', time.perf_counter())\n"
        "print(repr((before_free, freed, rss())))\n"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=env)
    before_free, freed, after = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert before_free - freed < 50  # freed, but the heap kept the pages
    assert 250 < freed - after < 350  # handed back at the stage's end
