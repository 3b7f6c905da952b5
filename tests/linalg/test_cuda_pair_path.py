"""The CUDA pair-step path (linalg.cuda), on CPU: the auto rule (cuBLAS gemm+epilogue unless the
fused kernel was measured faster on the GPU class), --pair-kernel from the CLI down to the backend,
what the result records, and a failing kernel as one error line with nothing run in its place.
The GPU runs of both paths are in tests/linalg/test_cuda.py (cuda channel)."""

import ast
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from triton_interpreter import interpreted

from dfmp2 import linalg
from dfmp2.linalg import KernelError, get_backend
from dfmp2.linalg import cuda as lcuda
from dfmp2.linalg.cuda import CudaBackend, auto_pair_path

WATER = str(Path(__file__).resolve().parents[2] / "inputs" / "water.xyz")


def _cli(args):
    from dfmp2.cli.main import main

    return CliRunner().invoke(main, args)


def _one_error_line(res, *fragments):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and sum(ln.startswith("error: ") for ln in lines) == 1, res.output
    assert "Traceback" not in res.output and res.exc_info[0] is SystemExit
    for f in fragments:
        assert f in lines[-1], (f, lines[-1])
    return lines[-1]


def test_auto_rule_takes_cublas_unless_the_fused_kernel_was_measured_faster():
    for prec, (gemm, fused) in (("fp64", ("0.656", "1.357")), ("fp32", ("0.669", "0.793"))):
        path, why = auto_pair_path(prec, (9, 0))  # H100: measured, gemm+epilogue faster
        assert path == "gemm+epilogue" and "sm_90" in why and gemm in why and fused in why, why
        path, why = auto_pair_path(prec, (8, 0))  # A100: not measured
        assert path == "gemm+epilogue" and "not been measured faster on sm_80" in why
        assert auto_pair_path(prec, None)[0] == "gemm+epilogue"  # no GPU (interpreter)
    # a GPU class where the fused kernel was faster in fp32 only
    measured = {
        **lcuda.PAIR_PATH_MEASUREMENTS,
        (12, 0): {
            "gpu": "test GPU",
            "date": "2026-11",
            "versions": "-",
            "shape": (1, 2, 3),
            "fp64": {"gemm+epilogue": 1.0, "fused": 1.5},
            "fp32": {"gemm+epilogue": 1.0, "fused": 0.5},
        },
    }
    assert auto_pair_path("fp64", (12, 0), measured)[0] == "gemm+epilogue"
    path, why = auto_pair_path("fp32", (12, 0), measured)
    assert path == "fused" and why.startswith("auto: fused (measured on sm_120, test GPU")


def test_backend_resolves_and_records_the_path(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    d = CudaBackend("cuda").describe()
    assert d["pair_path"] == {"fp64": "gemm+epilogue", "fp32": "gemm+epilogue"}
    assert all(w.startswith("auto: gemm+epilogue (no GPU") for w in d["pair_path_why"].values())
    monkeypatch.setattr(CudaBackend, "capability", lambda self: (9, 0))  # as on an H100
    d = CudaBackend("cuda").describe()
    assert d["pair_path"]["fp64"] == "gemm+epilogue" and "1.357" in d["pair_path_why"]["fp64"]
    be = CudaBackend("cuda", pair_kernel="fused")
    assert be.pair_path == {"fp64": "fused", "fp32": "fused"}
    assert be.pair_path_why["fp32"] == "user choice (--pair-kernel fused)"
    be = CudaBackend("cuda", pair_kernel="fused", pair_path={"fp32": "gemm+epilogue"})
    assert be.pair_path == {"fp64": "fused", "fp32": "gemm+epilogue"}
    with pytest.raises(ValueError, match="pair_kernel"):
        CudaBackend("cuda", pair_kernel="torch")


@pytest.mark.parametrize("device", ["cpu", "trn1", "trn2"])
def test_fused_pair_kernel_is_for_cuda_only(device):
    with pytest.raises(ValueError, match=f"not a pair-step path of device '{device}'"):
        get_backend(device, pair_kernel="fused")
    with pytest.raises(ValueError, match="unknown pair kernel"):
        get_backend(device, pair_kernel="cutlass")


def test_cli_pair_kernel_on_a_non_cuda_device_is_one_error_line():
    _one_error_line(
        _cli(["run", WATER, "--pair-kernel", "fused"]), "pair kernel 'fused'", "not a pair-step path of device 'cpu'"
    )
    _one_error_line(
        _cli(["compare", "--synthetic", "2,3,4", "--devices", "cpu,trn1", "--pair-kernel", "fused"]),
        "a path of none of the devices",
    )


def _compilation_error():
    """What Triton 3.6 raised for the fp64 accumulator: a CompilationError over an AssertionError."""
    from triton.compiler.errors import CompilationError

    src = 'x = tl.dot(u, v, x, input_precision="ieee")'
    try:
        raise AssertionError()
    except AssertionError as cause:
        try:
            raise CompilationError(src, ast.parse(src).body[0], None) from cause
        except CompilationError as e:
            return e


@pytest.fixture
def broken_fused(monkeypatch):
    """The fused kernel fails to compile; the other pair paths record any call made to them."""
    pytest.importorskip("triton")
    import dfmp2.kernels.triton.fused_pair_energy as fpe
    import dfmp2.kernels.triton.pair_energy_epilogue as pee
    from dfmp2.linalg import torch_ops

    other = []

    def broken(*a, **k):
        raise _compilation_error()

    monkeypatch.setattr(fpe, "fused_pair_energy", broken)
    monkeypatch.setattr(pee, "gemm_epilogue_pair_energy", lambda *a, **k: other.append("gemm+epilogue"))
    monkeypatch.setattr(torch_ops, "mp2_pair_energy", lambda *a, **k: other.append("torch"))
    return other


def test_kernel_failure_is_one_line_and_nothing_else_runs(broken_fused):
    import triton

    p = linalg.synthetic_problem(3, 8, 10, seed=1)
    be = CudaBackend("cpu", pair_kernel="fused")
    with pytest.raises(KernelError) as e:
        be.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    msg = str(e.value)
    assert "\n" not in msg
    for fragment in (
        "pair-step kernel triton.fused_pair_energy(fp64",
        f"with Triton {triton.__version__}",
        'CompilationError: line 1 of the kernel function, `x = tl.dot(u, v, x, input_precision="ieee")`: '
        "AssertionError",
        "no other kernel was run",
        "user choice (--pair-kernel fused)",
    ):
        assert fragment in msg, (fragment, msg)
    assert "cpu (no CUDA GPU)" in msg or "Triton interpreter" in msg
    assert broken_fused == []  # no fallback to gemm+epilogue or torch
    assert list(be.kernels_used) == [
        "mp2_pair_energy:triton.fused_pair_energy(fp64: fp64 dot, fp64 sums)"
        + (" [Triton interpreter, cpu tensors]" if "interpreter" in msg else "")
    ]


def test_cli_kernel_failure_is_one_error_line_exit_2(broken_fused, monkeypatch, tmp_path):
    """dfmp2 run with the CUDA backend (on CPU tensors: a GPU is not needed to fail): one line naming
    the kernel, the device and the Triton version; no result file."""
    monkeypatch.setattr(
        linalg,
        "get_backend",
        lambda name, *, simulate=False, pair_kernel="auto": CudaBackend("cpu", pair_kernel=pair_kernel),
    )
    out = tmp_path / "r.json"
    line = _one_error_line(
        _cli(["run", WATER, "--pair-kernel", "fused", "--json", str(out), "-q"]),
        "error: pair-step kernel triton.fused_pair_energy(fp64",
        "with Triton ",
        "CompilationError",
        "no other kernel was run",
    )
    assert not out.exists() and broken_fused == [], line


@interpreted
def test_result_records_the_path_that_ran_and_why(monkeypatch, tmp_path):
    """Through the whole pipeline under Triton's interpreter: --pair-kernel reaches the backend, and
    the result JSON's 'ran' names the path, the reason and the kernel that ran."""
    monkeypatch.setattr(
        linalg,
        "get_backend",
        lambda name, *, simulate=False, pair_kernel="auto": CudaBackend("cpu", pair_kernel=pair_kernel),
    )
    for choice, why in (
        ("fused", "user choice (--pair-kernel fused)"),
        ("auto", "auto: gemm+epilogue (no GPU: Triton interpreter"),
    ):
        out = tmp_path / f"{choice}.json"
        res = _cli(["run", WATER, "--pair-kernel", choice, "--json", str(out), "-q"])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        ran = doc["ran"]
        path = "fused" if choice == "fused" else "gemm+epilogue"
        assert ran["pair_path"]["fp64"] == path and ran["pair_path_why"]["fp64"].startswith(why)
        (kernel,) = [k["kernel"] for k in ran["kernels"] if k["op"] == "mp2_pair_energy"]  # JSON: a list
        assert ("fused_pair_energy" in kernel) == (choice == "fused") and "[Triton interpreter" in kernel
        # water/cc-pVDZ DF-MP2, PySCF's own value (the same check as tests/workflows/test_compare.py)
        assert abs(doc["energies"]["e_corr"] - (-0.2047684304)) < 1e-8


def test_unrestricted_backend_takes_gemm_epilogue_and_refuses_fused(monkeypatch):
    """UHF runs have opposite-spin pair blocks, which only gemm+epilogue computes: auto resolves to
    it (saying why, also where the fused kernel was measured faster) and an explicit fused is
    refused when the backend is built, before any work; a fused backend refuses an opposite-spin call."""
    measured = {
        (12, 0): {
            "gpu": "test GPU",
            "date": "2026-11",
            "versions": "-",
            "shape": (1, 2, 3),
            "fp64": {"gemm+epilogue": 1.0, "fused": 0.5},
            "fp32": {"gemm+epilogue": 1.0, "fused": 0.5},
        }
    }
    monkeypatch.setattr(lcuda, "PAIR_PATH_MEASUREMENTS", measured)
    monkeypatch.setattr(CudaBackend, "capability", lambda self: (12, 0))
    monkeypatch.setattr(lcuda, "auto_pair_path", lambda prec, cap, m=measured: auto_pair_path(prec, cap, m))
    assert CudaBackend("cuda").pair_path["fp64"] == "fused"
    b = CudaBackend("cuda", unrestricted=True)
    assert b.pair_path == {"fp64": "gemm+epilogue", "fp32": "gemm+epilogue"}
    assert all("UHF" in w for w in b.pair_path_why.values())
    with pytest.raises(ValueError, match="no opposite-spin"):
        CudaBackend("cuda", pair_kernel="fused", unrestricted=True)
    B = torch.zeros(1, 2, 3, dtype=torch.float64)
    e = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(ValueError, match="no opposite-spin form"):
        CudaBackend("cuda", pair_kernel="fused").mp2_pair_energy(B, B, e, e, e[:1].repeat(2), eps_vir_j=e.repeat(2))


@interpreted
def test_open_shell_through_the_pipeline_on_the_epilogue(monkeypatch, tmp_path):
    """OH (DF-UMP2) through the whole pipeline on the CUDA backend under Triton's interpreter:
    auto takes gemm+epilogue and says why, the alpha-beta block runs the epilogue's RECT form,
    E_corr matches PySCF's DFUMP2 (inputs/references.json) to 1e-9 Eh; an explicit fused is one
    error line before any work."""
    from dfmp2.workflows.regress import find_reference, load_references

    monkeypatch.setattr(
        linalg,
        "get_backend",
        lambda name, *, simulate=False, pair_kernel="auto", unrestricted=False: CudaBackend(
            "cpu", pair_kernel=pair_kernel, unrestricted=unrestricted
        ),
    )
    oh = str(Path(WATER).parent / "open_shell" / "hydroxyl.xyz")
    out = tmp_path / "oh.json"
    res = _cli(["run", oh, "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["ran"]["pair_path"]["fp64"] == "gemm+epilogue" and "UHF" in doc["ran"]["pair_path_why"]["fp64"]
    assert {
        "op": "mp2_pair_energy",
        "calls": 3,
        "kernel": "torch.matmul(DGEMM)+triton.pair_energy_epilogue(fp64 sums) [Triton interpreter, cpu tensors]",
    } in doc["ran"]["kernels"]
    ref = find_reference(load_references(), "hydroxyl")
    assert abs(doc["energies"]["e_corr"] - ref["e_corr"]) <= 1e-9
    _one_error_line(
        _cli(["run", oh, "--pair-kernel", "fused", "--json", str(tmp_path / "f.json")]),
        "pair kernel 'fused' has no opposite-spin (UHF alpha-beta) form",
    )
    assert not (tmp_path / "f.json").exists()
