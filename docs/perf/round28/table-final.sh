#!/bin/bash
# Round 28: #3's table at the default sizes with this round's final build, fresh cluster, the
# mount on /dev/fuse (enable_uring N), as round 27's table.sh.
cd /work/main
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; M=/var/tmp/mT28; O=/var/tmp/r28
rm -rf /var/tmp/st-T28b
[ "$(cat /sys/module/fuse/parameters/enable_uring)" = N ] || { echo "enable_uring is not N"; exit 1; }
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/st-T28b --mount $M > $O/up-final.log 2>&1 || { echo up failed; exit 1; }
echo "Round 28, build $(git rev-parse --short HEAD): penstock-bench compare WORKLOAD $L $M --runs 3 [--drop-caches for the read workloads] --plot final-WORKLOAD.svg, every workload at its default sizes; one cluster (3 data servers, release build), mount $M on /dev/fuse." > $O/table-final.txt
for w in meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel; do
  extra=""
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table-final.txt
  $B compare $w $L $M --runs 3 $extra --plot $O/final-$w.svg >> $O/table-final.txt 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O/table-final.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/st-T28b >> $O/up-final.log 2>&1
