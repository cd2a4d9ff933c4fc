#!/bin/bash
# Round 33: the data servers' read policy side by side, same build, three clusters up at once:
#   m0: the default (--direct-read-min 0: every read through the page cache)
#   mH: --direct-read-min 1M (cold reads of large files' chunks with O_DIRECT)
#   mD: --direct-io (all chunk data with O_DIRECT)
# (The first run, 07:20-07:35 on build 0e63404 plus this change uncommitted, had the 1M default
# then tried: m0 was given --direct-read-min 0 and mH nothing; the same two policies.)
# the read workloads at their default sizes, --drop-caches, interleaved (local, m0, mH, mD), medians of 3.
# usage: [OUT=name] docs/perf/round33/hybrid-reads.sh [workload...]   (raw output in docs/perf/round33/hybrid-reads.txt or name.txt)
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round33/${OUT:-hybrid-reads}.txt
up() { PENSTOCK_DATA_ARGS="$3" PENSTOCK_BUILD=build-perf deploy/local-cluster up --state $1 --mount $2 > /dev/null; }
up /var/tmp/st0 /var/tmp/m0 "" || exit 1
up /var/tmp/stH /var/tmp/mH "--direct-read-min 1M" || exit 1
up /var/tmp/stD /var/tmp/mD "--direct-io" || exit 1
mkdir -p $L
W=${*:-restore-fanout ckpt-restore train-seq train-rand train-small}
echo "Round 33, build $(git rev-parse --short HEAD): compare W $L /var/tmp/m0 /var/tmp/mH /var/tmp/mD --runs 3 --drop-caches (m0: default, mH: --direct-read-min 1M, mD: --direct-io)" > $O
for w in $W; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 1200 $B compare $w $L /var/tmp/m0 /var/tmp/mH /var/tmp/mD --runs 3 --drop-caches >> $O 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O
for s in st0 stH stD; do PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/$s > /dev/null; done
