"""ESTIMATED Trainium (trn1, trn2) times from the NKI kernels' work and AWS's published rates.

Nothing here is a measurement and nothing here runs on Trainium. Every number this module
returns is labelled ``estimate``; the report keeps it in its own table, apart from measured
times, and a CPU run of the NKI kernels (``--simulate``) is never reported as a Trainium time.

Work model. For one linalg op at one size, the instruction stream the trn backend
(linalg/neuron.py) would issue is rebuilt from the kernels' own tiling (kernels/nki/*.py,
read, not modified): the backend's host logic (GEMM orientation, row-bucket padding,
occupied-block launches of the pair kernel) and each kernel's loop nest, instruction by
instruction. ``check_against_emulator`` runs the real kernels on the NumPy emulator at a small
size and compares the emulator's own counters (matmul flops, DMA bytes, instruction count)
with the model, so the model is tested against the kernels as they are.

Time model, one NeuronCore, fp32 (Trainium has no fp64):
  Tensor Engine   sum over nc_matmul of 4 * max(min(64, M), N) cycles (fp32 inputs; M the
                  stationary free size, N the moving free size) [nc_matmul "Estimated instruction
                  cost"]; cycles -> seconds with the clock implied by the published FP32 peak
                  (a full 128x128x512 tile: 2048 cycles for 2*128*128*512 flops, i.e.
                  8192 flop/cycle), so a stream of full tiles runs at exactly the published peak.
  Vector Engine   sum of the published per-instruction costs, MIN_II = 64 cycles:
                  tensor_tensor max(64, N) with one PSUM input, max(64, 2N) with both in SBUF;
                  tensor_scalar, tensor_copy, tensor_reduce, memset max(64, N); reciprocal
                  max(64, 8N) (N: elements per partition); clock = published VectorE FP32
                  FLOP/s / FLOP per cycle (see RATES: trn2's FLOP per cycle is not published and
                  is taken equal to trn1's).
  DMA             bytes moved / the core's share of the chip's HBM bandwidth.
  estimate        max(Tensor, Vector, DMA): the engines overlapping perfectly. ``serial_s`` (the
                  sum) is reported beside it. Not included: kernel launch overhead (not
                  published; the launch count is reported), host work the trn backend does in
                  fp64 (Cholesky, eigh, TRSM diagonal-block inverses, layout copies, the final
                  sums), and host <-> device transfers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PMAX = 128
MIN_II = 64

SOURCES = {
    "nc_matmul_cost": "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/nki/api/generated/nki.isa.nc_matmul.html",
    "vector_costs": "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/nki/api/nki.isa.html "
    "(tensor_tensor, tensor_scalar, tensor_reduce, tensor_copy, memset, reciprocal: "
    "'Estimated instruction cost')",
    "trn1": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html",
    "trn1_nki_arch": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium_inferentia2_arch.html",
    "nc_v2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/neuron-core-v2.html",
    "nc_v2_flop_per_cycle": "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.9.1/general/arch/neuron-hardware/neuron-core-v2.html",
    "trn2": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html",
    "nc_v3": "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/neuron-core-v3.html",
}

# Published per-chip figures, split evenly over the chip's NeuronCores.
RATES = {
    "trn1": {
        "neuroncore": "NeuronCore-v2",
        "cores_per_chip": 2,
        "fp32_tflops_chip": 47.5,
        "hbm_gbytes_per_s_chip": 820.0,
        "vector_fp32_tflops_core": 2.3,
        "vector_flop_per_cycle": 2500,
        "sources": [SOURCES["trn1"], SOURCES["trn1_nki_arch"], SOURCES["nc_v2"], SOURCES["nc_v2_flop_per_cycle"]],
        "notes": "47.5 FP32 TFLOPS and 820 GB/s per chip of 2 NeuronCore-v2; VectorE 2.3 FP32 TFLOPS "
        "at 2,500 FLOP/cycle (0.92 GHz)",
    },
    "trn2": {
        "neuroncore": "NeuronCore-v3",
        "cores_per_chip": 8,
        "fp32_tflops_chip": 181.0,
        "hbm_gbytes_per_s_chip": 2900.0,
        "vector_fp32_tflops_core": 1.0,
        "vector_flop_per_cycle": 2500,
        "sources": [SOURCES["trn2"], SOURCES["nc_v3"]],
        "notes": "181 FP32 TFLOPS and 2.9 TB/s per chip of 8 NeuronCore-v3; VectorE 1 FP32 TFLOPS; "
        "FLOP/cycle not published for NeuronCore-v3, taken as NeuronCore-v2's 2,500 (ASSUMED)",
    },
}


def rates(target: str) -> dict:
    """Per-NeuronCore rates derived from RATES: Tensor Engine clock (Hz), VectorE clock (Hz),
    HBM bytes/s, FP32 peak flop/s."""
    r = RATES[target]
    peak = r["fp32_tflops_chip"] * 1e12 / r["cores_per_chip"]
    return {
        "target": target,
        "neuroncore": r["neuroncore"],
        "fp32_peak_flops": peak,
        "pe_hz": peak / (2 * PMAX * PMAX / 4),
        "ve_hz": r["vector_fp32_tflops_core"] * 1e12 / r["vector_flop_per_cycle"],
        "hbm_bytes_per_s": r["hbm_gbytes_per_s_chip"] * 1e9 / r["cores_per_chip"],
    }


@dataclass
class Work:
    """The instruction stream of one op: counts and costs per engine."""

    matmuls: int = 0
    matmul_flops: int = 0
    pe_cycles: int = 0
    dma_bytes: int = 0
    ve_cycles: int = 0
    instructions: Counter = field(default_factory=Counter)
    launches: Counter = field(default_factory=Counter)
    host: list = field(default_factory=list)  # host-side steps, not estimated

    # ---- instructions ----
    def matmul(self, k: int, m: int, n: int) -> None:
        self.matmuls += 1
        self.matmul_flops += 2 * k * m * n
        self.pe_cycles += 4 * max(min(64, m), n)
        self.instructions["nc_matmul"] += 1

    def dma(self, elements: int, itemsize: int = 4) -> None:
        self.dma_bytes += elements * itemsize
        self.instructions["dma_copy"] += 1

    def vector(self, kind: str, n: int, both_sbuf: bool = False) -> None:
        """One Vector Engine instruction over n elements per partition."""
        cost = {"tensor_tensor": 2 * n if both_sbuf else n, "reciprocal": 8 * n}.get(kind, n)
        self.ve_cycles += max(MIN_II, cost)
        self.instructions[kind] += 1

    def launch(self, kernel: str) -> None:
        self.launches[kernel] += 1

    @property
    def instruction_count(self) -> int:
        return sum(self.instructions.values())

    def times(self, target: str) -> dict:
        r = rates(target)
        pe = self.pe_cycles / r["pe_hz"]
        ve = self.ve_cycles / r["ve_hz"]
        dma = self.dma_bytes / r["hbm_bytes_per_s"]
        parts = {"tensor_engine": pe, "vector_engine": ve, "dma": dma}
        bound = max(parts, key=parts.get)
        return {
            "estimate_s": parts[bound],
            "serial_s": pe + ve + dma,
            "bound": bound,
            "tensor_engine_s": pe,
            "vector_engine_s": ve,
            "dma_s": dma,
        }

    def counts(self) -> dict:
        return {
            "matmul_instructions": self.matmuls,
            "matmul_flops": self.matmul_flops,
            "pe_cycles": self.pe_cycles,
            "ve_cycles": self.ve_cycles,
            "dma_bytes": self.dma_bytes,
            "instructions": self.instruction_count,
            "launches": dict(self.launches),
        }


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- kernels (mirror kernels/nki/*.py loop by loop) ----
def gemm_kernel(w: Work, K: int, M: int, N: int) -> None:
    """kernels/nki/gemm.py gemm_kernel(lhsT (K, M), rhs (K, N))."""
    from dfmp2.kernels.nki.gemm import TILE_K, TILE_M, TILE_N

    w.launch("gemm_kernel")
    for m0 in range(0, M, TILE_M):
        mt = min(TILE_M, M - m0)
        for n0 in range(0, N, TILE_N):
            nt = min(TILE_N, N - n0)
            for k0 in range(0, K, TILE_K):
                kt = min(TILE_K, K - k0)
                w.dma(kt * mt)
                w.dma(kt * nt)
                w.matmul(kt, mt, nt)
            w.vector("tensor_copy", nt)
            w.dma(mt * nt)


def gemm2d(w: Work, M: int, K: int, N: int) -> None:
    """NeuronBackend._gemm2d for (M, K) @ (K, N): M padded to its bucket, the orientation with
    fewer output tiles."""
    from dfmp2.linalg.neuron import bucket

    if 0 in (M, N, K):
        return
    Mp = bucket(M)
    direct = _cdiv(Mp, 128) * _cdiv(N, 512)
    swapped = _cdiv(N, 128) * _cdiv(Mp, 512)
    if swapped < direct:
        gemm_kernel(w, K, N, Mp)
    else:
        gemm_kernel(w, K, Mp, N)


def syrk_kernel(w: Work, K: int, N: int) -> None:
    """kernels/nki/syrk.py syrk_lower_kernel(aT (K, N))."""
    from dfmp2.kernels.nki.syrk import TILE_K, TILE_M, TILE_N

    w.launch("syrk_lower_kernel")
    for i0 in range(0, N, TILE_M):
        it = min(TILE_M, N - i0)
        c_end = i0 + it
        for c0 in range(0, c_end, TILE_N):
            ct = min(TILE_N, c_end - c0)
            for k0 in range(0, K, TILE_K):
                kt = min(TILE_K, K - k0)
                w.dma(kt * it)
                w.dma(kt * ct)
                w.matmul(kt, it, ct)
            w.vector("tensor_copy", ct)
            w.dma(it * ct)


def trsm_kernel(w: Work, n: int, m: int) -> None:
    """kernels/nki/trsm.py trsm_lower_kernel(lT (n, n), dinvT, b (n, m))."""
    from dfmp2.kernels.nki.trsm import TILE, TILE_N

    w.launch("trsm_lower_kernel")
    nblk = _cdiv(n, TILE)
    for c0 in range(0, m, TILE_N):
        ct = min(TILE_N, m - c0)
        for kb in range(nblk):
            k0 = kb * TILE
            kt = min(TILE, n - k0)
            w.dma(kt * ct)
            if kb > 0:
                for jb in range(kb):
                    jt = min(TILE, n - jb * TILE)
                    w.dma(jt * kt)
                    w.matmul(jt, kt, ct)
                w.vector("tensor_tensor", ct)  # rhs - acc, acc in PSUM
            w.dma(kt * kt)
            w.matmul(kt, kt, ct)
            w.vector("tensor_copy", ct)
            w.dma(kt * ct)


def pair_kernel(w: Work, ni: int, nj: int, nvir: int, naux: int, symmetric: bool) -> None:
    """kernels/nki/mp2_pair.py mp2_pair_kernel for one launch."""
    from dfmp2.kernels.nki.mp2_pair import TILE_A, TILE_B, TILE_P

    w.launch("mp2_pair_kernel")
    nk = _cdiv(naux, TILE_P)
    ktiles = [min(TILE_P, naux - k * TILE_P) for k in range(nk)]
    w.vector("memset", 2 * ni * nj)
    w.dma(PMAX * ni)
    w.dma(PMAX * nj)
    w.dma(PMAX * nvir)
    ablocks = [(a0, min(TILE_A, nvir - a0)) for a0 in range(0, nvir, TILE_A)]
    for _, at in ablocks:
        w.dma(at)
    for i in range(ni):
        for kt in ktiles:
            w.dma(kt * nvir)
        for _ in range(i + 1 if symmetric else nj):
            for kt in ktiles:
                w.dma(kt * nvir)
            for a0, at in ablocks:
                w.vector("tensor_tensor", 1, both_sbuf=True)
                w.vector("tensor_tensor", 1, both_sbuf=True)
                for b0 in range(a0, nvir, TILE_B):
                    bt = min(TILE_B, nvir - b0)
                    for kt in ktiles:
                        w.matmul(kt, at, bt)
                    for kt in ktiles:
                        w.matmul(kt, at, bt)
                    w.vector("tensor_scalar", bt)
                    w.vector("reciprocal", bt)
                    w.vector("tensor_tensor", bt)  # q = M1 / D (M1 in PSUM)
                    w.vector("tensor_tensor", bt)  # q * M1
                    w.vector("tensor_reduce", bt)
                    w.vector("tensor_tensor", 1, both_sbuf=True)  # acc += part
                    w.vector("tensor_tensor", bt)  # q * M2
                    w.vector("tensor_reduce", bt)
                    w.vector("tensor_tensor", 1, both_sbuf=True)
                    d = at if b0 == a0 else 0
                    if d < bt:
                        r = bt - d
                        w.vector("tensor_tensor", r)
                        w.vector("tensor_reduce", r)
                        w.vector("tensor_tensor", 1, both_sbuf=True)
                        w.vector("tensor_tensor", r)
                        w.vector("tensor_tensor", r)
                        w.vector("tensor_reduce", r)
                        w.vector("tensor_tensor", 1, both_sbuf=True)
    w.dma(PMAX * 2 * ni * nj)


def pair_occ_block_cap(target: str, naux: int, nvir: int) -> int:
    """NeuronBackend._occ_block_cap: occupied orbitals per pair-kernel launch (0: does not fit)."""
    from dfmp2.kernels.nki.mp2_pair import sbuf_bytes_per_partition
    from dfmp2.kernels.nki_emulator.limits import limits_for
    from dfmp2.linalg.neuron import PAIR_MAX_OCC

    budget = int(0.9 * limits_for(target).sbuf_partition_bytes)
    s = PAIR_MAX_OCC
    while s >= 1 and sbuf_bytes_per_partition(s, s, naux, nvir) > budget:
        s //= 2
    return max(s, 0)


# ---- ops (mirror linalg/neuron.py NeuronBackend) ----
class NotEstimable(Exception):
    """The op has no Trainium kernel at this size (host work, or a kernel limit)."""


def op_work(op: str, shape, target: str, iterations: int | None = None) -> Work:  # noqa: C901
    """The Work of one linalg op call on the trn backend. Raises NotEstimable with the reason
    for ops that run on the host there or sizes the kernels cannot take."""
    w = Work()
    shape = tuple(int(s) for s in shape)
    if op == "gemm":
        m, k, n = shape
        gemm2d(w, m, k, n)
    elif op == "syrk":
        n, k = shape
        syrk_kernel(w, k, n)
    elif op == "trsm":
        n, m = shape
        w.host.append("trsm_diag_inverse: host fp64 inverses of the 128x128 diagonal blocks (once per matrix)")
        trsm_kernel(w, n, m)
    elif op == "inv_sqrt_newton_schulz":
        (n,) = shape
        if iterations is None:
            raise NotEstimable("Newton-Schulz needs the iteration count of a run")
        for _ in range(3 * iterations + 2):
            gemm2d(w, n, n, n)
        w.host.append("Newton-Schulz norms and scalings: elementwise on the host")
    elif op == "mp2_pair_energy_os":
        raise NotEstimable("the UMP2 opposite-spin block is not in the Trainium work model yet")
    elif op in ("cholesky", "inv_sqrt_eigh"):
        raise NotEstimable(f"{op} runs on the host in fp64 on {target} (no Trainium kernel)")
    elif op == "mp2_pair_energy":
        if len(shape) == 3:
            nocc, nvir, naux = shape
            ni = nj = nocc
            symmetric = True
        else:
            ni, nj, nvir, naux = shape
            symmetric = False
        cap = pair_occ_block_cap(target, naux, nvir)
        if cap < 1:
            raise NotEstimable(
                f"the pair kernel's on-chip B_i, B_j buffers for nvir={nvir}, naux={naux} "
                f"do not fit {target}'s SBUF (the backend refuses this shape)"
            )
        for i0 in range(0, ni, cap):
            i1 = min(ni, i0 + cap)
            for j0 in range(0, (i0 + 1) if symmetric else nj, cap):
                j1 = min(nj, j0 + cap)
                pair_kernel(w, i1 - i0, j1 - j0, nvir, naux, symmetric and i0 == j0)
        w.host.append("pair partial sums: fp64 on the host")
    else:
        raise ValueError(f"unknown op {op!r}")
    return w


def estimate(op: str, shape, target: str, flops: float | None = None, iterations: int | None = None) -> dict:
    """One estimate row: status 'estimate' with times, or 'not estimated' with the reason."""
    row = {
        "device": target,
        "status": "estimate",
        "kind": "estimate",
        "op": op,
        "args": [int(s) for s in shape],
        "precision": "fp32",
    }
    try:
        w = op_work(op, shape, target, iterations)
    except NotEstimable as e:
        row.update(status="not estimated", reason=str(e))
        return row
    row.update(w.times(target))
    row.update(w.counts())
    row["host_not_estimated"] = w.host
    if flops:
        row["flops"] = flops
        row["gflops"] = flops / row["estimate_s"] / 1e9 if row["estimate_s"] > 0 else None
        row["pct_fp32_peak"] = 100.0 * flops / row["estimate_s"] / rates(target)["fp32_peak_flops"]
    return row


def check_against_emulator(op: str, shape, target: str = "trn1", iterations: int | None = None) -> dict:
    """Run the op through the trn backend on the NumPy emulator (explicitly that engine) and
    compare its counters with the model. Returns {op, args, model, emulator, match}."""
    import torch

    from dfmp2 import linalg
    from dfmp2.kernels.nki import engines as E
    from dfmp2.linalg.neuron import make_neuron_backend
    from dfmp2.linalg.synthetic import random_matrix, random_spd, synthetic_problem

    be = make_neuron_backend(target, simulate=True, engine=E.EMULATOR)
    shape = tuple(int(s) for s in shape)
    f32 = torch.float32
    if op == "gemm":
        m, k, n = shape
        linalg.gemm(random_matrix((m, k), 1, dtype=f32), random_matrix((k, n), 2, dtype=f32), backend=be)
    elif op == "syrk":
        n, k = shape
        linalg.syrk(random_matrix((n, k), 3, dtype=f32), backend=be)
    elif op == "trsm":
        n, m = shape
        L = torch.linalg.cholesky(random_spd(n, 1e3, 4)).to(f32)
        linalg.trsm(L, random_matrix((n, m), 5, dtype=f32), backend=be)
    elif op == "inv_sqrt_newton_schulz":
        (n,) = shape
        _, info = linalg.inv_sqrt_spd(random_spd(n, 1e3, 7, dtype=f32), method="newton_schulz", backend=be)
        iterations = info["iterations"]
    elif op == "mp2_pair_energy":
        if len(shape) == 3:
            nocc, nvir, naux = shape
            p = synthetic_problem(nocc, nvir, naux, seed=8, dtype=f32)
            linalg.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True, backend=be)
        else:
            ni, nj, nvir, naux = shape
            p = synthetic_problem(ni + nj, nvir, naux, seed=8, dtype=f32)
            linalg.mp2_pair_energy(
                p.B[nj:], p.B[:nj], p.eps_occ[nj:], p.eps_occ[:nj], p.eps_vir, symmetric=False, backend=be
            )
    else:
        raise ValueError(f"no emulator check for {op}")
    emu = dict(be.runner.emulator_totals)
    emu["launches"] = dict(be.runner.launches)
    w = op_work(op, shape, target, iterations)
    model = {
        "matmul_flops": w.matmul_flops,
        "dma_bytes": w.dma_bytes,
        "instructions": w.instruction_count,
        "launches": dict(w.launches),
    }
    match = all(model[k] == emu.get(k) for k in model)
    return {
        "op": op,
        "args": list(shape),
        "target": target,
        "engine": be.engine,
        "model": model,
        "emulator": emu,
        "match": match,
    }


def describe_method() -> dict:
    """What the estimate is based on, for the JSON and the markdown."""
    return {
        "what": "ESTIMATE from the NKI kernels' instruction stream and published engine rates; not a measurement",
        "estimate": "max(Tensor Engine, Vector Engine, DMA) time on one NeuronCore (perfect overlap)",
        "excluded": "kernel launch overhead (not published; launch counts reported), host fp64 work of the "
        "trn backend, host<->device transfers",
        "rates": {t: {**RATES[t], **{k: v for k, v in rates(t).items() if k != "target"}} for t in RATES},
        "instruction_costs": "nc_matmul fp32: 4*max(min(64, N_stationary), N_moving) TensorE cycles; "
        "VectorE: tensor_tensor max(64,N) (one PSUM input) / max(64,2N) (both SBUF), "
        "tensor_scalar/tensor_copy/tensor_reduce/memset max(64,N), reciprocal max(64,8N)",
        "sources": SOURCES,
    }


def fmt_rate_line(target: str) -> str:
    r = rates(target)
    return (
        f"{target} ({r['neuroncore']}, one core): FP32 peak {r['fp32_peak_flops'] / 1e12:.2f} TFLOP/s "
        f"(TensorE {r['pe_hz'] / 1e9:.2f} GHz-equivalent), VectorE {r['ve_hz'] / 1e9:.2f} GHz, "
        f"HBM {r['hbm_bytes_per_s'] / 1e9:.0f} GB/s"
    )


__all__ = [
    "RATES",
    "SOURCES",
    "NotEstimable",
    "Work",
    "check_against_emulator",
    "describe_method",
    "estimate",
    "fmt_rate_line",
    "op_work",
    "pair_occ_block_cap",
    "rates",
]
