"""Bit-level fingerprint of the energies, for restructures that must not change a single bit.

    python scripts/energy_fingerprint.py > before.json       # on the old code
    python scripts/energy_fingerprint.py > after.json        # on the new code
    diff before.json after.json                              # empty: byte-identical energies

Runs, in one process with one torch thread, through the public ``dfmp2.energy``: the fast
regression cases (inputs/references.json, subset 'fast': RHF and UHF, df and exact SCF,
all-electron and frozen core) in fp64 and fp32; out of core (B on disk, small occupied blocks);
a checkpointed run, its complete checkpoint read back, and a run interrupted in the pair step
then resumed; water on trn1 through the NKI kernels on this CPU (``--simulate``); and the gradient
path (``gradient_fingerprints``). Prints JSON {case: {e_hf, e_os, e_ss: float.hex}} (Hartree) and
{case: {gradient: [float.hex]}} (Eh/bohr), sorted.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

import dfmp2
from dfmp2 import linalg


def hexes(r) -> dict:
    return {"e_hf": float(r.e_hf).hex(), "e_os": float(r.e_os).hex(), "e_ss": float(r.e_ss).hex()}


def interrupted_then_resumed(path, ck, after: int, **opts):
    """Stop the pair step after ``after`` pair kernels (KeyboardInterrupt), then --resume."""
    real = linalg.mp2_pair_energy
    calls = []

    def counted(*a, **k):
        if len(calls) == after:
            raise KeyboardInterrupt("fingerprint")
        calls.append(1)
        return real(*a, **k)

    linalg.mp2_pair_energy = counted
    try:
        dfmp2.energy(path, checkpoint=ck, **opts)
    except KeyboardInterrupt:
        pass
    finally:
        linalg.mp2_pair_energy = real
    return dfmp2.energy(path, resume=ck, **opts)


def gradient_fingerprints(water: str, oh: str) -> dict:
    """The gradient path's bits: RHF water MP2 and frozen-core SCS-MP2, UHF hydroxyl MP2 (6-31G,
    the CLI's ``dfmp2 gradient`` through ``dfmp2.gradient``), and the drop-in's
    ``DFMP2(mf).nuc_grad_method()`` on a PySCF DF-RHF; each component as float.hex (Eh/bohr)."""
    from pyscf import gto, scf

    def grad_hexes(g) -> dict:
        return {"gradient": [float(x).hex() for x in g.ravel()]}

    out = {}
    out["water|gradient|mp2"] = grad_hexes(dfmp2.gradient(water, basis="6-31g").gradient)
    out["water|gradient|scs-mp2|fc"] = grad_hexes(
        dfmp2.gradient(water, method="scs-mp2", basis="6-31g", frozen_core=True).gradient
    )
    out["hydroxyl|gradient|mp2"] = grad_hexes(dfmp2.gradient(oh, basis="6-31g").gradient)
    mol = gto.M(atom=water, basis="6-31g", verbose=0)
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)
    out["water|dropin-gradient|mp2"] = grad_hexes(dfmp2.DFMP2(mf).nuc_grad_method().kernel())
    return out


def main() -> None:
    torch.set_num_threads(1)
    refs = json.loads((ROOT / "inputs" / "references.json").read_text())["references"]
    out = {}
    for key, e in sorted(refs.items()):
        if e["subset"] != "fast":
            continue
        for precision in ("fp64", "fp32"):
            r = dfmp2.energy(
                str(ROOT / e["path"]),
                basis=e["basis"],
                scf_mode=e["scf_mode"],
                frozen_core=e["frozen_core"],
                precision=precision,
            )
            out[f"{key}|{precision}"] = hexes(r)
    water = str(ROOT / "inputs" / "water.xyz")
    dimer = str(ROOT / "inputs" / "water_clusters" / "h2o_02.xyz")
    oh = str(ROOT / "inputs" / "open_shell" / "hydroxyl.xyz")
    small = {"occ_block_max": 2, "j3c_block_mb": 0.05}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp64", "fp32"):
            for name, path in (("water", water), ("hydroxyl", oh)):
                r = dfmp2.energy(path, storage="disk", scratch_dir=tmp, precision=precision, **small)
                out[f"{name}|out-of-core|{precision}"] = hexes(r)
        for precision in ("fp64", "fp32"):
            for scf_mode in ("df", "pyscf-df"):
                ck = str(Path(tmp) / f"ck-{precision}-{scf_mode}.h5")
                opts = dict(precision=precision, scf_mode=scf_mode, **small)
                out[f"h2o_2|checkpoint|{scf_mode}|{precision}"] = hexes(dfmp2.energy(dimer, checkpoint=ck, **opts))
                out[f"h2o_2|checkpoint-complete|{scf_mode}|{precision}"] = hexes(dfmp2.energy(dimer, resume=ck, **opts))
                ck2 = str(Path(tmp) / f"ck2-{precision}-{scf_mode}.h5")
                r = interrupted_then_resumed(dimer, ck2, 3, storage="disk", scratch_dir=tmp, **opts)
                out[f"h2o_2|interrupted-resumed|{scf_mode}|{precision}"] = hexes(r)
    out["water|trn1-simulate|fp32"] = hexes(dfmp2.energy(water, device="trn1", simulate=True))
    out.update(gradient_fingerprints(water, oh))
    json.dump(dict(sorted(out.items())), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
