"""dfmp2.linalg.cuda.CudaBackend's pair step and the B-streaming helper, on CPU tensors: the Triton
kernels run under the interpreter (``@interpreted``: see tests/helpers/triton_interpreter.py); no GPU is
needed here.
The GPU itself is exercised in tests/linalg/test_cuda.py (cuda channel)."""

import importlib.util

import pytest
import torch
from triton_interpreter import in_interpreter, interpreted

from dfmp2 import linalg
from dfmp2.linalg.cuda import CudaBackend
from dfmp2.linalg.synthetic import synthetic_problem


def _bt_problem(nocc=6, nvir=24, naux=20, seed=11):
    p = synthetic_problem(nocc, nvir, naux, seed)
    Bt = p.B.permute(2, 0, 1).reshape(naux, nocc * nvir).contiguous()
    return Bt, Bt.view(naux, nocc, nvir).permute(1, 2, 0), p.eps_occ, p.eps_vir


def _pipeline_pairs(B, eo, ev, backend, occ_block):
    """The MP2 stage's pair loop over blocks I >= J, in-line so this test does not import dfmp2."""
    nocc = B.shape[0]
    e_os = e_ss = 0.0
    for I in range(0, nocc, occ_block):
        for J in range(0, I + 1, occ_block):
            o, s = linalg.mp2_pair_energy(
                B[I : I + occ_block],
                B[J : J + occ_block],
                eo[I : I + occ_block],
                eo[J : J + occ_block],
                ev,
                symmetric=(I == J),
                backend=backend,
            )
            w = 1.0 if I == J else 2.0
            e_os, e_ss = e_os + w * o, e_ss + w * s
    return e_os, e_ss


@interpreted
@pytest.mark.parametrize("path", ["fused", "gemm+epilogue"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_backend_pair_step_matches_torch(path, dtype):
    _Bt, B, eo, ev = _bt_problem()
    B = B.to(dtype) if dtype != torch.float64 else B
    prec = "fp64" if dtype == torch.float64 else "fp32"
    be = CudaBackend("cuda", pair_path={prec: path}, pair_config={"BLOCK": 16, "BLOCK_P": 16})
    got = _pipeline_pairs(B, eo, ev, be, occ_block=4)
    ref = _pipeline_pairs(B, eo, ev, linalg.TorchBackend("cpu"), occ_block=4)
    tol = 1e-14 if dtype == torch.float64 else 1e-6
    assert abs(got[0] - ref[0]) <= tol * abs(ref[0]) and abs(got[1] - ref[1]) <= tol * abs(ref[0])
    kernels = be.describe()["kernels"]
    assert sum(kernels.values()) == 3  # block pairs (0,0), (4,0), (4,4)
    (label,) = kernels
    assert "[Triton interpreter, cpu tensors]" in label
    assert label.startswith("mp2_pair_energy:")
    if path == "fused":
        assert f"triton.fused_pair_energy({prec}" in label
        assert ("fp32 ieee dot" in label) == (prec == "fp32")
    else:
        assert "torch.matmul(DGEMM" in label or "torch.matmul(SGEMM" in label
        assert "triton.pair_energy_epilogue" in label
    d = be.describe()
    assert d["engine"] == "torch+triton" and d["pair_path"][prec] == path and "triton" in d


@pytest.mark.skipif(in_interpreter(), reason="checks a process that compiles (TRITON_INTERPRET unset)")
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_cuda_backend_never_falls_back(monkeypatch):
    """Without a GPU and without the interpreter, the Triton pair step raises (no torch fallback)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, B, eo, ev = _bt_problem(2, 5, 6)
    be = CudaBackend("cuda")
    with pytest.raises(RuntimeError, match="Triton"):
        be.mp2_pair_energy(B, B, eo, eo, ev, symmetric=True)
    assert not any("torch.matmul(rows)" in k or "pair_epilogue.c" in k for k in be.kernels_used)


def test_cuda_backend_rejects_unknown_paths():
    with pytest.raises(ValueError, match="pair_path"):
        CudaBackend("cuda", pair_path={"fp64": "torch"})
    with pytest.raises(ValueError, match="pair_path"):
        CudaBackend("cuda", pair_path={"bf16": "fused"})
