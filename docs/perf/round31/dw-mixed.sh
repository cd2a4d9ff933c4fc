#!/bin/bash
# Round 31: -o direct_writes against the default mount on today's build, for the mixed workload
# (training p99 during a checkpoint burst) and ckpt-write. One fresh cluster (3 data servers,
# release build), the default mount mD and a second mount mW with -o direct_writes.
. "$(dirname "$0")/two-mounts.sh"
out=$O/dw-mixed.txt
echo "Round 31, build $(git rev-parse --short HEAD): compare of L, default mount $MD, -o direct_writes mount $MW" > $out
for w in mixed ckpt-write mixed; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $out
  timeout 1200 $B compare $w $L $MD $MW --runs 3 >> $out 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $out
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state $S >> $O/up.log 2>&1
rm -rf $S $L
