#!/bin/bash
# (H2O)24/cc-pVDZ --memory 2000: peak RSS per stage with glibc's dynamic mmap threshold (default)
# and with a fixed 1 MB threshold (freed blocks >= 1 MB go back to the OS at once)
cd /tmp
for mode in default fixed; do
  if [ $mode = fixed ]; then export MALLOC_MMAP_THRESHOLD_=1048576; else unset MALLOC_MMAP_THRESHOLD_; fi
  /usr/bin/time -f "%e s %M KB" env PYTHONPATH=/work/wt-s8 python -m dfmp2 run /work/main/inputs/water_clusters/h2o_24.xyz --memory 2000 -q --json /tmp/m24_$mode.json --scratch /tmp > /tmp/m24_$mode.out 2>&1
  tail -1 /tmp/m24_$mode.out
  python -c "
import json;d=json.load(open('/tmp/m24_$mode.json'));print('$mode', round(d['wall_s'],1), {k:round(v) for k,v in d['peak_rss_mb'].items()}, {k:round(v) for k,v in d['memory']['stages_mb'].items()}, d['ran']['scf']['jk_factor']['layout'], d['ran'].get('storage'))"
done
