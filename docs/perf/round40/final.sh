#!/usr/bin/env bash
# Round 40, the default as committed (8 places on 2 CPUs): the local directory, mB (round 39's
# build: libfuse's loop, 16 threads) and m1 (this round), interleaved.
set -u
B=${BENCH:-build-perf/tools/bench/penstock-bench}
mkdir -p /var/tmp/loc
echo "== compare meta /var/tmp/loc /var/tmp/mB /var/tmp/m1 --runs 3"
"$B" compare meta /var/tmp/loc /var/tmp/mB /var/tmp/m1 --runs 3 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare mixed /var/tmp/loc /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches"
"$B" compare mixed /var/tmp/loc /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare train-small /var/tmp/m1 /var/tmp/mB --runs 3 --drop-caches"
"$B" compare train-small /var/tmp/m1 /var/tmp/mB --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
