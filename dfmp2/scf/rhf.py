"""Our DF-RHF (``DFRHF``): the SCF on the run's device, one step a method.

A peer of the MP2 stage: it takes the backend, asks its capabilities and times itself with the
pipeline's timer. It returns the same ``dfmp2.reference.Reference`` the MP2 stage consumes (mf None).
J and K over the JK factor (dfmp2.scf.jk), DIIS (dfmp2.scf.diis), the precision policy
(dfmp2.scf.precision); dense (nao, nao) fp64 algebra on ``dense``. Energies in Hartree.
Convergence as PySCF's RHF with our thresholds (dfmp2.options.SCF_CONV_TOL, SCF_CONV_TOL_GRAD): Pulay DIIS
on F D S - S D F in the orthogonal basis from cycle 1, 8 vectors (its small solve scaled: DIIS;
fewer cycles than PySCF's on water clusters); converged when |ΔE| < 1e-12 Eh
and ||2 C_vir^T F C_occ|| < 1e-9; then one more diagonalisation and J/K build (PySCF's check).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from pyscf.scf import hf as pyscf_hf

from dfmp2 import distributed, linalg
from dfmp2.df import basis, integrals
from dfmp2.errors import InputError
from dfmp2.io import molecule
from dfmp2.provenance import ScfRecord, cycle_precision
from dfmp2.reference import OUR_SCF_NAMES, Reference, project_density, restricted
from dfmp2.scf import jk_dist, pyscf_scf
from dfmp2.scf.diis import DIIS, DIIS_SPACE, DIIS_START_CYCLE
from dfmp2.scf.jk import (
    JKFactor,
    build_jk_factor,
    deferred_unpacked,
    fp32_unpacked,
    screening_record,
    significant_pairs,
    unpacked,
)
from dfmp2.scf.precision import (
    FP32_NOISE,
    FP32_STALL,
    FP32_SWITCH,
    HOST_REBUILD_BELOW,
    REBUILD_GRACE,
    resolve_precision,
)
from dfmp2.scf.settings import DEFAULT_SETTINGS, SCFSettings

ENGINE = OUR_SCF_NAMES[0]  # "dfmp2.scf": our DF-SCF in records (Reference.source, ScfRecord.engine)
DELTA_CUTOFF = 1e-13  # |eigenvalue| of ΔD below which its eigenvector is dropped (incremental builds)


class DFRHF:
    """Our DF-RHF, one step a method: the J/K build (``two_electron``, ``delta_factor``), the Fock
    matrix and its energy, diagonalisation, the density, DIIS and the convergence test. A DF-UHF
    overrides the spin-dependent ones (density, two_electron per spin) and keeps the rest.

    Dense O(N^3) algebra runs on ``dense``: the backend where it has fp64, else the host CPU."""

    reference = "RHF"
    diis_scaled = True  # False: PySCF's unscaled DIIS solve (see DIIS)
    diis_space = DIIS_SPACE
    planned_rebuild = None  # on a device without fp64: rebuild G on the host once below this gradient
    deferred = None  # a mixed SCF's (U64, U32) until its fp32 cycles end (jk.deferred_unpacked)
    fac32_mb = None  # its fp32 copy's MB (recorded after the copy is dropped)
    jk_text = "J by GEMVs, K by GEMM + SYRK over the packed JK factor"
    jk_text_unpacked = "J and K in one pass over the unpacked JK factor (K by GEMM + SYRK, J by a GEMV per block)"
    jk_text_disk = (
        "J and K in one pass over the packed JK factor streamed from the scratch disk "
        "(each block unpacked; K by GEMM + SYRK, J by a GEMV per block)"
    )

    def __init__(  # noqa: PLR0913
        self,
        mol,
        backend,
        settings: SCFSettings = DEFAULT_SETTINGS,
        *,
        timer,
        engine=None,
        progress=None,
        world=None,
        dm0=None,
        jk_auxbasis=None,
        scratch=None,
    ):
        """The SCF of ``mol`` on ``backend`` as ``settings`` (dfmp2.scf.settings.SCFSettings), up to
        its first cycle: the JK factor fitted (and its fp32 copy for a mixed SCF), the
        one-electron part and the guess. The run's objects as ``driver.run_scf``'s; ``scratch``
        the directory of a factor on disk (``df.outofcore.Scratch``)."""
        self.settings, self.mol, self.backend, self.timer = settings, mol, backend, timer
        self.dm0_given = dm0  # a density to start from (``initial_density``), or None: 'minao'
        self.world = world if world is not None and distributed.split_scf(world) else distributed.World()
        self.progress = progress or (lambda *args: None)
        self.jk_dtype = backend.fit_dtype(backend.default_precision)  # fp64 where the device has it
        incremental, precision = settings.incremental, settings.precision
        self.incremental = self.jk_dtype != torch.float64 if incremental is None else incremental
        speedup = settings.fp32_speedup if precision == "auto" else None
        self.requested, self.mode, self.why = (
            precision,
            *resolve_precision(backend.caps, precision, settings.fp32_copy, speedup),
        )
        self.fp32_phase, self.fp32_cycles, self.switch = self.mode == "mixed", 0, None
        self.host_rebuild, self.host_builds = False, []  # G rebuilt in fp64 on the host: at these cycles
        self.built_on_host = False  # this cycle's G was such a rebuild
        self.g_noise = 0.0  # the noise of the last G built (fp32: FP32_NOISE; not counted on trn)
        self.dense = backend if backend.has_fp64 else linalg.TorchBackend("cpu")
        timer.watch(self.dense)  # its flops (the factor's fit, the dense algebra) are the SCF's too
        self.kernels0, self.seconds0 = dict(backend.kernels_used), dict(timer.seconds)
        self.jk_spec = jk_auxbasis if jk_auxbasis is not None else basis.default_auxbasis(mol, "jk")
        self.auxmol = basis.make_auxmol(mol, self.jk_spec)
        self.nao, self.nocc = mol.nao_nr(), max(mol.nelec)  # RHF: nelectron / 2
        self.engine = engine or integrals.HostEngine(mol, backend)
        self._jk_factor(settings, scratch)
        self.t0 = time.perf_counter()
        self._one_electron()

    def _jk_factor(self, settings: SCFSettings, scratch) -> None:
        """The JK factor of ``settings`` (screened, laid out and blocked as the memory plan says):
        ``fac`` (the cycles'), ``fac64`` (the fp64 factor on the host of a device without fp64, or
        None), and a mixed SCF's fp32 copy ``fac32`` (unpacked; with the 'unpacked' layout in the
        buffer the fp64 factor is unpacked into when the fp32 cycles end, ``deferred``; with the
        'disk' layout no copy: the file read as fp32 blocks, ``DiskJKFactor.fp32``)."""
        mol, backend, timer = self.mol, self.backend, self.timer
        self.screen, self.pairs = settings.screen, significant_pairs(mol, settings.screen)
        block_mb, layout = settings.block_mb, settings.layout
        defer = self.mode == "mixed" and layout == "unpacked"  # the fp64 factor unpacked when fp32 ends
        self.fac, self.fac64 = build_jk_factor(
            mol,
            self.auxmol,
            backend,
            self.jk_dtype,
            timer,
            block_mb,
            fit_backend=self.dense,
            engine=self.engine,
            world=self.world,
            layout="packed" if defer else layout,
            scratch=scratch,
            fit_mb=settings.fit_mb,
            pairs=self.pairs,
        )
        self.fac32 = self.deferred = None
        if self.mode == "mixed" and layout == "disk":  # the file read as fp32 blocks: no copy kept
            self.fac32 = self.fac.fp32()
        elif self.mode == "mixed":
            t0 = time.perf_counter()
            self.deferred = deferred_unpacked(self.fac) if defer else None  # (U64, U32)
            self.fac32 = fp32_unpacked(self.fac, block_mb, out=self.deferred[1] if defer else None)
            timer.add("scf_fit", t0)
        self.fac32_mb = self.fac32.B.numel() * 4 / 1e6 if self.fac32 is not None and layout != "disk" else None

    # ---- set-up: PySCF's one-electron part and guess, canonical orthogonalisation
    def _one_electron(self) -> None:
        todev, f64, mol = self.dense.to_device, torch.float64, self.mol
        self.S = todev(mol.intor_symmetric("int1e_ovlp"), f64)
        self.H = todev(pyscf_hf.get_hcore(mol), f64)
        self.e_nuc = float(mol.energy_nuc())
        self.t0 = self.timer.add("scf_integrals", self.t0, sync=False)
        # the guess timed apart ('scf_guess', host work: 0 flops): what a better start would have to beat
        self.dm0 = self.initial_density() if self.dm0_given is None else self.given_density(self.dm0_given)
        self.t0 = self.timer.add("scf_guess", self.t0, sync=False)
        s, U = linalg.eigh(self.S, backend=self.dense)  # PySCF's cutoff on S's eigenvalues
        cutoff = molecule.overlap_cutoff()
        keep = s > cutoff if cutoff is not None else torch.ones_like(s, dtype=torch.bool)
        self.X = U[:, keep] / torch.sqrt(s[keep])  # (nao, nmo)

    def given_density(self, dm0):
        """A caller's starting density (the previous geometry's, ``Reference.density``): (nao, nao)
        for RHF, (2, nao, nao) for UHF, in this molecule's AO basis; when it carries its orbitals
        (``mo_coeff``, ``mo_occ``, PySCF's tag_array) they are re-orthonormalised in this geometry's
        overlap (``reference.project_density``). InputError on another shape."""
        want = self.density_shape()
        if tuple(np.shape(dm0)) != want:
            raise InputError(
                f"the starting density has shape {tuple(np.shape(dm0))}, this molecule's "
                f"{self.reference} needs {want} (its basis has {self.nao} functions)"
            )
        return project_density(dm0, self.S.cpu().numpy())  # S: _one_electron's, fp64

    def density_shape(self) -> tuple:
        return (self.nao, self.nao)

    @property
    def guess_name(self) -> str:
        return "minao (PySCF's default)" if self.dm0_given is None else "given density (a previous geometry's)"

    def initial_density(self):
        """PySCF's RHF default guess ('minao'), (nao, nao) numpy with its orbitals attached."""
        return pyscf_hf.init_guess_by_minao(self.mol)

    def guess(self):
        """(D, G) of the guess: 'minao' comes with its orbitals and (fractional) occupations."""
        D = self.dense.to_device(np.asarray(self.dm0), torch.float64)
        occ0 = getattr(self.dm0, "mo_occ", None)
        if occ0 is not None and np.all(np.asarray(occ0) >= 0):
            occ0 = np.asarray(occ0)
            Cg = self.dense.to_device(
                np.asarray(self.dm0.mo_coeff)[:, occ0 > 0] * np.sqrt(occ0[occ0 > 0]), torch.float64
            )
            return D, self.two_electron(D, Cg)
        return D, self.two_electron(D, *self.delta_factors(D, self.nao))

    # ---- J/K
    def two_electron(self, Dm, C, split=None, f=None):
        """G = J(Dm) - K(Dm)/2 (nao, nao) in fp64 on the dense device; Dm = C[:, :split] C^T - ... ."""
        J, K = self.coulomb_exchange(Dm, f or self.cycle_factor(), [(C, split)], 0.5)
        return J - K[0]

    def coulomb_exchange(self, Dm, f, factors, scale: float):
        """(J(Dm), scale K of each of ``factors``) as ``coulomb`` and ``exchange``; Dm is the sum of
        the factors' densities. An unpacked factor (the plan's fp64 one, a mixed SCF's fp32 copy)
        builds both in one pass (JKFactor.jk: J's long sums in fp64 from an fp32 copy too), and
        sets ``g_noise`` as ``exchange`` does."""
        if f.layout == "packed":
            return self.coulomb(Dm, f), self.exchange(f, factors, scale)
        J, K = f.jk([(C.to(f.device), split) for C, split in factors], world=self.world)  # ordered over the ranks
        K = K * scale
        if f is self.fac32:
            self.g_noise = FP32_NOISE * torch.finfo(torch.float32).eps * float(torch.linalg.norm(K))
        elif f.dtype == torch.float64:
            self.g_noise = 0.0
        return self.dense.to_device(J, torch.float64), self.dense.to_device(K, torch.float64)

    def coulomb(self, Dm, f):
        """J(Dm) (nao, nao) fp64 on the dense device; a mixed SCF's J stays fp64 (see FP32_NOISE)."""
        fj = self.fac if f is self.fac32 else f
        J = fj.coulomb(Dm.to(fj.device), world=self.world).to(torch.float64)  # ordered over the ranks
        return self.dense.to_device(J, torch.float64)

    def exchange(self, f, factors, scale: float):
        """scale K(C C^T) (nfactor, nao, nao) fp64 on the dense device, one per (C, split) of
        ``factors`` (JKFactor.exchange; C with no columns: zero). Sets ``g_noise``, the gradient
        noise of an fp32 K (what DIIS and the switch ask): FP32_NOISE eps32 ||scale K||_F."""
        K = f.exchanges([(C.to(f.device), split) for C, split in factors], world=self.world) * scale
        if f is self.fac32:
            self.g_noise = FP32_NOISE * torch.finfo(torch.float32).eps * float(torch.linalg.norm(K))
        elif f.dtype == torch.float64:
            self.g_noise = 0.0
        return self.dense.to_device(K, torch.float64)

    def cycle_factor(self) -> JKFactor:
        """The factor of this cycle's J/K: the fp32 copy in a mixed SCF's fp32 phase, else ``fac``."""
        return self.fac32 if self.fp32_phase else self.fac

    @property
    def cycle_precision(self) -> str:
        if self.built_on_host:
            return "fp64"
        return str(self.cycle_factor().dtype).replace("torch.float", "fp")

    def delta_factor(self, dD, width=None):
        """(Cf, split) with dD = Cf[:, :split] Cf[:, :split]^T - Cf[:, split:] Cf[:, split:]^T,
        ``width`` (default nocc) columns each, zero-padded (one kernel shape) or widened when dD
        needs more, from the eigenvectors of dD (dense fp64). A difference of two rank-nocc
        densities has at most nocc of each sign; the first one, from the guess, may have more."""
        w, V = linalg.eigh(dD, backend=self.dense)
        pos = torch.nonzero(w > DELTA_CUTOFF).flatten()
        neg = torch.nonzero(w < -DELTA_CUTOFF).flatten()
        width = max(width or self.nocc, len(pos), len(neg))
        Cf = torch.zeros((self.nao, 2 * width), dtype=torch.float64, device=dD.device)
        Cf[:, : len(pos)] = V[:, pos] * torch.sqrt(w[pos])
        Cf[:, width : width + len(neg)] = V[:, neg] * torch.sqrt(-w[neg])
        return Cf, width

    def new_G(self, D, D_last, G, C, f=None):
        """G of the new density D: of ΔD added to G (incremental) or of the whole D. A mixed SCF's
        fp32 cycles build J/K of the whole D in fp32 (not of ΔD: K of ΔD takes 2 nocc columns, as
        many flops in fp32 as K of D in fp64), added to H in fp64: its rounding is not carried
        from cycle to cycle, and the fp64 cycles after the switch rebuild G from D."""
        self.built_on_host = self.host_rebuild and f is None
        if self.built_on_host:  # G of D with the fp64 factor, on the host
            self.host_rebuild = False
            G_acc = G + self.two_electron(D - D_last, *self.delta_factors(D - D_last))
            t1, f1 = time.perf_counter(), self.timer.executed()
            G = self.two_electron(D, *self.occupied_factor(C), f=self.fac64)
            self.t0 -= self.timer.add("scf_fp64_host", t1, sync=False, flops0=f1) - t1  # not charged to 'scf'
            self.diis.shift(G - G_acc)  # the accumulated rounding taken out of DIIS's Fock matrices too
            return G
        if self.incremental and f is None:
            return G + self.two_electron(D - D_last, *self.delta_factors(D - D_last))
        return self.two_electron(D, *self.occupied_factor(C), f=f)

    def occupied_factor(self, C):
        """(factor, split) of the density of orbitals C: D = 2 C_occ C_occ^T."""
        return math.sqrt(2.0) * C[:, : self.nocc], None

    def delta_factors(self, dD, width=None):
        """(factor, split) of a density change dD (``delta_factor``)."""
        return self.delta_factor(dD, width)

    # ---- dense steps
    def energy(self, Dm, G) -> float:
        return float((Dm * (self.H + 0.5 * G)).sum()) + self.e_nuc

    def diagonalize(self, F):
        dense, X = self.dense, self.X
        Fo = linalg.gemm(X, linalg.gemm(F, X, backend=dense), trans_a=True, backend=dense)
        e, V = linalg.eigh(Fo, backend=dense)
        return e, linalg.gemm(X, V, backend=dense)

    def density(self, C):
        return linalg.syrk(C[:, : self.nocc], alpha=2.0, backend=self.dense)

    def diis_error(self, F, D):
        """FDS - SDF in the orthogonal basis."""
        dense, X = self.dense, self.X
        FDS = linalg.gemm(F, linalg.gemm(D, self.S, backend=dense), backend=dense)
        return linalg.gemm(X, linalg.gemm(FDS - FDS.mT, X, backend=dense), trans_a=True, backend=dense)

    def orbital_gradient(self, F, C) -> float:
        """||2 C_vir^T F C_occ|| (PySCF's RHF get_grad)."""
        return 2.0 * self.gradient_norm(F, C, self.nocc)

    def gradient_norm(self, F, C, nocc: int) -> float:
        """||C_vir^T F C_occ||_F of one spin's Fock matrix F (nao, nao) and orbitals C (nao, nmo)."""
        g = linalg.gemm(C[:, nocc:], linalg.gemm(F, C[:, :nocc], backend=self.dense), trans_a=True, backend=self.dense)
        return float(torch.linalg.norm(g))

    def converged(self, e_tot: float, e_last: float, gnorm: float) -> bool:
        return abs(e_tot - e_last) < self.settings.conv_tol and gnorm < self.settings.conv_tol_grad

    # ---- the iterations
    def iterate(self, max_cycle: int):
        """Pulay DIIS from DIIS_START_CYCLE to convergence in at most ``max_cycle`` cycles. Returns
        (cycles, D, G, F)."""
        region = self.timer.region  # the profile's parts of a cycle (dfmp2 run --profile)
        with region("jk"):
            D, G = self.guess()
        e_tot = self.energy(D, G)
        diis = self.diis = DIIS(self.diis_space, scaled=self.diis_scaled)
        gnorms = []  # the cycles' gradient norms: a stall's advice (pyscf_scf.not_converged)
        for cycle in range(max_cycle):
            e_last, D_last = e_tot, D
            F = self.H + G
            if cycle >= DIIS_START_CYCLE:
                with region("diis"):
                    F = diis.update(F, self.diis_error(F, D), self.g_noise)
            with region("diagonalize"):
                _, C = self.diagonalize(F)
            with region("density"):
                D = self.density(C)
            with region("jk"):
                G = self.new_G(D, D_last, G, C)
            with region("checks"):
                e_tot = self.energy(D, G)
                F = self.H + G
                gnorm = self.orbital_gradient(F, C)
            gnorms.append(gnorm)
            self.progress(cycle + 1, e_tot, e_tot - e_last, gnorm, self.cycle_precision)
            if self.fp32_phase:
                self.fp32_cycles += 1
                self.maybe_switch(cycle + 1, e_tot - e_last, gnorm)
            elif self.converged(e_tot, e_last, gnorm):
                return cycle + 1, D, G, F
            else:
                self.maybe_host_rebuild(cycle + 1, e_tot - e_last, gnorm)
        raise pyscf_scf.not_converged(
            self.reference, max_cycle, e_tot, e_tot - e_last, gnorm, self.settings, gnorms[-pyscf_scf.STALL_CYCLES :]
        )

    def maybe_switch(self, cycle: int, d_e: float, gnorm: float) -> bool:
        """End the fp32 phase once the orbital gradient nears the fp32 build's noise (below
        FP32_SWITCH noises, or stalled: FP32_STALL): the next cycle's J/K (of the whole density)
        are fp64. An fp32 cycle never ends the SCF: its Fock matrix is not the converged one.
        True when it switched."""
        last, self.last_gnorm = getattr(self, "last_gnorm", None), gnorm
        if gnorm < FP32_SWITCH * self.g_noise or (last is not None and gnorm > FP32_STALL * last):
            self.fp32_phase = False
            self.switch = {"cycle": cycle, "gnorm": gnorm, "d_e": d_e}
            self.fac32 = None  # its cycles are over
            if self.deferred is not None:  # the fp64 factor unpacked over the fp32 copy (jk.deferred_unpacked)
                self.fac, self.deferred = unpacked(self.fac, self.settings.block_mb, out=self.deferred[0]), None
        return not self.fp32_phase

    def maybe_host_rebuild(self, cycle: int, d_e: float, gnorm: float) -> bool:
        """On a device without fp64: the next cycle's G is built from the whole density with the
        fp64 factor on the host once the incremental fp32 cycles' orbital gradient first falls
        below ``planned_rebuild`` (the DF-UHF's), or stalls (FP32_STALL) below HOST_REBUILD_BELOW
        (dfmp2.scf.precision). True when one is due (``host_builds`` records it)."""
        last, self.last_gnorm = getattr(self, "last_gnorm", None), gnorm
        grace = bool(self.host_builds) and cycle < self.host_builds[-1]["cycle"] + REBUILD_GRACE
        planned = self.planned_rebuild is not None and not self.host_builds and gnorm < self.planned_rebuild
        if (
            self.mode != "fp32"
            or not self.incremental
            or self.fac64 is None
            or grace
            or not (planned or (last is not None and gnorm < HOST_REBUILD_BELOW and gnorm > FP32_STALL * last))
        ):
            return False
        self.host_rebuild = True
        self.host_builds.append(
            {
                "cycle": cycle + 1,
                "gnorm_before": gnorm,
                "why": "planned (UHF_PLANNED_REBUILD)" if planned else "stalled (HOST_REBUILD_BELOW)",
            }
        )
        return True

    def finish(self, D, G, F):
        """PySCF's final check: diagonalise the undamped Fock matrix once more, rebuild,
        re-evaluate. Incremental (fp32 device): this last J/K is of the whole density with the
        fp64 factor on the host. The fp32 builds' rounding stays in the accumulated Fock matrix
        (water: E(HF) 2e-7 Eh off); the energy is stationary in D, so evaluated with fp64 J/K it
        carries that error squared, and this build is recorded as host work.
        Returns (mo_energy, C, e_tot, e_device: the fp32-Fock energy or None)."""
        D_last = D
        with self.timer.region("diagonalize"):
            mo_e, C = self.diagonalize(F)
        with self.timer.region("density"):
            D = self.density(C)
        e_device = None
        if self.incremental:
            e_device = self.energy(D, self.new_G(D, D_last, G, C))
            t1, f1 = time.perf_counter(), self.timer.executed()
            G = self.new_G(D, D_last, G, C, f=self.fac64 if self.fac64 is not None else self.fac)
            self.t0 -= self.timer.add("scf_final_fp64_host", t1, sync=False, flops0=f1) - t1  # not charged to 'scf'
        else:
            with self.timer.region("jk"):
                G = self.new_G(D, D_last, G, C)
        return mo_e, C, self.energy(D, G), e_device

    def run(self) -> Reference:
        """Converge (``settings.max_cycle`` cycles at most), then PySCF's final check; the Reference."""
        cycles, D, G, F = self.iterate(self.settings.max_cycle)
        mo_e, C, e_tot, e_device = self.finish(D, G, F)
        C, mo_e = jk_dist.same_orbitals(C, mo_e, self.world)
        self.timer.add("scf", self.t0)
        return self.reference_of(
            C.detach().cpu().numpy(), mo_e.detach().cpu().numpy(), e_tot, self.record(cycles, e_device)
        )

    def reference_of(self, C, mo_e, e_tot: float, record: ScfRecord) -> Reference:
        """The Reference of converged orbitals C (nao, nmo) and energies mo_e (nmo,) numpy."""
        return restricted(
            C, mo_e, self.nocc, e_hf=e_tot, source=ENGINE, scf=record, jk_auxbasis=basis.describe_auxbasis(self.jk_spec)
        )

    def record(self, cycles: int, e_device: float | None) -> ScfRecord:
        """What ran this SCF (kernels and times of this stage only)."""
        be, fac, timer = self.backend, self.fac, self.timer
        used = {k: v - self.kernels0.get(k, 0) for k, v in be.kernels_used.items() if v != self.kernels0.get(k, 0)}
        times = {k: v - self.seconds0.get(k, 0.0) for k, v in timer.seconds.items() if v != self.seconds0.get(k, 0.0)}
        host = (
            "PySCF: S, hcore, E_nuc"
            + ("" if self.dm0_given is not None else ", the 'minao' guess")
            + "; DIIS's small solve"
            + ("; (P|Q) and (μν|P) by libcint" if self.engine.name == "host" else "")
        )
        if self.dense is not be:
            host += "; fp64 dense algebra (orthogonalisation, Fock diagonalisation, density, DIIS, Fock sums)"
        if self.host_builds:
            host += "; G rebuilt from the whole density with the fp64 factor, " + ", ".join(
                f"at cycle {b['cycle']} (gradient {b['gnorm_before']:.2g}, {b['why']})" for b in self.host_builds
            )
        return ScfRecord(
            engine=ENGINE,
            reference=self.reference,
            device=be.name,
            source="ran",
            iterations=cycles,
            conv_tol_grad=self.settings.conv_tol_grad,
            guess=self.guess_name,
            jk={"packed": self.jk_text, "unpacked": self.jk_text_unpacked, "disk": self.jk_text_disk}[fac.layout],
            jk_auxbasis=basis.describe_auxbasis(self.jk_spec),
            backend_engine=be.engine,
            precision={
                "jk": "fp32, then fp64" if self.fp32_cycles else str(self.jk_dtype).replace("torch.float", "fp"),
                "fock_energy": "fp64",
                "fock_build": "incremental (J/K of ΔD, Fock summed in fp64)"
                if self.incremental
                else "full (J/K of D each cycle)",
            },
            kernels=dict(sorted(used.items())),
            times=times,
            host_kernels=dict(sorted(self.dense.kernels_used.items())) if self.dense is not be else {},
            jk_factor={
                "naux": fac.naux,
                "shape": list(fac.B.shape) if fac.B is not None else [fac.naux, fac.npairs],
                "mb": fac.B.numel() * fac.B.element_size() / 1e6 if fac.B is not None else 0.0,
                "metric": fac.metric,
                "exchange_block": fac.block,
                "layout": fac.layout,
                **(fac.describe() if fac.layout == "disk" else {}),
                "screening": screening_record(fac.nao, self.pairs, self.screen, fac.naux),
            },
            integrals=self.engine.describe(),
            e_hf_device_fock=e_device,
            host=host,
            final_energy=(
                "J/K of the converged density with the fp64 factor on the host "
                "(the energy's error from the fp32 cycles enters squared)"
                if self.fac64 is not None
                else "the last J/K of the whole density on the device"
            ),
            cycle_precision=self.cycle_record(cycles),
        )

    def cycle_record(self, cycles: int) -> dict:
        """Which cycles built J/K in which precision (provenance.cycle_precision)."""
        n32 = cycles - len(self.host_builds) if self.mode == "fp32" else self.fp32_cycles
        return cycle_precision(
            self.mode,
            self.requested,
            why=self.why,
            fp32_cycles=n32,
            fp64_cycles=cycles - n32,
            switch=self.switch,
            device=self.backend.name if n32 else None,
            fp32_factor_mb=self.fac32_mb,
        )
