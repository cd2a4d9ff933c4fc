#!/bin/bash
# Round 32: as direct-reads.sh, for the write workloads: ckpt-write and mixed on the default data
# servers (mB) against --direct-io ones (mD), both clusters up side by side, medians of 3,
# interleaved. (Measured with the clusters direct-reads.sh had used, started again on their state;
# their page caches were cold for mixed, which drops no cache.)
# usage: docs/perf/round32/direct-writes-mixed.sh   (raw output in direct-writes-mixed.txt)
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round32/direct-writes-mixed.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stB --mount /var/tmp/mB > /dev/null || exit 1
PENSTOCK_DATA_ARGS="--direct-io" PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stD --mount /var/tmp/mD > /dev/null || exit 1
mkdir -p $L
echo "Round 32, build $(git rev-parse --short HEAD): compare W $L /var/tmp/mB /var/tmp/mD --runs 3 (mB: default data servers, mD: --direct-io)" > $O
for w in ckpt-write mixed; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 900 $B compare $w $L /var/tmp/mB /var/tmp/mD --runs 3 >> $O 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stB > /dev/null
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stD > /dev/null
