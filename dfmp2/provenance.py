"""What ran, typed: the records every result carries (``Result.ran`` is ``RunRecord.to_dict()``).

The same keys and types for RHF and UHF, every SCF engine and every storage; a field that does
not apply is None (never missing, never another type). Nothing is inferred after the fact: the
stage that did the work fills its record.

    RunRecord        the backend's own record (device, engine, kernels, ...: linalg's describe()),
                     precisions, metric, the integral engine, and
    StorageRecord    where B lived, its blocking, and what came from a checkpoint (FromCheckpoint)
    ScfRecord        the SCF: engine, device, source ('ran' | 'checkpoint' | 'given'), iterations,
                     precision, J/K build, kernels and times
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def cycle_precision(
    mode: str,
    requested: str | None,
    *,
    why: str | None = None,
    fp32_cycles: int = 0,
    fp64_cycles: int | None = None,
    switch: dict | None = None,
    device: str | None = None,
    fp32_factor_mb: float | None = None,
) -> dict:
    """The precision of an SCF's cycles (``ScfRecord.cycle_precision``), the same keys for every
    SCF: mode 'mixed' (fp32 J/K, then fp64), 'fp64' or 'fp32' (a device without fp64); requested
    (the scf_precision option, None where it does not apply: PySCF's SCF); why that mode; how
    many cycles built their J/K in fp32 and in fp64 (fp64_cycles None: not counted, PySCF);
    the switch (the last fp32 cycle, its orbital gradient and ΔE in Hartree; None without one);
    the device whose fp32 units ran (the accelerator, None without fp32 cycles); the fp32 copy
    of the JK factor in MB (None: none kept)."""
    switch = switch or {}
    return {
        "mode": mode,
        "requested": requested,
        "why": why,
        "fp32_cycles": fp32_cycles,
        "fp64_cycles": fp64_cycles,
        "switch_cycle": switch.get("cycle"),
        "switch_gnorm": switch.get("gnorm"),
        "switch_d_e": switch.get("d_e"),
        "fp32_device": device,
        "fp32_factor_mb": fp32_factor_mb,
    }


@dataclass
class ScfRecord:
    """The SCF of a reference. engine: 'dfmp2.scf' (ours) or 'pyscf'; reference 'RHF' | 'UHF';
    device: the backend's name, or 'host' (PySCF); source: 'ran' (in this run), 'checkpoint'
    (read back; ``checkpoint`` names the file) or 'given' (a PySCF mf the caller converged);
    precision: {'jk', 'fock_energy', 'fock_build'}; times in s; e_hf_device_fock in Hartree;
    cycle_precision: ``cycle_precision(...)``, which cycles ran their J/K in fp32 and fp64."""

    engine: str
    reference: str
    device: str
    source: str
    iterations: int | None
    jk: str
    conv_tol_grad: float | None = None  # the orbital-gradient threshold it converged to (energy: 1e-12 Eh)
    jk_auxbasis: str | None = None
    precision: dict = field(
        default_factory=lambda: {"jk": "fp64", "fock_energy": "fp64", "fock_build": "full (J/K of D each cycle)"}
    )
    backend_engine: str | None = None
    kernels: dict = field(default_factory=dict)
    host_kernels: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)
    jk_factor: dict | None = None
    integrals: dict | None = None
    final_energy: str | None = None
    e_hf_device_fock: float | None = None
    host: str | None = None
    checkpoint: str | None = None
    cycle_precision: dict = field(default_factory=lambda: cycle_precision("fp64", None))
    df_tensor: str | None = None  # PySCF's DF-SCF: its tensor in 'memory' or on 'disk' (scratch)
    guess: str | None = None  # our DF-SCF's starting density: PySCF's 'minao', or one given (a previous geometry's)
    stability: dict | None = None  # a UHF's internal stability check (dfmp2.scf.stability.StabilityRecord)
    # a Kohn-Sham SCF ended at a stalled gradient (dfmp2.scf.pyscf_scf.stall_accepted): its level,
    # the threshold, the cycles and their largest energy change (Eh)
    stalled: dict | None = None

    def from_checkpoint(self, path: str, iterations: int | None) -> ScfRecord:
        """This SCF as read back from checkpoint ``path``: no kernels or times of this run."""
        return ScfRecord(
            engine=self.engine,
            reference=self.reference,
            device=self.device,
            source="checkpoint",
            iterations=iterations,
            jk=self.jk,
            conv_tol_grad=self.conv_tol_grad,
            jk_auxbasis=self.jk_auxbasis,
            precision=dict(self.precision),
            checkpoint=str(path),
            cycle_precision=dict(self.cycle_precision),
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FromCheckpoint:
    """What this run took from a checkpoint instead of computing: the SCF, B, finished block pairs."""

    scf: bool = False
    B: bool = False
    pairs: int = 0


@dataclass
class StorageRecord:
    """Where B lived ('memory' | 'disk (HDF5)'); occ_blocks: blocks per spin channel; block_pairs:
    pair blocks in all; checkpoint: its path or None; B_file: the file B was on, when on disk."""

    B: str
    occ_blocks: list
    block_pairs: int
    checkpoint: str | None = None
    B_file: str | None = None
    from_checkpoint: FromCheckpoint = field(default_factory=FromCheckpoint)


@dataclass
class RunRecord:
    """What ran the run. ``backend``: linalg's ``Backend.describe()`` (device, engine, kernels and
    what the device adds), flattened into the JSON's top level as before."""

    backend: dict
    precision: str
    simulated: bool
    stage_precision: dict
    metric: str
    storage: StorageRecord
    integrals: dict
    scf: ScfRecord

    def to_dict(self) -> dict:
        d = dict(self.backend)
        d.update(
            {
                "precision": self.precision,
                "simulated": self.simulated,
                "stage_precision": self.stage_precision,
                "metric": self.metric,
                "storage": asdict(self.storage),
                "integrals": self.integrals,
                "scf": self.scf.to_dict(),
            }
        )
        return d
