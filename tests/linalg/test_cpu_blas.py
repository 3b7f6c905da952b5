"""The CPU's BLAS choice (linalg.cpu_blas): torch's BLAS or numpy's OpenBLAS for GEMM, SYRK and the
pair step's GEMMs. Either library gives the same energies (RHF water, UHF OH), the result names what
ran per op, a forced choice is honoured (and refused off the cpu before any work), the probe is
short and cached, and the OpenBLAS path copies none of its inputs."""

import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from dfmp2 import linalg
from dfmp2.errors import InputError
from dfmp2.linalg import cpu_blas
from dfmp2.pipeline import RunOptions, run

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
OH = INPUTS / "open_shell" / "hydroxyl.xyz"

pytestmark = pytest.mark.skipif(cpu_blas.numpy_blas_info() is None, reason="numpy here has no OpenBLAS")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test's own cache directory: the user's ~/.cache is never read or written here."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_blas, "_TABLES", {})


@pytest.mark.parametrize("xyz", [WATER, OH], ids=["water-RHF", "OH-UHF"])
def test_torch_and_openblas_give_the_same_energies(xyz):
    """Each library forced in turn: E_HF, E_OS, E_SS agree to 1e-12 Eh (cross-check of the two
    libraries; PySCF agreement of these energies is tests/mp2/test_pipeline.py's and test_ump2.py's).
    The SCF in fp64 throughout: the mixed SCF's fp32 cycles take a library-dependent path to the
    same converged state (E_HF within 1e-10 Eh, tests/scf/test_dfhf.py), which moves E_corr by ~2e-12."""
    res = {mode: run(xyz, RunOptions(cpu_blas=mode, scf_precision="fp64")) for mode in ("torch", "openblas")}
    t, o = res["torch"], res["openblas"]
    for name in ("e_hf", "e_os", "e_ss"):
        assert abs(getattr(t, name) - getattr(o, name)) < 1e-12, name
    used_t, used_o = t.ran["kernels"], o.ran["kernels"]
    assert not any("openblas" in k for k in used_t)
    assert any(k.startswith("gemm:openblas.dgemm") for k in used_o)
    assert any(k.startswith("mp2_pair_energy:openblas.") for k in used_o)
    if xyz == WATER:  # our DF-RHF: its K build's SYRK
        assert any(k.startswith("syrk:openblas.dsyrk") for k in used_o)
        assert any(k.startswith("syrk:openblas.dsyrk") for k in o.ran["scf"]["kernels"])


def test_the_result_names_library_and_kernel_per_op():
    d = json.loads(json.dumps(run(WATER, RunOptions(cpu_blas="openblas")).to_dict()))
    blas = d["ran"]["cpu_blas"]
    assert blas["mode"] == "openblas" and blas["source"] == "user" and blas["choice"] is None
    ob, tb = blas["libraries"]["openblas"], blas["libraries"]["torch"]
    assert ob["library"] == "OpenBLAS" and ob["version"] and ob["architecture"] and ob["threads"] >= 1
    assert ob["threads"] == torch.get_num_threads()  # the pools agree: no oversubscription
    assert tb["library"] and tb["torch"] == torch.__version__
    for op in ("gemm", "syrk", "mp2_pair_energy"):
        assert any(k["op"] == op and k["kernel"].startswith("openblas.") for k in d["ran"]["kernels"]), op
    auto = json.loads(json.dumps(run(WATER, RunOptions()).to_dict()))["ran"]["cpu_blas"]
    assert auto["mode"] == "auto" and auto["source"] in ("probe", "cache")
    assert set(auto["choice"]) == set(auto["probe_gflops"])
    assert {e.split("/")[0] for e in auto["choice"]} == set(cpu_blas.OPS)
    assert set(auto["choice"].values()) <= {"torch", "openblas"}


def test_probe_is_short_and_cached(tmp_path):
    flops = sum(
        2.0 * np.prod(s) if op != "syrk" else 2.0 * s[0] ** 2 * s[1]
        for op, shapes in cpu_blas.PROBE_SHAPES.items()
        for s in shapes.values()
    )
    assert flops < 2e9  # per library and dtype: ~20 ms of an idle 2-core CPU's GEMM
    be = linalg.get_backend("cpu")
    t0 = time.perf_counter()
    first = be.blas.describe()
    took = time.perf_counter() - t0
    assert first["source"] == "probe" and first["cache_error"] is None
    assert took < 10.0  # a loaded CI machine; ~0.3 s idle (the probe's own time is recorded)
    assert first["probe_seconds"] > 0
    assert Path(first["cache"]).is_file()
    cpu_blas._TABLES.clear()  # a new process: the table comes from the cache file, no probe
    t0 = time.perf_counter()
    again = linalg.get_backend("cpu").blas.describe()
    assert again["source"] == "cache" and again["choice"] == first["choice"]
    assert time.perf_counter() - t0 < 0.5


def test_a_cache_that_cannot_be_written_does_not_break_a_run(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    d = linalg.get_backend("cpu").blas.describe()
    assert d["source"] == "probe" and d["cache_error"]
    (tmp_path / "c" / "dfmp2").mkdir(parents=True)
    (tmp_path / "c" / "dfmp2" / "cpu_blas.json").write_text("{not json")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    cpu_blas._TABLES.clear()
    assert linalg.get_backend("cpu").blas.describe()["source"] == "probe"  # and rewritten
    assert json.loads((tmp_path / "c" / "dfmp2" / "cpu_blas.json").read_text())["version"] == cpu_blas.CACHE_VERSION


@pytest.mark.parametrize("mode", ["torch", "openblas"])
def test_a_forced_choice_is_honoured_without_a_probe(mode, monkeypatch):
    monkeypatch.setattr(cpu_blas, "probe", lambda *a, **k: pytest.fail("a forced choice probed"))
    be = linalg.get_backend("cpu", cpu_blas=mode)
    for dtype in (torch.float64, torch.float32):
        a = torch.rand(300, 200, dtype=dtype)
        be.gemm(a, a, trans_a=True)
        be.syrk(a, trans=True)
        B = torch.rand(200, 4 * 30, dtype=dtype)  # the pipeline's layout: Bt (naux, nocc*nvir)
        Bi = B.view(200, 4, 30).permute(1, 2, 0)
        e = torch.linspace(-1.0, -0.5, 4, dtype=torch.float64)
        v = torch.linspace(0.5, 2.0, 30, dtype=torch.float64)
        be.mp2_pair_energy(Bi, Bi, e, e, v, symmetric=True)
    lib = "openblas" if mode == "openblas" else "torch"
    assert all(k.split(":", 1)[1].startswith(lib) for k in be.kernels_used), be.kernels_used
    assert be.describe()["cpu_blas"]["source"] == "user"


def test_openblas_off_the_cpu_is_refused_before_any_work():
    with pytest.raises(InputError) as e:
        RunOptions(device="trn1", cpu_blas="openblas").check_choices()
    assert e.value.option == "cpu_blas" and "\n" not in str(e.value)
    with pytest.raises(InputError) as e:
        run(WATER, RunOptions(device="cuda", cpu_blas="openblas"))
    assert e.value.option == "cpu_blas"
    with pytest.raises(ValueError, match="only to the cpu"):
        linalg.get_backend("trn1", cpu_blas="openblas")
    with pytest.raises(InputError):
        RunOptions(cpu_blas="mkl").check_choices()


def test_the_openblas_path_copies_no_input():
    """np.matmul is handed the tensors' own memory (transposed views as BLAS 'T', x @ x.T as SYRK):
    numpy allocates nothing (tracemalloc sees numpy's allocations), and the result equals torch's."""
    be = linalg.get_backend("cpu", cpu_blas="openblas")
    a = torch.rand(400, 300, dtype=torch.float64)
    b = torch.rand(400, 250, dtype=torch.float64)
    Bt = torch.rand(256, 8 * 40, dtype=torch.float64)
    Bi = Bt.view(256, 8, 40).permute(1, 2, 0)  # (nocc, nvir, naux) view, as the pair step's
    ptrs = (a.data_ptr(), b.data_ptr(), Bt.data_ptr())
    out = torch.empty(300, 250, dtype=torch.float64)
    e = torch.linspace(-1.0, -0.5, 8, dtype=torch.float64)
    v = torch.linspace(0.5, 2.0, 40, dtype=torch.float64)
    be.gemm(a, b, trans_a=True, out=out)  # warm-up (first calls may allocate buffers)
    tracemalloc.start()
    try:
        c = be.gemm(a, b, trans_a=True, out=out)
        s = be.syrk(a, trans=True)
        be.mp2_pair_energy(Bi, Bi, e, e, v, symmetric=True)
        numpy_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert numpy_bytes < 64 * 1024, numpy_bytes  # a copy of a would be 960 kB
    assert c is out and (a.data_ptr(), b.data_ptr(), Bt.data_ptr()) == ptrs
    assert torch.allclose(c, a.mT @ b, rtol=1e-13, atol=1e-12)
    assert torch.allclose(s, a.mT @ a, rtol=1e-13, atol=1e-12) and torch.equal(s, s.mT)
    assert set(be.kernels_used) == {
        "gemm:openblas.dgemm(numpy.matmul)",
        "syrk:openblas.dsyrk(numpy.matmul)",
        "mp2_pair_energy:openblas.dgemm(numpy.matmul, tiles)+pair_epilogue.c(fp64 sums)",
    }
    # a layout OpenBLAS would need copied goes to torch, and the record says so
    be.gemm(a[:, ::2], b, trans_a=True)
    assert be.kernels_used.get("gemm:torch.matmul") == 1
