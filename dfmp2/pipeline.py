"""The DF-MP2 pipeline: XYZ -> RHF -> integrals -> metric -> transforms -> fit -> pair energies.

Everything after the raw integrals runs through ``linalg`` on the chosen backend. The
energy sums are carried in fp64 in both precisions.

    B_ia^P = sum_Q (ia|Q) [L^-T]_QP,   L L^T = (P|Q)
    K_ab   = sum_P B_ia^P B_jb^P,      D = e_i + e_j - e_a - e_b
    E_OS   = sum_ij sum_ab K_ab^2 / D,   E_SS = sum_ij sum_ab K_ab (K_ab - K_ba) / D
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, asdict
from pathlib import Path

import numpy as np
import torch

import linalg
from linalg import DTYPES

from . import integrals, scf
from .errors import InputError
from .memory import MemoryPlan, plan_memory
from .result import Result, software_versions
from .xyz import Geometry, read_xyz

PRECISIONS = tuple(DTYPES)


@dataclass
class RunOptions:
    """What the user asked for. ``precision=None``: fp64 on cpu/cuda, fp32 on trn (no fp64 there)."""

    basis: str = "cc-pvdz"
    auxbasis: str | None = None          # None: the MP2-fit set matched to ``basis``
    charge: int | None = None            # None: from the XYZ comment line, else 0
    multiplicity: int | None = None
    device: str = "cpu"
    simulate: bool = False
    precision: str | None = None
    frozen_core: bool = False
    scf_mode: str = "df"
    memory_mb: float | None = None       # None: a safe fraction of available memory

    def resolved_precision(self) -> str:
        p = self.precision or ("fp32" if self.device.startswith("trn") else "fp64")
        if p not in PRECISIONS:
            raise InputError(f"unknown precision '{p}'; use one of {', '.join(PRECISIONS)}")
        if p == "fp64" and self.device.startswith("trn"):
            raise InputError(f"{self.device} has no fp64 arithmetic; use --precision fp32 "
                             "(energies are still accumulated in fp64)")
        return p


class _Timer:
    """Wall-clock seconds per stage, synchronising the device before each reading."""

    def __init__(self, backend):
        self.backend, self.seconds = backend, {}

    def add(self, stage: str, t0: float, sync: bool = True) -> float:
        """Charge the time since t0 to ``stage``; sync=False for host-only work, so queued
        device work (and its overlap with the host) is not interrupted."""
        if sync:
            self.backend.synchronize()
        t1 = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (t1 - t0)
        return t1


def fit_metric(j2c: torch.Tensor, backend) -> tuple[torch.Tensor, str, dict]:
    """Factor the fitting metric j2c (naux, naux) fp64. Returns (M, kind, info): kind 'cholesky'
    with M = L (lower, j2c = L L^T), or, when j2c is numerically not positive definite, kind
    'eigh' with M = j2c^-1/2 (eigenvalues below 1e-10 dropped, as PySCF and Psi4 do)."""
    try:
        return linalg.cholesky(j2c, backend=backend), "cholesky", {}
    except torch.linalg.LinAlgError:   # linalg.NotPositiveDefiniteError among them
        M, info = linalg.inv_sqrt_spd(j2c, method="eigh", threshold=1e-10, backend=backend)
        return M, "eigh", info


def build_B(mol, auxmol, C_occ, C_vir, backend, dtype, plan: MemoryPlan, timer: _Timer):
    """Fitted integrals, stored transposed: Bt (naux', nocc*nvir) in ``dtype`` on the device,
    Bt[P, i*nvir + a] = B_ia^P.

    (μν|P) is streamed from libcint in aux-shell blocks; each block is half-transformed with
    C_occ then C_vir (gemm) into rows of (P|ia); then Bt = L^-1 (P|ia) (trsm, left). Keeping
    the auxiliary index outermost makes every write a contiguous row block and is the layout
    the pair step contracts over (the partition axis on Trainium).
    """
    nao, nocc = C_occ.shape
    nvir = C_vir.shape[1]
    naux = auxmol.nao_nr()
    t0 = time.perf_counter()
    j2c = backend.to_device(integrals.metric_2c(auxmol), torch.float64)
    t0 = timer.add("integrals", t0)
    M, metric_kind, metric_info = fit_metric(j2c, backend)
    t0 = timer.add("metric", t0)
    co = backend.to_device(C_occ, dtype)
    cv = backend.to_device(C_vir, dtype)
    Pia = torch.empty((naux, nocc * nvir), dtype=dtype, device=co.device)
    blocks = integrals.aux_shell_blocks(auxmol, plan.aux_block)
    t_loop, t_int = t0, 0.0
    for p0, p1, j3c in integrals.iter_j3c(mol, auxmol, blocks):
        t1 = time.perf_counter()
        t_int += t1 - t0                      # host libcint time; device work may still run
        nb = p1 - p0
        # two 2-D GEMMs (one launch each on Trainium) rather than a batch over P
        x = backend.to_device(j3c, dtype).reshape(nb * nao, nao)          # (P μ, ν)
        half = linalg.gemm(x, co, backend=backend)                       # (P μ, i)
        half = half.reshape(nb, nao, nocc).transpose(1, 2).reshape(nb * nocc, nao)
        Pia[p0:p1] = linalg.gemm(half, cv, backend=backend).reshape(nb, nocc * nvir)
        t0 = time.perf_counter()
    t0 = timer.add("transform", t_loop)
    timer.seconds["transform"] -= t_int
    timer.seconds["integrals"] += t_int
    if metric_kind == "cholesky":
        Bt = linalg.trsm(M.to(dtype), Pia, side="left", uplo="lower", backend=backend)
    else:                      # M = j2c^-1/2 is symmetric
        Bt = linalg.gemm(M.to(dtype), Pia, backend=backend)
    del Pia
    timer.add("fit", t0)
    return Bt, metric_kind, metric_info


def pair_energies(B, eps_occ, eps_vir, backend, occ_block: int, progress=None):
    """E_OS, E_SS (Hartree, fp64) over occupied blocks I >= J; off-diagonal blocks count twice.

    B: (nocc, nvir, naux) in working precision (may be a strided view of Bt). eps_*: fp64
    tensors on the device.
    ``progress(done, total)`` is called after each block pair.
    """
    nocc = B.shape[0]
    starts = list(range(0, nocc, occ_block))
    pairs = [(I, J) for I in starts for J in starts if J <= I]
    e_os = e_ss = 0.0
    for n, (I, J) in enumerate(pairs, start=1):
        Bi, Bj = B[I:I + occ_block], B[J:J + occ_block]
        os_, ss_ = linalg.mp2_pair_energy(Bi, Bj, eps_occ[I:I + occ_block],
                                          eps_occ[J:J + occ_block], eps_vir,
                                          symmetric=(I == J), backend=backend)
        w = 1.0 if I == J else 2.0
        e_os += w * os_
        e_ss += w * ss_
        if progress is not None:
            progress(n, len(pairs))
    return e_os, e_ss


def run_geometry(geom: Geometry, options: RunOptions, progress=None, log=None) -> Result:
    """Run DF-MP2 on a parsed geometry. Checks everything cheap before the heavy work."""
    say = log or (lambda msg: None)
    precision = options.resolved_precision()
    if options.scf_mode not in scf.SCF_MODES:
        raise InputError(f"unknown SCF mode '{options.scf_mode}'; use one of {', '.join(scf.SCF_MODES)}")
    if options.simulate and not options.device.startswith("trn"):
        raise InputError(f"--simulate applies only to trn1/trn2, not to device '{options.device}'")
    try:
        backend = linalg.get_backend(options.device, simulate=options.simulate)
    except ValueError as e:        # an unknown device name or a misplaced --simulate
        raise InputError(str(e)) from None
    dtype = DTYPES[precision]
    mol = scf.build_molecule(geom, options.basis, options.charge, options.multiplicity)
    auxbasis = scf.mp2_auxbasis(mol, options.auxbasis)
    auxmol = scf.make_auxmol(mol, auxbasis)
    nocc_all = mol.nelectron // 2
    nfrozen = scf.frozen_core_count(mol) if options.frozen_core else 0
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    nmo = nao  # spherical basis without linear dependence; checked after SCF
    plan = plan_memory(nao=nao, nocc=nocc_all - nfrozen, nvir=nmo - nocc_all, naux=naux,
                       itemsize=torch.finfo(dtype).bits // 8, limit_mb=options.memory_mb,
                       device=options.device)
    say(f"{geom.natm} atoms, {mol.nelectron} electrons, nbasis {nao}, naux {naux}; "
        f"memory plan {plan.peak_mb:.0f} MB of {plan.limit_mb:.0f} MB")

    timer = _Timer(backend)
    t0 = time.perf_counter()
    say("RHF ...")
    ref = scf.run_rhf(mol, options.scf_mode)
    timer.add("scf", t0)
    nmo = ref.mo_coeff.shape[1]
    nocc = ref.nocc - nfrozen
    nvir = nmo - ref.nocc
    if nocc <= 0 or nvir <= 0:
        raise InputError(f"{geom.source}: no MP2 correlation possible with {nocc} active "
                         f"occupied and {nvir} virtual orbitals")
    say("integrals, transforms, fit and pair energies ...")
    e_os, e_ss, ran = mp2_energy(mol, auxmol, ref, nfrozen=nfrozen, backend=backend,
                                 precision=precision, plan=plan, timer=timer, progress=progress)
    return Result(
        molecule=geom.source, natm=geom.natm, formula=_formula(geom.symbols),
        charge=mol.charge, basis=options.basis, auxbasis=scf.describe_auxbasis(auxbasis),
        scf_mode=options.scf_mode, jk_auxbasis=ref.jk_auxbasis, frozen_core=options.frozen_core,
        nbasis=nao, nmo=nmo, nocc=nocc, nfrozen=nfrozen, nvir=nvir, naux=naux,
        e_hf=ref.e_hf, e_os=e_os, e_ss=e_ss,
        timings=timer.seconds, ran=ran, memory=plan.to_dict(),
        versions=software_versions())


def mp2_energy(mol, auxmol, ref, *, nfrozen: int, backend, precision: str, plan: MemoryPlan,
               timer: _Timer, progress=None):
    """The DF-MP2 stage after the SCF: integrals, metric, transforms, fit and pair energies.

    Returns (e_os, e_ss, ran): correlation energies in Hartree and what ran.
    """
    nocc = ref.nocc - nfrozen
    nvir = ref.mo_coeff.shape[1] - ref.nocc
    C = ref.mo_coeff
    C_occ, C_vir = C[:, nfrozen:ref.nocc], C[:, ref.nocc:]
    # fp32 rounding of (P|ia) is amplified by L^-1 (the metric's condition number): measured on
    # (H2O)4 it costs 2e-7 Eh against 1e-8 Eh with an fp64 fit. The transforms and the fit are
    # O(N^4) next to the O(N^5) pair step, so they stay fp64 wherever the device has fp64.
    fit_dtype = torch.float32 if backend.name.startswith("trn") else torch.float64
    Bt, metric_kind, metric_info = build_B(mol, auxmol, C_occ, C_vir, backend, fit_dtype, plan, timer)
    Bt = Bt.to(DTYPES[precision])
    B = Bt.view(Bt.shape[0], nocc, nvir).permute(1, 2, 0)    # (nocc, nvir, naux') view, no copy
    eps_occ = backend.to_device(ref.mo_energy[nfrozen:ref.nocc], torch.float64)
    eps_vir = backend.to_device(ref.mo_energy[ref.nocc:], torch.float64)
    t0 = time.perf_counter()
    e_os, e_ss = pair_energies(B, eps_occ, eps_vir, backend, plan.occ_block, progress)
    timer.add("pair", t0)
    ran = backend.describe()
    ran["precision"] = precision
    # A Trainium number measured on a CPU is the worst bug we can ship: say it on every result.
    ran["simulated"] = backend.name.startswith("trn") and backend.engine != "neuron-hardware"
    ran["stage_precision"] = {"transform_fit": str(fit_dtype).replace("torch.float", "fp"),
                              "pair": precision, "energy_sums": "fp64"}
    ran["metric"] = metric_kind if metric_kind == "cholesky" else f"eigh (dropped {metric_info['dropped']})"
    return e_os, e_ss, ran


def run(path, options: RunOptions, progress=None, log=None) -> Result:
    """Read an XYZ file and run DF-MP2 on it."""
    return run_geometry(read_xyz(path), options, progress=progress, log=log)


def _formula(symbols) -> str:
    """Hill formula: C, then H, then the rest alphabetically (all alphabetical without C)."""
    counts = {}
    for sym in symbols:
        counts[sym] = counts.get(sym, 0) + 1
    first = [k for k in ("C", "H") if k in counts] if "C" in counts else []
    order = first + sorted(k for k in counts if k not in first)
    return "".join(f"{k}{counts[k] if counts[k] > 1 else ''}" for k in order)
