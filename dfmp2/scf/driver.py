"""Our DF-SCF's entry point and memory plan: ``run_scf`` (``dfmp2 run --scf df``, the default).

A peer of the MP2 stage: it takes the backend, asks its capabilities and times itself with the
pipeline's timer. It returns the same ``dfmp2.reference.Reference`` the MP2 stage consumes (mf None).
``run_scf`` runs DFRHF (dfmp2.scf.rhf) or, for open shells, DFUHF (dfmp2.scf.uhf); ``memory_mb`` and
``check_memory`` are the stage's memory estimate (MB, 1e6 B) before any integral; OPS the linalg
operations it calls. Where things are: the JK factor and the J/K builds in dfmp2.scf.jk, DIIS in
dfmp2.scf.diis, the precision policy in dfmp2.scf.precision, the split factor over ranks in
dfmp2.scf.jk_dist, the UHF stability check in dfmp2.scf.stability, PySCF's SCF in
dfmp2.scf.pyscf_scf.
"""

from __future__ import annotations

import contextlib

from dfmp2.df.outofcore import Scratch
from dfmp2.errors import MemoryLimitError
from dfmp2.memory import QUEUE_DEPTH, human
from dfmp2.reference import Reference
from dfmp2.scf.diis import DIIS_SPACE, UHF_DIIS_SPACE
from dfmp2.scf.jk import DISK_READ_DEPTH, DISK_UNPACK_MB, JK_BLOCK_MB, SCATTER_MB, disk_rows, jk_block, npair
from dfmp2.scf.rhf import DFRHF
from dfmp2.scf.settings import DEFAULT_SETTINGS, SCFSettings
from dfmp2.scf.uhf import DFUHF
from dfmp2.timing import Timer

OPS = ("gemm", "syrk", "trsm", "cholesky", "eigh")  # the linalg ops this stage calls
DISK_FIT_ROWS_MIN = 64  # auxiliary functions of the fit's smallest row block with the factor on disk
# (fewer a block: the fit reads the file back more often)


def memory_mb(  # noqa: PLR0913
    nao: int,
    naux: int,
    nocc: int,
    itemsize: int,
    block_mb: float = JK_BLOCK_MB,
    fp32_copy: bool = False,
    spins: int = 1,
    layout: str = "packed",
    fit_mb: float = 0.0,
    pairs: int | None = None,
    held: int = 0,
) -> dict:
    """MB the SCF stage needs: 'factor' (the resident JK factor: packed naux nao(nao+1)/2 itemsize,
    or with ``layout`` 'unpacked' naux nao^2 itemsize), 'fp32_copy' (the mixed-precision SCF's fp32
    copy of an fp64 factor, unpacked: naux nao^2 4 B, about the packed fp64 factor's size; or 0;
    with the unpacked layout it lives in the factor's buffer while the fp64 factor is still
    packed, ``jk.deferred_unpacked``: the cycles hold the packed factor instead) and
    'peak': the fit (the raw integrals and the solution in fp64, and the factor in itemsize
    when that differs; unpacked: the packed solution and the unpacked factor), or in the cycles
    the factor (and its fp64 copy for the final energy when itemsize is not 8, or its fp32 copy
    with ``fp32_copy``), one unpacked block (packed layout) and its half-transform (2 nocc columns
    at most; the spins' exchange builds run one after the other: nocc is the wider spin's); plus
    the dense nao x nao fp64 matrices, per spin (``spins`` 2 for the DF-UHF): about 8 (S, hcore,
    Fock, ...) and the DIIS history's Fock matrices and errors (DIIS_SPACE, UHF_DIIS_SPACE): 24 for
    RHF, 2 x 40 for UHF. Layout 'disk' (fp64): 'factor' 0 and 'disk' the packed factor's MB in the
    scratch directory; the fit holds the metric and its Cholesky factor (2 naux^2), one row block
    of the raw integrals and its solution (2 ``fit_mb``), the integral engine's blocks and the
    reader's; the cycles the reader's blocks (DISK_READ_DEPTH + 1 packed), one exchange block
    (DISK_UNPACK_MB) unpacked and its half-transform (an fp32 pass's: as many bytes).
    ``pairs``: the packed columns kept by screening (``jk.significant_pairs``; default all
    nao(nao+1)/2): the packed and disk factors hold only those, and a screened unpack adds its
    scatter buffer (SCATTER_MB). ``held``: the (nao, nao) fp64 partials of J and K the
    cycles' ordered sum holds at once (``jk_dist.held_partials``), counted in the cycles."""
    width = npair(nao) if pairs is None else pairs
    scatter = 0 if pairs is None else SCATTER_MB * 1e6  # a screened unpack's buffer
    fac64 = naux * width * 8
    copy32 = naux * nao * nao * 4 if fp32_copy and itemsize == 8 else 0
    disk = 0
    if layout == "disk":
        rows = disk_rows(nao, naux, pairs=width)
        reads = (DISK_READ_DEPTH + 1) * rows * width * 8
        engine = (QUEUE_DEPTH + 1) * disk_rows(nao, naux) * npair(nao) * 8  # unscreened blocks (jk.fit_to_disk)
        fac, copy32, disk = 0, 0, fac64
        fit = 2 * naux * naux * 8 + 2 * fit_mb * 1e6 + engine + reads
        nb = min(rows, jk_block(nao, naux, 8, DISK_UNPACK_MB))  # unpacked a block at a time (DiskJKFactor.blocks)
        cycle = reads + nb * nao * nao * 8 + scatter + 2 * nb * nao * 2 * nocc * 8
    elif layout == "unpacked":  # with the fp32 copy: jk.deferred_unpacked, one buffer of 'factor' MB
        fac = naux * nao * nao * itemsize  # holds the copy, then the fp64 factor unpacked over it
        nb = jk_block(nao, naux, itemsize, block_mb)
        fit = max(2 * fac64, fac64 + fac + (nb * nao * nao * 8 if copy32 else 0))
        cycle = fac + (fac64 + scatter if copy32 else 0) + 2 * nb * nao * 2 * nocc * itemsize
    else:
        fac = naux * width * itemsize
        nb = jk_block(nao, naux, itemsize, block_mb)
        fit = 2 * fac64 + (fac if itemsize != 8 else 0)
        cycle = fac + (fac64 if itemsize != 8 else 0) + copy32 + nb * nao * nao * 8 + scatter
        cycle += 2 * nb * nao * 2 * nocc * 8
    cycle += held * nao * nao * 8
    space = UHF_DIIS_SPACE if spins == 2 else DIIS_SPACE
    dense = (8 + 2 * space) * spins * nao * nao * 8
    return {
        "factor": fac / 1e6,
        "fp32_copy": copy32 / 1e6,
        "peak": (max(fit, cycle) + dense) / 1e6,
        "phases": {"fit": (fit + dense) / 1e6, "cycles": (cycle + dense) / 1e6},
        "layout": layout,
        "disk": disk / 1e6,
        "fit_mb": fit_mb,
    }


def check_memory(  # noqa: PLR0913
    nao: int,
    naux: int,
    nocc: int,
    itemsize: int,
    limit_mb: float,
    fp32_copy: bool = False,
    spins: int = 1,
    disk: bool = False,
    other_mb: float = 0.0,
    pairs: int | None = None,
    held: int = 0,
    block_mb: float = JK_BLOCK_MB,
) -> dict:
    """``memory_mb`` of the first plan that fits ``limit_mb``: the unpacked fp64 factor (no unpack
    per cycle, J and K in one pass: the fastest, twice the memory), else the packed one, each with
    the exchange block ``block_mb`` (the device's: ``jk.exchange_block_mb``), then JK_BLOCK_MB where
    that is smaller, else one auxiliary function per block; with ``fp32_copy`` (a mixed-
    precision SCF asks for it) each first with the factor's fp32 copy, then without it
    ('fp32_copy' 0: the SCF then runs in fp64); else, with ``disk`` (fp64, one process: the
    caller's to say), the packed factor on disk, fitted in row blocks as large as the limit leaves
    room for ('fit_mb', at most the whole factor) but no larger than keeps the fit within the
    larger of the cycles' peak and ``other_mb`` (the run's other stages' peak: a fit at the limit
    would raise the run's peak for fewer re-reads of the file only, and leave nothing of the
    limit to the process's own memory, about 0.3 GB outside every plan), and streamed every
    cycle. The result's
    'block_mb' is the exchange block and 'layout' the factor's; ``pairs`` the screened factor's
    packed columns (``memory_mb``). MemoryLimitError (one line in human units, before any
    integral) when none fits, naming what would."""
    kw = dict(spins=spins, pairs=pairs, held=held)
    blocks = sorted({block_mb, min(block_mb, JK_BLOCK_MB)}, reverse=True)
    plans = [("unpacked", b) for b in blocks] if itemsize == 8 else []
    plans += [("packed", b) for b in blocks] + [("packed", 1e-9)]  # a smaller block costs more than the copy saves
    for layout, block_mb in plans:
        for copy in (True, False) if fp32_copy else (False,):
            need = memory_mb(nao, naux, nocc, itemsize, block_mb, fp32_copy=copy, layout=layout, **kw)
            if need["peak"] <= limit_mb:
                return {**need, "block_mb": block_mb}
    smallest = need
    pairs_text = f"nbasis {nao}({nao}+1)/2" if pairs is None else f"{pairs} screened pairs"
    factor = f"the JK factor {human(need['factor'])} in memory: naux {naux} x {pairs_text} x {itemsize} B"
    least, how = smallest["peak"], factor
    if disk and itemsize == 8:
        fixed = memory_mb(nao, naux, nocc, 8, JK_BLOCK_MB, layout="disk", **kw)
        row_mb = (npair(nao) if pairs is None else pairs) * 8 / 1e6  # one auxiliary function's row
        rows_min = min(naux, DISK_FIT_ROWS_MIN)
        room = max(fixed["phases"]["cycles"], other_mb) - fixed["phases"]["fit"]
        fit_mb = min(fixed["disk"], (limit_mb - fixed["peak"]) / 2, max(room / 2, row_mb * rows_min))
        if fit_mb >= row_mb * rows_min:
            need = memory_mb(nao, naux, nocc, 8, JK_BLOCK_MB, layout="disk", fit_mb=fit_mb, **kw)
            if need["peak"] <= limit_mb:
                return {**need, "block_mb": JK_BLOCK_MB}
        disk_min = fixed["peak"] + 2 * row_mb * rows_min
        if disk_min < least:
            least, how = disk_min, f"the JK factor on disk, {human(fixed['disk'])} in the scratch directory"
    elif itemsize == 8:
        factor += "; on disk only in one process"
    raise MemoryLimitError(
        f"the DF-SCF needs at least {human(least)} ({how}) but the memory limit is {human(limit_mb)}; "
        f"raise the memory limit, or use PySCF's DF-SCF (SCF mode 'pyscf-df')",
        need_mb=least,
        limit_mb=limit_mb,
    )


def min_memory_mb(
    nao: int,
    naux: int,
    nocc: int,
    itemsize: int,
    spins: int = 1,
    disk: bool = False,
    pairs: int | None = None,
    held: int = 0,
) -> float:
    """The least MB any plan of ``check_memory`` runs in (the factor on disk where ``disk`` allows
    it, else the packed factor with the smallest exchange block)."""
    try:
        check_memory(nao, naux, nocc, itemsize, 0.0, spins=spins, disk=disk, pairs=pairs, held=held)
    except MemoryLimitError as e:
        return e.need_mb
    raise AssertionError("a plan fitted in no memory")


def run_scf(  # noqa: PLR0913
    mol,
    backend,
    settings: SCFSettings = DEFAULT_SETTINGS,
    *,
    timer=None,
    engine=None,
    progress=None,
    world=None,
    dm0=None,
    jk_auxbasis=None,
) -> Reference:
    """Converge DF-RHF (DF-UHF with ``settings.unrestricted``: two spin channels, DFUHF) on
    ``backend`` (dfmp2.scf.rhf, dfmp2.scf.uhf) as ``settings`` (dfmp2.scf.settings.SCFSettings:
    thresholds, cycle limit, precision, screening, the memory plan's factor layout and blocks).
    Returns the Reference (source 'dfmp2.scf', mo_coeff (nao, nmo) and mo_energy (nmo,) fp64 numpy)
    with its ScfRecord (device, precision, iterations, kernels of this stage, host work, times).
    SCFNotConvergedError when it does not converge in ``settings.max_cycle`` cycles.

    The run's objects: ``timer`` (default a new Timer of ``backend``); ``engine`` the integral
    engine for the JK-fit integrals (dfmp2.df.integrals; default: the host engine);
    ``progress(cycle, e_tot, d_e, gnorm, precision)`` after each cycle (timing.CycleLog prints it;
    precision: that cycle's J/K, 'fp32' or 'fp64'); ``world`` (dfmp2.distributed.World) over
    several ranks: the JK factor split by auxiliary index in fixed groups, J and K added in group
    order each cycle (dfmp2.scf.jk_dist: the same bits as one process), unless the SCF is
    replicated (``distributed.split_scf``); ``dm0`` the density to start from
    (``DFRHF.given_density``; default PySCF's 'minao' guess); ``jk_auxbasis`` the JK-fit set
    already chosen for the run (``dfmp2.drivers.job.Job.jk_auxbasis``; default
    ``dfmp2.df.basis.default_auxbasis(mol, 'jk')``). A factor on disk lives in a private scratch
    directory under ``settings.scratch_dir``, removed when the SCF ends, however it ends."""
    cls = DFUHF if settings.unrestricted else DFRHF
    disk = settings.layout == "disk"
    with Scratch(settings.scratch_dir) if disk else contextlib.nullcontext() as scratch:
        return cls(
            mol,
            backend,
            settings,
            timer=timer or Timer(backend),
            engine=engine,
            progress=progress,
            world=world,
            dm0=dm0,
            jk_auxbasis=jk_auxbasis,
            scratch=scratch,
        ).run()
