#!/bin/bash
# Round 31: the data servers at SCHED_BATCH (chrt -b on every thread) against SCHED_OTHER, for
# mixed with the default mount mD and the -o direct_writes mount mW. One fresh cluster; one
# discarded mixed run per directory first, so every block starts with the dataset in the page cache.
. "$(dirname "$0")/two-mounts.sh"
out=$O/dw-batch.txt
setpol() { for p in $(awk '$1 ~ /^data/ {print $2}' $S/pids); do chrt $1 -a -p 0 $p; done; }
echo "Round 31, build $(git rev-parse --short HEAD) (data path as 2ead023): L, default mount $MD, -o direct_writes mount $MW; data servers' policy per block" > $out
timeout 1200 $B compare mixed $L $MD $MW --runs 1 > /dev/null 2>&1  # warm-up, discarded
for pol in -b -o -b -o; do
  setpol $pol
  echo "===== data servers chrt $pol: $(for p in $(awk '$1 ~ /^data/ {print $2}' $S/pids); do chrt -p $p | head -1 | sed 's/.*: //'; done | tr '\n' ' ')" >> $out
  bash docs/perf/round27/quiet.sh
  echo "===== mixed  ($(date -u +%H:%M:%S))" >> $out
  timeout 1200 $B compare mixed $L $MD $MW --runs 2 2>&1 | sed -n '/^compare/,$p' >> $out
done
echo "===== done $(date -u +%H:%M:%S)" >> $out
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state $S >> $O/up.log 2>&1
rm -rf $S $L
