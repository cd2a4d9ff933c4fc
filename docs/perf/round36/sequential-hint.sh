#!/bin/bash
# Round 36: ReadReq::sequential under --direct-read-min 1M, side by side, with #3's table.
# m0: this checkout's build-perf, default data servers; mS: the same build, --direct-read-min 1M
# --buffered-streams (streams buffered, random cold reads direct; measured on 59b251d, where plain
# --direct-read-min 1M did that); mH: the build before the hint (BASE, a clone of
# f53b0ad built with `meson setup build-perf -Dbuildtype=release -Dtests=false`) at
# --direct-read-min 1M (every cold range of a long chunk direct). The read workloads compare all
# four directories, the others local, m0 and mS; --runs 3, --drop-caches for the read workloads,
# mounts on /dev/fuse (enable_uring N). Raw output in docs/perf/round36/table.txt.
# usage: BASE=/var/tmp/base docs/perf/round36/sequential-hint.sh [workload...]
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round36
BASE=${BASE:-/var/tmp/base}
[ "$(cat /sys/module/fuse/parameters/enable_uring)" = N ] || { echo "enable_uring is not N"; exit 1; }
[ -x /tmp/first-touch ] || cc -O2 -o /tmp/first-touch docs/perf/round32/first-touch.c || exit 1
rm -rf /var/tmp/st0 /var/tmp/stS /var/tmp/stH $L; mkdir -p $L
up() { PENSTOCK_DATA_ARGS="$5" PENSTOCK_BUILD=$3 $4/deploy/local-cluster up --state $1 --mount $2 >> $O/up.log 2>&1 || { echo "up $2 failed"; exit 1; }; }
: > $O/up.log
up /var/tmp/st0 /var/tmp/m0 build-perf . ""
up /var/tmp/stS /var/tmp/mS build-perf . "--direct-read-min 1M --buffered-streams"
up /var/tmp/stH /var/tmp/mH $BASE/build-perf $BASE "--direct-read-min 1M"
W=${*:-meta train-small ckpt-write ckpt-restore restore-fanout train-seq train-rand mixed accel}
echo "Round 36, build $(git rev-parse --short HEAD), base $(git -C $BASE rev-parse --short HEAD): penstock-bench compare WORKLOAD $L /var/tmp/m0 /var/tmp/mS [/var/tmp/mH for the read workloads] --runs 3 [--drop-caches for the read workloads] --plot WORKLOAD.svg, every workload at its default sizes; three clusters (3 data servers each, release builds; m0 default, mS --direct-read-min 1M --buffered-streams, mH the base build at --direct-read-min 1M), mounts on /dev/fuse." > $O/table.txt
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
for w in $W; do
  extra=""; dirs="$L /var/tmp/m0 /var/tmp/mS"
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand|mixed) dirs="$dirs /var/tmp/mH";; esac
  case $w in train-small|ckpt-restore|restore-fanout|train-seq|train-rand) extra="--drop-caches";; esac
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/table.txt
  timeout 1200 $B compare $w $dirs --runs 3 $extra --plot $O/$w.svg >> $O/table.txt 2>&1
done
/tmp/first-touch 2048 0 >> $O/table.txt 2>&1
echo "===== done $(date -u +%H:%M:%S)" >> $O/table.txt
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/st0 >> $O/up.log 2>&1
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state /var/tmp/stS >> $O/up.log 2>&1
PENSTOCK_BUILD=$BASE/build-perf $BASE/deploy/local-cluster down --state /var/tmp/stH >> $O/up.log 2>&1
rm -rf /var/tmp/st0 /var/tmp/stS /var/tmp/stH $L
