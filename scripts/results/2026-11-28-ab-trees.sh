#!/bin/bash
# usage: ab.sh TAG ROUNDS MOL MEM tree1 tree2 ...   (MEM=default for no --memory)
tag=$1; rounds=$2; mol=$3; mem=$4; shift 4
cd /tmp
for round in $(seq $rounds); do
  for tree in "$@"; do
    extra=""; [ $mem != default ] && extra="--memory $mem"
    name=$(basename $tree); out=/tmp/ab_${tag}_${name}_$round
    PYTHONPATH=$tree python -m dfmp2 run /work/main/inputs/water_clusters/$mol.xyz $extra -q --json $out.json --scratch /tmp > $out.out 2>&1
    python -c "
import json;d=json.load(open('$out.json'));t=d['timings']
print('$tag r$round $name wall', round(d['wall_s'],1), 'rss', {k:round(v) for k,v in d['peak_rss_mb'].items()}, {k:round(v,1) for k,v in t.items()}, repr(d['energies']['e_mp2']))" || tail -3 $out.out
  done
done
