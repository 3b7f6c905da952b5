"""The precision policy of our DF-SCF's J/K: the mode (``resolve_precision``) and its thresholds.

Precision. fp64 devices build J and K of the whole density each cycle. A device without fp64
(trn, fp32 NKI GEMM/SYRK) builds the J and K of the density change ΔD = D_n - D_(n-1) and the
Fock matrix is accumulated in fp64 on the host (as the MP2 stage carries its sums): the fp32
noise then shrinks with ΔD and the SCF converges to the fp64 thresholds. ΔD = P - Q with P, Q
positive semidefinite of rank nocc, so its eigenvectors give K(ΔD) = K(V+ λ+^1/2) - K(V- |λ-|^1/2)
with at most nocc columns each (padded to nocc: one kernel shape). What stays is the fp32
rounding of the first build (the guess's J and K) and of the factor: see the DF-RHF's tests
and scripts/results for the measured E(HF) difference to fp64. Where that perturbation stalls
the gradient (open shells with degenerate orbitals: OH), G is rebuilt once from the whole
density with the fp64 factor on the host and the fp32 cycles go on from there
(HOST_REBUILD_BELOW, recorded).

Mixed precision (``precision`` 'mixed', or 'auto' where the device has fp64 and fast fp32,
``resolve_precision``): the first cycles build J and K of the whole density from an unpacked
fp32 copy of the factor (a factor on disk: its file read as fp32 blocks, DiskJKFactor.fp32) in
one pass (dfmp2.scf.jk.JKFactor.jk: each GEMM's sums over an AO index in fp32, J's sums over P
and i in fp64; a packed fp64 factor gives J of the density instead), G
summed into the Fock matrix in fp64 (nothing fp32 is carried from
cycle to cycle); once the orbital gradient nears the fp32 noise (FP32_NOISE, FP32_SWITCH) or
stalls (FP32_STALL) every later cycle is fp64, DIIS dropping the fp32 Fock matrices once the
error is below their noise, and the SCF converges to the same thresholds. Recorded in
``ScfRecord.cycle_precision``.

The constants below are read by DFRHF's cycles (dfmp2.scf.rhf: ``maybe_switch``,
``maybe_host_rebuild``, ``exchange``); gradient norms are those of the orbital gradient (Hartree).
"""

from __future__ import annotations

from dfmp2.errors import InputError
from dfmp2.options import SCF_PRECISIONS

# Mixed precision (fp64 devices with fast fp32): the cycles' K in fp32 until the orbital gradient
# nears the fp32 build's noise, then J/K in fp64 to the usual thresholds. J's long sums stay fp64
# (over P, in the one-pass build over an unpacked copy; with a packed fp64 factor J is its two
# GEMVs): an fp32 J's long sums made nearly all of the noise (benzene). At
# converged densities the gradient noise of an fp32 K was at most 7.5 x eps32 ||K/2||_F on the test
# molecules (FP32_NOISE bounds it); the energy's noise is first order and size-extensive, so a |ΔE|
# test would switch by chance: none is made (numbers: scripts/results/docstring-measurements.md).
FP32_NOISE = 20.0  # the gradient noise of an fp32 K, bounded: this many eps32 ||K/2||_F
FP32_SWITCH = 10.0  # J/K go to fp64 once the orbital gradient is below this many noises, ...
FP32_STALL = 0.8  # ... or falls by less than this factor in a cycle (at the noise floor)
# A device without fp64 (trn): J/K of ΔD in fp32 keep a fixed rounding perturbation in the Fock
# matrix (mostly the guess's build: the later ΔD are small). Open shells with degenerate partly
# filled orbitals (OH, NO: one pi electron in two pi orbitals) have a flat rotation between them,
# along which that perturbation moves the solution: OH's orbital gradient stalled above the
# threshold (1e-9), then wandered away (trn1 simulated). So G is rebuilt from the
# whole density with the fp64 factor on the host (the factor the final energy uses anyway): the
# DF-UHF once its gradient first falls below UHF_PLANNED_REBUILD, and any SCF whose fp32 gradient
# stalls (FP32_STALL) below HOST_REBUILD_BELOW (not sooner than REBUILD_GRACE cycles after the
# last rebuild). The difference to the accumulated G is added to DIIS's stored Fock matrices too
# (the same perturbation is in all of them), and the fp32 cycles of ΔD go on from there on the
# device. On simulated trn1, 8 open-shell cases then converge in about the cycles of our fp64 SCF,
# with a few host builds, to E(UHF) and <S^2> equal to round-off; without the planned rebuild, or
# resetting DIIS at a rebuild instead of correcting it, they take more cycles (numbers:
# scripts/results/docstring-measurements.md). Recorded: cycle_precision (fp64_cycles: the host
# builds), the 'scf_fp64_host' time, the record's host line.
HOST_REBUILD_BELOW = 1e-5
UHF_PLANNED_REBUILD = 1e-3  # the DF-UHF's rebuild is planned: once, when the gradient first falls below this
REBUILD_GRACE = 3  # cycles after a rebuild before a stall counts (DIIS starts again from one vector)


FP32_PAYS = 1.5  # 'auto' runs mixed where the measured SGEMM/DGEMM ratio is at least this: an fp32
# cycle's J/K then costs about half an fp64 one (at a ratio of 2 the fp32 cycles, about a third of
# them, shortened a water cluster's DF-RHF by about a fifth)


def resolve_precision(
    caps, requested: str, fp32_copy: bool = True, fp32_speedup: float | None = None
) -> tuple[str, str]:
    """(mode, why) of the cycles' J/K on a device of capabilities ``caps`` for ``requested``
    (options.SCF_PRECISIONS): 'mixed' (fp32 J/K, then fp64), 'fp64', or 'fp32' (a device without
    fp64: J/K of ΔD in fp32, Fock summed in fp64, final energy with the fp64 factor on the host).
    'auto' is mixed where the device has fp64 and fast fp32 and memory allows the factor's fp32
    copy (``fp32_copy``): fast when this machine's measured SGEMM/DGEMM ratio ``fp32_speedup``
    (``Backend.fp32_speedup``: the CPU's BLAS probe) is at least FP32_PAYS, else, where nothing
    was measured, by ``caps.fast_fp32``. InputError for fp64 or mixed on a device without fp64."""
    if requested not in SCF_PRECISIONS:
        raise InputError(
            f"unknown SCF precision '{requested}'; use one of {', '.join(SCF_PRECISIONS)}", option="scf_precision"
        )
    if not caps.has_fp64:
        if requested != "auto":
            raise InputError(
                f"SCF precision {requested} needs fp64 arithmetic, which this device lacks; "
                "use auto (fp32 J/K of the density change, Fock matrix in fp64)",
                option="scf_precision",
            )
        return "fp32", "the device has no fp64: J/K of the density change in fp32, the Fock matrix summed in fp64"
    if requested == "fp64":
        return "fp64", "asked for"
    if requested == "auto" and fp32_speedup is not None and fp32_speedup < FP32_PAYS:
        return (
            "fp64",
            f"auto: this machine's SGEMM is {fp32_speedup:.2f}x its DGEMM (measured; mixed from {FP32_PAYS}x)",
        )
    if requested == "auto" and fp32_speedup is None and not caps.fast_fp32:
        return "fp64", "auto: the device's fp32 is not faster than its fp64"
    if not fp32_copy:
        return "fp64", f"{requested}: the fp32 copy of the JK factor does not fit the memory limit"
    if requested == "mixed":
        return "mixed", "asked for"
    if fp32_speedup is not None:
        return (
            "mixed",
            f"auto: this machine's SGEMM is {fp32_speedup:.2f}x its DGEMM (measured; mixed from {FP32_PAYS}x)",
        )
    return "mixed", "auto: the device has fp64 and fast fp32"
