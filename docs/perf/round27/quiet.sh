#!/bin/bash
# waits until the disk has done no discard/write for 3 s in a row (at most 120 s)
prev=""; q=0; for i in $(seq 1 240); do cur=$(awk '{print $5, $12}' /sys/block/vda/stat 2>/dev/null; cat /sys/block/vda/stat | awk '{print $5,$15}'); if [ "$cur" == "$prev" ]; then q=$((q+1)); [ $q -ge 6 ] && exit 0; else q=0; fi; prev="$cur"; sleep 0.5; done
