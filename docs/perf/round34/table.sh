#!/bin/bash
# Round 34: #3's table at the default sizes with this round's build (docs/perf/table.sh says how).
exec "$(dirname "$0")/../table.sh" 34
