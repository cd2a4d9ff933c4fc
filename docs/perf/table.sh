#!/bin/bash
# #3's table at the default sizes, as rounds 30 and 31 measured it: on one fresh cluster (3 data
# servers, the release build in build-perf) with its mount on /dev/fuse (enable_uring N),
# `penstock-bench compare WORKLOAD /var/tmp/bench-local MOUNT --runs 3 [--drop-caches for the read
# workloads] --plot docs/perf/roundN/WORKLOAD.svg` for every workload; raw output in
# docs/perf/roundN/table.txt, the cluster's start and stop in up.log. With URING=Y the mount takes
# its requests over io_uring instead (the kernel's enable_uring must be Y; --fuse-uring auto then
# uses it), and the output goes to docs/perf/roundN-uring/.
# usage: [URING=Y] docs/perf/table.sh N     (N: the round number)
N=${1:?usage: docs/perf/table.sh ROUND}
cd "$(dirname "$0")/../.."
URING=${URING:-N}
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; M=/var/tmp/m$N; O=docs/perf/round$N
[ "$URING" = Y ] && O=docs/perf/round$N-uring
S=/var/tmp/st$N
mkdir -p $O
rm -rf $S $L; mkdir -p $L
[ "$(cat /sys/module/fuse/parameters/enable_uring)" = "$URING" ] || { echo "enable_uring is not $URING"; exit 1; }
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state $S --mount $M > $O/up.log 2>&1 || { echo up failed; exit 1; }
echo "Round $N, build $(git rev-parse --short HEAD): penstock-bench compare WORKLOAD $L $M --runs 3 [--drop-caches for the read workloads] --plot WORKLOAD.svg, every workload at its default sizes; one cluster (3 data servers, release build), mount $M on $([ "$URING" = Y ] && echo "io_uring (enable_uring Y)" || echo /dev/fuse)." > $O/table.txt
for w in meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel; do
  extra=""
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table.txt
  timeout 900 $B compare $w $L $M --runs 3 $extra --plot $O/$w.svg >> $O/table.txt 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O/table.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state $S >> $O/up.log 2>&1
rm -rf $S $L
