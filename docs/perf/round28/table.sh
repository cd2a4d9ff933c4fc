#!/bin/bash
# Round 28: #3's table at the default sizes on this round's machine, one fresh cluster, two
# mounts of it side by side: /dev/fuse (--fuse-uring off) and the FUSE ring (--fuse-uring on,
# which sets /sys/module/fuse/parameters/enable_uring to Y; put back to N at the end).
cd /work/main
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; F=/var/tmp/mF28; R=/var/tmp/mR28; O=/var/tmp/r28
rm -rf /var/tmp/st-T28
PENSTOCK_BUILD=build-perf PENSTOCK_MOUNT_ARGS="--fuse-uring off" deploy/local-cluster up --state /var/tmp/st-T28 --mount $F > $O/up.log 2>&1 || { echo up failed; exit 1; }
PENSTOCK_BUILD=build-perf PENSTOCK_MOUNT_ARGS="--fuse-uring on" deploy/local-cluster mount --state /var/tmp/st-T28 --mount $R >> $O/up.log 2>&1 || { echo ring mount failed; exit 1; }
echo "Round 28, build $(git rev-parse --short HEAD): penstock-bench compare WORKLOAD $L $F $R --runs 3 [--drop-caches for the read workloads] --plot WORKLOAD.svg, every workload at its default sizes; one cluster (3 data servers, release build); $F on /dev/fuse, $R on the FUSE ring." > $O/table.txt
for w in meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel; do
  extra=""
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table.txt
  $B compare $w $L $F $R --runs 3 $extra --plot $O/$w.svg >> $O/table.txt 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O/table.txt
fusermount3 -u $R
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/st-T28 >> $O/up.log 2>&1
echo N > /sys/module/fuse/parameters/enable_uring
