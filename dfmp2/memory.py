"""Memory planning: estimate the peak of each stage from the shapes and pick block sizes.

Estimates are in MB (10^6 bytes). The plan is checked before the heavy work, so a run
that cannot fit fails at once with the minimum it needs.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict

from .errors import MemoryLimitError

MB = 1e6
DEFAULT_FRACTION = 0.8        # of available memory when no limit is given
J3C_SHARE = 0.25              # share of the limit the streamed integral blocks may use
OCC_BLOCK_MAX = 16            # occupied block of the pair step (progress granularity)


def available_mb(device: str) -> float:
    """Available memory on the device the big arrays live on (host for cpu and trn)."""
    if device.startswith("cuda"):
        import torch
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free / MB
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / MB


@dataclass
class MemoryPlan:
    limit_mb: float
    peak_mb: float
    aux_block: int            # max auxiliary functions per streamed (μν|P) block
    occ_block: int            # occupied orbitals per pair-step block
    stages_mb: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _stages(nao, nocc, nvir, naux, w, aux_block, occ_block) -> dict:
    nov = nocc * nvir
    return {
        "metric": 2 * naux * naux * 8 / MB,
        # host packed + unpacked fp64 block, its device copy and the half-transformed blocks,
        # all at most fp64 (the fit precision)
        "j3c_block": (aux_block * nao * nao * 24 + 2 * aux_block * nao * nocc * 8
                      + aux_block * nov * 8) / MB,
        # (P|ia) and B in fp64 (the fit precision) plus B in the pair step's precision
        "iaP_and_B": nov * naux * (16 + (w if w != 8 else 0)) / MB,
        "pair_workspace": 6 * occ_block * nvir * nvir * 8 / MB,
    }


def plan_memory(*, nao: int, nocc: int, nvir: int, naux: int, itemsize: int,
                limit_mb: float | None, device: str = "cpu") -> MemoryPlan:
    """Choose block sizes that fit ``limit_mb`` (default: a safe fraction of what is free).

    Raises MemoryLimitError, naming the minimum needed, when even the smallest blocks do not fit.
    """
    limit = limit_mb if limit_mb is not None else DEFAULT_FRACTION * available_mb(device)
    w = itemsize
    occ_block = max(1, min(nocc, OCC_BLOCK_MAX))
    per_aux_fn = _stages(nao, nocc, nvir, naux, w, 1, occ_block)["j3c_block"]
    aux_block = int(max(1, min(naux, J3C_SHARE * limit / max(per_aux_fn, 1e-12))))
    aux_block = max(aux_block, min(naux, 64))  # at least one shell-sized block; checked below
    while True:
        st = _stages(nao, nocc, nvir, naux, w, aux_block, occ_block)
        peak = st["metric"] + st["j3c_block"] + st["iaP_and_B"] + st["pair_workspace"]
        if peak <= limit or (aux_block <= 16 and occ_block == 1):
            break
        if aux_block > 16:
            aux_block = max(16, aux_block // 2)
        else:
            occ_block = max(1, occ_block // 2)
    if peak > limit:
        raise MemoryLimitError(
            f"this run needs at least {peak:.3g} MB but the memory limit is {limit:.3g} MB "
            f"(nocc {nocc}, nvir {nvir}, naux {naux}); raise --memory or use a smaller basis")
    return MemoryPlan(limit_mb=limit, peak_mb=peak, aux_block=aux_block,
                      occ_block=occ_block, stages_mb=st)
