#!/bin/bash
# Round 35: default data servers, the build before this round (BASE, a clone of 0d9f1a3 built with
# `meson setup build-perf -Dbuildtype=release -Dtests=false`: mB) against this checkout's
# build-perf (mN), side by side: was the default path slowed? Interleaved, medians of 3, --drop-caches.
# usage: BASE=/var/tmp/base docs/perf/round35/default-ab.sh [workload...]
cd "$(dirname "$0")"
OUT=default-ab ARGS=" " exec ./joined-header.sh "${@:-train-small}"
