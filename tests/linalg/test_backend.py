"""Backends from device names: clear errors for devices that cannot run, no silent fallback."""

import pytest
import torch

from dfmp2 import linalg
from dfmp2.linalg import DeviceUnavailableError, TorchBackend, backend_for, get_backend


def test_cpu_backend_describes_what_ran():
    be = get_backend("cpu", cpu_blas="torch")  # auto may pick OpenBLAS (tests/linalg/test_cpu_blas.py)
    assert isinstance(be, TorchBackend) and be.engine == "torch"
    linalg.gemm(torch.ones(2, 2), torch.ones(2, 2), backend=be)
    d = be.describe()
    assert d["device"] == "cpu" and d["kernels"] == {"gemm:torch.matmul": 1} and d["torch"] == torch.__version__
    # backends are separate objects: no module-global state
    assert get_backend("cpu").kernels_used == {}
    assert backend_for(torch.zeros(1)).name == "cpu"


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_gpu_is_one_clear_error(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU, on any machine
    with pytest.raises(DeviceUnavailableError) as e:
        get_backend(name)
    msg = str(e.value)
    assert "\n" not in msg and f"'{name}'" in msg and "CUDA" in msg


def test_trainium_without_neuron_sdk_is_one_clear_error():
    import importlib.util

    if importlib.util.find_spec("neuronxcc") is not None:
        pytest.skip("a Neuron SDK is installed here")
    for name in ("trn1", "trn2"):
        with pytest.raises(DeviceUnavailableError) as e:
            get_backend(name)
        assert "\n" not in str(e.value) and "Neuron" in str(e.value)


def test_cuda_name_builds_the_cuda_backend(monkeypatch):
    # Only the wiring is checked (a usable GPU is faked). make_cuda_backend is replaced by a spy so
    # that Triton is not imported here: importing it early changes how later interpreter tests run.
    import dfmp2.linalg.cuda  # noqa: F401  (loads linalg.cuda, patched below)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    built = []
    monkeypatch.setattr(
        linalg.cuda, "make_cuda_backend", lambda name, **kw: built.append((name, kw)) or f"cuda backend {name}"
    )
    assert get_backend("cuda") == "cuda backend cuda"
    assert get_backend("cuda:1", pair_kernel="fused") == "cuda backend cuda:1"
    assert built == [("cuda", {"pair_kernel": "auto"}), ("cuda:1", {"pair_kernel": "fused"})]
    get_backend("cuda", unrestricted=True)  # a UHF run: opposite-spin pair blocks
    assert built[-1] == ("cuda", {"pair_kernel": "auto", "unrestricted": True})
    with pytest.raises(DeviceUnavailableError, match="only 2 CUDA"):
        get_backend("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "cpu:1", "trn3", "", "cuda:x"])
def test_unknown_device_names(name):
    with pytest.raises(ValueError, match="unknown device"):
        get_backend(name)
    with pytest.raises(ValueError):
        get_backend(3)


@pytest.mark.cuda
def test_ops_on_cuda_match_cpu():
    be = get_backend("cuda")
    a = linalg.random_matrix((300, 70), 1)
    ag = a.cuda()
    assert torch.allclose(linalg.gemm(ag, ag, trans_b=True, backend=be).cpu(), a @ a.T, atol=1e-10)
    assert torch.allclose(linalg.syrk(ag, backend=be).cpu(), a @ a.T, atol=1e-10)
    s = linalg.random_spd(200, 1e6, 2)
    L = linalg.cholesky(s.cuda(), backend=be)
    assert torch.allclose(L.cpu(), torch.linalg.cholesky(s), atol=1e-10)
    x = linalg.trsm(L, ag[:200], backend=be)
    assert torch.allclose(x.cpu(), torch.linalg.solve_triangular(L.cpu(), a[:200], upper=False), atol=1e-8)
    xn, info = linalg.inv_sqrt_spd(s.cuda(), method="newton_schulz", backend=be)
    assert info["converged"] and xn.device.type == "cuda"
    p = linalg.synthetic_problem(4, 20, 50, seed=1, device="cuda")
    q = linalg.synthetic_problem(4, 20, 50, seed=1)
    assert torch.equal(p.B.cpu(), q.B)  # bit-identical generation on both devices
    e_gpu = linalg.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True, backend=be)
    e_cpu = linalg.mp2_pair_energy(q.B, q.B, q.eps_occ, q.eps_occ, q.eps_vir, symmetric=True)
    assert e_gpu == pytest.approx(e_cpu, rel=1e-12)
    assert be.describe()["gpu"]


def test_capabilities_come_from_the_device_name_without_hardware():
    """What a stage asks the backend: fp64, the fit dtype, the default precision."""
    from dfmp2.linalg import device_capabilities

    for name, fp64 in (("cpu", True), ("cuda", True), ("cuda:1", True), ("trn1", False), ("trn2", False)):
        caps = device_capabilities(name)
        assert caps.has_fp64 == fp64 and caps.default_precision == ("fp64" if fp64 else "fp32")
        for prec in ("fp64", "fp32"):  # the fit stays fp64 wherever the device has it
            assert caps.fit_dtype(prec) == (torch.float64 if fp64 else torch.float32)
        assert (caps.precision_problem("fp64") is None) == fp64 and caps.precision_problem("fp32") is None
        assert caps.supports("mp2_pair_energy") and not caps.supports("fft")
    assert device_capabilities("trn1").simulable and not device_capabilities("cpu").simulable
    assert device_capabilities("cuda").pair_kernels == ("auto", "gemm+epilogue", "fused")
    assert device_capabilities("cpu").pair_kernels == ("auto", "gemm+epilogue", "gemm+torch")
    assert device_capabilities("trn1").pair_kernels == ("auto",)
    for bad in ("gpu", "cpu:0", "trn3", "cuda:x"):
        with pytest.raises(ValueError, match="unknown device"):
            device_capabilities(bad)
    be = get_backend("cpu")
    assert be.has_fp64 and be.fit_dtype("fp32") == torch.float64 and be.device == torch.device("cpu")


def test_no_device_name_comparisons_outside_linalg():
    """Stages ask the backend's capabilities; only linalg knows what a device name means."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r'startswith\("(trn|cuda)|== "(cpu|cuda|trn1|trn2)"|name\.startswith')
    hits = [
        f"{p.relative_to(root)}:{n}"
        for d in ("dfmp2", "scripts")
        for p in sorted((root / d).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_the_fp32_probe_times_both_precisions_on_the_given_device(monkeypatch):
    """``measure_fp32_speedup`` (what 'auto' SCF precision reads on a GPU) is the median DGEMM time
    over the median SGEMM time of the same square product: on this CPU a positive ratio, and a
    stubbed matmul that takes twice as long in fp64 gives 2."""
    import time

    from dfmp2.linalg import cuda

    assert cuda.measure_fp32_speedup("cpu", n=64) > 0
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def matmul(a, b, out=None):
        clock[0] += 2.0 if a.dtype == torch.float64 else 1.0

    monkeypatch.setattr(torch, "matmul", matmul)
    assert cuda.measure_fp32_speedup("cpu", n=8, repeats=3) == 2.0


def test_the_cuda_backend_measures_fp32_only_on_a_gpu():
    from dfmp2.linalg.cuda import CudaBackend

    assert CudaBackend("cpu").fp32_speedup() is None  # Triton's interpreter: no GPU to measure


@pytest.mark.cuda
def test_the_gpu_fp32_probe_is_measured_once():
    from dfmp2.linalg import cuda

    be = cuda.CudaBackend("cuda")
    r = be.fp32_speedup()
    assert r is not None and r > 0 and cuda._FP32_SPEEDUP[str(be.device)] == r and be.fp32_speedup() == r


def test_pair_config_gives_the_gemm_epilogue_its_chunk_and_the_fused_kernel_the_rest():
    from dfmp2.linalg.cuda import CudaBackend

    be = CudaBackend("cpu", pair_config={"max_elems": 1 << 28, "BLOCK": 64})
    assert be.fused_config() == {"BLOCK": 64} and be.pair_config["max_elems"] == 1 << 28
