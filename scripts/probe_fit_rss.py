#!/usr/bin/env python
"""Probe: how many (naux, occ_block nvir) blocks the out-of-core fit (dfmp2.df.outofcore.fit_blocks)
holds at its peak, against the memory plan's count (memory.stage_estimates 'fit': 7 with the default
read-ahead and write-behind). Fills an HDF5 store with 8 blocks of about 100 MB, raises the
process's high-water mark a little above its resident set (so the set-up's transients do not hide
the fit's), runs the fit in place and prints (high-water mark after - resident before) / block.

    python scripts/probe_fit_rss.py
"""

import os
import tempfile

import h5py
import numpy as np
import torch

from dfmp2 import linalg
from dfmp2.df import outofcore as oc
from dfmp2.memory import peak_rss_mb
from dfmp2.memory import resident_mb as resident


def main() -> None:
    naux, nvir, ob = 1000, 800, 16
    blocks = oc.OccBlocks(nocc=8 * ob, nvir=nvir, naux=naux, occ_block=ob)
    be = linalg.get_backend("cpu", cpu_blas="torch")
    with tempfile.TemporaryDirectory() as d, h5py.File(os.path.join(d, "b.h5"), "w") as f:
        store = oc.HDF5B(f.create_dataset("B", shape=(blocks.size,), dtype="f8"), blocks)
        x = torch.randn(naux, ob * nvir, dtype=torch.float64)
        for k in range(blocks.count):
            store.set_block(k, x)
        store.flush()
        del x
        L = torch.linalg.cholesky(torch.eye(naux, dtype=torch.float64) * 2)
        scratch = np.ones(3 * naux * ob * nvir)  # the high-water mark 3 blocks above what stays resident
        del scratch
        before = resident()
        oc.fit_blocks(L, "cholesky", store, store, be, torch.float64)
        store.close()
        blk = naux * ob * nvir * 8 / 1e6
        print(f"block {blk:.0f} MB; blocks alive at the fit's peak: {(peak_rss_mb() - before) / blk:.1f}")


if __name__ == "__main__":
    main()
