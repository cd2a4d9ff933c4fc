#!/bin/bash
# Round 41: #3's table at the default sizes for this checkout's build-perf: `penstock-bench compare
# WORKLOAD /var/tmp/bench-local /var/tmp/m0 --runs 3 [--drop-caches for the read workloads] --plot
# WORKLOAD.svg`, the local directory and a default cluster (3 data servers, one mount on /dev/fuse)
# interleaved. Raw output in docs/perf/round41/table.txt.
# usage: docs/perf/round41/table.sh   (needs /tmp/first-touch: cc -O2 -o /tmp/first-touch docs/perf/round32/first-touch.c)
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round41
[ "$(cat /sys/module/fuse/parameters/enable_uring)" = N ] || { echo "enable_uring is not N"; exit 1; }
rm -rf /var/tmp/st0 $L; mkdir -p $L
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/st0 --mount /var/tmp/m0 > $O/up.log 2>&1 || { echo up failed; exit 1; }
echo "Round 41, build $(git rev-parse --short HEAD): penstock-bench compare WORKLOAD $L /var/tmp/m0 --runs 3 [--drop-caches for the read workloads] --plot WORKLOAD.svg, every workload at its default sizes; one default cluster (3 data servers, release build), its mount on /dev/fuse; $(nproc) vCPUs, kernel $(uname -r)." > $O/table.txt
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
for w in meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel; do
  extra=""
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table.txt
  timeout 1200 $B compare $w $L /var/tmp/m0 --runs 3 $extra --plot $O/$w.svg >> $O/table.txt 2>&1
done
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
echo "===== done $(date -u +%H:%M:%S)" >> $O/table.txt
getfattr --only-values -n user.penstock.stats /var/tmp/m0 > $O/mount-stats.txt 2>&1
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/st0 >> $O/up.log 2>&1
rm -rf /var/tmp/st0 $L
