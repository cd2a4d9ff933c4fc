#!/usr/bin/env bash
# Round 40, after the watch ticks only while every place is serving: mB (round 39's build) and m1.
set -u
B=${BENCH:-build-perf/tools/bench/penstock-bench}
echo "== compare train-small /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches"
"$B" compare train-small /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare train-small /var/tmp/m1 /var/tmp/mB --runs 3 --drop-caches"
"$B" compare train-small /var/tmp/m1 /var/tmp/mB --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare meta /var/tmp/m1 /var/tmp/mB --runs 3"
"$B" compare meta /var/tmp/m1 /var/tmp/mB --runs 3 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare train-rand /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches"
"$B" compare train-rand /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
