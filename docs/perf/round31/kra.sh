#!/bin/bash
# Round 31: the mount's kernel read-ahead, 1 MiB (the default) against 4 and 8 MiB (the local
# disk's read_ahead_kb is 8192), for the sequential read rows. One fresh cluster, three mounts.
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round31
S=/var/tmp/st31k; M1=/var/tmp/m31k1; M4=/var/tmp/m31k4; M8=/var/tmp/m31k8
rm -rf $S $L; mkdir -p $L
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state $S --mount $M1 > $O/up-kra.log 2>&1 || { echo up failed; exit 1; }
for k in 4 8; do
  PENSTOCK_BUILD=build-perf PENSTOCK_MOUNT_ARGS="--kernel-readahead ${k}M" deploy/local-cluster mount --state $S --mount /var/tmp/m31k$k >> $O/up-kra.log 2>&1 || { echo mount failed; exit 1; }
done
out=$O/kra.txt
echo "Round 31, build $(git rev-parse --short HEAD): L, mounts with --kernel-readahead 1M (default) $M1, 4M $M4, 8M $M8; --drop-caches" > $out
for w in train-seq ckpt-restore restore-fanout train-seq; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $out
  timeout 900 $B compare $w $L $M1 $M4 $M8 --runs 3 --drop-caches >> $out 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $out
PENSTOCK_BUILD=build-perf deploy/local-cluster down --state $S >> $O/up-kra.log 2>&1
rm -rf $S $L
