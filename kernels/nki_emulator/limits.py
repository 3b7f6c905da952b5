"""NeuronCore limits the emulator enforces, per target, with the documents they come from.

All sizes are per partition unless named otherwise.

- 128 partitions for SBUF and PSUM tiles; matmul stationary free size <= 128 and moving
  free size <= 512; PSUM tile free size <= 512 fp32 (one bank):
  NKI docs, get-started/about/tiling-overview ("Tile-Size Constraint #1-#3") and
  nki.isa.nc_matmul ("Tile size": moving <= 512 on NeuronCore-v2 and -v3).
- PSUM: 2 MiB = 128 partitions x 16 KiB = 8 banks of 2 KiB per partition:
  NKI docs, guides/architecture/trainium_inferentia2_arch (NeuronCore-v2) and
  trainium2_arch ("PSUM capacity remains the same at 2MiB"); nki.language.tile_size
  (psum_bank_fmax, psum_num_banks = 8).
- SBUF: 24 MiB = 128 x 192 KiB on NeuronCore-v2 (trn1); 28 MiB = 128 x 224 KiB on
  NeuronCore-v3 (trn2): the same two architecture pages.

The emulator counts the full per-partition capacity as usable; the real compiler may
reserve part of it (nki.language.tile_size.sbuf_fmax_bytes is the usable size, whose
value these docs do not state).
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024


@dataclass(frozen=True)
class CoreLimits:
    target: str  # "trn1" (NeuronCore-v2) or "trn2" (NeuronCore-v3)
    pmax: int = 128  # partitions
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax: int = 512
    psum_bank_bytes: int = 2 * KiB
    psum_num_banks: int = 8
    sbuf_partition_bytes: int = 192 * KiB

    @property
    def psum_bank_fmax(self) -> int:
        """fp32 elements per PSUM bank per partition."""
        return self.psum_bank_bytes // 4


TARGETS = {
    "trn1": CoreLimits(target="trn1", sbuf_partition_bytes=192 * KiB),
    "trn2": CoreLimits(target="trn2", sbuf_partition_bytes=224 * KiB),
}


def limits_for(target: str) -> CoreLimits:
    try:
        return TARGETS[target]
    except KeyError:
        raise ValueError(f"unknown NKI target '{target}'; use one of {', '.join(TARGETS)}") from None
