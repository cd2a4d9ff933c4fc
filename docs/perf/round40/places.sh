#!/usr/bin/env bash
# Round 40: how many places. mB: round 39's build (libfuse's loop, 16 threads); m1: 4 places (the
# default on 2 CPUs); m8: --active-threads 8, on m1's cluster.
set -u
B=${BENCH:-build-perf/tools/bench/penstock-bench}
echo "== compare mixed /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3 --drop-caches"
"$B" compare mixed /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare meta /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3"
"$B" compare meta /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3 2>&1 | grep -v "^penstock-bench compare: run\|^     "
echo "== compare train-small /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3 --drop-caches"
"$B" compare train-small /var/tmp/mB /var/tmp/m1 /var/tmp/m8 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
