#!/bin/bash
# Round 32: the data servers' reads through the page cache (cluster mB, the default) against
# O_DIRECT (cluster mD, penstock-data --direct-io), both clusters up side by side, the read
# workloads at their default sizes, --drop-caches, interleaved (local, mB, mD), medians of 3.
# usage: docs/perf/round32/direct-reads.sh   (raw output in docs/perf/round32/direct-reads.txt;
# ROUND=N writes docs/perf/roundN/direct-reads.txt instead, as round 33 did)
cd "$(dirname "$0")/../../.."
ROUND=${ROUND:-32}
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round$ROUND/direct-reads.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stB --mount /var/tmp/mB > /dev/null || exit 1
PENSTOCK_DATA_ARGS="--direct-io" PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stD --mount /var/tmp/mD > /dev/null || exit 1
mkdir -p $L
echo "Round $ROUND, build $(git rev-parse --short HEAD): compare W $L /var/tmp/mB /var/tmp/mD --runs 3 --drop-caches (mB: default data servers, mD: --direct-io)" > $O
for w in train-rand ckpt-restore restore-fanout train-seq train-small; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 900 $B compare $w $L /var/tmp/mB /var/tmp/mD --runs 3 --drop-caches >> $O 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stB > /dev/null
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stD > /dev/null
