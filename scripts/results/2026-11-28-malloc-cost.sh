#!/bin/bash
# The cost of glibc's fixed 1 MB mmap threshold (MALLOC_MMAP_THRESHOLD_=1048576): (H2O)16/cc-pVDZ
# `dfmp2 run`, JK factor in memory (default limit) and on disk (--memory 1000), each mode
# interleaved with the default allocator, 2 rounds, run alone on the 2 cores
cd /tmp
for round in 1 2; do
  for mem in default 1000; do
    for mode in default fixed; do
      if [ $mode = fixed ]; then export MALLOC_MMAP_THRESHOLD_=1048576; else unset MALLOC_MMAP_THRESHOLD_; fi
      extra=""; [ $mem != default ] && extra="--memory $mem"
      out=/tmp/mc_${mem}_${mode}_$round
      /usr/bin/time -f "%e s %M KB" python -m dfmp2 run /work/main/inputs/water_clusters/h2o_16.xyz $extra -q --json $out.json --scratch /tmp > $out.out 2>&1
      python -c "
import json;d=json.load(open('$out.json'));t=d['timings']
print('round $round mem $mem $mode wall', round(d['wall_s'],1), 'rss', round(max(d['peak_rss_mb'].values())), {k:round(v,1) for k,v in t.items()}, d['ran']['scf']['jk_factor']['layout'], repr(d['energies']['e_mp2']))"
    done
  done
done
