#!/bin/bash
# Round 35: cold small-file reads, one reader, through mounts that already hold the files
# (MOUNTS, each with small/d0..d9/f0..f199 of 100 KiB): per round and mount, every cache dropped
# (sync, the mount's user.penstock.drop_caches, /proc/sys/vm/drop_caches), then readall.c reads
# the 2000 files in one shuffled order while perf records the FUSE requests' send and end
# tracepoints; prints files/s and each opcode's mean latency. Rounds interleave the mounts.
# usage: MOUNTS="/var/tmp/mL /var/tmp/mB /var/tmp/mN" [ROUNDS=3] docs/perf/round35/read-latency.sh
cd "$(dirname "$0")"
W=/tmp/read-latency; mkdir -p $W
gcc -O2 -o $W/readall readall.c || exit 1
first=${MOUNTS%% *}
( cd $first/small && find . -type f ) | sort | shuf --random-source=<(yes) > $W/order
for r in $(seq 1 ${ROUNDS:-3}); do
  for M in $MOUNTS; do
    sed "s#^\.#$M/small#" $W/order > $W/list
    sync; setfattr -n user.penstock.drop_caches -v 1 $M; echo 3 > /proc/sys/vm/drop_caches
    echo "== round $r $M: $(perf record -q -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o $W/fuse.data -- $W/readall < $W/list)"
    perf script -i $W/fuse.data -F time,event,trace 2>/dev/null | awk '
      /fuse_request_send/ { t=$1; sub(":","",t); for(i=1;i<=NF;i++){ if($i=="req") id=$(i+1); if($i=="opcode") op=$(i+2)}; s[id]=t; o[id]=op }
      /fuse_request_end/ { t=$1; sub(":","",t); for(i=1;i<=NF;i++) if($i=="req") id=$(i+1); if (id in s) { d=(t-s[id])*1e6; n[o[id]]++; sum[o[id]]+=d; delete s[id] } }
      END { for (k in n) if (n[k] > 10) printf "   %-16s %6d requests, mean %6.1f us\n", k, n[k], sum[k]/n[k] }' | sort
  done
done
