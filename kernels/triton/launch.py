"""Host-side helpers shared by the Triton kernels: argument checks, pair and tile index lists,
and the fixed-order fp64 reduction of per-program partial sums."""

from __future__ import annotations

import os

import torch
import triton

MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (and z); gridDim.x allows 2**31 - 1


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1).

    Triton fixes the mode of its own library functions (tl.zeros, tl.sum, ...) when
    triton.language is first imported, so a process either interprets or compiles; a
    TRITON_INTERPRET setting that disagrees with that import is an error here rather than a
    confusing failure inside the kernel.
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older: the variable itself
    env = (
        bool(knobs.runtime.interpret)
        if knobs is not None
        else os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    )
    lang = isinstance(tl.zeros, InterpretedFunction)
    if env != lang:
        raise RuntimeError(
            f"TRITON_INTERPRET is {'set' if env else 'unset'} but triton was imported "
            f"{'with' if lang else 'without'} it: Triton's interpreter mode is fixed when triton is "
            "first imported; set TRITON_INTERPRET=1 before the process imports triton (CPU), "
            "or leave it unset for GPU runs"
        )
    return env


def check_device(op: str, *tensors: torch.Tensor) -> torch.device:
    """All tensors on one device that Triton can launch on: a CUDA device, or the CPU under
    Triton's interpreter. Anything else is an error (never a quiet switch to torch)."""
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"{op}: tensors on different devices ({dev} and {t.device})")
    if dev.type == "cuda":
        return dev
    if dev.type == "cpu" and interpreting():
        return dev
    raise RuntimeError(
        f"{op}: Triton kernels need CUDA tensors (got {dev}); on the CPU they run only "
        "under Triton's interpreter (TRITON_INTERPRET=1 in the environment)"
    )


def check_pair_args(op: str, Bi, Bj, eps_i, eps_j, eps_vir, symmetric: bool, eps_vir_j=None):
    """Validate the mp2_pair_energy contract's arguments (``eps_vir_j``: opposite spins, Bj over
    its own virtuals); returns (ni, nj, nvir, naux)."""
    mixed = eps_vir_j is not None
    if Bi.ndim != 3 or Bj.ndim != 3:
        raise ValueError(f"{op}: Bi and Bj must be (n, nvir, naux), got {tuple(Bi.shape)} and {tuple(Bj.shape)}")
    ni, nvir, naux = Bi.shape
    nj = Bj.shape[0]
    if (Bj.shape[2] != naux) if mixed else (Bj.shape[1:] != Bi.shape[1:]):
        raise ValueError(
            f"{op}: Bi {tuple(Bi.shape)} and Bj {tuple(Bj.shape)} differ in {'naux' if mixed else '(nvir, naux)'}"
        )
    if symmetric and (mixed or nj != ni):
        raise ValueError(f"{op}: symmetric=True needs Bj to be Bi (same spin)")
    if mixed and tuple(eps_vir_j.shape) != (Bj.shape[1],):
        raise ValueError(f"{op}: eps_vir_j must have shape ({Bj.shape[1]},), got {tuple(eps_vir_j.shape)}")
    if Bi.dtype != Bj.dtype or Bi.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{op}: Bi and Bj must both be fp32 or both fp64, got {Bi.dtype} and {Bj.dtype}")
    for name, e, n in (("eps_i", eps_i, ni), ("eps_j", eps_j, nj), ("eps_vir", eps_vir, nvir)):
        if tuple(e.shape) != (n,):
            raise ValueError(f"{op}: {name} must have shape ({n},), got {tuple(e.shape)}")
    return ni, nj, nvir, naux


def pair_lists(ni: int, nj: int, symmetric: bool, device):
    """(pair_i, pair_j, weight): int64 occupied indices of every pair computed, row-major in i,
    and its fp64 weight in the full I x J sum (symmetric: i >= j only, 2 for i > j, 1 for i = j)."""
    if symmetric:
        ii, jj = torch.tril_indices(ni, ni, device="cpu")
        w = torch.where(ii == jj, 1.0, 2.0).to(torch.float64)
    else:
        ii = torch.arange(ni).repeat_interleave(nj)
        jj = torch.arange(nj).repeat(ni)
        w = torch.ones(ni * nj, dtype=torch.float64)
    return ii.to(device), jj.to(device), w.to(device)


def tile_pairs(nvir: int, block: int, diagonal: bool, device):
    """(tile_a, tile_b) int64: the diagonal tiles (A, A), or the strictly upper pairs A < B."""
    t = -(-nvir // block)
    if diagonal:
        a = torch.arange(t)
        return a.to(device), a.to(device)
    a, b = torch.triu_indices(t, t, offset=1, device="cpu")
    return a.to(device), b.to(device)


def pair_chunks(npairs: int):
    """[(p0, p1), ...] launches of at most MAX_GRID_Y pairs (pairs are the grid's y axis)."""
    return [(p0, min(npairs, p0 + MAX_GRID_Y)) for p0 in range(0, npairs, MAX_GRID_Y)]


def reduce_partials(os_parts: list, ss_parts: list, weight: torch.Tensor) -> tuple[float, float]:
    """Sum per-program partials (each (npairs, ntiles) fp64) in a fixed order: over tiles per pair,
    then weighted over pairs. Torch's reductions use no atomics, so the result is bit-identical
    run to run on one device."""
    os_pair = sum(p.sum(dim=1) for p in os_parts)
    ss_pair = sum(p.sum(dim=1) for p in ss_parts)
    return float((os_pair * weight).sum()), float((ss_pair * weight).sum())
