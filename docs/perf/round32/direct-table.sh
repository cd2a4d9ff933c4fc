#!/bin/bash
# Round 32: #3's table with every data server at --direct-io (docs/perf/table.sh says how);
# raw output and pictures in docs/perf/round32-direct/.
PENSTOCK_DATA_ARGS="--direct-io" exec "$(dirname "$0")/../table.sh" 32-direct
