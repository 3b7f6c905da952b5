"""The SCF's settings as one object: ``SCFSettings``, derived from the run options in one place.

``run_scf`` (dfmp2.scf.driver), ``DFRHF`` (dfmp2.scf.rhf), ``DFUHF`` (dfmp2.scf.uhf) and
``pyscf_scf.run_ks`` take an ``SCFSettings`` and the few objects of the run itself (the molecule,
the backend, the ranks, the timer, the progress callback, a starting density). The run's options
become settings in ``SCFSettings.from_options`` only, the memory plan's choices (``plan``) with
them, so that a new setting is one field here and one line there.
"""

from __future__ import annotations

import dataclasses

from dfmp2.options import SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE, RunOptions
from dfmp2.scf.jk import JK_BLOCK_MB, SCREEN_DEFAULT

# the fields of the memory plan's SCF share (ScfPlan, dfmp2.drivers.plan) that are settings
PLAN_FIELDS = ("block_mb", "fp32_copy", "layout", "fit_mb", "fp32_speedup")


@dataclasses.dataclass(frozen=True)
class ScfPlan:
    """Our DF-SCF's part of the plan: its exchange block (MB, smaller when the limit needs it),
    whether a mixed-precision SCF can run its fp32 cycles (the factor's fp32 copy fits; on disk
    always: the file is read as fp32 blocks), the factor's layout ('unpacked' where it fits,
    'packed', or 'disk'), its size on disk (MB), the block of a disk fit (MB) and the
    measured SGEMM/DGEMM ratio that decides an 'auto' SCF precision (None: not measured)."""

    block_mb: float = JK_BLOCK_MB
    fp32_copy: bool = False
    layout: str = "packed"
    disk: float = 0.0
    fit_mb: float = 0.0
    fp32_speedup: float | None = None


@dataclasses.dataclass(frozen=True)
class SCFSettings:
    """How an SCF runs; the defaults are ``run_scf``'s (a bare call: no stability check, the packed
    factor), ``from_options`` the run's. Energies in Hartree (Eh), memory in MB (1e6 B).

    Convergence (PySCF's test, our thresholds): |ΔE| < ``conv_tol`` (Eh) and the orbital-gradient
    norm ||2 C_vir^T F C_occ|| < ``conv_tol_grad`` (Eh), within ``max_cycle`` cycles (else
    SCFNotConvergedError). ``unrestricted``: DF-UHF (two spin channels) rather than DF-RHF;
    ``stability``: a UHF's internal stability check after convergence (dfmp2.scf.stability).

    Precision and builds: ``precision`` the cycles' J/K, options.SCF_PRECISIONS ('auto': mixed where
    the device has fp64 and fast fp32, dfmp2.scf.precision.resolve_precision); ``fp32_speedup`` a
    measured SGEMM/DGEMM ratio that decides 'auto' (None: the device's capabilities decide);
    ``fp32_copy`` whether memory allows a mixed SCF's fp32 cycles (the factor's fp32 copy; with
    the 'disk' layout they read the file as fp32 blocks, no copy; False: fp64 cycles, recorded);
    ``incremental`` the Fock build (J/K of ΔD; None: exactly when the device lacks fp64).
    ``screen``: the JK factor's Schwarz threshold (``jk.significant_pairs``; 0: every pair kept).

    Memory and disk (the memory plan's, ``driver.check_memory``): ``layout`` the JK factor's,
    'packed', 'unpacked' or 'disk'; ``block_mb`` the exchange build's block (MB); 'disk': the
    factor in a private directory under ``scratch_dir`` (None: the system's temporary
    directory), fitted in row blocks of ``fit_mb`` MB, removed when the SCF ends.

    DIIS (its space and first cycle, dfmp2.scf.diis) is not a setting: the memory plan counts its
    history, so it stays the method's."""

    max_cycle: int = SCF_MAX_CYCLE
    conv_tol: float = SCF_CONV_TOL  # Eh, energy change between cycles
    conv_tol_grad: float = SCF_CONV_TOL_GRAD  # Eh, orbital-gradient norm
    unrestricted: bool = False
    stability: bool = False
    precision: str = "auto"
    fp32_speedup: float | None = None
    fp32_copy: bool = True
    incremental: bool | None = None
    screen: float = SCREEN_DEFAULT
    layout: str = "packed"
    block_mb: float = JK_BLOCK_MB  # MB
    fit_mb: float | None = None  # MB
    scratch_dir: str | None = None

    @classmethod
    def from_options(
        cls, options: RunOptions, *, unrestricted: bool = False, plan: ScfPlan | None = None
    ) -> SCFSettings:
        """The settings of a run with ``options``: its cycle limit, gradient threshold, precision,
        screening, stability check and scratch directory; ``unrestricted`` the reference's kind
        (``Job.unrestricted``); ``plan`` the memory plan's SCF share (PLAN_FIELDS: exchange block,
        fp32 copy, layout, fit block, measured fp32 speed-up); None: the defaults (an SCF not
        planned here, PySCF's)."""
        planned = {} if plan is None else {k: getattr(plan, k) for k in PLAN_FIELDS}
        return cls(
            max_cycle=options.scf_max_cycle,
            conv_tol_grad=options.scf_conv_tol_grad,
            unrestricted=unrestricted,
            stability=options.scf_stability,
            precision=options.scf_precision,
            screen=options.scf_screen,
            scratch_dir=options.scratch_dir,
            **planned,
        )

    def replace(self, **changes) -> SCFSettings:
        """A copy with ``changes`` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


DEFAULT_SETTINGS = SCFSettings()  # a bare ``run_scf``'s
