#!/bin/bash
# Round 36: the default data path before (BASE, a clone of f53b0ad built with `meson setup
# build-perf -Dbuildtype=release -Dtests=false`; mB) and after this round (this checkout's
# build-perf; mN) side by side, both default data servers, to tell the code from the machine in
# the workloads whose m0 ratio moved most against round 35. Raw output in default-ab.txt.
# usage: BASE=/var/tmp/base docs/perf/round36/default-ab.sh [workload...]
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round36/default-ab.txt
BASE=${BASE:-/var/tmp/base}
rm -rf /var/tmp/stB /var/tmp/stN $L; mkdir -p $L
PENSTOCK_BUILD=$BASE/build-perf $BASE/deploy/local-cluster up --state /var/tmp/stB --mount /var/tmp/mB > /dev/null || exit 1
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state /var/tmp/stN --mount /var/tmp/mN > /dev/null || exit 1
echo "Round 36, base $(git -C $BASE rev-parse --short HEAD) (mB) against $(git rev-parse --short HEAD) (mN), both default: compare W $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches" > $O
/tmp/first-touch 2048 0 >> $O 2>&1
for w in ${*:-train-rand restore-fanout}; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 1200 $B compare $w $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches >> $O 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O
PENSTOCK_BUILD=$BASE/build-perf $BASE/deploy/local-cluster down --state /var/tmp/stB > /dev/null
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stN > /dev/null
rm -rf /var/tmp/stB /var/tmp/stN $L
