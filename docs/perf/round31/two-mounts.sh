# Sourced by round 31's scripts: one fresh cluster (3 data servers, release build) with the
# default mount $MD and a second mount $MW with -o direct_writes; $B the bench, $L the local dir.
cd /work/main
B=build-perf/tools/bench/penstock-bench; L=/var/tmp/bench-local; O=docs/perf/round31
S=/var/tmp/st31; MD=/var/tmp/m31d; MW=/var/tmp/m31w
rm -rf $S $L; mkdir -p $L
PENSTOCK_BUILD=build-perf deploy/local-cluster up --state $S --mount $MD > $O/up.log 2>&1 || { echo up failed; exit 1; }
PENSTOCK_BUILD=build-perf PENSTOCK_MOUNT_ARGS="-o direct_writes" deploy/local-cluster mount --state $S --mount $MW >> $O/up.log 2>&1 || { echo mount failed; exit 1; }
