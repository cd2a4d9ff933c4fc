#!/bin/bash
# Round 35: #3's table at the default sizes for this checkout's build-perf, with a second cluster
# whose data servers run `--direct-io` beside the default one: `penstock-bench compare WORKLOAD
# /var/tmp/bench-local /var/tmp/m0 /var/tmp/mD --runs 3 [--drop-caches for the read workloads]
# --plot WORKLOAD.svg`, the three directories interleaved; mounts on /dev/fuse (enable_uring N).
# Raw output in docs/perf/round35/table.txt.
# usage: docs/perf/round35/default-vs-direct.sh
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round35
[ "$(cat /sys/module/fuse/parameters/enable_uring)" = N ] || { echo "enable_uring is not N"; exit 1; }
rm -rf /var/tmp/st0 /var/tmp/stD $L; mkdir -p $L
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/st0 --mount /var/tmp/m0 > $O/up.log 2>&1 || { echo up failed; exit 1; }
PENSTOCK_DATA_ARGS="--direct-io" PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stD --mount /var/tmp/mD >> $O/up.log 2>&1 || { echo up failed; exit 1; }
echo "Round 35, build $(git rev-parse --short HEAD): penstock-bench compare WORKLOAD $L /var/tmp/m0 /var/tmp/mD --runs 3 [--drop-caches for the read workloads] --plot WORKLOAD.svg, every workload at its default sizes; two clusters (3 data servers each, release build; m0 default, mD data servers at --direct-io), mounts on /dev/fuse." > $O/table.txt
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
for w in meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel; do
  extra=""
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table.txt
  timeout 1200 $B compare $w $L /var/tmp/m0 /var/tmp/mD --runs 3 $extra --plot $O/$w.svg >> $O/table.txt 2>&1
done
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
echo "===== done $(date -u +%H:%M:%S)" >> $O/table.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/st0 >> $O/up.log 2>&1
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stD >> $O/up.log 2>&1
rm -rf /var/tmp/st0 /var/tmp/stD $L
