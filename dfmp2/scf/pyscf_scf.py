"""PySCF's SCF runs: the RHF or UHF reference converged by PySCF on the host.

``run_rhf``/``run_uhf`` (SCF modes 'pyscf-df' and 'exact'; 'df' is our own DF-SCF on the run's
device, dfmp2.scf.driver.run_scf) converge PySCF's SCF tightly (``SCF_CONV_TOL``,
``SCF_CONV_TOL_GRAD``) because MP2 energies are first-order sensitive to orbital errors and we
compare to 1e-9 Eh; density-fitted with the JK-fit set ``dfmp2.df.basis.default_auxbasis(mol,
'jk')``. Its DF tensor (naux_jk x nbasis(nbasis+1)/2 fp64, ``pyscf_df_mb``, MB) is kept in memory
or on disk (``pyscf_df_disk_mb``), every file PySCF writes in ``pyscf_scratch``.
``not_converged`` is the error of any SCF (ours too) that stops unconverged.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import warnings
from pathlib import Path

from pyscf import gto, lib, scf

from dfmp2.df.basis import _copy, default_auxbasis, describe_auxbasis, make_auxmol
from dfmp2.errors import InputError, SCFNotConvergedError
from dfmp2.io import tempdirs
from dfmp2.options import SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_DF_MODES, SCF_MAX_CYCLE, SCF_MODES
from dfmp2.provenance import ScfRecord, cycle_precision
from dfmp2.reference import S2_WARN, Reference, from_pyscf  # noqa: F401 (S2_WARN: the result's spin block)
from dfmp2.scf.settings import SCFSettings

# PySCF keeps its DF tensor in memory while it fits in this share of the memory limit (PySCF's
# own rule: 0.9 of max_memory), else in a file in the run's scratch directory.
PYSCF_DF_INCORE_SHARE = 0.9


def pyscf_df_mb(mol: gto.Mole, jk_auxbasis=None) -> float:
    """PySCF's DF-SCF tensor (JK-fit set ``jk_auxbasis``, default ``default_auxbasis(mol, 'jk')``):
    naux_jk x nbasis(nbasis+1)/2 fp64, in MB (1e6 B)."""
    nao = mol.nao_nr()
    naux = make_auxmol(mol, jk_auxbasis if jk_auxbasis is not None else default_auxbasis(mol, "jk")).nao_nr()
    return naux * nao * (nao + 1) // 2 * 8 / 1e6


def pyscf_df_disk_mb(mol: gto.Mole, memory_mb: float, jk_auxbasis=None) -> float:
    """The MB PySCF's DF tensor (``pyscf_df_mb``) puts on disk under the memory limit ``memory_mb``
    (MB): all of it when it does not fit PYSCF_DF_INCORE_SHARE of the limit, else 0. Decided
    here, before the run, so that the disk check counts it and PySCF does what was planned.
    ``jk_auxbasis``: as ``pyscf_df_mb``'s."""
    mb = pyscf_df_mb(mol, jk_auxbasis)
    return mb if mb >= PYSCF_DF_INCORE_SHARE * memory_mb else 0.0


@contextlib.contextmanager
def pyscf_scratch(parent=None):
    """A private directory under ``parent`` (default: the system's temp directory, as for our own
    scratch files) for every file PySCF writes meanwhile: PySCF reads ``lib.param.TMPDIR`` when
    it makes a temporary file (its DF tensor, swap files, the SCF's chkfile), and it is pointed
    here; removed on exit, however the block ends. Yields the directory (a Path)."""
    d = Path(tempfile.mkdtemp(prefix="dfmp2-pyscf-", dir=parent))
    tempdirs.register(d)
    old, lib.param.TMPDIR = lib.param.TMPDIR, str(d)
    try:
        yield d
    finally:
        lib.param.TMPDIR = old
        shutil.rmtree(d, ignore_errors=True)
        tempdirs.unregister(d)


def _release_files(mf) -> None:
    """Close the temporary files PySCF's ``mf`` holds (its chkfile, a DF tensor file), so they are
    removed now, inside ``pyscf_scratch``, rather than at a later garbage collection."""
    for owner, name in ((mf, "_chkfile"), (getattr(mf, "with_df", None), "_cderi_to_save")):
        f = getattr(owner, name, None)
        if f is not None and hasattr(f, "close"):
            with contextlib.suppress(OSError):
                f.close()


def run_rhf(
    mol: gto.Mole,
    scf_mode: str = "pyscf-df",
    max_cycle: int = SCF_MAX_CYCLE,
    progress=None,
    conv_tol_grad: float = SCF_CONV_TOL_GRAD,
    *,
    memory_mb: float | None = None,
    scratch_dir=None,
    jk_auxbasis=None,
) -> Reference:
    """Converge RHF with PySCF on the host: density-fitted (``default_auxbasis(mol, 'jk')``: the
    JK-fit set matched to the basis, with fallbacks for the elements it lacks; 'pyscf-df', or
    'df', the name the references use for the same DF-RHF) or exact. ``dfmp2 run``'s default
    'df' is our own DF-RHF on the run's device, ``dfmp2.scf.driver.run_scf``, not this.
    ``progress(cycle, e_tot, d_e, gnorm)`` after each cycle (PySCF's gradient norm).
    ``memory_mb``: PySCF's ``max_memory`` (MB; default PySCF's own); its DF tensor is kept in
    memory or written to a file as ``pyscf_df_disk_mb`` decides. Every file PySCF writes goes to
    a private directory under ``scratch_dir`` (``pyscf_scratch``), removed when this returns.
    ``jk_auxbasis``: the JK-fit set already chosen for the run (default: ``default_auxbasis``'s)."""
    settings = _settings(max_cycle, conv_tol_grad, scratch_dir)
    return _run_pyscf(scf.RHF, mol, scf_mode, "RHF", settings, progress, memory_mb, jk_auxbasis)


def run_uhf(
    mol: gto.Mole,
    scf_mode: str = "pyscf-df",
    max_cycle: int = SCF_MAX_CYCLE,
    progress=None,
    conv_tol_grad: float = SCF_CONV_TOL_GRAD,
    *,
    memory_mb: float | None = None,
    scratch_dir=None,
    jk_auxbasis=None,
) -> Reference:
    """Converge UHF with PySCF on the host (``scf.UHF``; density-fitted as ``run_rhf``, same
    JK-fit set and thresholds, for 'df' and 'pyscf-df': the cross-check of our DF-UHF, dfmp2.scf.uhf.DFUHF;
    or exact), for ``mol.spin`` = n_alpha - n_beta. ``progress``, ``memory_mb`` and
    ``scratch_dir`` as ``run_rhf``'s."""
    settings = _settings(max_cycle, conv_tol_grad, scratch_dir, unrestricted=True)
    return _run_pyscf(scf.UHF, mol, scf_mode, "UHF", settings, progress, memory_mb, jk_auxbasis)


def run_ks(
    mol: gto.Mole,
    dh,
    scf_mode: str = "pyscf-df",
    settings: SCFSettings | None = None,
    *,
    grid_level: int = 3,
    progress=None,
    memory_mb: float | None = None,
    jk_auxbasis=None,
) -> tuple[Reference, dict]:
    """A double hybrid's Kohn-Sham SCF (``dh``: a dfmp2.mp2.double_hybrids.DoubleHybrid) by PySCF on
    the host: RKS, or UKS with ``settings.unrestricted``, with ``dh``'s hybrid part (its xc string of libxc
    components) on PySCF's grid of level ``grid_level``; density-fitted with the JK-fit set as
    ``run_rhf`` ('df', 'pyscf-df') or with exact J/K ('exact'); converged to ``settings``'
    thresholds in its cycle limit, its files under ``settings.scratch_dir`` (dfmp2.scf.settings;
    default: ``run_rhf``'s).
    Returns (the Reference, e_hf its KS energy without PT2 and dispersion; the KS record: xc, grid
    (level, points, pruning, radial and partition schemes), the SCF's fitting set)."""
    from pyscf import dft

    from dfmp2.mp2 import double_hybrids

    xc = double_hybrids.register(dh)
    settings = settings if settings is not None else _settings(SCF_MAX_CYCLE, SCF_CONV_TOL_GRAD, None)
    unrestricted = settings.unrestricted

    def make(m):
        mf = (dft.UKS if unrestricted else dft.RKS)(m)
        mf.xc = xc
        mf.grids.level = int(grid_level)
        return mf

    what = "UKS" if unrestricted else "RKS"
    ref = _run_pyscf(make, mol, scf_mode, what, settings, progress, memory_mb, jk_auxbasis)
    g = ref.mf.grids
    ks = {
        "engine": "pyscf.dft (libxc " + dft.libxc.__version__ + ")",
        "kind": what,
        "xc": dh.xc,
        "grid": {
            "level": int(grid_level),
            "points": int(g.coords.shape[0]),
            "prune": getattr(g.prune, "__name__", str(g.prune)),
            "radial": getattr(g.radi_method, "__name__", str(g.radi_method)),
            "partition": getattr(g.becke_scheme, "__name__", str(g.becke_scheme)),
        },
        "jk_auxbasis": ref.jk_auxbasis,
        "device": "host",
    }
    return ref, ks


STALL_CYCLES = 10  # the last cycles over which a gradient that fell by less than half has stalled


def stalled(gnorms) -> float | None:
    """The level (Eh) at which the orbital gradient has stalled: the smallest of the last
    STALL_CYCLES norms of ``gnorms`` when they fell by less than a factor of 2 over them (more
    cycles will not help: a Kohn-Sham grid's noise, or a flat rotation between the degenerate
    orbitals of a partly filled shell, as in OH's pi doublet); None when still falling or too few."""
    last = [float(g) for g in list(gnorms)[-STALL_CYCLES:]]
    if len(last) < STALL_CYCLES or not all(g == g for g in last):
        return None
    return min(last) if min(last) > 0.5 * max(last) else None


KS_STALL_MAX_GRAD = 1e-5  # Eh: a Kohn-Sham gradient stalled above this is not accepted (PySCF's KS default: 3e-5)


def stall_accepted(history, conv_tol: float) -> float | None:
    """The level of a Kohn-Sham SCF's stalled orbital gradient when it is accepted as converged
    (``history``: the cycles' (energy change, gradient norm), Eh): over the last STALL_CYCLES
    cycles every energy change is below ``conv_tol`` and the gradient has ``stalled`` at a level
    of at most KS_STALL_MAX_GRAD; None otherwise. Why: on a DFT grid, a partly filled degenerate
    shell (OH's pi doublet, NO, superoxide) leaves a rotation that moves the energy by about 1e-7
    Eh (the grid's anisotropy) with a near-zero curvature, along which DIIS (and PySCF's
    newton()) creep at a steady gradient of 1e-8 to 1e-6 while the energy stays put; a stiff
    mode at such a gradient would move the energy by far more than 1e-12 per cycle."""
    last = list(history)[-STALL_CYCLES:]
    if len(last) < STALL_CYCLES or any(not abs(d_e) < conv_tol for d_e, _ in last):
        return None
    level = stalled([g for _, g in last])
    return level if level is not None and level <= KS_STALL_MAX_GRAD else None


KS_FINISH_MAX_STEPS = 20  # second-order steps of one search of the soft-mode finish (OH: 6 to 3e-14)
KS_FINISH_KRYLOV = 24  # Hessian products per step: the Krylov space of the gradient
KS_FINISH_MAX_STEP = 0.5  # radian: the longest orbital rotation of one step
KS_SOFT_CURVATURE = 1e-3  # Eh: a lowest orbital-Hessian eigenvalue below this is a flat rotation, probed (OH: 1e-5)


def soft_mode_finish(mf, conv_tol_grad: float) -> dict | None:
    """Converge a Kohn-Sham SCF that stalled on a nearly flat orbital rotation (``stall_accepted``)
    to ``conv_tol_grad`` by saddle-free Newton steps (``_newton_to``), then probe that rotation's
    other minima: from the minimum, ±45° along the soft mode (the Hessian's lowest eigenvector,
    ``_soft_mode``), each converged again; the lowest of them is kept (lower by more than 1e-10 Eh
    than the first). Why: OH's DIIS stall sits near a maximum along the rotation between its pi
    orbitals (curvature -9e-6, the gradient all along it), where the analytic gradient, which
    assumes a stationary point, was 4e-5 Eh/bohr off the energies' differences; and the rotation
    has two families of minima (pi_x-like and pi_x+y-like on an axis-aligned OH, 8e-8 Eh apart),
    of which the first minimum reached depends on where DIIS stalled: the energies of nearby
    geometries landed in different ones (central differences 1.2e-5 off). Changes ``mf`` in place
    (orbitals, energies, e_tot, converged) and returns {'steps' (all three searches), 'gradient',
    'energy_change'} (Eh) when the first search converges; None (``mf`` untouched) when it does
    not in KS_FINISH_MAX_STEPS."""
    import numpy as np

    newton = mf.newton()
    best = _newton_to(mf, newton, mf.mo_coeff, conv_tol_grad)
    if best is None:
        return None
    steps = best[4]
    v, curvature = _soft_mode(newton, best[0], mf.mo_occ)
    for sign in (1.0, -1.0) if abs(curvature) < KS_SOFT_CURVATURE else ():
        start = newton.rotate_mo(best[0], newton.update_rotate_matrix(sign * np.pi / 4 * v, mf.mo_occ))
        probe = _newton_to(mf, newton, start, conv_tol_grad)
        steps += KS_FINISH_MAX_STEPS if probe is None else probe[4]
        if probe is not None and probe[2] < best[2] - 1e-10:
            best = probe
    e0 = float(mf.e_tot)
    mf.mo_coeff, mf.mo_energy, mf.e_tot, mf.converged = best[0], best[1], best[2], True
    return {"steps": steps, "gradient": best[3], "energy_change": best[2] - e0}


def _newton_to(mf, newton, mo, conv_tol_grad: float):
    """Saddle-free Newton steps (``_saddle_free_step``) from orbitals ``mo`` of ``mf``'s occupation
    to an orbital gradient below ``conv_tol_grad``, each step's orbitals canonicalised. Returns
    (mo, mo_energy, e_tot, gradient norm, steps), or None when KS_FINISH_MAX_STEPS do not get there."""
    import numpy as np

    occ, mo_e, dm = mf.mo_occ, None, None
    for step in range(KS_FINISH_MAX_STEPS + 1):
        g, hop, hdiag = newton.gen_g_hop(mo, occ)
        gnorm = float(np.linalg.norm(g))
        if gnorm < conv_tol_grad and dm is not None:
            return mo, mo_e, float(mf.energy_tot(dm)), gnorm, step
        if step == KS_FINISH_MAX_STEPS:
            return None
        x = _saddle_free_step(g, hop, hdiag)
        mo = newton.rotate_mo(mo, newton.update_rotate_matrix(x, occ))
        dm = mf.make_rdm1(mo, occ)
        mo_e, mo = mf.canonicalize(mo, occ, mf.get_fock(dm=dm))
    return None


def _krylov(v0, hop, hdiag):
    """The Hessian preconditioned by its diagonal, H' = M^-1/2 H M^-1/2 (M = |hdiag|: its spectrum
    the soft mode near zero and the rest near 1, well resolved by a short Krylov space), in the
    Krylov space of ``v0`` (Lanczos with full reorthogonalisation, KS_FINISH_KRYLOV products of
    ``hop``): (M^-1/2 (n,), the basis (n, k), H's eigenvalues (k,) and eigenvectors (k, k) there)."""
    import numpy as np

    sc = 1.0 / np.sqrt(np.maximum(np.abs(hdiag), 1e-3))
    V, HV = [v0 / np.linalg.norm(v0)], []
    for _ in range(min(KS_FINISH_KRYLOV, v0.size)):
        HV.append(sc * hop(sc * V[-1]))
        w = HV[-1] - np.array(V).T @ (np.array(V) @ HV[-1])
        w -= np.array(V).T @ (np.array(V) @ w)
        if np.linalg.norm(w) < 1e-12 * np.linalg.norm(HV[-1]):
            break
        V.append(w / np.linalg.norm(w))
    Vm = np.array(V[: len(HV)]).T
    Hs = Vm.T @ np.array(HV).T
    ws, us = np.linalg.eigh(0.5 * (Hs + Hs.T))
    return sc, Vm, ws, us


def _saddle_free_step(g, hop, hdiag):
    """-M^-1/2 Σ_k u_k (u_k·g') / |w_k| over the eigenpairs (w_k, u_k) of H' in the Krylov space
    of g' = M^-1/2 g (``_krylov``); its length capped at KS_FINISH_MAX_STEP."""
    import numpy as np

    sc = 1.0 / np.sqrt(np.maximum(np.abs(hdiag), 1e-3))
    sc, Vm, ws, us = _krylov(sc * g, hop, hdiag)
    gp = Vm.T @ (sc * g)
    x = -sc * (Vm @ (us @ ((us.T @ gp) / np.maximum(np.abs(ws), 1e-12))))
    n = float(np.linalg.norm(x))
    return x if n <= KS_FINISH_MAX_STEP else x * (KS_FINISH_MAX_STEP / n)


def _soft_mode(newton, mo, occ):
    """(v, v·H v): the unit rotation v (PySCF's packed occupied-virtual variables) along the
    orbital Hessian's lowest eigenvector at ``mo`` (``_krylov`` from a fixed pseudo-random start)
    and its curvature (Eh)."""
    import numpy as np

    g, hop, hdiag = newton.gen_g_hop(mo, occ)
    sc, Vm, _, us = _krylov(np.random.default_rng(0).standard_normal(g.size), hop, hdiag)
    v = sc * (Vm @ us[:, 0])
    v /= np.linalg.norm(v)
    return v, float(v @ hop(v))


def stall_warning(stalled_record: dict | None, what: str = "Kohn-Sham") -> str | None:
    """One line for a result whose Kohn-Sham SCF stalled (``ScfRecord.stalled``): taken as converged
    there, or converged by the soft-mode finish (``soft_mode_finish``)."""
    if not stalled_record:
        return None
    r = stalled_record
    flat = (
        "a nearly flat orbital rotation (a partly filled degenerate shell on the DFT grid, as in OH's pi "
        "doublet), along which the grid's anisotropy moves the energy by about 1e-7 Eh (docs/double_hybrids.md)"
    )
    if r.get("second_order"):
        f = r["second_order"]
        return (
            f"the {what} SCF's orbital gradient stalled at {r['gradient']:.1e} under DIIS on {flat}; "
            f"{f['steps']} second-order steps along it converged it to {f['gradient']:.1e}, the energy "
            f"changing by {f['energy_change']:.1e} Eh"
        )
    return (
        f"the {what} SCF's orbital gradient stalled at {r['gradient']:.1e} (threshold {r['threshold']:g}) "
        f"with every energy change below {r['max_abs_energy_change']:.0e} Eh over its last {r['cycles']} "
        f"cycles, and was taken as converged: {flat}"
    )


def stall_check(mf, settings: SCFSettings, seen: dict):
    """PySCF's ``check_convergence`` hook for a Kohn-Sham SCF: PySCF's own tests (|ΔE| below
    conv_tol and |g| below conv_tol_grad in the cycles; its looser test in the extra cycle after
    them), and a stalled gradient accepted (``stall_accepted``), recorded in ``seen['stalled']``; a
    gradient stalled at KS_STALL_MAX_GRAD or below while the energy still creeps (OH's DIIS, 2e-12 Eh
    a cycle) ends the cycles too, recorded in ``seen['pending']``: ``_converge`` then runs the
    soft-mode finish, and without its convergence the SCF has not converged."""
    history = []

    def check(envs) -> bool:
        d_e, g = float(envs["e_tot"] - envs["last_hf_e"]), float(envs["norm_gorb"])
        if envs["conv_tol"] != mf.conv_tol:  # PySCF's extra cycle (conv_check): its tolerances x10, x3
            return abs(d_e) < envs["conv_tol"] or g < envs["conv_tol_grad"]
        history.append((d_e, g))
        if abs(d_e) < settings.conv_tol and g < settings.conv_tol_grad:
            return True
        level = stall_accepted(history, settings.conv_tol)
        if level is not None:
            seen["stalled"] = _stall_record(level, settings, [(0, 0.0, d, g) for d, g in history])
            return True
        soft = stalled([g for _, g in history])
        if soft is not None and soft <= KS_STALL_MAX_GRAD:  # the energy still creeping: the finish decides
            seen["pending"] = _stall_record(soft, settings, [(0, 0.0, d, g) for d, g in history])
            return True
        return False

    return check


def _stall_record(level: float, settings: SCFSettings, cycles) -> dict:
    """``ScfRecord.stalled`` of a stall at ``level`` over the last STALL_CYCLES of ``cycles``
    ((cycle, energy, energy change, gradient norm) each)."""
    return {
        "gradient": level,
        "threshold": settings.conv_tol_grad,
        "cycles": STALL_CYCLES,
        "max_abs_energy_change": max(abs(c[2]) for c in list(cycles)[-STALL_CYCLES:]),
    }


def not_converged(
    what: str, cycles: int, e_tot: float, d_e: float, gnorm: float, settings: SCFSettings, gnorms=()
) -> SCFNotConvergedError:
    """The error of an SCF that stopped unconverged after ``cycles``: what did not converge and by
    how much (never the input's fault), against the thresholds of ``settings``. Its option: the
    gradient threshold when the gradient has stalled (``stalled`` of the cycles' norms ``gnorms``:
    a threshold ten times that level, rounded up to a power of ten, is named) or the energy had
    converged, else the cycle limit."""
    conv_tol, conv_tol_grad = settings.conv_tol, settings.conv_tol_grad
    energy_ok = abs(d_e) < conv_tol
    level = stalled(gnorms)
    if level is not None:
        looser = 10.0 ** math.ceil(math.log10(10 * level))
        advice = (
            f"the gradient has stalled near {level:.1e} over the last {STALL_CYCLES} cycles, so more cycles "
            f"will not help; a gradient threshold of {looser:g} ends it there"
        )
    elif energy_ok:
        advice = "loosen the gradient threshold if that energy is converged enough for you"
    else:
        advice = "raise the cycle limit"
    return SCFNotConvergedError(
        f"{what} did not converge in {cycles} cycles: the last energy change {d_e:.1e} Eh "
        f"({'below' if energy_ok else 'above'} the threshold {conv_tol:g}) and orbital-gradient norm "
        f"{gnorm:.1e} (threshold {conv_tol_grad:g}), last energy {e_tot:.10f} Eh; " + advice,
        option="scf_conv_tol_grad" if energy_ok or level is not None else "scf_max_cycle",
    )


def _settings(max_cycle: int, conv_tol_grad: float, scratch_dir, unrestricted: bool = False) -> SCFSettings:
    """The settings of a PySCF SCF called with these arguments; its energy threshold is this
    module's SCF_CONV_TOL as it is now (the benchmarks' ``waters.scf_tolerance`` sets it)."""
    return SCFSettings(
        max_cycle=max_cycle,
        conv_tol=SCF_CONV_TOL,
        conv_tol_grad=conv_tol_grad,
        unrestricted=unrestricted,
        scratch_dir=scratch_dir,
    )


def _run_pyscf(
    cls,
    mol: gto.Mole,
    scf_mode: str,
    what: str,
    settings: SCFSettings,
    progress=None,
    memory_mb: float | None = None,
    jk_auxbasis=None,
) -> Reference:
    """``cls(mol)`` (PySCF's RHF or UHF) density-fitted (JK-fit set ``default_auxbasis(mol,
    'jk')``) or not, converged to ``settings``' thresholds in its cycle limit, with its files in
    ``pyscf_scratch(settings.scratch_dir)``; the Reference (``reference.from_pyscf``) with its
    record. SCFNotConvergedError if it does not converge."""
    if scf_mode not in SCF_MODES:
        raise InputError(f"unknown SCF mode '{scf_mode}'; use one of {', '.join(SCF_MODES)}", option="scf_mode")
    made = []  # the SCF objects made, whose files are closed at the end
    with pyscf_scratch(settings.scratch_dir) as tmp:
        try:
            mf, jk_aux, df_storage = _prepared(cls(mol), scf_mode, memory_mb, tmp, made, jk_auxbasis)
            return _converge(mf, what, settings, progress, jk_aux, df_storage)
        finally:
            for each in made:
                _release_files(each)


def _prepared(mf, scf_mode: str, memory_mb, tmp: Path, made: list, jk_auxbasis=None):
    """``_run_pyscf``'s SCF object ``mf`` set up in the scratch directory ``tmp``: PySCF's memory
    limit ``memory_mb`` (MB), and for a density-fitted ``scf_mode`` the JK-fit set's DF tensor
    built, in memory or in ``tmp`` (``pyscf_df_disk_mb``); each SCF object made is put in
    ``made``. Returns (the SCF object, the fitting set's description or None, 'memory', 'disk'
    or None: where its DF tensor is)."""
    mol, jk_aux, df_storage = mf.mol, None, None
    made.append(mf)
    mf.chkfile = None  # nothing reads it: PySCF writes none
    if memory_mb is not None:
        mf.max_memory = float(memory_mb)
    if scf_mode in SCF_DF_MODES:
        jk_spec = jk_auxbasis if jk_auxbasis is not None else default_auxbasis(mol, "jk")
        mf = mf.density_fit(auxbasis=_copy(jk_spec))
        made.append(mf)
        mf.with_df.max_memory = mf.max_memory
        on_disk = pyscf_df_disk_mb(mol, mf.max_memory, jk_spec) > 0
        if on_disk:  # a path: PySCF writes the tensor there, whatever its memory
            mf.with_df._cderi_to_save = str(tmp / "pyscf-df-tensor.h5")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mf.with_df.build()
        jk_aux = describe_auxbasis(jk_spec)
        df_storage = "disk" if on_disk else "memory"
    return mf, jk_aux, df_storage


def _converge(mf, what: str, settings: SCFSettings, progress, jk_aux, df_storage) -> Reference:
    """Converge the prepared SCF ``mf`` (``_prepared``) to ``settings``' thresholds; the Reference
    (``reference.from_pyscf``) with its record. A Kohn-Sham SCF also ends at a stalled gradient
    (``stall_check``), recorded in ``ScfRecord.stalled``."""
    from pyscf.dft.rks import KohnShamDFT  # a double hybrid's KS-SCF (run_ks)

    kohn_sham, seen = isinstance(mf, KohnShamDFT), {}
    if kohn_sham:
        mf.check_convergence = stall_check(mf, settings, seen)
    mf.conv_tol = settings.conv_tol
    mf.conv_tol_grad = settings.conv_tol_grad
    mf.max_cycle = settings.max_cycle
    mf.verbose = 0
    cycles = []

    def callback(envs):
        cycles.append(
            (
                envs["cycle"] + 1,
                float(envs["e_tot"]),
                float(envs["e_tot"] - envs["last_hf_e"]),
                float(envs["norm_gorb"]),
            )
        )
        if progress is not None:
            progress(*cycles[-1], "fp64")

    mf.callback = callback
    mf.kernel()
    level = stalled([c[3] for c in cycles]) if kohn_sham else None
    pending = seen.pop("pending", None)  # DIIS ended at a stall whose energy still crept
    if seen.get("stalled") or pending or (not mf.converged and level is not None and level <= KS_STALL_MAX_GRAD):
        finish = soft_mode_finish(mf, settings.conv_tol_grad)  # the flat rotation's minimum: a stationary point
        if finish is not None:
            seen["stalled"] = {
                **(seen.get("stalled") or pending or _stall_record(level, settings, cycles)),
                "second_order": finish,
            }
        elif pending:
            mf.converged = False  # neither the finish nor a steady energy: not converged
    if not mf.converged:
        raise not_converged(
            what,
            *(cycles[-1] if cycles else (0, float(mf.e_tot), float("nan"), float("nan"))),
            settings,
            [c[3] for c in cycles],
        )
    record = ScfRecord(
        engine="pyscf",
        reference=what,
        device="host",
        source="ran",
        conv_tol_grad=settings.conv_tol_grad,
        iterations=len(cycles) or None,
        jk_auxbasis=jk_aux,
        jk="pyscf.df (DF-J/K)" if jk_aux else "pyscf (exact J/K)",
        df_tensor=df_storage,
        cycle_precision=cycle_precision("fp64", None, why="PySCF's SCF (fp64 on the host)", fp64_cycles=len(cycles)),
        stalled=seen.get("stalled"),
    )
    return from_pyscf(mf, scf=record, jk_auxbasis=jk_aux, kohn_sham=kohn_sham)
