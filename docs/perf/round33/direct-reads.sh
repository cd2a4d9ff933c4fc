#!/bin/bash
# Round 33: round 32's side-by-side of buffered (mB) and --direct-io (mD) data servers, rerun on
# this round's machine (output in docs/perf/round33/direct-reads.txt).
ROUND=33 exec "$(dirname "$0")/../round32/direct-reads.sh"
