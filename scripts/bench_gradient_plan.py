"""The gradient stage alone in a fresh process (ru_maxrss), RHF or UHF: mode "energy" (run the energy
and pickle the reference to --ref), "zvector,jk_deriv" (forced forms, the JK factor in memory) or
"limit:MB" (choose_plan); out: the prefix of the .json record and the .npy gradient.

    python scripts/bench_gradient_plan.py energy /tmp/g/ref.pkl --xyz water_clusters/h2o_08.xyz --charge 1 --mult 2
    python scripts/bench_gradient_plan.py limit:500 /tmp/g/disk --ref /tmp/g/ref.pkl --xyz ... --charge 1 --mult 2
"""

import argparse
import json
import pickle
import resource
import time

import numpy as np

from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.grad import plan as grad_plan
from dfmp2.io import INPUTS
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.timing import Timer

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("out")
ap.add_argument("--xyz", default="water_clusters/h2o_16.xyz", help="under inputs/")
ap.add_argument("--basis", default="cc-pvdz")
ap.add_argument("--charge", type=int, default=0)
ap.add_argument("--mult", type=int, default=1)
ap.add_argument("--ref", default="/tmp/g38/ref.pkl", help="the pickled reference of mode 'energy'")
a = ap.parse_args()
geom = read_xyz(INPUTS / a.xyz)
opts = RunOptions(basis=a.basis, charge=a.charge, multiplicity=a.mult)
be = energy_driver.make_backend(opts, unrestricted=a.mult > 1)
if a.mode == "energy":
    job = energy_driver.prepare(geom, opts, be, None)
    done = energy_driver.run_energy(job)
    pickle.dump(done.ref, open(a.out, "wb"))
    print("naux", job.space.naux, job.jk_auxmol.nao_nr())
    raise SystemExit
job = energy_driver.prepare(geom, opts, be)
ref = pickle.load(open(a.ref, "rb"))
shapes = (grad_plan.rhf_shapes if ref.restricted else grad_plan.uhf_shapes)(job.mol, ref, job.auxmol, job.jk_auxmol)
if a.mode.startswith("limit:"):
    plan = grad_plan.choose_plan(shapes, float(a.mode.split(":")[1]))
else:
    plan = grad_plan.make_plan(shapes, *a.mode.split(","))
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
t = time.perf_counter()
parts = gradient_driver.gradient_stage(job.mol, ref, job.auxmol, job.jk_auxmol, be, "mp2", Timer(be), plan)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
np.save(a.out + ".npy", parts.gradient)
rec = dict(
    mode=a.mode,
    xyz=a.xyz,
    wall_s=wall,
    maxrss_mb=rss,
    rss_before_stage_mb=rss0,
    estimate_mb=plan.peak_mb,
    phases=plan.phases,
    plan=plan.record(),
    timings=parts.timings,
    zvector=parts.zvector,
    stage_peak_rss_mb=parts.peak_rss_mb,
    shapes=shapes,
)
json.dump(rec, open(a.out + ".json", "w"), indent=1)
print(json.dumps(rec))
