#!/usr/bin/env bash
# Round 40: the workloads the FUSE worker pool could slow, on mB (round 39's build, libfuse's
# loop, 16 threads) and m1 (this round: 4 places, up to 16 threads), two default clusters.
set -u
B=${BENCH:-build-perf/tools/bench/penstock-bench}
for w in train-small train-rand mixed ckpt-write; do
  echo "== compare $w /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches"
  "$B" compare "$w" /var/tmp/mB /var/tmp/m1 --runs 3 --drop-caches 2>&1 | grep -v "^penstock-bench compare: run\|^     "
done
