#!/bin/bash
# Round 32: as direct-reads.sh, for the write workloads: ckpt-write and mixed on the default data
# servers (mB) against --direct-io ones (mD), both clusters up, medians of 3, interleaved.
cd "$(dirname "$0")/../../.."
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round32/direct-writes-mixed.txt
mkdir -p $L
echo "Round 32, build $(git rev-parse --short HEAD): compare W $L /var/tmp/mB /var/tmp/mD --runs 3 (mB: default data servers, mD: --direct-io)" > $O
for w in ckpt-write mixed; do
  bash docs/perf/round27/quiet.sh
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O
  timeout 900 $B compare $w $L /var/tmp/mB /var/tmp/mD --runs 3 >> $O 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O
