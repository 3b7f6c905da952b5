"""Every Triton kernel in kernels/triton compiles ahead of time for the GPUs we claim (sm_80 A100,
sm_90 H100), in fp64 and fp32, with its default launch configuration and every configuration that
scripts/bench_cuda.py sweeps: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``
runs Triton's whole pipeline down to a cubin (Triton's wheel bundles ptxas), so no GPU is needed.

The interpreter tests cannot catch a kernel that the installed Triton refuses to lower (the
interpreter skips code generation), and a GPU machine may carry an older Triton than this one
(torch 2.11 ships 3.6); .ci/run therefore runs this file a second time under the oldest Triton
that pyproject allows.
"""

import importlib.util
import pkgutil
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'dfmp2[test]')")

from triton_interpreter import in_interpreter

if in_interpreter():
    pytest.skip(
        "this process runs Triton's interpreter (TRITON_INTERPRET=1), which cannot compile", allow_module_level=True
    )

import dfmp2.kernels.triton as kt
from dfmp2.kernels.triton import fused_pair_energy as fpe
from dfmp2.kernels.triton import pair_energy_epilogue as pee

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = (80, 90)  # A100, H100: the default configurations
# The bench's swept configurations: on the GPU class it was run on (H100), and only the
# off-diagonal variant (DIAG=False: both dots, the most registers; DIAG=True differs by a register
# transpose, compiled in the default configurations). Everything on both classes took 90 s cold
# here (2 cores), most of it in the register-heavy BLOCK=128 fp32 configurations.
SWEEP_CAPABILITIES = (90,)
PRECISIONS = {"fp64": torch.float64, "fp32": torch.float32}
# Pointer arguments by role; everything else not constexpr is an integer (i32: sizes and element
# strides of the shapes we run fit; the kernels widen offsets to int64 themselves).
OPERANDS = ("bi_ptr", "bj_ptr", "k_ptr")  # B or K in the working precision
INDEX_LISTS = ("pair_i_ptr", "pair_j_ptr", "tile_a_ptr", "tile_b_ptr")
FP64_POINTERS = ("eps_i_ptr", "eps_j_ptr", "eps_vir_ptr", "eps_vir_b_ptr", "os_ptr", "ss_ptr")


def _bench_sweep() -> dict:
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "scripts" / "bench_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # module level only defines constants and functions
    return mod.SWEEP


def _signature(fn, prec: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in OPERANDS:
            sig[name] = f"*{prec}"
        elif name in INDEX_LISTS:
            sig[name] = "*i64"
        elif name in FP64_POINTERS:
            sig[name] = "*fp64"
        elif name.endswith("_ptr"):
            raise AssertionError(f"{fn.__name__}: pointer argument {name} has no type in this test")
        else:
            sig[name] = "i32"
    return sig


def compile_kernel(pyfn, cc: int, prec: str, constexprs: dict, options: dict):
    """triton.compile of a kernel's plain Python function for sm_<cc>, jitted as the kernel module
    jits it (with the shared tile_sums helper); returns the CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dfmp2.kernels.triton.tile_sums import jit_kernel

    fn = jit_kernel(pyfn)
    src = ASTSource(fn, _signature(fn, prec, constexprs), constexprs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def _fused_cases():
    sweep = _bench_sweep()
    for prec, dtype in PRECISIONS.items():
        default = fpe.default_config(dtype)
        configs = [default] + [c for c in sweep[prec] if c != default]
        for cfg in configs:
            name = "default" if cfg == default else "-".join(f"{k}{v}" for k, v in cfg.items())
            # the swept configurations (a minute cold on 2 cores) in the heavy channel; .ci/run
            # runs them under both Tritons, the default configurations stay in every run
            marks = () if cfg == default else (pytest.mark.heavy,)
            for cc in CAPABILITIES if cfg == default else SWEEP_CAPABILITIES:
                yield pytest.param(
                    cc,
                    prec,
                    cfg,
                    (True, False) if cfg == default else (False,),
                    id=f"sm{cc}-{prec}-{name}",
                    marks=marks,
                )


@pytest.mark.parametrize("cc,prec,cfg,diags", list(_fused_cases()))
def test_fused_pair_energy_compiles(cc, prec, cfg, diags):
    for diag in diags:
        k = compile_kernel(
            fpe._fused_pair_energy_kernel,
            cc,
            prec,
            {"DIAG": diag, "FP32": prec == "fp32", "BLOCK": cfg["BLOCK"], "BLOCK_P": cfg["BLOCK_P"]},
            {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
        )
        ptx = k.asm["ptx"]
        assert k.asm.get("cubin"), "ptxas produced no cubin"
        mma = [ln for ln in ptx.splitlines() if "mma" in ln]
        if prec == "fp64":  # the docstring's claim: an fp64 tensor-core dot on sm80/sm90
            assert any(".f64.f64.f64.f64" in ln for ln in mma), mma[:3]
        else:  # input_precision="ieee": no TF32 tensor-core products
            assert not any("tf32" in ln for ln in mma), mma[:3]


@pytest.mark.parametrize("cc", CAPABILITIES)
@pytest.mark.parametrize("prec", PRECISIONS)
def test_pair_energy_epilogue_compiles(cc, prec):
    for diag, rect in ((True, False), (False, False), (False, True)):  # RECT: UMP2 alpha-beta
        k = compile_kernel(
            pee._pair_energy_epilogue_kernel,
            cc,
            prec,
            {"DIAG": diag, "BLOCK": pee.BLOCK, "RECT": rect},
            {"num_warps": pee.NUM_WARPS},
        )
        assert k.asm.get("cubin"), "ptxas produced no cubin"


def test_every_kernel_module_is_compiled_here():
    """A new kernel in kernels/triton must be added to this file."""
    covered = {"fused_pair_energy", "pair_energy_epilogue"}
    modules = {
        m.name
        for m in pkgutil.iter_modules(kt.__path__)
        if hasattr(importlib.import_module(f"dfmp2.kernels.triton.{m.name}"), "kernel")
    }
    assert modules == covered, modules ^ covered
