"""Per-op benchmark cases: the op through ``linalg`` on a backend, its flop count, and the
same computation through torch / torch.linalg directly, scipy.linalg and (for the pair
energy) PySCF's DF-MP2 pair kernel, all on identical inputs.

Flop counts (the op's own algorithm; a baseline that does other work has its own count):
    gemm (m, k, n)                  2 m k n
    syrk (n, k)                     n (n + 1) k           (C = A A^T, one triangle)
    trsm (n, m)                     n^2 m                 (n: triangle, m: right-hand sides)
    cholesky (n,)                   n^3 / 3               (rounded down)
    inv_sqrt_eigh (n,)              (4/3 + 2 + 2) n^3     nominal: tridiagonalisation, eigenvector
                                                          back-transformation, V diag V^T
    inv_sqrt_newton_schulz (n,)     (3 k + 2) 2 n^3       k iterations as run, + the residual check
    mp2_pair_energy (nocc, nvir, naux)        nocc (nocc + 1) / 2 * 2 nvir^2 naux   (i >= j)
    mp2_pair_energy (ni, nj, nvir, naux)      ni nj * 2 nvir^2 naux   (an off-diagonal block I x J)
    mp2_pair_energy_os (ni, nj, nvir_a, nvir_b, naux)   ni nj * 2 nvir_a nvir_b naux   (UMP2's
                                    opposite-spin block: alpha I x beta J, rectangular K)
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from dfmp2.linalg import flops as lf

OPS = (
    "gemm",
    "syrk",
    "trsm",
    "cholesky",
    "inv_sqrt_eigh",
    "inv_sqrt_newton_schulz",
    "mp2_pair_energy",
    "mp2_pair_energy_os",
)
BASELINES = ("torch", "scipy", "pyscf")
BASELINE_LABELS = {"torch": "torch.linalg", "scipy": "scipy.linalg", "pyscf": "PySCF"}
# Newton-Schulz iterations assumed for the expected time before a run (the count is read after it).
NS_ITERATIONS_GUESS = {torch.float64: 25, torch.float32: 15}
# A torch einsum baseline of the pair energy materialises (ni, nj, nvir, nvir) in fp64.
EINSUM_LIMIT_BYTES = 512e6


@dataclass
class Case:
    """One op at one shape, ready to time. ``baselines[name]`` is a callable, or a string saying
    why that baseline does not run here. ``baseline_flops``: {baseline: its own flop count} where its
    algorithm differs from ours (used for its GFLOP/s)."""

    op: str
    shape: tuple
    flops: float
    ours: Callable
    baselines: dict = field(default_factory=dict)
    baseline_flops: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    note: str = ""
    finalize: Callable | None = None

    def settle(self) -> None:
        """After ``ours`` has run: flops and extras that depend on the run (Newton-Schulz iterations)."""
        if self.finalize is not None:
            self.flops, extra = self.finalize()
            self.extra.update(extra)
            self.finalize = None


def flops(op: str, shape, iterations: int | None = None) -> float:
    """The op's flop count (see the module docstring): linalg.flops' count, the one a run charges
    to its stages, of the case's shape."""
    if op == "gemm":
        m, k, n = shape
        return float(lf.gemm((m, k), (k, n)))
    if op == "syrk":
        n, k = shape
        return float(lf.syrk((n, k)))
    if op == "trsm":
        n, m = shape
        return float(lf.trsm((n, n), n * m))
    if op == "cholesky":
        return float(lf.cholesky((shape[0], shape[0])))
    if op == "inv_sqrt_eigh":
        return float(lf.inv_sqrt_spd((shape[0], shape[0]), {"method": "eigh", "kept": shape[0]}))
    if op == "inv_sqrt_newton_schulz":
        if iterations is None:
            raise ValueError("inv_sqrt_newton_schulz flops need the iteration count")
        info = {"method": "newton_schulz", "iterations": iterations, "residual": 0.0}
        return float(lf.inv_sqrt_spd((shape[0], shape[0]), info))
    if op == "mp2_pair_energy":
        if len(shape) == 3:
            nocc, nvir, naux = shape
            return float(lf.mp2_pair_energy((nocc, nvir, naux), (nocc, nvir, naux), symmetric=True))
        ni, nj, nvir, naux = shape
        return float(lf.mp2_pair_energy((ni, nvir, naux), (nj, nvir, naux), symmetric=False))
    if op == "mp2_pair_energy_os":
        ni, nj, nva, nvb, naux = shape
        return float(lf.mp2_pair_energy((ni, nva, naux), (nj, nvb, naux), symmetric=False))
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def pyscf_pair_energy(
    iaL: np.ndarray, jbL: np.ndarray, eo_i: np.ndarray, eo_j: np.ndarray, ev: np.ndarray, symmetric: bool
) -> tuple[float, float]:
    """(e_os, e_ss) through PySCF's DF-MP2 pair kernel ``libmp.MP2_contract_d`` (the C routine
    ``pyscf.mp.dfmp2.kernel`` calls per occupied block pair; fp64, OpenMP).
    iaL (ni, nvir, naux), jbL (nj, nvir, naux) fp64 C-contiguous; energies in Hartree.
    symmetric=True: iaL is jbL and only i >= j is summed (i > j twice), as our symmetric=True."""
    from pyscf import lib

    libmp = lib.load_library("libmp")
    ni, nvir, naux = iaL.shape
    nj = jbL.shape[0]
    moeoo = np.asarray(eo_i[:, None] + eo_j[None, :], order="C")
    moevv = np.asarray(ev[:, None] + ev[None, :], order="C")
    ed = np.zeros(1)
    ex = np.zeros(1)
    libmp.MP2_contract_d(
        ed.ctypes.data_as(ctypes.c_void_p),
        ex.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int(1 if symmetric else 0),
        iaL.ctypes.data_as(ctypes.c_void_p),
        jbL.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int(0),
        ctypes.c_int(0),
        ctypes.c_int(ni),
        ctypes.c_int(nj),
        ctypes.c_int(max(ni, nj)),
        ctypes.c_int(nvir),
        ctypes.c_int(naux),
        moeoo.ctypes.data_as(ctypes.c_void_p),
        moevv.ctypes.data_as(ctypes.c_void_p),
        lib.c_null_ptr(),
        ctypes.c_int(0),
    )
    return float(ed[0]), float(ed[0] + ex[0])


class Inputs:
    """Philox inputs shared by the cases of one shape: each SPD matrix and synthetic problem is
    built once in fp64 on the CPU and rounded to each precision and moved to each device.
    Bit-identical to building them per precision: linalg.random_spd and synthetic_problem both
    compute in fp64 and round to the requested dtype as their last step."""

    def __init__(self):
        self._spd: dict = {}
        self._problem: dict = {}

    def spd(self, n: int, cond: float, seed: int, dtype, device) -> torch.Tensor:
        from dfmp2.linalg import random_spd

        key = (n, cond, seed)
        if key not in self._spd:
            self._spd[key] = random_spd(n, cond, seed, dtype=torch.float64)
        return self._spd[key].to(dtype).to(device)

    def problem(self, nocc: int, nvir: int, naux: int, seed: int, dtype, device):
        from dfmp2.linalg import synthetic_problem
        from dfmp2.linalg.synthetic import SyntheticProblem

        key = (nocc, nvir, naux, seed)
        if key not in self._problem:
            self._problem = {key: synthetic_problem(nocc, nvir, naux, seed=seed, dtype=torch.float64)}
        p = self._problem[key]
        return SyntheticProblem(
            B=p.B.to(dtype).to(device),
            eps_occ=p.eps_occ.to(device),
            eps_vir=p.eps_vir.to(device),
            seed=p.seed,
            e_target=p.e_target,
        )


def make_case(op: str, shape, dtype, backend, *, pyscf_baseline: bool = True, inputs: Inputs | None = None) -> Case:
    """Inputs (Philox, identical on every device) and callables for one op and shape.

    The scipy and PySCF baselines run on the host: on a GPU backend they are reported as not run
    (they would time a different device). On Trainium no baseline runs (torch has no Trainium
    device here; a host time in a trn row would read as a Trainium time)."""
    case = _make_case(op, shape, dtype, backend, pyscf_baseline, inputs or Inputs())
    if not backend.caps.torch_device:
        case.baselines = {
            k: f"baselines run on the host, not on {backend.name}; see the cpu rows" for k in case.baselines
        }
    return case


def _make_case(op: str, shape, dtype, backend, pyscf_baseline: bool, inputs: Inputs) -> Case:
    import scipy.linalg as sla

    from dfmp2 import linalg
    from dfmp2.linalg import random_matrix

    dev = backend.to_device(torch.zeros(0)).device
    on_cpu = backend.caps.is_host
    host_only = "" if on_cpu else f"host library; not run on {backend.name}"
    shape = tuple(int(s) for s in shape)

    def host(fn):
        return fn if on_cpu else host_only

    if op == "gemm":
        m, k, n = shape
        a = random_matrix((m, k), 1, dtype=dtype, device=dev)
        b = random_matrix((k, n), 2, dtype=dtype, device=dev)
        an, bn = a.cpu().numpy(), b.cpu().numpy()
        gemm = sla.blas.get_blas_funcs("gemm", (an,))
        return Case(
            op,
            shape,
            flops(op, shape),
            lambda: linalg.gemm(a, b, backend=backend),
            {"torch": lambda: torch.matmul(a, b), "scipy": host(lambda: gemm(1.0, an, bn))},
        )
    if op == "syrk":
        n, k = shape
        a = random_matrix((n, k), 3, dtype=dtype, device=dev)
        an = np.asfortranarray(a.cpu().numpy())
        syrk = sla.blas.get_blas_funcs("syrk", (an,))
        return Case(
            op,
            shape,
            flops(op, shape),
            lambda: linalg.syrk(a, backend=backend),
            {"torch": lambda: torch.matmul(a, a.mT), "scipy": host(lambda: syrk(1.0, an, lower=1))},
        )
    if op == "trsm":
        n, m = shape
        L = torch.linalg.cholesky(inputs.spd(n, 1e3, 4, torch.float64, "cpu")).to(dtype).to(dev)
        b = random_matrix((n, m), 5, dtype=dtype, device=dev)
        Ln, bn = L.cpu().numpy(), b.cpu().numpy()
        return Case(
            op,
            shape,
            flops(op, shape),
            lambda: linalg.trsm(L, b, backend=backend),
            {
                "torch": lambda: torch.linalg.solve_triangular(L, b, upper=False),
                "scipy": host(lambda: sla.solve_triangular(Ln, bn, lower=True, check_finite=False)),
            },
        )
    if op == "cholesky":
        (n,) = shape
        s = inputs.spd(n, 1e4, 6, dtype, dev)
        sn = s.cpu().numpy()
        return Case(
            op,
            shape,
            flops(op, shape),
            lambda: linalg.cholesky(s, backend=backend),
            {
                "torch": lambda: torch.linalg.cholesky(s),
                "scipy": host(lambda: sla.cholesky(sn, lower=True, check_finite=False)),
            },
        )
    if op in ("inv_sqrt_eigh", "inv_sqrt_newton_schulz"):
        return _inv_sqrt_case(op, shape, dtype, backend, dev, inputs, host)
    if op == "mp2_pair_energy":
        return _pair_case(op, shape, dtype, backend, dev, inputs, pyscf_baseline, on_cpu, host_only)
    if op == "mp2_pair_energy_os":
        return _os_pair_case(op, shape, dtype, backend, dev, inputs)
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def _inv_sqrt_case(op: str, shape, dtype, backend, dev, inputs: Inputs, host) -> Case:
    """A^-1/2 by eigh or Newton-Schulz against the eigh-based baselines."""
    import scipy.linalg as sla

    from dfmp2 import linalg

    (n,) = shape
    s = inputs.spd(n, 1e6 if dtype == torch.float64 else 1e3, 7, dtype, dev)
    sn = s.cpu().numpy()

    def torch_eigh():
        w, v = torch.linalg.eigh(s)
        return (v * w.rsqrt()) @ v.mT

    def scipy_eigh():
        w, v = sla.eigh(sn, check_finite=False)
        return (v / np.sqrt(w)) @ v.T

    base = {"torch": torch_eigh, "scipy": host(scipy_eigh)}
    eigh_flops = flops("inv_sqrt_eigh", shape)
    if op == "inv_sqrt_eigh":
        return Case(op, shape, eigh_flops, lambda: linalg.inv_sqrt_spd(s, backend=backend), base)
    # The flop count depends on the iterations: known after the timed calls (``settle``).
    last: dict = {}

    def newton_schulz():
        x, info = linalg.inv_sqrt_spd(s, method="newton_schulz", backend=backend)
        last.update(info)
        return x

    guess = NS_ITERATIONS_GUESS[dtype]
    return Case(
        op,
        shape,
        flops(op, shape, guess),
        newton_schulz,
        base,
        baseline_flops={"torch": eigh_flops, "scipy": eigh_flops},
        note="baselines: eigh-based A^-1/2 (same result, other algorithm; nominal eigh flops)",
        finalize=lambda: (
            flops(op, shape, last["iterations"]),
            {"iterations": last["iterations"], "residual": last["residual"]},
        ),
    )


def _pair_case(  # noqa: PLR0913
    op: str, shape, dtype, backend, dev, inputs: Inputs, pyscf_baseline: bool, on_cpu: bool, host_only: str
) -> Case:
    """The MP2 pair energy of one block (nocc, nvir, naux: symmetric) or an off-diagonal one
    (ni, nj, nvir, naux) against one einsum and PySCF's contraction."""
    from dfmp2 import linalg

    if len(shape) == 3:
        nocc, nvir, naux = shape
        ni = nj = nocc
        symmetric = True
        p = inputs.problem(nocc, nvir, naux, 8, dtype, dev)
        Bi = Bj = p.B
        ei = ej = p.eps_occ
    else:
        ni, nj, nvir, naux = shape
        symmetric = False
        # An off-diagonal block: I = occupied [nj, nj + ni), J = [0, nj) of one problem.
        p = inputs.problem(ni + nj, nvir, naux, 8, dtype, dev)
        Bi, Bj = p.B[nj:], p.B[:nj]
        ei, ej = p.eps_occ[nj:], p.eps_occ[:nj]
    ev = p.eps_vir

    def ours():
        return linalg.mp2_pair_energy(Bi, Bj, ei, ej, ev, symmetric=symmetric, backend=backend)

    kbytes = ni * nj * nvir * nvir * 8.0
    if kbytes <= EINSUM_LIMIT_BYTES:

        def einsum_ref():
            K = torch.einsum("iaP,jbP->ijab", Bi, Bj).to(torch.float64)
            D = ei[:, None, None, None] + ej[None, :, None, None] - ev[:, None] - ev
            return float((K * (2 * K - K.transpose(2, 3)) / D).sum())

        torch_base = einsum_ref
    else:
        torch_base = (
            f"one einsum over the block needs {kbytes / 1e6:.0f} MB for K (limit {EINSUM_LIMIT_BYTES / 1e6:.0f} MB)"
        )
    pyscf_base = "not requested"
    if pyscf_baseline:
        if not on_cpu:
            pyscf_base = host_only
        else:
            iaL = np.ascontiguousarray(Bi.to(torch.float64).cpu().numpy())
            jbL = iaL if symmetric else np.ascontiguousarray(Bj.to(torch.float64).cpu().numpy())
            eoi, eoj, evn = (x.cpu().numpy() for x in (ei, ej, ev))
            pyscf_base = lambda: pyscf_pair_energy(iaL, jbL, eoi, eoj, evn, symmetric)
    all_pairs = ni * nj * 2.0 * nvir * nvir * naux
    return Case(
        op,
        shape,
        flops(op, shape),
        ours,
        {"torch": torch_base, "scipy": "no scipy routine for this op", "pyscf": pyscf_base},
        baseline_flops={"torch": all_pairs} if symmetric else {},
        extra={"symmetric": symmetric},
        note=(
            "torch baseline: one einsum over all pairs (no i >= j symmetry); PySCF: libmp.MP2_contract_d in fp64"
            if symmetric
            else "torch baseline: one einsum over the block; PySCF: libmp.MP2_contract_d in fp64"
        ),
    )


def _os_pair_case(op: str, shape, dtype, backend, dev, inputs: Inputs) -> Case:
    """UMP2's opposite-spin block (ni alpha, nj beta occupied; nvir_a, nvir_b virtuals): the
    rectangular pair kernel the DF-UMP2 stage calls (``eps_vir_j``), against one einsum. Inputs: one
    Philox problem of ni + nj occupied and nvir_b virtuals, alpha taking its first nvir_a."""
    from dfmp2 import linalg

    ni, nj, nva, nvb, naux = shape
    p = inputs.problem(ni + nj, nvb, naux, 9, dtype, dev)
    Bi, Bj = p.B[nj:, :nva].contiguous(), p.B[:nj]
    ei, ej, eva, evb = p.eps_occ[nj:], p.eps_occ[:nj], p.eps_vir[:nva], p.eps_vir

    def ours():
        return linalg.mp2_pair_energy(Bi, Bj, ei, ej, eva, eps_vir_j=evb, backend=backend)

    kbytes = ni * nj * nva * nvb * 8.0
    if kbytes <= EINSUM_LIMIT_BYTES:

        def einsum_ref():
            K = torch.einsum("iaP,jbP->ijab", Bi, Bj).to(torch.float64)
            D = ei[:, None, None, None] + ej[None, :, None, None] - eva[:, None] - evb
            return float((K * K / D).sum())

        torch_base = einsum_ref
    else:
        torch_base = (
            f"one einsum over the block needs {kbytes / 1e6:.0f} MB for K (limit {EINSUM_LIMIT_BYTES / 1e6:.0f} MB)"
        )
    return Case(
        op,
        shape,
        flops(op, shape),
        ours,
        {
            "torch": torch_base,
            "scipy": "no scipy routine for this op",
            "pyscf": "PySCF's DFUMP2 has no separate kernel for this block (numpy in pyscf.mp.dfump2)",
        },
        extra={"symmetric": False},
        note="UMP2 opposite-spin block; torch baseline: one einsum over it",
    )


def derive(row: dict, peak_gflops: float | None, columns=("linalg",) + BASELINES) -> None:
    """Add GFLOP/s and % of the same-device, same-precision GEMM peak to each timed column
    (baselines with their own flop count where it differs)."""
    for name in columns:
        r = row.get(name)
        if not isinstance(r, dict) or "median_s" not in r:
            continue
        bf = row.get("baseline_flops")
        bf = bf.get(name) if isinstance(bf, dict) else bf
        f = row["flops"] if name == "linalg" or not bf else bf
        r["gflops"] = f / r["median_s"] / 1e9
        r["pct_peak"] = 100.0 * r["gflops"] / peak_gflops if peak_gflops else None
