#!/usr/bin/env python
"""Probe: where in a run the process's resident memory peaks. Runs ``dfmp2 ARGS`` in this process
while a thread reads the resident set (``memory.resident_mb``) and every other thread's innermost
dfmp2 frames every 50 ms, then prints the highest reading seen at each place (first the 25 highest)
and writes every sample to ``--samples`` (JSON: [seconds, MB, frames]).

    python scripts/probe_rss_timeline.py [--samples FILE] run inputs/water_clusters/h2o_16.xyz --memory 1000 -q

The sampler holds the GIL briefly 20 times a second: timings are a little slower than a plain run.
"""

import collections
import json
import os
import sys
import threading
import time

from dfmp2.memory import resident_mb

PERIOD_S = 0.05


def frames(me: int) -> str:
    """Up to 4 innermost dfmp2 frames of each thread but ``me``, 'file:line:function < ...'."""
    out = []
    for tid, f in sys._current_frames().items():
        if tid == me:
            continue
        fr = []
        while f is not None and len(fr) < 4:
            if "dfmp2" in f.f_code.co_filename:
                fr.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}:{f.f_code.co_name}")
            f = f.f_back
        if fr:
            out.append(" < ".join(fr))
    return " | ".join(out)


def main(argv: list) -> int:
    path = None
    if argv[:1] == ["--samples"]:
        path, argv = argv[1], argv[2:]
    samples, done = [], threading.Event()

    def sample():
        me, t0 = threading.get_ident(), time.perf_counter()
        while not done.is_set():
            samples.append((time.perf_counter() - t0, resident_mb(), frames(me)))
            time.sleep(PERIOD_S)

    threading.Thread(target=sample, daemon=True).start()
    from dfmp2.cli.main import main as dfmp2_main

    try:
        dfmp2_main(argv, standalone_mode=False)
    finally:
        done.set()
        best = collections.OrderedDict()
        for t, mb, where in samples:
            if where not in best or mb > best[where][1]:
                best[where] = (t, mb)
        for where, (t, mb) in sorted(best.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"{mb:8.0f} MB at {t:7.1f} s  {where}", file=sys.stderr)
        if path:
            with open(path, "w") as f:
                json.dump(samples, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
