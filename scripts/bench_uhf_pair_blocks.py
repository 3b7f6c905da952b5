"""The UHF gradient's densities phase (``dfmp2.grad.ump2.corr_uhf``: B of both spins, the pair
loops, the 3-index terms) of (H2O)16+ doublet/cc-pVDZ with pair blocks of argv[1] MB, in a fresh
process: prints one JSON line (seconds of the phase and of the pair loops alone, E_corr). The
reference comes from ``bench_gradient_plan.py energy /tmp/g16/ref.pkl --xyz water_clusters/h2o_16.xyz
--charge 1 --mult 2``."""

import json
import pickle
import sys
import time
from types import SimpleNamespace

from dfmp2.drivers import energy as energy_driver
from dfmp2.grad import common as grad_common
from dfmp2.grad import ump2 as grad_ump2
from dfmp2.io import INPUTS
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

pair_mb = float(sys.argv[1])
geom = read_xyz(INPUTS / "water_clusters/h2o_16.xyz")
opts = RunOptions(basis="cc-pvdz", charge=1, multiplicity=2)
be = energy_driver.make_backend(opts, unrestricted=True)
job = energy_driver.prepare(geom, opts, be)
ref = pickle.load(open("/tmp/g16/ref.pkl", "rb"))
orbs = [grad_common.Orbitals(ch) for ch in ref.channels]
plan = SimpleNamespace(block_mb=200.0, pair_mb=pair_mb)
t = time.perf_counter()
tp = [0.0]
real = grad_ump2.pair_densities


def timed(*a, **k):
    t0 = time.perf_counter()
    out = real(*a, **k)
    tp[0] += time.perf_counter() - t0
    return out


grad_ump2.pair_densities = timed
e_corr, *_ = grad_ump2.corr_uhf(job.mol, job.auxmol, orbs, be, 1.0, 1.0, plan=plan)
print(json.dumps(dict(pair_mb=pair_mb, densities_s=time.perf_counter() - t, pair_loops_s=tp[0], e_corr=e_corr)))
