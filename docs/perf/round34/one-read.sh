#!/bin/bash
# Round 34: the data service's one read per request (ChunkStore::read_for_reply) against round 33's
# two (read_unverified, then read() when the range must be read), both under --direct-read-min 1M,
# side by side: mB runs the build before the change (BASE, a worktree of a96bbf5 built with
# `meson setup build-perf -Dbuildtype=release -Dtests=false`), mN this checkout's build-perf.
# The read workloads at their default sizes, --drop-caches, interleaved (local, mB, mN), medians of 3.
# usage: BASE=/var/tmp/base [OUT=name] docs/perf/round34/one-read.sh [workload...]
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round34/${OUT:-one-read}.txt
BASE=${BASE:-/var/tmp/base}
up() { PENSTOCK_DATA_ARGS="--direct-read-min 1M" PENSTOCK_BUILD=$3 $4/deploy/local-cluster up --state $1 --mount $2 > /dev/null; }
up /var/tmp/stB /var/tmp/mB $BASE/build-perf $BASE || exit 1
up /var/tmp/stN /var/tmp/mN build-perf . || exit 1
mkdir -p $L
W=${*:-train-rand ckpt-restore train-seq}
echo "Round 34, base $(git -C $BASE rev-parse --short HEAD) against $(git rev-parse --short HEAD)+: compare W $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches (both --direct-read-min 1M)" > $O
/tmp/first-touch 2048 0 >> $O 2>&1
for w in $W; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 1200 $B compare $w $L /var/tmp/mB /var/tmp/mN --runs 3 --drop-caches >> $O 2>&1
done
/tmp/first-touch 2048 0 >> $O 2>&1
echo "===== done $(date -u +%H:%M:%S)" >> $O
PENSTOCK_BUILD=$BASE/build-perf $BASE/deploy/local-cluster down --state /var/tmp/stB > /dev/null
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stN > /dev/null
