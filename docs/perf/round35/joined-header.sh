#!/bin/bash
# Round 35: a cold O_DIRECT read reads its chunk's header in the batch with its data (one wait for
# the disk) against the header read first (two), both clusters with `--direct-io` data servers,
# side by side: mB runs the build before the change (BASE, a clone of 0d9f1a3 built with
# `meson setup build-perf -Dbuildtype=release -Dtests=false`), mN this checkout's build-perf.
# Read workloads at their default sizes, --drop-caches, interleaved (local, mB, mN), medians of 3.
# usage: BASE=/var/tmp/base [OUT=name] [ARGS="--direct-io"] [FLAGS="--threads 1"] docs/perf/round35/joined-header.sh [workload...]
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round35/${OUT:-joined-header}.txt
BASE=${BASE:-/var/tmp/base}; ARGS=${ARGS:---direct-io}
up() { PENSTOCK_DATA_ARGS="$ARGS" PENSTOCK_BUILD=$3 $4/deploy/local-cluster up --state $1 --mount $2 > /dev/null; }
up /var/tmp/stB /var/tmp/mB $BASE/build-perf $BASE || exit 1
up /var/tmp/stN /var/tmp/mN build-perf . || exit 1
mkdir -p $L
W=${*:-train-small train-rand}
echo "Round 35, base $(git -C $BASE rev-parse --short HEAD) against $(git rev-parse --short HEAD)+: compare W $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches $FLAGS (both data servers $ARGS)" > $O
/tmp/first-touch 2048 0 >> $O 2>&1
for w in $W; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 1500 $B compare $w $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches $FLAGS >> $O 2>&1
done
/tmp/first-touch 2048 0 >> $O 2>&1
echo "===== done $(date -u +%H:%M:%S)" >> $O
PENSTOCK_BUILD=$BASE/build-perf $BASE/deploy/local-cluster down --state /var/tmp/stB > /dev/null
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stN > /dev/null
