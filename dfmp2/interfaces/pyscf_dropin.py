"""The PySCF drop-in: ``DFMP2``, a DF-MP2 (DF-UMP2) on a converged PySCF RHF or UHF, in place of
``pyscf.mp.dfmp2.DFMP2``, with its gradient object (``Gradients``), scanner and eris.

    from pyscf import gto, scf
    import dfmp2
    mol = gto.M(atom="O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="cc-pvdz")
    mf = scf.RHF(mol).density_fit().run()
    pt = dfmp2.DFMP2(mf, frozen=1).run()           # instead of pyscf.mp.dfmp2.DFMP2(mf, frozen=1)
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_tot, pt.e_tot_scs

``DFMP2`` runs this program's DF-MP2 stage (``dfmp2.drivers.energy.mp2_after_scf``: the same memory plan,
devices and kernels as ``dfmp2 run``) on the orbitals of a converged PySCF RHF or UHF; the SCF is
not run again. Its fitting set is PySCF's choice (``mf.with_df`` on a density-fitted mf, else
``df.make_auxbasis(mol, mp2fit=True)``), so the default number is PySCF's. Energies in Hartree.
Its nuclear gradient (``nuc_grad_method()``) runs ``dfmp2.drivers.gradient.gradient_stage``, as
``dfmp2 gradient`` does; its densities (``make_rdm1(relaxed=...)``, ``make_natorbs``, ``make_fno``)
``dfmp2.grad.relaxed.density_stage``, the same pieces without the derivative integrals.

The amplitudes (``t2``) and ``ao2mo``'s ``ovL`` go through a plain torch path beside the stage
(``_amplitudes``): B from the stage's own fit (``mp2.build_B``, in memory), then T2_ijab =
(ia|jb) / (e_i + e_j - e_a - e_b) one occupied orbital at a time. ``kernel(eris=...)`` sums the
given ovL through the backend's own pair step (``linalg.mp2_pair_energy``), recorded in ``ran``.
The one-call API (``dfmp2.energy``, ``dfmp2.gradient``) is dfmp2.interfaces.api.
"""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np
from pyscf import df as pyscf_df
from pyscf import lib as pyscf_lib
from pyscf.grad import rhf as pyscf_grad_rhf
from pyscf.lib import logger
from pyscf.mp import mp2 as pyscf_mp2
from pyscf.mp import ump2 as pyscf_ump2

from dfmp2.errors import InputError, MemoryLimitError
from dfmp2.interfaces.pyscf_eris import DFERIs, _eris_energies, _t2, fitted_B

WITH_T2 = True  # PySCF's default for kernel(with_t2=...)


class DFMP2(pyscf_mp2.MP2Base):
    """DF-MP2 on a converged PySCF RHF (DF-UMP2 on a UHF), a drop-in for ``pyscf.mp.dfmp2.DFMP2``.

    mf: a converged ``pyscf.scf.RHF``, or ``pyscf.scf.UHF`` for DF-UMP2 (density-fitted or not;
        its orbitals and orbital energies are used as they are). ROHF/GHF and Kohn-Sham
        references are refused (InputError).
    frozen: None (all orbitals correlated), an int n (the n lowest orbitals frozen), a list of
        orbital indices (0-based, occupied or virtual; negative from the top) left out of the MP2,
        or on a UHF a pair of such lists (alpha, beta) — PySCF's DFMP2/DFUMP2 forms and meaning.
    mo_coeff, mo_occ, mo_energy: PySCF's positional arguments (default the mf's). Other orbitals
        (``make_fno``'s frozen natural orbitals, rotations within the occupied or the virtual
        space, fewer virtuals) are taken as PySCF takes them: Fock matrix and E_HF of their
        density under the mf's Hamiltonian, then the active occupied and virtual blocks made
        semi-canonical (dfmp2.interfaces.pyscf_orbitals); t2 comes back in the given orbitals.
        Their occupied space must be the SCF's. ao2mo, eris, densities and gradients take the
        mf's own orbitals only (InputError).
    with_df: the fitting object (``pyscf.df.DF``); default as PySCF: ``mf.with_df`` on a
        density-fitted mf (the SCF's JK-fit set), else ``df.DF(mol)`` with
        ``df.make_auxbasis(mol, mp2fit=True)`` (the MP2-fit set, e.g. cc-pVDZ-RI).
    auxbasis: a fitting basis (name or {element: name}) instead: ``with_df = df.DF(mol, auxbasis)``.
        ``pt.auxbasis = ...`` after construction does the same; ``pt.with_df = ...`` is honoured.
    memory_mb: the memory limit in MB, an alias of PySCF's ``max_memory`` (default mf.max_memory);
        ``force_outcore=True`` (PySCF's name) puts B on disk (our storage 'disk').
    device, precision, simulate, pair_kernel, cpu_blas: as ``dfmp2 run``'s options.

    After ``run()`` / ``kernel()``: e_hf, e_corr, e_corr_os, e_corr_ss, e_tot, emp2, emp2_scs,
    e_tot_scs (Grimme's SCS: 1.2 OS + SS/3), e_corr_sos, e_tot_sos (1.3 OS), all Hartree; nocc
    and nmo (active, PySCF's counting); auxbasis_used (its description), naux, timings (s per
    stage), ran (device, engine, kernels, precisions), warnings. ``t2`` (nocc, nocc, nvir, nvir)
    (UHF: PySCF's (t2aa, t2ab, t2bb)) is computed on first use where it fits in max_memory.
    ``make_rdm1(relaxed=False, ao_repr=False)``: the unrelaxed or relaxed MP2 density (HF part
    included; UHF per spin), PySCF's dfmp2_native conventions, from the gradient's pair loop and
    Z-vector (no kernel needed first, no t2 stored; ``make_rdm1(t2=...)``: PySCF's formula on
    given amplitudes); ``make_natorbs``, ``make_fno`` (PySCF's frozen natural orbitals of the
    unrelaxed density); ``densities()`` the whole record. ``nuc_grad_method().kernel()`` (or ``Gradients()``):
    the nuclear gradient (natm, 3) Hartree/Bohr of E_HF + E_MP2 on a density-fitted RHF or UHF mf (the
    DF-HF response on the mf's own fitting set; dfmp2.grad.mp2, dfmp2.grad.ump2). Logs through
    ``pyscf.lib.logger`` at mf.verbose.
    """

    _keys: ClassVar[set] = {
        "with_df",
        "mo_energy",
        "force_outcore",
        "device",
        "precision",
        "simulate",
        "pair_kernel",
        "cpu_blas",
        "naux",
        "timings",
        "ran",
        "warnings",
        "auxbasis_used",
    }

    def __init__(  # noqa: PLR0913
        self,
        mf,
        frozen=None,
        mo_coeff=None,
        mo_occ=None,
        mo_energy=None,
        *,
        auxbasis=None,
        with_df=None,
        device: str = "cpu",
        precision: str | None = None,
        memory_mb: float | None = None,
        simulate: bool = False,
        pair_kernel: str = "auto",
        cpu_blas: str = "auto",
    ):
        _check_scf_object(mf)
        if auxbasis is not None and with_df is not None:
            raise InputError(
                "give auxbasis= or with_df=, not both (with_df carries its own auxbasis)", option="auxbasis"
            )
        self.mol, self._scf = mf.mol, mf
        self.verbose, self.stdout = mf.verbose, mf.stdout
        self.max_memory = mf.max_memory if memory_mb is None else memory_mb
        self.frozen, self.level_shift = frozen, 0
        self.mo_coeff = mf.mo_coeff if mo_coeff is None else mo_coeff
        self.mo_occ = mf.mo_occ if mo_occ is None else mo_occ
        self.mo_energy = mf.mo_energy if mo_energy is None else mo_energy
        self._nocc = self._nmo = None
        self._semi = None
        self._default_df = None
        # the fitting set the mf's SCF ran with, for check_scf_solution when a shared mf.with_df
        # is given another auxbasis later (PySCF's ``pt.with_df.auxbasis = ...`` pattern)
        self._scf_fit = getattr(getattr(mf, "with_df", None), "auxbasis", None)
        if with_df is not None:
            self.with_df = with_df
        elif auxbasis is not None:
            self.auxbasis = auxbasis
        elif getattr(mf, "with_df", None):
            self.with_df = mf.with_df  # PySCF: the SCF's (JK-fit) set
        else:
            self.with_df = self._default_df = pyscf_df.DF(mf.mol)
            self.with_df.auxbasis = pyscf_df.make_auxbasis(mf.mol, mp2fit=True)
        self.force_outcore = False
        self.device, self.precision, self.simulate = device, precision, simulate
        self.pair_kernel, self.cpu_blas = pair_kernel, cpu_blas
        self._clear()

    def _clear(self) -> None:
        self.e_hf = self.e_corr = self.e_corr_os = self.e_corr_ss = None
        self._t2, self._state = None, None
        self.naux = self.timings = self.ran = self.auxbasis_used = None
        self.warnings = []

    # --- attributes PySCF users set ---------------------------------------------------------
    @property
    def auxbasis(self):
        """The fitting basis of ``with_df`` (None: PySCF's default for it); setting it replaces
        ``with_df`` by ``df.DF(mol, auxbasis)``."""
        return getattr(self.with_df, "auxbasis", None)

    @auxbasis.setter
    def auxbasis(self, value) -> None:
        self.with_df = pyscf_df.DF(self.mol, auxbasis=value)

    @property
    def memory_mb(self):
        """The memory limit in MB: PySCF's ``max_memory``."""
        return self.max_memory

    @memory_mb.setter
    def memory_mb(self, value) -> None:
        self.max_memory = value

    @property
    def t2(self):
        """The MP2 amplitudes of the last kernel, computed on first use (None before a kernel)."""
        if self._t2 is None and self._state is not None:
            self._t2 = self._amplitudes()
        return self._t2

    @t2.setter
    def t2(self, value) -> None:
        self._t2 = value

    def set(self, *args, **kwargs):
        """Set attributes (PySCF's ``set``); a name this class does not have is an InputError
        instead of a silently ignored attribute."""
        if args:
            raise InputError("set() takes keyword arguments only, e.g. set(frozen=1)")
        known = set().union(*(getattr(c, "_keys", ()) for c in type(self).__mro__)) | {
            "auxbasis",
            "memory_mb",
            "t2",
            "nocc",
            "nmo",
            "verbose",
            "stdout",
            "max_memory",
        }
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InputError(
                f"DFMP2 has no attribute {', '.join(unknown)}; set one of "
                f"{', '.join(sorted(k for k in known if not k.startswith('_')))}"
            )
        for k, v in kwargs.items():
            setattr(self, k, v)
        return self

    def reset(self, mol=None):
        """PySCF's ``reset`` (a new molecule for a scanner): the fitting object and the SCF are
        reset, the results cleared."""
        if self.with_df is not None and hasattr(self.with_df, "reset"):
            self.with_df.reset(mol)
        pyscf_mp2.MP2Base.reset(self, mol)
        self._clear()
        return self

    # --- orbital counts, PySCF's, for RHF and UHF --------------------------------------------
    def _unrestricted(self) -> bool:
        return np.asarray(self.mo_occ).ndim == 2

    def get_nocc(self):
        return (pyscf_ump2.get_nocc if self._unrestricted() else pyscf_mp2.get_nocc)(self)

    def get_nmo(self):
        return (pyscf_ump2.get_nmo if self._unrestricted() else pyscf_mp2.get_nmo)(self)

    def get_frozen_mask(self):
        return (pyscf_ump2.get_frozen_mask if self._unrestricted() else pyscf_mp2.get_frozen_mask)(self)

    # --- energies, as PySCF names them (None before a run) -----------------------------------
    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_hf + self.e_corr

    @property
    def emp2_scs(self):
        from dfmp2.io.result import SCS_OS, SCS_SS

        return None if self.e_corr is None else SCS_OS * self.e_corr_os + SCS_SS * self.e_corr_ss

    @property
    def e_tot_scs(self):
        return None if self.e_corr is None else self.e_hf + self.emp2_scs

    @property
    def e_corr_sos(self):
        from dfmp2.io.result import SOS_OS

        return None if self.e_corr is None else SOS_OS * self.e_corr_os

    @property
    def e_tot_sos(self):
        return None if self.e_corr is None else self.e_hf + self.e_corr_sos

    # --- running -----------------------------------------------------------------------------
    def run(self, *args, **kwargs) -> DFMP2:
        """Set ``kwargs`` as attributes (``set``), compute the energies; returns self. ``t2`` is
        not formed here: it is computed when first used."""
        self.set(**kwargs)
        self._energy(*args)
        return self

    def kernel(self, mo_energy=None, mo_coeff=None, eris=None, with_t2=WITH_T2):
        """PySCF's ``kernel``: returns (e_corr, t2), t2 (nocc, nocc, nvir, nvir) when ``with_t2``
        (MemoryLimitError when it does not fit in max_memory: use with_t2=False or ``run()``)."""
        self._energy(mo_energy, mo_coeff, eris)
        return self.e_corr, (self.t2 if with_t2 else None)

    def _energy(self, mo_energy=None, mo_coeff=None, eris=None) -> None:
        """The energies of the current attributes (the MP2 stage, or the given ``eris``)."""
        log = logger.new_logger(self)
        t0 = (logger.process_clock(), logger.perf_counter())
        if self.verbose >= logger.WARN:
            self.check_sanity()
        self._clear()
        ref = self._reference(mo_energy, mo_coeff)
        semi = self._semi
        self.dump_flags()
        if eris is not None:
            self._refuse_given("kernel(eris=...)")
            e_os, e_ss, backend = _eris_energies(eris, ref, self._options(ref))
            self._state = (ref, None, None, eris, None)
            self.ran = dict(backend, path="kernel(eris=...): the given eris.ovL through linalg.mp2_pair_energy")
            log.info("dfmp2: DF-MP2 energy from the given eris.ovL (naux %d) on %s", eris.naux, backend["device"])
        else:
            auxmol, source = self._auxmol()
            options = self._options(ref)
            from dfmp2.drivers.energy import mp2_after_scf

            done = mp2_after_scf(self.mol, auxmol, ref, options)  # the stage call of run_energy
            e_os, e_ss, self.timings, self.ran = done.mp2.e_os, done.mp2.e_ss, done.timings, done.ran
            self._state = (ref, auxmol, options, None, semi)
            self._describe_run(log, auxmol, source, ref, done.seconds)
            if semi is not None and semi.rotated:
                self.warnings.append(
                    "the given orbitals were not semi-canonical: their active occupied and virtual "
                    "Fock blocks were diagonalised (an energy invariant to rotations within each; "
                    "pyscf.mp.dfmp2, which keeps only the Fock diagonal, differs there)"
                )
                log.warn("dfmp2: %s", self.warnings[-1])
        self.e_hf, self.e_corr_os, self.e_corr_ss = ref.e_hf, float(e_os), float(e_ss)
        self.e_corr = self.e_corr_os + self.e_corr_ss
        log.timer(type(self).__name__, *t0)
        self._finalize()

    def _describe_run(self, log, auxmol, source: str, ref, seconds: float) -> None:
        from dfmp2.df import basis as df_basis

        spec = auxmol.basis
        self.auxbasis_used = df_basis.describe_auxbasis(spec) if isinstance(spec, (str, dict)) else "given shells"
        self.naux = auxmol.nao_nr()
        notes = [ref.gap_warning(), ref.contamination_warning()]
        if "even-tempered" in self.auxbasis_used:
            notes.append(
                f"no optimised fitting set for some element: PySCF generated an even-tempered "
                f"set ({self.auxbasis_used}); give auxbasis= to choose one"
            )
        self.warnings = [w for w in notes if w]
        ran = self.ran
        log.info(
            "dfmp2: DF-MP2 stage on %s (%s, %s), B in %s, %.3f s",
            ran["device"],
            ran["precision"],
            ran["engine"],
            ran["storage"]["B"],
            seconds,
        )
        log.info("dfmp2: fitting set %s (naux %d): %s", self.auxbasis_used, self.naux, source)
        for w in self.warnings:
            log.warn("dfmp2: %s", w)

    def _reference(self, mo_energy=None, mo_coeff=None):
        """The Reference of the mf with ``frozen``: the mf's own canonical orbitals (InputError
        when they are not its SCF solution), or, where mo_coeff, mo_occ or mo_energy were given
        and differ from the mf's, those orbitals made semi-canonical
        (``dfmp2.interfaces.pyscf_orbitals``; ``self._semi`` their rotations, else None)."""
        from dfmp2.reference import from_pyscf

        mf = self._scf
        C = mo_coeff if mo_coeff is not None else self.mo_coeff
        eps = mo_energy if mo_energy is not None else self.mo_energy
        self._semi = None
        if not (_same(C, mf.mo_coeff) and _same(self.mo_occ, mf.mo_occ) and _same(eps, mf.mo_energy)):
            from dfmp2.interfaces.pyscf_orbitals import given_reference

            given_eps = None if _same(eps, mf.mo_energy) else eps
            ref, self._semi = given_reference(mf, self.mol, self.frozen, C, self.mo_occ, given_eps)
            return ref
        ref = from_pyscf(mf, self.frozen)
        wd = getattr(mf, "with_df", None)
        if wd is not None and getattr(wd, "auxbasis", None) != self._scf_fit:
            mf = mf.copy()  # the SCF's own Hamiltonian, not the re-fitted with_df's
            mf.with_df = wd.copy()
            mf.with_df.auxbasis = self._scf_fit
        check_scf_solution(mf, self.mol)
        return ref

    def _refuse_given(self, what: str) -> None:
        """InputError for ``what`` on given (non-canonical) orbitals: the stages after the energy
        (eris, densities, gradients) take the mf's own canonical ones."""
        if self._semi is not None:
            raise InputError(
                f"DFMP2 {what} runs on the mf's own canonical orbitals; the energy (run(), "
                "kernel(), t2) takes given mo_coeff (e.g. make_fno's), the rest does not"
            )

    def _auxmol(self):
        """(auxmol, where it came from) of ``with_df``, as PySCF's DF-MP2 takes it: its built
        ``auxmol``, else ``make_auxmol(with_df.mol, with_df.auxbasis)`` (None: PySCF's JK-fit
        default); InputError when it is not on the mf's molecule."""
        from dfmp2.df import basis as df_basis

        wd = self.with_df
        if wd is None or not hasattr(wd, "auxbasis"):
            raise InputError(
                f"with_df must be a pyscf.df.DF object, got {type(wd).__name__}; or set auxbasis='...'",
                option="auxbasis",
            )
        if getattr(wd, "cell", None) is not None:
            raise InputError("a periodic (PBC) with_df is not supported: DFMP2 takes molecules")
        auxmol = getattr(wd, "auxmol", None)
        if auxmol is None:
            auxmol = df_basis.make_auxmol(getattr(wd, "mol", None) or self.mol, wd.auxbasis)
        mol = self.mol
        if (
            auxmol.natm != mol.natm
            or not np.allclose(auxmol.atom_coords(), mol.atom_coords(), atol=1e-10)
            or [auxmol.atom_pure_symbol(i) for i in range(mol.natm)]
            != [mol.atom_pure_symbol(i) for i in range(mol.natm)]
        ):
            raise InputError(
                "with_df belongs to another molecule (other atoms or geometry) than the "
                "mf: call pt.reset(mol) or give with_df=df.DF(mf.mol, auxbasis)"
            )
        if wd is getattr(self._scf, "with_df", None):
            source = "mf.with_df, the SCF's own fitting set (PySCF's choice on a density-fitted mf)"
        elif wd is self._default_df:
            source = "df.make_auxbasis(mol, mp2fit=True), PySCF's MP2-fit default"
        else:
            source = "with_df/auxbasis given"
        return auxmol, source

    def _options(self, ref):
        """RunOptions of the attributes (max_memory -> memory_mb, force_outcore -> storage)."""
        from dfmp2.options import RunOptions

        options = RunOptions(
            device=self.device,
            precision=self.precision,
            memory_mb=self.max_memory,
            simulate=self.simulate,
            pair_kernel=self.pair_kernel,
            cpu_blas=self.cpu_blas,
            storage="disk" if self.force_outcore else "auto",
        )
        options.resolved_precision()  # an impossible device or precision: before any work
        return options

    # --- amplitudes, densities, PySCF's eris ---------------------------------------------------
    def _amplitudes(self):
        """t2 of the last kernel (dimensionless): (nocc, nocc, nvir, nvir), UHF (t2aa, t2ab, t2bb)
        as PySCF's UMP2 orders them. MemoryLimitError when t2 and B do not fit in max_memory."""
        ref, auxmol, options, eris, semi = self._state
        chans = ref.channels
        sizes = [
            (a.nocc_active, b.nocc_active, a.nvir_active, b.nvir_active)
            for a, b in (
                [(chans[0], chans[0])]
                if ref.restricted
                else [(chans[0], chans[0]), (chans[0], chans[1]), (chans[1], chans[1])]
            )
        ]
        t2_mb = sum(int(np.prod(s)) for s in sizes) * 8 / 1e6
        naux = eris.naux if eris is not None else auxmol.nao_nr()
        b_mb = sum(c.nocc_active * c.nvir_active for c in chans) * naux * 8 / 1e6
        if self.max_memory is not None and t2_mb + b_mb > self.max_memory:
            raise MemoryLimitError(
                f"t2 ({t2_mb:.0f} MB) and B ({b_mb:.0f} MB) do not fit in max_memory "
                f"{self.max_memory:.0f} MB; raise max_memory, or use run() / "
                "kernel(with_t2=False), which do not form t2",
                option="memory_mb",
                need_mb=t2_mb + b_mb,
                limit_mb=self.max_memory,
            )
        if eris is not None:
            Bs = [np.asarray(eris.ovL).T]
        else:
            Bs = [fitted_B(self.mol, auxmol, c, options) for c in chans]
        if ref.restricted:
            return _given_basis(_t2(Bs[0], Bs[0], chans[0], chans[0], same_spin=False), semi, 0, 0)
        a, b = chans
        return (
            _given_basis(_t2(Bs[0], Bs[0], a, a, same_spin=True), semi, 0, 0),
            _given_basis(_t2(Bs[0], Bs[1], a, b, same_spin=False), semi, 0, 1),
            _given_basis(_t2(Bs[1], Bs[1], b, b, same_spin=True), semi, 1, 1),
        )

    def make_rdm1(self, t2=None, ao_repr=False, with_frozen=True, *, relaxed=False):
        """The MP2 one-particle density matrix with the HF part, PySCF's conventions: spin-traced
        (nmo, nmo) for RHF, (2, nmo, nmo) per spin for UHF, in the MO basis of the mf's orbitals
        (``ao_repr``: the AO basis, C P C^T); ``with_frozen`` False: the active orbitals' block only.

        Without ``t2``: this program's densities (``dfmp2.grad.relaxed.density_stage``, the
        gradient's pair loop and Z-vector on this DFMP2's fitting set, the mf's JK-fit set for the
        response), no amplitudes stored; ``relaxed`` True adds the orbital response, as
        ``pyscf.mp.dfmp2_native.DFMP2.make_rdm1(relaxed=True)`` (a density-fitted mf needed; the
        frozen-core block included). Like that class, a bool first argument is ``relaxed``:
        ``make_rdm1(True)``. With ``t2`` (PySCF's ``pyscf.mp.dfmp2.DFMP2`` signature): PySCF's
        unrelaxed density of those amplitudes."""
        if isinstance(t2, (bool, np.bool_)):
            relaxed, t2 = bool(t2), None
        if t2 is not None:
            if relaxed:
                raise InputError(
                    "a relaxed density comes from the Z-vector, not from given amplitudes: call "
                    "make_rdm1(relaxed=True) without t2"
                )
            if self._unrestricted():
                return pyscf_ump2.make_rdm1(self, t2, ao_repr=ao_repr, with_frozen=with_frozen)
            return pyscf_mp2.make_rdm1(self, t2, ao_repr=ao_repr, with_frozen=with_frozen)
        dens = self.densities(relaxed=relaxed)
        dms, Cs = dens.mo("relaxed" if relaxed else "unrelaxed"), dens.mo_coeff
        if not with_frozen:
            dms = [d[np.ix_(~f, ~f)] for d, f in zip(dms, dens.frozen)]
            Cs = [c[:, ~f] for c, f in zip(Cs, dens.frozen)]
        if ao_repr:
            dms = [c @ d @ c.T for c, d in zip(Cs, dms)]
        if dens.restricted:
            return dms[0]
        return np.stack(dms) if dms[0].shape == dms[1].shape else tuple(dms)

    def densities(self, relaxed: bool = True):
        """The ``dfmp2.grad.densities.MP2Densities`` of this DFMP2 (unrelaxed, and relaxed when
        ``relaxed``): per spin channel, MO basis, HF part included, with ``ao(kind)`` and
        ``total_ao(kind)``; ``zvector`` the Z-vector's iterations and residual. The MP2 part on
        this DFMP2's fitting set, the response (``relaxed``) on the mf's (InputError for an mf
        that is not density-fitted)."""
        from dfmp2.grad.relaxed import density_stage

        ref, auxmol, jk_auxmol, backend = self._stage_inputs("relaxed densities", need_jk=relaxed)
        return density_stage(self.mol, ref, auxmol, jk_auxmol, backend, "mp2", relaxed=relaxed)

    def make_natorbs(self, rdm1_mo=None, relaxed=False):
        """Natural orbitals, as ``pyscf.mp.dfmp2_native.DFMP2.make_natorbs``: (occupation numbers,
        largest first, (nmo,); natural orbitals (nao, nmo) in the AO basis) of ``rdm1_mo`` (an MO
        density; default ``make_rdm1(relaxed=relaxed)``). UHF (as ``dfump2_native``): the β density
        taken into the α orbitals' basis and the spin sum diagonalised there."""
        if rdm1_mo is None:
            dm = self.make_rdm1(relaxed=relaxed)
        elif isinstance(rdm1_mo, np.ndarray):
            dm = rdm1_mo
        else:
            raise InputError(f"rdm1_mo must be an MO density matrix (ndarray), got {type(rdm1_mo).__name__}")
        C = np.asarray(self.mo_coeff)
        if self._unrestricted():
            S = self.mol.intor_symmetric("int1e_ovlp")
            Sab = C[0].T @ S @ C[1]
            dm = dm[0] + Sab @ dm[1] @ Sab.T
            C = C[0]
        eigval, eigvec = np.linalg.eigh(dm)
        return np.flip(eigval), C @ np.fliplr(eigvec)

    def make_fno(self, thresh=1e-6, pct_occ=None, nvir_act=None, t2=None):
        """Frozen natural orbitals, PySCF's ``mp2.make_fno`` (``ump2.make_fno`` for UHF) on this
        DFMP2's unrelaxed density (``make_rdm1(t2=t2, with_frozen=False)``: ours without ``t2``):
        (the orbitals to freeze, the semicanonical NO coefficients (nao, nmo) in the AO basis; UHF
        a pair of each). ``thresh``: keep the virtual NOs occupied above it; ``pct_occ`` (overrides
        it): keep that fraction of the virtual occupation; ``nvir_act`` (overrides both): keep
        that many."""
        if self._unrestricted():
            return pyscf_ump2.make_fno(self, thresh=thresh, pct_occ=pct_occ, nvir_act=nvir_act, t2=t2)
        return pyscf_mp2.make_fno(self, thresh=thresh, pct_occ=pct_occ, nvir_act=nvir_act, t2=t2)

    def make_rdm2(self, t2=None, ao_repr=False):
        raise InputError("make_rdm2 is not implemented in dfmp2; use pyscf.mp.dfmp2.DFMP2 for it")

    def nuc_grad_method(self):
        """PySCF's name: the nuclear gradient of this DF-MP2 energy (``Gradients``; ``.kernel()``
        returns (natm, 3) Hartree/Bohr)."""
        return Gradients(self)

    Gradients = nuc_grad_method

    def _gradient(self):
        """GradientParts of E_HF + E_MP2 (dfmp2.grad.mp2): the HF part is the DF-HF's on the mf's
        own fitting set (``mf.with_df``), the MP2 part on this DFMP2's; InputError (one line) for
        an mf that is not density-fitted, frozen virtuals, or a UHF mf on a device without fp64
        (an RHF one runs its pair loop there in fp32, the rest on the host in fp64). The stage is
        ``dfmp2.drivers.gradient.gradient_stage``, as for ``dfmp2 gradient`` (RHF or UHF by the mf)."""
        from dfmp2.drivers.gradient import gradient_stage

        self._stage_inputs("gradients", need_jk=True)  # an mf that is not density-fitted: before the energy
        if self.e_corr is None:
            self.run()
        ref, auxmol, jk_auxmol, backend = self._stage_inputs("gradients", need_jk=True)
        return gradient_stage(self.mol, ref, auxmol, jk_auxmol, backend, "mp2")

    def _stage_inputs(self, what: str, need_jk: bool = True):
        """(Reference, MP2 auxmol, JK auxmol (None unless ``need_jk``), backend) of the stages after
        the energy on this mf; ``need_jk``: InputError (one line, naming ``what``) for an mf that
        is not density-fitted (the response is the DF-HF's, on the mf's own fitting set)."""
        from pyscf.df import addons as df_addons

        from dfmp2.drivers.energy import make_backend

        wd = getattr(self._scf, "with_df", None)
        if need_jk and (wd is None or not hasattr(wd, "auxbasis")):
            raise InputError(
                f"DFMP2 {what} need a density-fitted mf (scf.RHF(mol).density_fit()): its "
                "response is the DF-HF's; an exact-integral mf is not supported"
            )
        ref = self._reference()
        self._refuse_given(what)
        auxmol, _ = self._auxmol()
        jk_auxmol = None
        if need_jk:
            jk_auxmol = getattr(wd, "auxmol", None)
            if jk_auxmol is None:
                jk_auxmol = df_addons.make_auxmol(self.mol, self._scf_fit)
        options = self._options(ref)
        return ref, auxmol, jk_auxmol, make_backend(options, unrestricted=not ref.restricted)

    def ao2mo(self, mo_coeff=None, ovL=None, ovL_to_save=None):
        """PySCF's eris of DF-MP2 (RHF): ``ovL`` (nocc*nvir, naux), B_ia^P of our fit, in memory;
        ``ovL_to_save``: also written to that HDF5 file (dataset 'ovL') and read from there;
        ``ovL``: an array or such a file given back (PySCF's layout), nothing computed."""
        ref = self._reference(None, mo_coeff)
        self._refuse_given("ao2mo")
        if not ref.restricted:
            raise InputError("ao2mo (PySCF's ovL) is for an RHF reference; a UHF runs through run()")
        ch = ref.channels[0]
        if ovL is None:
            auxmol, _ = self._auxmol()
            arr = np.ascontiguousarray(fitted_B(self.mol, auxmol, ch, self._options(ref)).T)
            return DFERIs(arr, ch, path=ovL_to_save, write=ovL_to_save is not None)
        if isinstance(ovL, (str, os.PathLike)):
            return DFERIs(None, ch, path=ovL)
        if not isinstance(ovL, np.ndarray):
            raise InputError(f"ovL must be an array or an HDF5 file path, got {type(ovL).__name__}")
        return DFERIs(ovL, ch)

    def density_fit(self, auxbasis=None, with_df=None):
        """PySCF's ``MP2.density_fit``: a new DFMP2 of the same mf, frozen and options, fitting
        with ``with_df`` (default this one's) and, when it differs, ``auxbasis`` on a copy of it."""
        new = DFMP2(
            self._scf,
            self.frozen,
            self.mo_coeff,
            self.mo_occ,
            self.mo_energy,
            with_df=with_df if with_df is not None else self.with_df,
            device=self.device,
            precision=self.precision,
            memory_mb=self.max_memory,
            simulate=self.simulate,
            pair_kernel=self.pair_kernel,
            cpu_blas=self.cpu_blas,
        )
        if new.with_df.auxbasis != auxbasis:
            new.with_df = new.with_df.copy()
            new.with_df.auxbasis = auxbasis
        return new

    def as_scanner(self):
        """PySCF's ``as_scanner``: a function of a molecule (or geometry) returning E(MP2) in
        Hartree; the SCF runs as ``mf.as_scanner()``, the MP2 stage as ``run()`` (t2 on first use)."""
        if isinstance(self, pyscf_lib.SinglePointScanner):
            return self
        logger.info(self, "Set %s as a scanner", type(self))
        name = type(self).__name__ + pyscf_mp2.MP2_Scanner.__name_mixin__
        return pyscf_lib.set_class(_Scanner(self), (_Scanner, type(self)), name)


class Gradients(pyscf_grad_rhf.GradientsBase):
    """PySCF's gradient object of a DFMP2 (``pt.nuc_grad_method()``, ``pt.Gradients()``), on PySCF's
    ``GradientsBase``: ``kernel(atmlst=None)`` returns the nuclear gradient ``de`` (natm, 3) in
    Hartree/Bohr (the rows of ``atmlst`` when given) and prints PySCF's table at verbose >= NOTE;
    ``grad_elec()`` its electronic part, ``grad_nuc()`` the nuclear repulsion's; ``as_scanner()`` a
    function of a molecule returning (E(MP2) in Hartree, de); ``optimizer(solver='geomeTRIC')``
    PySCF's optimiser over that scanner; ``parts`` the stage's record (GradientParts)."""

    _keys: ClassVar[set] = {"parts"}

    def __init__(self, pt: DFMP2):
        pyscf_grad_rhf.GradientsBase.__init__(self, pt)
        self.parts = None

    def kernel(self, atmlst=None):
        """The gradient of E_HF + E_MP2 (natm, 3) Hartree/Bohr (``atmlst``: those rows), PySCF's
        ``kernel``: ``de`` set, the table printed (``_finalize``)."""
        if atmlst is None:
            atmlst = self.atmlst
        else:
            self.atmlst = atmlst
        if self.verbose >= logger.INFO:
            self.dump_flags()
        self.parts = self.base._gradient()
        de = np.asarray(self.parts.gradient)
        self.de = de if atmlst is None else de[list(atmlst)]
        self._finalize()
        return self.de

    grad = kernel

    def grad_elec(self, atmlst=None):
        """The electronic part (natm, 3) Hartree/Bohr: ``kernel()``'s gradient less ``grad_nuc``."""
        if self.parts is None:
            self.kernel()
        de = np.asarray(self.parts.gradient) - self.grad_nuc()
        return de if atmlst is None else de[list(atmlst)]

    def grad_nuc(self, mol=None, atmlst=None):
        """The nuclear repulsion's gradient, through the mf's own gradient object as PySCF's MP2
        gradients do (an external potential added there is kept)."""
        return self.base._scf.nuc_grad_method().grad_nuc(mol, atmlst)

    def as_scanner(self):
        """PySCF's gradient scanner: ``scanner(mol_or_geom)`` runs the SCF and the MP2 stage at the
        new geometry (the last orbitals as the guess) and returns (e_tot, de), Hartree and
        Hartree/Bohr; ``converged`` is the SCF's. geomeTRIC's PySCF driver calls this."""
        if isinstance(self, pyscf_lib.GradScanner):
            return self
        logger.info(self, "Create scanner for %s", type(self))
        name = type(self).__name__ + _GradScanner.__name_mixin__
        return pyscf_lib.set_class(_GradScanner(self), (_GradScanner, type(self)), name)


class _GradScanner(pyscf_lib.GradScanner):
    """PySCF's MP2 gradient scanner over our energy scanner (``DFMP2.as_scanner``)."""

    def __call__(self, mol_or_geom, **kwargs):
        from pyscf import gto

        mol = mol_or_geom if isinstance(mol_or_geom, gto.MoleBase) else self.mol.set_geom_(mol_or_geom, inplace=False)
        self.reset(mol)
        e_tot = self.base(mol)
        return e_tot, self.kernel(**kwargs)

    @property
    def converged(self):
        return bool(getattr(self.base._scf, "converged", False))


class _Scanner(pyscf_mp2.MP2_Scanner):
    """PySCF's MP2 scanner, taking the new SCF's orbital energies too and running ``run()``."""

    def __call__(self, mol_or_geom, **kwargs):
        from pyscf import gto

        mol = mol_or_geom if isinstance(mol_or_geom, gto.MoleBase) else self.mol.set_geom_(mol_or_geom, inplace=False)
        self.reset(mol)
        mf = self._scf
        mf(mol)
        self.mo_coeff, self.mo_occ, self.mo_energy = mf.mo_coeff, mf.mo_occ, mf.mo_energy
        self.run(**kwargs)
        return self.e_tot


def _same(mine, theirs) -> bool:
    """Whether an orbital attribute is the mf's own (the same object or equal arrays)."""
    return mine is theirs or np.array_equal(np.asarray(mine), np.asarray(theirs))


def _given_basis(t2, semi, s: int, t: int):
    """t2 of spin channels (s, t) in the given orbitals' basis (``semi``: the rotations to the
    semi-canonical ones; None: the mf's own orbitals, t2 as it is)."""
    if semi is None:
        return t2
    from dfmp2.interfaces.pyscf_orbitals import rotate_t2

    return rotate_t2(t2, semi.u_occ[s], semi.u_occ[t], semi.u_vir[s], semi.u_vir[t])


def _check_scf_object(mf) -> None:
    from pyscf.scf import hf

    if not isinstance(mf, hf.SCF):
        raise InputError(f"DFMP2 takes a PySCF SCF object (e.g. scf.RHF(mol).run()), got {type(mf).__name__}")
    if getattr(mf, "cell", None) is not None:
        raise InputError("DFMP2 takes molecules; a periodic (pyscf.pbc) mf is not supported")


SOLUTION_TOL = 1e-4  # Hartree: largest off-diagonal MO Fock element of a converged, canonical mf
# (PySCF's default conv_tol_grad leaves ~1e-5; a 0.3 rad rotation ~1e-1)


def check_scf_solution(mf, mol=None) -> None:
    """Refuse (InputError) orbitals that are not the mf's canonical SCF solution: a ``mol`` that
    does not belong to them (another size, or orbitals not orthonormal in its overlap), or a Fock
    matrix (of mf.make_rdm1(), in the MO basis) with an off-diagonal element above SOLUTION_TOL
    or a diagonal that is not mo_energy. ``mol``: the molecule the MP2 will use (default
    mf.mol). One Fock build of the caller's mf."""
    mol = mf.mol if mol is None else mol
    C = np.asarray(mf.mo_coeff)
    Cs = C if C.ndim == 3 else C[None]
    if Cs.shape[1] != mol.nao_nr():
        raise InputError(
            f"the mf's orbitals span {Cs.shape[1]} basis functions but its molecule has "
            f"{mol.nao_nr()}: the mf and the molecule do not belong together"
        )
    S = mol.intor_symmetric("int1e_ovlp")
    if max(abs(c.T @ S @ c - np.eye(c.shape[1])).max() for c in Cs) > 1e-6:
        raise InputError(
            "the mf's orbitals are not orthonormal in its molecule's overlap: was the molecule replaced after the SCF?"
        )
    fock = np.asarray(mf.get_fock(dm=mf.make_rdm1()))
    focks = fock if fock.ndim == 3 else fock[None]
    eps = np.asarray(mf.mo_energy).reshape(len(Cs), -1)
    for c, f, e in zip(Cs, focks, eps):
        fmo = c.T @ f @ c
        off = abs(fmo - np.diag(np.diag(fmo))).max()
        if off > SOLUTION_TOL or abs(np.diag(fmo) - e).max() > SOLUTION_TOL:
            raise InputError(
                f"the mf's orbitals are not its canonical SCF solution (largest off-diagonal "
                f"Fock element {off:.2e} Eh in the MO basis, above {SOLUTION_TOL:g}): were "
                "they rotated or changed after the SCF, or mf.with_df changed? Converge the SCF again"
            )
