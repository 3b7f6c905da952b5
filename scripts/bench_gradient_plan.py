"""(H2O)16/cc-pVDZ gradient stage alone in a fresh process (ru_maxrss): argv mode "energy" (pickle the
reference), "zvector,jk_deriv" (forced forms) or "limit:MB" (choose_plan); argv out prefix."""

import json
import pickle
import resource
import sys
import time

import numpy as np

from dfmp2 import pipeline
from dfmp2.grad import rhf as g
from dfmp2.grad import run as gr
from dfmp2.io import INPUTS
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.timing import Timer

mode, out = sys.argv[1], sys.argv[2]
geom = read_xyz(INPUTS / "water_clusters/h2o_16.xyz")
opts = RunOptions(basis="cc-pvdz")
be = pipeline.make_backend(opts)
if mode == "energy":
    job = pipeline.prepare_run(geom, opts, be, None)
    done = pipeline.run_energy(job)
    pickle.dump(done.ref, open(out, "wb"))
    print("naux", job.space.naux, job.jk_auxmol.nao_nr())
    sys.exit()
job = pipeline.prepare(geom, opts, be)
ref = pickle.load(open("/tmp/g38/ref.pkl", "rb"))
shapes = g.rhf_shapes(job.mol, ref, job.auxmol, job.jk_auxmol)
if mode.startswith("limit:"):
    plan = g.choose_plan(shapes, float(mode.split(":")[1]))
else:
    zv, jd = mode.split(",")
    plan = g.make_plan(shapes, zv, jd)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
t = time.perf_counter()
parts = gr.gradient_stage(job.mol, ref, job.auxmol, job.jk_auxmol, be, "mp2", Timer(be), plan)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
np.save(out + ".npy", parts.gradient)
rec = dict(
    mode=mode,
    wall_s=wall,
    maxrss_mb=rss,
    rss_before_stage_mb=rss0,
    estimate_mb=plan.peak_mb,
    phases=plan.phases,
    plan=plan.record(),
    timings=parts.timings,
    zvector=parts.zvector,
    shapes=shapes,
)
json.dump(rec, open(out + ".json", "w"), indent=1)
print(json.dumps(rec))
