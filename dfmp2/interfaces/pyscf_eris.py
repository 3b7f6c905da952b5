"""The drop-in's ERIs side (dfmp2.interfaces.pyscf_dropin): ``DFERIs`` (PySCF's ``ovL`` of one
spin channel, in memory or in an HDF5 file), B as the MP2 stage fits it (``fitted_B``), the
amplitudes of one pair of occupied blocks (``_t2``) and ``kernel(eris=...)``'s energies from a given
ovL through the backend's own pair step (``_eris_energies``).
"""

from __future__ import annotations

import numpy as np

from dfmp2.errors import InputError


class DFERIs:
    """PySCF's DF-MP2 eris: ``ovL`` (nocc*nvir, naux) fp64, B_ia^P (fitted 3-index integrals,
    row i*nvir + a), an ndarray or an HDF5 dataset 'ovL'; nocc, nvir, naux; mo_energy (nmo,)
    Hartree of the active orbitals. ``path`` with ``write``: ``ovL`` is written there first."""

    def __init__(self, ovL, channel, path=None, write=False):
        import h5py

        self.nocc, self.nvir = channel.nocc_active, channel.nvir_active
        self.mo_energy = np.concatenate([channel.eps_occ, channel.eps_vir])
        self.feri = None
        if path is not None:
            try:
                self.feri = h5py.File(path, "w" if write else "r")
                if write:
                    self.feri.create_dataset("ovL", data=ovL, chunks=(1, ovL.shape[1]))
                    self.feri.flush()
                ovL = self.feri["ovL"]
            except (OSError, KeyError) as e:
                raise InputError(f"ovL file {path}: {e}") from None
        if ovL.ndim != 2 or ovL.shape[0] != self.nocc * self.nvir:
            raise InputError(
                f"ovL has shape {ovL.shape}, expected ({self.nocc * self.nvir}, naux) for "
                f"nocc {self.nocc} and nvir {self.nvir}: made for other orbitals or frozen"
            )
        self.ovL, self.naux = ovL, int(ovL.shape[1])
        self.dtype, self.dsize = np.dtype(np.float64), 8


def fitted_B(mol, auxmol, channel, options) -> np.ndarray:
    """B_ia^P of one spin channel as the MP2 stage fits it (``mp2.build_B`` on ``options``'
    backend, in memory): (naux, nocc*nvir) fp64 on the host, column i*nvir + a."""
    import dataclasses

    import torch

    from dfmp2.df import outofcore
    from dfmp2.drivers.energy import make_backend, select_integrals, stage_plan
    from dfmp2.linalg import DTYPES
    from dfmp2.mp2.stage import build_B
    from dfmp2.timing import Timer

    opts = dataclasses.replace(options, storage="memory")
    precision = opts.resolved_precision()
    backend = make_backend(opts)
    engine = select_integrals(opts, mol, backend)
    nocc, nvir = channel.nocc_active, channel.nvir_active
    plan = stage_plan(mol, auxmol, opts, backend, precision, nocc=nocc, nvir=nvir, engine=engine)
    blocks = outofcore.OccBlocks(nocc, nvir, auxmol.nao_nr(), plan.occ_block)
    store = outofcore.open_b_store(plan, blocks, DTYPES[precision], backend)
    try:
        build_B(
            mol,
            auxmol,
            channel.C_occ,
            channel.C_vir,
            backend,
            backend.fit_dtype(precision),
            plan,
            Timer(backend),
            store,
            engine=engine,
        )
        return torch.cat([b.to("cpu", torch.float64) for b in store.data.data], dim=1).numpy()
    finally:
        store.close()


def _t2(Bi, Bj, ci, cj, same_spin: bool) -> np.ndarray:
    """t2 (nocc_i, nocc_j, nvir_i, nvir_j), dimensionless, of B^i (naux, nocc_i*nvir_i) and B^j
    (channels ci, cj): K_ijab = (ia|jb) = sum_P B_ia^P B_jb^P, D = e_i + e_j - e_a - e_b (Hartree),
    t2_ijab = K/D (same_spin: (K_ijab - K_ijba)/D), one occupied orbital i at a time."""
    import torch

    oi, vi, oj, vj = ci.nocc_active, ci.nvir_active, cj.nocc_active, cj.nvir_active
    X = torch.from_numpy(np.ascontiguousarray(Bi, dtype=np.float64)).reshape(-1, oi, vi)
    Y = torch.from_numpy(np.ascontiguousarray(Bj, dtype=np.float64)).reshape(-1, oj * vj)
    eoi, evi = (torch.from_numpy(np.asarray(e, dtype=np.float64)) for e in (ci.eps_occ, ci.eps_vir))
    eoj, evj = (torch.from_numpy(np.asarray(e, dtype=np.float64)) for e in (cj.eps_occ, cj.eps_vir))
    t2 = np.empty((oi, oj, vi, vj))
    for i in range(oi):
        K = (X[:, i, :].T @ Y).reshape(vi, oj, vj).permute(1, 0, 2)  # (j, a, b) = (ia|jb)
        T = K / (eoi[i] + eoj[:, None, None] - evi[None, :, None] - evj[None, None, :])
        t2[i] = (T - T.transpose(1, 2)).numpy() if same_spin else T.numpy()
    return t2


def _eris_energies(eris, ref, options) -> tuple[float, float, dict]:
    """(E_OS, E_SS) in Hartree from a given ``eris.ovL`` (RHF): the pair step of ``options``'
    backend (its device, precision and kernels), over B = ovL as (nocc, nvir, naux); and that
    backend's record of what ran."""
    if not ref.restricted:
        raise InputError("kernel(eris=...) takes the eris of an RHF reference (ao2mo)")
    ch = ref.channels[0]
    if (eris.nocc, eris.nvir) != (ch.nocc_active, ch.nvir_active):
        raise InputError(
            f"the eris were made for nocc {eris.nocc}, nvir {eris.nvir}, but this DFMP2 has "
            f"nocc {ch.nocc_active}, nvir {ch.nvir_active}: made with another frozen"
        )
    import torch

    from dfmp2 import linalg
    from dfmp2.drivers.energy import make_backend
    from dfmp2.linalg import DTYPES

    backend = make_backend(options)
    ovL = np.asarray(eris.ovL, dtype=np.float64).reshape(ch.nocc_active, ch.nvir_active, -1)
    B = backend.to_device(torch.from_numpy(ovL), DTYPES[options.resolved_precision()])
    eo, ev = (torch.from_numpy(np.asarray(e, dtype=np.float64)) for e in (ch.eps_occ, ch.eps_vir))
    e_os, e_ss = linalg.mp2_pair_energy(B, B, eo, eo, ev, symmetric=True, backend=backend)
    return e_os, e_ss, backend.describe()
