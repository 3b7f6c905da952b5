"""The DF-MP2 pipeline: XYZ -> RHF -> integrals -> metric -> transforms -> fit -> pair energies.

Everything after the raw integrals runs through ``linalg`` on the chosen backend. The
energy sums are carried in fp64 in both precisions.

    B_ia^P = sum_Q (ia|Q) [L^-T]_QP,   L L^T = (P|Q)
    K_ab   = sum_P B_ia^P B_jb^P,      D = e_i + e_j - e_a - e_b
    E_OS   = sum_ij sum_ab K_ab^2 / D,   E_SS = sum_ij sum_ab K_ab (K_ab - K_ba) / D
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

import linalg
from linalg import DTYPES

from . import checkpoint, dfhf, integrals, memory, outofcore, outputs, scf
from .fitting import describe_metric, metric_factor
from .timing import Timer
from .errors import InputError
from .memory import MB, STORAGE_CHOICES, MemoryPlan, plan_memory
from .options import PRECISIONS, RunOptions  # noqa: F401 (PRECISIONS: pipeline's public name)
from .result import Result, software_versions
from .xyz import Geometry, read_xyz

def build_B(mol, auxmol, C_occ, C_vir, backend, dtype, plan: MemoryPlan, timer: Timer, B,
            engine: integrals.IntegralEngine | None = None, metric=None) -> None:
    """Fit B into the store ``B`` (``outofcore.open_b_store``): block k holds
    B[P, i*nvir + a] = B_ia^P for the block's i as a (naux, nk*nvir) array in ``B.dtype``; then
    ``B.mark_complete`` (a checkpoint records B and its metric, ``B.metric``).

    (μν|P) is streamed from the integral ``engine`` (dfmp2.integrals; default: the host engine,
    libcint) in aux-shell blocks, packed, and unpacked on the device; each block is half-transformed
    with C_occ then C_vir (gemm) into rows of (P|ia) in ``dtype``; then, one occupied block of columns
    at a time, B_k = L^-1 (P|ia)_k (trsm, left). The auxiliary index stays outermost (the
    partition axis on Trainium, the contraction of the pair step). (P|ia) lives where the store
    puts it (``B.open_pia``: out of core, in place in B's file when the dtypes match).
    ``metric``: the factored metric ``metric_factor`` made, when it is shared (UHF: both spins).
    """
    nao, nocc = C_occ.shape
    nvir = C_vir.shape[1]
    engine = engine or integrals.HostEngine(mol, backend)
    M, metric_kind, metric_info = metric if metric is not None else metric_factor(auxmol, backend, timer, engine)
    t0 = time.perf_counter()
    co = backend.to_device(C_occ, dtype)
    cv = backend.to_device(C_vir, dtype)
    pia = B.open_pia(dtype)
    try:
        aux_blocks = integrals.aux_shell_blocks(auxmol, plan.aux_block)
        t_loop, t_int = t0, 0.0
        with engine.blocks(auxmol, aux_blocks, dtype) as stream:
            for p0, p1, packed in stream:
                t1 = time.perf_counter()
                t_int += t1 - t0                  # waiting for the engine; device work may still run
                nb = p1 - p0
                # two 2-D GEMMs (one launch each on Trainium) rather than a batch over P
                x = integrals.unpack(packed, nao).reshape(nb * nao, nao)      # (P μ, ν)
                half = linalg.gemm(x, co, backend=backend)                   # (P μ, i)
                half = half.reshape(nb, nao, nocc).transpose(1, 2).reshape(nb * nocc, nao)
                pia.write_rows(p0, p1, linalg.gemm(half, cv, backend=backend).reshape(nb, nocc * nvir))
                t0 = time.perf_counter()
        pia.flush()
        t0 = timer.add("transform", t_loop)
        timer.seconds["transform"] -= t_int
        timer.seconds["integrals"] += t_int
        fit_M = M.to(dtype)
        outofcore.fit_blocks(fit_M, metric_kind, pia, B, backend, B.dtype)
        del fit_M, M
    finally:
        B.close_pia(pia)
    t0 = timer.add("fit", t0)
    B.mark_complete(metric_kind, metric_info)
    if B.checkpoint is not None:
        timer.add("checkpoint", t0)


def pair_energies(B, eps_occ, eps_vir, backend, occ_block: int, progress=None):
    """E_OS, E_SS (Hartree, fp64) over occupied blocks I >= J; off-diagonal blocks count twice.

    B: an outofcore store (InMemoryB / HDF5B), or a (nocc, nvir, naux) tensor in working
    precision (copied into occupied blocks of ``occ_block``). eps_*: fp64 tensors on the device.
    ``progress(done, total)`` is called after each block pair.
    """
    if isinstance(B, torch.Tensor):
        nocc, nvir, naux = B.shape
        blocks = outofcore.OccBlocks(nocc, nvir, naux, occ_block)
        store = outofcore.InMemoryB(blocks, B.dtype, B.device, allocate=False)
        for k in range(blocks.count):
            o0, o1 = blocks.orbitals(k)
            store.set_block(k, B[o0:o1].permute(2, 0, 1).reshape(naux, (o1 - o0) * nvir).contiguous())
        B = store
    sums = outofcore.pair_block_sums(B, eps_occ, eps_vir, backend, progress=progress)
    return outofcore.combine(sums, B.blocks.pairs())


def run_geometry(geom: Geometry, options: RunOptions, progress=None, log=None, on_plan=None,
                 backend=None) -> Result:
    """Run DF-MP2 on a parsed geometry. Checks everything cheap before the heavy work: options,
    device, basis sets, the memory plan (``on_plan(plan)`` sees it), scratch disk, checkpoint.
    ``backend``: one already made for ``options`` (several runs sharing a device, as
    ``dfmp2 interaction`` does); default a new one."""
    say = log or (lambda msg: None)
    precision = options.resolved_precision()
    if options.scf_mode not in scf.SCF_MODES:
        raise InputError(f"unknown SCF mode '{options.scf_mode}'; use one of {', '.join(scf.SCF_MODES)}")
    if options.storage not in STORAGE_CHOICES:
        raise InputError(f"unknown storage '{options.storage}'; use one of {', '.join(STORAGE_CHOICES)}")
    if options.simulate and not linalg.device_capabilities(options.device).simulable:
        raise InputError(f"--simulate applies only to trn1/trn2, not to device '{options.device}'")
    if options.checkpoint and options.resume and Path(options.checkpoint).resolve() != Path(options.resume).resolve():
        raise InputError("--checkpoint and --resume name different files; --resume PATH goes on "
                         "writing to PATH, so give only --resume")
    if options.scratch_dir is not None:      # a given --scratch must take files, used or not
        outputs.check_output_dir(options.scratch_dir, "--scratch")
    uhf = scf.resolve_reference(options.reference, geom, options.charge, options.multiplicity) == "uhf"
    if uhf and (options.checkpoint or options.resume):
        raise InputError("--checkpoint and --resume are not supported with a UHF reference yet; "
                         "run without them")
    if backend is None:
        backend = make_backend(options, unrestricted=uhf)
    mol = scf.build_molecule(geom, options.basis, options.charge, options.multiplicity, ecp=options.ecp)
    engine = select_integrals(options, mol, backend)
    say(f"integrals: {engine.name} ({engine.why})")
    auxbasis = scf.mp2_auxbasis(mol, options.auxbasis)
    auxmol = scf.make_auxmol(mol, auxbasis)
    nocc_all = (mol.nelectron + mol.spin) // 2          # alpha (all of them for a closed shell)
    nocc_b = nocc_all - mol.spin
    nfrozen = scf.frozen_core_count(mol) if options.frozen_core else 0
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    nmo, lindep_thr, _ = scf.linear_dependence(mol)     # the orbitals the SCF will keep
    if nocc_all >= nmo or nfrozen >= nocc_all:
        raise InputError(f"{geom.source}: no MP2 correlation possible with {nocc_all - nfrozen} "
                         f"active occupied and {nmo - nocc_all} virtual orbitals (nbasis {nao}"
                         f"{f', {nao - nmo} dropped as linearly dependent' if nmo < nao else ''})")
    if nfrozen > nocc_b:
        raise InputError(f"{geom.source}: the frozen core ({nfrozen} orbitals per spin) is more than "
                         f"the {nocc_b} occupied beta orbitals; use --all-electron")
    warnings = _input_warnings(mol, auxbasis, options, naux)
    if options.multiplicity is None and geom.multiplicity is None and mol.spin:
        warnings.append(f"no multiplicity given (--multiplicity or the XYZ comment): {mol.nelectron} "
                        f"electrons taken as a doublet (multiplicity {mol.spin + 1}, the lowest)")
    ck_path = options.resume or options.checkpoint
    fp = None
    if ck_path:
        fp = checkpoint.fingerprint(
            mol=mol, basis=options.basis, auxbasis=scf.describe_auxbasis(auxbasis),
            scf_mode=options.scf_mode, frozen_core=options.frozen_core, precision=precision,
            device=options.device, simulate=options.simulate, nfrozen=nfrozen,
            nocc=nocc_all - nfrozen, nvir=nmo - nocc_all, naux=naux, ecp=scf.ecp_info(mol))
    ck = checkpoint.Checkpoint.resume(options.resume, fp) if options.resume else None
    created = False
    try:
        if options.checkpoint and not options.resume and Path(options.checkpoint).exists():
            raise checkpoint.CheckpointError(
                f"checkpoint {options.checkpoint} already exists; continue it with --resume "
                f"{options.checkpoint} or remove it to start afresh")
        # UHF: B^alpha and B^beta are both resident; the plan counts them as one B of
        # n_alpha + n_beta occupied orbitals by max(nvir_alpha, nvir_beta) = nvir_beta virtuals
        # (an upper bound on both stores together, and the widest pair workspace)
        plan = stage_plan(mol, auxmol, options, backend, precision,
                          nocc=nocc_all - nfrozen + (nocc_b - nfrozen if uhf else 0),
                          nvir=nmo - (nocc_b if uhf else nocc_all),
                          occ_block=ck.occ_block if ck is not None else None, engine=engine)
        scf_block_mb = dfhf.JK_BLOCK_MB
        if options.scf_mode == "df" and not uhf and not (ck is not None and ck.has_scf):
            scf_block_mb = _plan_scf(mol, backend, plan)
        if on_plan is not None:
            on_plan(plan)
        say(f"{geom.natm} atoms, {mol.nelectron} electrons, nbasis {nao}, naux {naux}; "
            f"memory plan {plan.peak_mb:.0f} MB of {plan.limit_mb:.0f} MB, B "
            f"{'on disk' if plan.out_of_core else 'in memory'}")
        _check_disk(plan, options, ck_path, b_done=ck is not None and ck.b_complete,
                    b_mb=plan.b_mb, pia_mb=plan.disk_mb - plan.b_mb if plan.out_of_core else 0.0)
        if ck is None and options.checkpoint:
            ck = checkpoint.Checkpoint.create(options.checkpoint, fp, occ_block=plan.occ_block)
            created = True

        timer = Timer(backend)
        t0 = time.perf_counter()
        if ck is not None and ck.has_scf:
            say(f"RHF from checkpoint {ck.path}")
            ref = ck.load_scf()
            timer.add("checkpoint", t0)
        elif uhf:
            say("UHF (PySCF) ...")
            ref = scf.run_uhf(mol, options.scf_mode, max_cycle=options.scf_max_cycle)
            timer.add("scf", t0)
            warnings.append(ref.contamination_warning())
            warnings = [w for w in warnings if w]
        elif options.scf_mode == "df":
            say(f"DF-RHF on {backend.name} ...")
            ref = dfhf.run_dfhf(mol, backend, max_cycle=options.scf_max_cycle, timer=timer,
                                block_mb=scf_block_mb, engine=select_integrals(options, mol, backend))
            if ck is not None:
                ck.save_scf(ref)
        else:
            say("RHF (PySCF) ...")
            ref = scf.run_rhf(mol, options.scf_mode, max_cycle=options.scf_max_cycle)
            timer.add("scf", t0)
            if ck is not None:
                ck.save_scf(ref)
        nmo = ref.mo_coeff.shape[-1]
        if nmo < nao:
            warnings.append(f"linear dependence: {nao - nmo} of {nao} basis functions dropped "
                            f"(overlap eigenvalues below {lindep_thr:g}); nmo {nmo}")
        nocc = ref.nocc - nfrozen
        nvir = nmo - ref.nocc
        if nocc <= 0 or nvir <= 0:
            raise InputError(f"{geom.source}: no MP2 correlation possible with {nocc} active "
                             f"occupied and {nvir} virtual orbitals")
        say("integrals, transforms, fit and pair energies ...")
        spin = None
        if uhf:
            e_os, e_ss, ran, spin = ump2_energy(mol, auxmol, ref, nfrozen=nfrozen, backend=backend,
                                                precision=precision, plan=plan, timer=timer,
                                                progress=progress, scratch_dir=options.scratch_dir,
                                                engine=engine)
        else:
            e_os, e_ss, ran = mp2_energy(mol, auxmol, ref, nfrozen=nfrozen, backend=backend,
                                         precision=precision, plan=plan, timer=timer, progress=progress,
                                         scratch_dir=options.scratch_dir, checkpoint=ck, engine=engine)
        ran["scf"] = ref.ran if ref.ran is not None else {
            "engine": dfhf.ENGINE if ref.scf_mode == "df" else "pyscf", "iterations": ref.cycles,
            "from_checkpoint": str(ck.path)}
        if ck is not None:
            ck.mark_complete(e_os, e_ss)
    except BaseException as exc:
        # A checkpoint this run created stays only when it holds work to resume (the SCF at
        # least) and the failure is not a refusal that the same command would meet again;
        # otherwise it is removed, so the same command can be run again (no "already exists").
        if created:
            try:
                keep = ck.has_scf and not isinstance(exc, InputError)
            except Exception:          # unreadable after the failure: nothing to resume
                keep = False
            if not keep:
                ck.discard()
        raise
    finally:
        if ck is not None:
            ck.close()
    return Result(
        molecule=geom.source, natm=geom.natm, formula=_formula(geom.real_symbols) + _ghosts(geom),
        charge=mol.charge, basis=options.basis, auxbasis=scf.describe_auxbasis(auxbasis),
        scf_mode=options.scf_mode, jk_auxbasis=ref.jk_auxbasis, frozen_core=options.frozen_core,
        nbasis=nao, nmo=nmo, nocc=nocc, nfrozen=nfrozen, nvir=nvir, naux=naux,
        e_hf=ref.e_hf, e_os=e_os, e_ss=e_ss,
        timings=timer.seconds, ran=ran, memory=plan.to_dict(),
        versions=software_versions(), warnings=warnings, ecp=scf.ecp_info(mol), spin=spin)


def make_backend(options: RunOptions, unrestricted: bool = False):
    """The backend ``options`` ask for (``linalg.get_backend``: DeviceUnavailableError when the
    device cannot run, before any work); ``unrestricted``: for a UHF reference (the CUDA pair
    path then takes the opposite-spin form into account)."""
    try:
        return linalg.get_backend(options.device, simulate=options.simulate, pair_kernel=options.pair_kernel,
                                  **({"unrestricted": True} if unrestricted else {}))
    except ValueError as e:        # a pair kernel unknown or not for this device
        raise InputError(str(e)) from None


def _input_warnings(mol, auxbasis, options: RunOptions, naux: int) -> list[str]:
    """What the user should know about the auxiliary bases before trusting the energies:
    fallback sets for elements the matched set lacks, and a user's --auxbasis that is not a
    fitting set or has fewer functions than the orbital basis (DF error then grows to %)."""
    out = []
    if options.ecp == "none":
        out.append(scf.ecp_off_warning(options.basis, [scf.element(mol, i) for i in range(mol.natm)]))
    if options.auxbasis is None:
        out.append(scf.auxbasis_note(mol, auxbasis, "mp2"))
    else:
        if not scf.is_fitting_set(options.auxbasis):
            out.append(f"--auxbasis {options.auxbasis} is not a density-fitting set; use an "
                       "MP2-fit (RI) set such as the default")
        if naux < mol.nao_nr():
            out.append(f"--auxbasis {options.auxbasis} has fewer functions (naux {naux}) than the "
                       f"orbital basis (nbasis {mol.nao_nr()}); the fitting error in E_corr may "
                       "be large")
    if options.scf_mode in scf.SCF_DF_MODES:
        out.append(scf.auxbasis_note(mol, scf.default_auxbasis(mol, "jk"), "jk"))
    return [w for w in out if w]


def select_integrals(options: RunOptions, mol, backend) -> integrals.IntegralEngine:
    """The integral engine for ``options.integrals``, decided before any work (an explicit engine
    that cannot run raises EngineUnavailableError; an unknown name is an InputError)."""
    try:
        return integrals.select_engine(options.integrals, mol, backend)
    except ValueError as e:
        raise InputError(str(e)) from None


def stage_plan(mol, auxmol, options: RunOptions, backend, precision: str, *, nocc: int, nvir: int,
               occ_block: int | None = None, engine: integrals.IntegralEngine | None = None) -> MemoryPlan:
    """The memory plan ``dfmp2 run`` makes for ``nocc`` active occupied and ``nvir`` virtual
    orbitals with these options (``occ_block``: a resumed checkpoint's fixed block; ``engine``:
    whose working memory the transform holds, default the host engine)."""
    return plan_memory(nao=mol.nao_nr(), nocc=nocc, nvir=nvir, naux=auxmol.nao_nr(),
                       itemsize=torch.finfo(DTYPES[precision]).bits // 8, limit_mb=options.memory_mb,
                       device=options.device, fit_itemsize=torch.finfo(backend.fit_dtype(precision)).bits // 8,
                       storage=options.storage, aux_shell_max=_largest_shell(auxmol), occ_block=occ_block,
                       occ_block_max=options.occ_block_max,
                       j3c_block_mb=engine.block_mb(options.j3c_block_mb) if engine is not None else options.j3c_block_mb,
                       engine=engine.name if engine is not None else "host",
                       queue_depth=getattr(engine, "depth", memory.QUEUE_DEPTH))


def _plan_scf(mol, backend, plan: MemoryPlan) -> float:
    """Our DF-SCF's memory in the plan (stage 'scf': its JK factor, resident during the cycles
    and freed before the MP2 stage); MemoryLimitError before any integral when it does not fit.
    Returns the SCF's block size in MB (smaller when the limit needs it).
    Also refuses a backend that lacks an op the SCF needs (none does today)."""
    missing = [op for op in dfhf.OPS if not backend.supports(op)]
    if missing:
        raise linalg.DeviceUnavailableError(f"device '{backend.name}' cannot run the DF-SCF: it lacks "
                                            f"{', '.join(missing)}", alternatives=("cpu",))
    naux_jk = scf.make_auxmol(mol, scf.default_auxbasis(mol, "jk")).nao_nr()
    itemsize = torch.finfo(backend.fit_dtype(backend.default_precision)).bits // 8
    need = dfhf.check_memory(mol.nao_nr(), naux_jk, mol.nelectron // 2, itemsize, plan.limit_mb)
    plan.stages_mb = {"scf": need["peak"], **plan.stages_mb}
    plan.peak_mb = max(plan.peak_mb, need["peak"])
    plan.shapes["naux_jk"] = naux_jk
    return need["block_mb"]


def time_mp2_stage(mol, auxmol, ref, options: RunOptions, backend=None, engine=None):
    """One run of the DF-MP2 stage after the SCF exactly as ``dfmp2 run`` runs it (its memory
    plan, precision, frozen core, storage and scratch from ``options``; no checkpoint; DF-UMP2 for
    a ``scf.UHFReference``), for the benchmarks. ``backend``: an existing one for
    ``options.device`` (default: a new one); ``engine``: an integral engine for that backend
    (default: ``options.integrals``'s).
    Returns (seconds, e_os, e_ss, {stage: seconds}, ran), energies in Hartree."""
    precision = options.resolved_precision()
    uhf = isinstance(ref, scf.UHFReference)
    if backend is None:
        backend = make_backend(options, unrestricted=uhf)
    nfrozen = scf.frozen_core_count(mol) if options.frozen_core else 0
    nmo = ref.mo_coeff.shape[-1]
    engine = engine or select_integrals(options, mol, backend)
    plan = stage_plan(mol, auxmol, options, backend, precision,          # both spins, as run_geometry
                      nocc=ref.nocc - nfrozen + (ref.nocc_b - nfrozen if uhf else 0),
                      nvir=nmo - (ref.nocc_b if uhf else ref.nocc), engine=engine)
    timer = Timer(backend)
    backend.synchronize()
    t0 = time.perf_counter()
    stage = ump2_energy if uhf else mp2_energy
    e_os, e_ss, ran, *_ = stage(mol, auxmol, ref, nfrozen=nfrozen, backend=backend, precision=precision,
                                plan=plan, timer=timer, scratch_dir=options.scratch_dir, engine=engine)
    backend.synchronize()
    return time.perf_counter() - t0, e_os, e_ss, dict(timer.seconds), ran


def _largest_shell(auxmol) -> int:
    loc = auxmol.ao_loc_nr()
    return int(max(loc[1:] - loc[:-1])) if auxmol.nbas else 1


def _check_disk(plan: MemoryPlan, options: RunOptions, ck_path, *, b_done: bool, b_mb: float,
                pia_mb: float) -> None:
    """Before any heavy work: is there disk for what goes to disk? A checkpoint holds B (in memory
    or not); out of core without a checkpoint, B goes to the scratch directory, and (P|ia) does
    when its dtype differs from B's."""
    need: dict = {}

    def add(directory, mb, what):
        directory = outputs.check_output_dir(directory, what)
        dev = os.stat(directory).st_dev
        d, total, names = need.get(dev, (directory, 0.0, []))
        need[dev] = (d, total + mb, names + [what])

    scratch = Path(options.scratch_dir) if options.scratch_dir else Path(tempfile.gettempdir())
    if ck_path and not b_done:
        add(Path(ck_path).resolve().parent, b_mb, "checkpoint")
    if plan.out_of_core:
        if not ck_path:
            add(scratch, b_mb, "scratch (--scratch)")
        if pia_mb > 0:
            add(scratch, pia_mb, "scratch (--scratch)")
    for directory, mb, names in need.values():
        free = shutil.disk_usage(directory).free / MB
        if mb * 1.02 > free:
            raise InputError(f"this run needs {mb:.4g} MB of disk in {directory} ({' and '.join(sorted(set(names)))}) "
                             f"but only {free:.4g} MB are free; choose another --scratch or checkpoint "
                             "directory, or raise --memory")


def mp2_energy(mol, auxmol, ref, *, nfrozen: int, backend, precision: str, plan: MemoryPlan,
               timer: Timer, progress=None, scratch_dir=None, checkpoint=None, engine=None):
    """The DF-MP2 stage after the SCF: integrals, metric, transforms, fit and pair energies.

    B stays in memory or goes to HDF5 on disk as ``plan.out_of_core`` says (the same arithmetic
    either way, so the same bits); out-of-core files without a checkpoint go to a private directory
    under ``scratch_dir`` (default: the system's temp dir) that is removed however this returns.
    ``checkpoint`` (dfmp2.checkpoint.Checkpoint): B and each finished block pair are written to it,
    and what it already has is reused. ``engine``: the integral engine (default: host).
    Returns (e_os, e_ss, ran): correlation energies in Hartree and what ran.
    """
    ck = checkpoint
    nocc = ref.nocc - nfrozen
    nvir = ref.mo_coeff.shape[1] - ref.nocc
    naux = auxmol.nao_nr()
    C = ref.mo_coeff
    C_occ, C_vir = C[:, nfrozen:ref.nocc], C[:, ref.nocc:]
    # fp32 rounding of (P|ia) is amplified by L^-1 (the metric's condition number): measured on
    # (H2O)4 it costs 2e-7 Eh against 1e-8 Eh with an fp64 fit. The transforms and the fit are
    # O(N^4) next to the O(N^5) pair step, so they stay fp64 wherever the device has fp64.
    fit_dtype = backend.fit_dtype(precision)
    b_dtype = DTYPES[precision]
    blocks = outofcore.OccBlocks(nocc, nvir, naux, plan.occ_block)
    pairs = blocks.pairs()
    storage = {"B": "disk (HDF5)" if plan.out_of_core else "memory", "occ_blocks": blocks.count,
               "block_pairs": len(pairs), "checkpoint": str(ck.path) if ck is not None else None,
               "from_checkpoint": {"scf": ref.mf is None and ck is not None, "B": False, "pairs": 0}}
    engine = engine or integrals.HostEngine(mol, backend)
    t0 = time.perf_counter()
    B = outofcore.open_b_store(plan, blocks, b_dtype, backend, checkpoint=ck, scratch=scratch_dir)
    try:
        if B.complete:
            storage["from_checkpoint"]["B"] = True
            timer.add("checkpoint", t0)
        else:
            build_B(mol, auxmol, C_occ, C_vir, backend, fit_dtype, plan, timer, B, engine=engine)
        metric_kind, metric_info = B.metric
        if plan.out_of_core:
            storage["B_file"] = B.path if ck is not None else "temporary (removed at the end)"
        eps_occ = backend.to_device(ref.mo_energy[nfrozen:ref.nocc], torch.float64)
        eps_vir = backend.to_device(ref.mo_energy[ref.nocc:], torch.float64)
        done = on_pair = None
        if ck is not None:
            ck.init_pairs(len(pairs))
            done = ck.load_pairs()
            storage["from_checkpoint"]["pairs"] = int(done[0].sum())
            on_pair = ck.save_pair
        t0 = time.perf_counter()
        sums = outofcore.pair_block_sums(B, eps_occ, eps_vir, backend, done=done,
                                         on_pair=on_pair, progress=progress)
        timer.add("pair", t0)
        e_os, e_ss = outofcore.combine(sums, pairs)
    finally:
        B.close()
    return e_os, e_ss, _ran(backend, precision, fit_dtype, metric_kind, metric_info, storage, engine)


def _ran(backend, precision: str, fit_dtype, metric_kind: str, metric_info: dict, storage: dict,
         engine: integrals.IntegralEngine) -> dict:
    """What ran, for the result: the backend's record, precisions per stage, metric, storage,
    the integral engine."""
    ran = backend.describe()
    ran["precision"] = precision
    # A Trainium number measured on a CPU is the worst bug we can ship: say it on every result.
    ran["simulated"] = backend.caps.simulable and backend.engine != "neuron-hardware"
    ran["stage_precision"] = {"transform_fit": str(fit_dtype).replace("torch.float", "fp"),
                              "pair": precision, "energy_sums": "fp64"}
    ran["metric"] = describe_metric(metric_kind, metric_info)
    ran["storage"] = storage
    ran["integrals"] = engine.describe()
    if storage["from_checkpoint"]["B"]:
        ran["integrals"]["note"] = "not run: B came from the checkpoint"
    return ran


def ump2_energy(mol, auxmol, ref, *, nfrozen: int, backend, precision: str, plan: MemoryPlan,
                timer: Timer, progress=None, scratch_dir=None, engine=None):
    """DF-UMP2 after a UHF (``scf.UHFReference``): B^alpha and B^beta are built by ``build_B``
    into two stores (``open_b_store``, the same plan and blocking), then three spin blocks:

        E_aa = 1/2 sum_{ij in a} sum_ab K_ab (K_ab - K_ba) / D   (pair_block_sums on B^a: e_ss / 2)
        E_bb likewise on B^b,   E_ab = sum_{i in a, j in b} sum_ab K_ab^2 / D   (cross_block_sums)

    E_OS = E_ab, E_SS = E_aa + E_bb; for a closed shell these are RHF's E_OS and E_SS. ``nfrozen``
    core orbitals are frozen in each spin. Returns (e_os, e_ss, ran, spin): Hartree; ``spin`` has
    the per-spin shapes, the three blocks and <S^2>.
    """
    fit_dtype, b_dtype = backend.fit_dtype(precision), DTYPES[precision]
    naux, nmo = auxmol.nao_nr(), ref.mo_coeff.shape[-1]
    stores, eps, blocks = [], [], []
    storage = {"B": "disk (HDF5)" if plan.out_of_core else "memory", "checkpoint": None}
    metric = ("cholesky", {})
    factor = None                 # j2c and its factor, once for both spins
    engine = engine or integrals.HostEngine(mol, backend)
    try:
        for s in (0, 1):
            C, e, nocc_s = ref.spin(s)
            blk = outofcore.OccBlocks(nocc_s - nfrozen, nmo - nocc_s, naux, plan.occ_block)
            blocks.append(blk)
            if blk.nocc == 0:            # e.g. the H atom's beta spin: nothing to correlate
                stores.append(None)
                eps.append(None)
                continue
            B = outofcore.open_b_store(plan, blk, b_dtype, backend, scratch=scratch_dir)
            stores.append(B)
            factor = factor or metric_factor(auxmol, backend, timer, engine)
            build_B(mol, auxmol, C[:, nfrozen:nocc_s], C[:, nocc_s:], backend, fit_dtype, plan, timer, B,
                    engine=engine, metric=factor)
            metric = B.metric
            eps.append((backend.to_device(e[nfrozen:nocc_s], torch.float64),
                        backend.to_device(e[nocc_s:], torch.float64)))
        npairs = [len(b.pairs()) if st is not None else 0 for b, st in zip(blocks, stores)]
        ncross = blocks[0].count * blocks[1].count if None not in stores else 0
        total = sum(npairs) + ncross

        def offset(base):
            return None if progress is None else (lambda done, _n: progress(base + done, total))
        t0 = time.perf_counter()
        e_same = []
        for s in (0, 1):
            if stores[s] is None:
                e_same.append(0.0)
                continue
            sums = outofcore.pair_block_sums(stores[s], *eps[s], backend, progress=offset(sum(npairs[:s])))
            e_same.append(0.5 * outofcore.combine(sums, blocks[s].pairs())[1])
        e_ab = 0.0
        if ncross:
            sums = outofcore.cross_block_sums(stores[0], stores[1], *eps[0], *eps[1], backend,
                                              progress=offset(sum(npairs)))
            e_ab = float(sum(sums.tolist()))
        timer.add("pair", t0)
    finally:
        factor = None
        for B in stores:
            if B is not None:
                B.close()
    storage.update({"occ_blocks": [b.count for b in blocks], "block_pairs": sum(npairs) + ncross,
                    "from_checkpoint": {"scf": False, "B": False, "pairs": 0}})
    ran = _ran(backend, precision, fit_dtype, *metric, storage, engine)
    spin = {"reference": "UHF", "multiplicity": mol.spin + 1,
            "s2": ref.s2, "s2_exact": ref.s2_exact, "s2_warn_above": scf.S2_WARN,
            "nocc_alpha": blocks[0].nocc, "nocc_beta": blocks[1].nocc,
            "nvir_alpha": blocks[0].nvir, "nvir_beta": blocks[1].nvir,
            "e_corr_aa": e_same[0], "e_corr_bb": e_same[1], "e_corr_ab": e_ab}
    return e_ab, e_same[0] + e_same[1], ran, spin


def run(path, options: RunOptions, progress=None, log=None, on_plan=None) -> Result:
    """Read an XYZ file and run DF-MP2 on it."""
    return run_geometry(read_xyz(path), options, progress=progress, log=log, on_plan=on_plan)


def _ghosts(geom: Geometry) -> str:
    """' + 3 ghost atoms' after the formula of the real atoms; '' without ghosts."""
    n = geom.natm - len(geom.real_symbols)
    return f" + {n} ghost atom{'s' if n > 1 else ''}" if n else ""


def _formula(symbols) -> str:
    """Hill formula: C, then H, then the rest alphabetically (all alphabetical without C)."""
    counts = {}
    for sym in symbols:
        counts[sym] = counts.get(sym, 0) + 1
    first = [k for k in ("C", "H") if k in counts] if "C" in counts else []
    order = first + sorted(k for k in counts if k not in first)
    return "".join(f"{k}{counts[k] if counts[k] > 1 else ''}" for k in order)
