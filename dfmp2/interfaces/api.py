"""The one-call Python API: ``energy`` and ``gradient`` of a molecule (an XYZ file or a PySCF Mole).

    import dfmp2
    r = dfmp2.energy("water.xyz", basis="cc-pvtz", frozen_core=True)   # the Result `dfmp2 run` prints
    g = dfmp2.gradient("water.xyz", frozen_core=True).gradient          # (natm, 3) Hartree/Bohr

The PySCF drop-in class ``dfmp2.DFMP2`` (on a converged PySCF SCF) is dfmp2.interfaces.pyscf_dropin.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from dfmp2.errors import InputError

# The keyword options of energy(), gradient() and frequencies(): RunOptions' fields (dfmp2.options),
# each with its units and default, appended to their docstrings (help(dfmp2.energy));
# tests/interfaces/test_api_docs.py checks every field is here with RunOptions' default.
OPTIONS_DOC = """

    Keyword options (``dfmp2.options.RunOptions``' fields; ``dfmp2 run --help`` has the same as flags):

    The molecule and the method
        basis: orbital basis set name; a bracket such as 'cc-pv[dt]z' extrapolates (energy() only)
            [default: cc-pvdz]
        auxbasis: MP2 fitting basis [default: None, the MP2-fit set matched to basis (e.g.
            cc-pvdz-ri; def2-tzvpp-ri or AutoAux for elements it lacks)]
        charge: molecular charge, e [default: None, the XYZ comment's, else 0; a Mole's own]
        multiplicity: spin multiplicity 2S+1 [default: None, the XYZ comment's, else 1; a Mole's own]
        reference: 'auto' (RHF for a closed shell, UHF otherwise), 'rhf' or 'uhf' [default: auto]
        ecp: 'auto' (the effective core potential the basis comes with), 'none' or
            'none-for-testing' [default: auto]
        frozen_core: freeze the chemical core orbitals in MP2 (bool) [default: False]
        method: energy(): 'mp2' or a double hybrid ('b2plyp', 'dsd-pbep86', ...:
            docs/double_hybrids.md); gradient() and frequencies() take their own ``method``,
            'mp2', 'scs-mp2', 'sos-mp2' or a double hybrid (closed shells) [default: mp2]
        dft_grid: a double hybrid's KS-SCF grid level, PySCF's grids.level 0-9 [default: 3]
        properties: after the energy, e.g. ('dipole',) or 'dipole': HF, unrelaxed and relaxed
            MP2 dipoles in debye and e*bohr [default: (), none]
        cbs_scf: a basis bracket's SCF scheme: 'xtpl_highest_1', 'scf_xtpl_helgaker_2' or
            'scf_xtpl_helgaker_3' [default: xtpl_highest_1]

    The device
        device: 'cpu', 'cuda', 'cuda:N', 'trn1' or 'trn2' [default: cpu]
        simulate: trn1/trn2 only: run the NKI kernels on this CPU (bool) [default: False]
        precision: 'fp64' or 'fp32', the GEMMs' working precision (energies summed in fp64)
            [default: None, fp64 on cpu and cuda, fp32 on trn]
        pair_kernel: the MP2 pair-step path: 'auto', 'gemm+epilogue', 'gemm+torch' (cpu) or
            'fused' (cuda) [default: auto]
        integrals: 3-center integral engine: 'auto', 'host' or 'gpu4pyscf' (cuda) [default: auto]
        cpu_blas: cpu only: 'auto' (the faster measured per op and size), 'torch' or 'openblas'
            [default: auto]

    The SCF
        scf_mode: 'df' (ours, density-fitted), 'pyscf-df' (PySCF's DF-SCF) or 'exact' (PySCF's
            SCF with exact integrals; energy() only) [default: df]
        scf_max_cycle: most SCF iterations [default: 100]
        scf_conv_tol_grad: the orbital-gradient norm the SCF must reach, atomic units
            [default: 1e-09]
        scf_screen: our DF-SCF's Schwarz threshold of the JK factor's shell pairs, Hartree^1/2
            (0: all kept; at most 1e-6) [default: 1e-12]
        scf_precision: our DF-SCF's J/K: 'auto', 'fp64' or 'mixed' [default: auto]
        scf_stability: check a converged UHF's internal stability (bool) [default: True]
        dist_scf: over several ranks: 'split' (the JK factor over the ranks) or 'replicated'
            [default: split]
        ranks_per_run: over several ranks, the ranks of each run of a task-parallel workflow
            (CBS bracket, frequencies) [default: 1]

    Memory, disk and checkpoints
        memory_mb: memory limit per process, MB [default: None, 80% of available]
        storage: where B lives: 'auto' (memory if the plan fits), 'memory' or 'disk' [default: auto]
        scratch_dir: directory for out-of-core files [default: None, $TMPDIR or /tmp]
        checkpoint: write an HDF5 checkpoint (SCF, B, finished pair blocks) to this new file as the
            energy run goes [default: None, none]
        resume: continue the interrupted run in this checkpoint [default: None, none]
        occ_block_max: occupied orbitals per block, before the memory plan (tuning) [default: None,
            the device's: 16 on a CPU, 256 on a GPU]
        j3c_block_mb: target size of one streamed (mu nu|P) block, MB (tuning) [default: 512]
"""


def _with_options(f):
    """``f`` with OPTIONS_DOC after its docstring (help() shows every keyword option)."""
    f.__doc__ = (f.__doc__ or "") + OPTIONS_DOC
    return f


@_with_options
def energy(molecule, **options):
    """DF-MP2 from a molecule: an XYZ file path (str or Path, Ångström) or a PySCF ``gto.Mole``
    (its atoms, charge and spin; its basis name unless ``basis=`` is given). ``options`` are
    ``dfmp2.options.RunOptions``' fields (basis, auxbasis, frozen_core, ecp, device, precision,
    scf_mode, memory_mb, ...). Returns the ``result.Result`` that ``dfmp2 run`` prints (energies
    in Hartree; ``.render(console)``, ``.to_dict()``, ``.write_json(path)``); for a basis bracket
    (``basis="cc-pv[dt]z"``, Psi4's syntax) the ``cbs.CBSResult`` of ``dfmp2 run --basis
    cc-pv[dt]z`` (the extrapolated energies, each basis's run in ``.components``)."""
    from dfmp2.workflows import cbs

    geom, opts = _point_input(molecule, options, "energy")
    return cbs.run_cbs(geom, opts) if cbs.is_bracket(opts.basis) else run(geom, opts)


def run(  # noqa: PLR0913
    molecule,
    options,
    progress=None,
    log=None,
    on_plan=None,
    backend=None,
    on_reference=None,
    guess=None,
    world=None,
    profile=False,
):
    """``dfmp2 run`` in one call: ``run_energy(prepare(...))`` (dfmp2.drivers.energy) on an XYZ file
    path or a parsed ``Geometry`` with ``options`` (RunOptions); its ``Result``. ``backend``: one
    already made for ``options`` (several runs sharing a device); ``log``, ``progress``,
    ``on_plan``, ``guess``, ``profile`` as ``run_energy``'s; ``world``: the process group (default
    ``distributed.current()``); ``on_reference(mol, ref)``, after the run: the PySCF Mole and the
    converged Reference (``run_energy``'s EnergyRun holds both, for a caller that goes on)."""
    from dfmp2.drivers.energy import prepare, run_energy
    from dfmp2.io.xyz import Geometry, read_xyz

    geom = molecule if isinstance(molecule, Geometry) else read_xyz(molecule)
    job = prepare(geom, options, backend, log, world)
    done = run_energy(job, progress=progress, log=log, on_plan=on_plan, guess=guess, profile=profile)
    if on_reference is not None:
        on_reference(done.job.mol, done.ref)
    return done.result


@_with_options
def gradient(molecule, method: str = "mp2", **options):
    """The DF-MP2 energy and its nuclear gradient, as ``dfmp2 gradient`` computes them, for an XYZ
    file path or a PySCF ``gto.Mole`` (as ``energy``). ``method``: 'mp2', 'scs-mp2' or 'sos-mp2'
    (the spin-component scales of the differentiated energy), or a double hybrid of the table
    ('b2plyp', ...: closed shells, its KS part's grid ``dft_grid``; docs/double_hybrids.md).
    Returns ``dfmp2.drivers.gradient.GradientResult``: ``.gradient`` (natm, 3) in Hartree/Bohr,
    ``.energy`` (Hartree), ``.result`` (the energy run's Result), ``.parts`` (HF and correlation
    parts, Z-vector record), ``.to_dict()``. RHF or UHF with a density-fitted SCF (InputError
    otherwise); on a device without fp64 (trn, with simulate=True here) RHF only: its pair loop
    runs there in fp32, the rest on the host in fp64."""
    from dfmp2.drivers.gradient import run_gradient

    geom, opts = _point_input(molecule, options, "gradient")
    return run_gradient(geom, opts, method=method)


@_with_options
def frequencies(molecule, method: str = "mp2", **options):
    """Harmonic frequencies (cm⁻¹), normal modes, IR intensities (km/mol) and thermochemistry of
    ``method``'s energy (DF-MP2's, or a double hybrid's) at the molecule's geometry (an XYZ file
    path or a PySCF ``gto.Mole``, as ``energy``), as ``dfmp2 frequencies`` computes them: central
    differences of analytic gradients (dfmp2.workflows.frequencies). ``options``: RunOptions' fields, and the workflow's
    ``step`` (bohr), ``temperature`` (K), ``pressure`` (Pa), ``checkpoint`` (path), ``ir`` (bool),
    ``symmetry_number`` (σ of the thermochemistry; default: the detected point group's).
    Returns ``FrequencyResult`` (``.frequencies``, ``.ir``, ``.thermo``, ``.to_dict()``)."""
    from dfmp2.workflows import frequencies as freq

    own = ("step", "temperature", "pressure", "checkpoint", "ir", "symmetry_number")
    extra = {k: options.pop(k) for k in own if k in options}
    geom, opts = _point_input(molecule, options, "frequencies")
    return freq.frequencies(geom, opts, method, **extra)


def _point_input(molecule, options: dict, what: str):
    """(Geometry, RunOptions) of ``energy``'s and ``gradient``'s arguments; InputError for an
    unknown option or a molecule of another type."""
    import dataclasses
    from pathlib import Path

    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions

    fields = {f.name for f in dataclasses.fields(RunOptions)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; use {', '.join(sorted(fields))}")
    if isinstance(molecule, (str, Path)):
        return read_xyz(molecule), RunOptions(**options)
    from pyscf import gto

    if not isinstance(molecule, gto.Mole):
        raise InputError(f"{what}() takes an XYZ file path or a pyscf.gto.Mole, got {type(molecule).__name__}")
    geom, basis = geometry_from_mole(molecule)
    if "basis" not in options:
        if basis is None:
            raise InputError(f"the Mole's basis is neither a name nor a per-element dict; give basis=... to {what}()")
        options = {**options, "basis": basis}
    return geom, RunOptions(**options)


def _refuse_what_is_not_carried(mol) -> None:
    """energy(mol) rebuilds the molecule from its atoms, charge, spin, basis name and ECP; a Mole
    attribute that changes the basis or the Hamiltonian beyond those would be dropped, so it is
    refused (one InputError) instead of giving another molecule's energy. DFMP2(mf) takes the
    mf's orbitals and integrals as they are and honours them all."""
    changed = []
    if mol.cart:
        changed.append("cart=True (Cartesian d and f functions)")
    if mol.nucmod:
        changed.append(f"nucmod={mol.nucmod!r} (finite nuclei)")
    if mol.nucprop:
        changed.append(f"nucprop={mol.nucprop!r}")
    if float(mol.omega or 0.0) != 0.0:
        changed.append(f"omega={mol.omega} (range-separated Coulomb)")
    if changed:
        raise InputError(
            f"energy() rebuilds the molecule and cannot carry the Mole's {', '.join(changed)}; "
            "run the SCF in PySCF and use dfmp2.DFMP2(mf), which honours it"
        )


def geometry_from_mole(mol):
    """(Geometry, basis) of a PySCF Mole: element symbols, coordinates in Ångström, charge,
    multiplicity 2S+1; the basis one name where every atom has the same, else the Mole's own
    per-element dict (names or shells; None for anything else). An ECP set by hand on the Mole is
    refused unless it is each element's basis's own, which ``ecp='auto'`` attaches anyway."""
    from pyscf import gto
    from pyscf.data.elements import _std_symbol

    from dfmp2.io import molecule
    from dfmp2.io.xyz import Geometry

    if not mol._built:
        mol.build()
    _refuse_what_is_not_carried(mol)
    by_label = molecule.orbital_basis_names(mol)  # {'H': 'cc-pvdz', 'O': 'cc-pvdz'}: one name
    names = set(by_label.values())
    basis = names.pop() if len(names) == 1 and None not in names else None
    if basis is None and isinstance(mol.basis, dict):
        basis = mol.basis
    ecp = mol.ecp
    own = {molecule.element(mol, i): by_label[mol._atom[i][0]] for i in range(mol.natm)}
    given = ecp if isinstance(ecp, dict) else dict.fromkeys(own, ecp) if ecp else {}
    if any(v and str(v) != str(own.get(_std_symbol(k), basis)) for k, v in given.items()):
        raise InputError(
            f"the Mole's ecp {ecp!r} is not the ECP of its basis; energy() attaches the "
            "basis's own ECP (ecp='auto') or none (ecp='none')"
        )
    symbols = tuple(molecule.element(mol, i) for i in range(mol.natm))
    ghost = tuple(bool(gto.is_ghost_atom(mol.atom_symbol(i))) for i in range(mol.natm))
    geom = Geometry(
        symbols=symbols,
        coords_angstrom=np.asarray(mol.atom_coords(unit="Angstrom")),
        ghost=ghost if any(ghost) else (),
        charge=int(mol.charge),
        multiplicity=int(mol.spin) + 1,
        source=f"pyscf.gto.Mole ({mol.natm} atoms)",
    )
    return geom, basis


@contextlib.contextmanager
def torch_threads(ncores: int | str | None):
    """torch's intra-op thread count set to ``ncores`` for the call (QCEngine's cores for the task,
    the ASE calculator's ``num_threads``; 'max': every CPU this process may run on), restored
    afterwards; None: left as it is. InputError for anything else."""
    import torch

    if ncores == "max":
        ncores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if ncores is not None and (isinstance(ncores, bool) or not isinstance(ncores, int) or ncores < 1):
        raise InputError(f"num_threads must be a positive integer or 'max', got {ncores!r}", option="num_threads")
    before = torch.get_num_threads()
    if ncores:
        torch.set_num_threads(int(ncores))
    try:
        yield
    finally:
        torch.set_num_threads(before)
