#!/bin/bash
# Round 34: #3's table with the mount's FUSE requests over io_uring (docs/perf/table.sh, URING=Y):
# switches the kernel's enable_uring on for the run (root) and back to what it was after.
P=/sys/module/fuse/parameters/enable_uring
was=$(cat $P)
echo Y > $P || exit 1
URING=Y "$(dirname "$0")/../table.sh" 34
rc=$?
echo "$was" > $P
exit $rc
