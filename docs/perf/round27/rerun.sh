#!/bin/bash
cd /work/main
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; M=/var/tmp/mN27; O=/var/tmp/r27
echo "Round 27 rerun, build $(git rev-parse --short HEAD), cluster /var/tmp/st-N27 (fresh this session, 3 data servers), mount $M on /dev/fuse (enable_uring $(cat /sys/module/fuse/parameters/enable_uring))" > $O/rerun.txt
for w in train-seq train-rand restore-fanout; do
  bash docs/perf/round27/quiet.sh  # waits until the disk has been quiet 3 s
  echo "===== $w  ($(date -u +%H:%M:%S))" >> $O/rerun.txt
  $B compare $w $L $M --runs 3 --drop-caches --plot $O/$w-rerun.svg >> $O/rerun.txt 2>&1
done
echo "===== done $(date -u +%H:%M:%S)" >> $O/rerun.txt
