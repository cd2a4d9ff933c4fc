#!/usr/bin/env bash
# Runs inside the soft-RoCE VM (started by tests/rdma-vm/run): every RDMA test binary of the
# build dir $1, each with a timeout, then (when $2 is 1) the RDMA vs TCP benchmark. Prints each
# failing binary's output, a "N passed, N failed" summary, and exits non-zero on any failure.
set -u
build=${1:?build dir}
bench=${2:-0}
export RDMAVM_GUEST=1   # RDMA cases must run here, not skip
export TMPDIR=/tmp
pass=0
fail=0
failed=()
up() { awk '{print $1}' /proc/uptime; }

echo "rdma-vm guest: $(ibv_devices | awk 'NR>2{print $1}' | tr '\n' ' ') on ${RDMAVM_IP:-?}, $(nproc) vCPU"
run() {  # run <name> <timeout s> <binary> [args...]
  local name=$1 limit=$2
  shift 2
  local t=$(up) log=/tmp/$name.log
  timeout -k 5 "$limit" "$@" --gtest_color=no > "$log" 2>&1
  local rc=$?
  local took=$(awk -v a="$t" -v b="$(up)" 'BEGIN{printf "%.1f", b-a}')
  local counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$log" | tr -s ' ' | tr '\n' ' ')
  if [ $rc = 0 ] && ! grep -q '^\[  SKIPPED \] [1-9]' "$log"; then
    echo "PASS: $name (${took} s) $counts"
    pass=$((pass + 1))
  else
    [ $rc = 124 ] && echo "  (timed out after $limit s)"
    echo "FAIL: $name (status $rc, ${took} s) $counts"
    grep -vE '^\[ RUN|^\[       OK|INFO ' "$log" | tail -60 | sed 's/^/  | /'
    fail=$((fail + 1))
    failed+=("$name")
  fi
}
run net_unit 60 "$build/tests/unit/net/net_test"
run transport_integration 240 "$build/tests/integration/transport/transport_integration_test" \
  --gtest_filter='-RdmaDeviceRemovalTest.*'
run rdma_cluster 180 "$build/tests/integration/transport/rdma_cluster_test"
# Last: deletes the RDMA device (in-flight calls must fail cleanly, nothing may hang).
PENSTOCK_TEST_RDMA_DELETE_DEVICE=${RDMAVM_IBDEV:-rxe0} run device_removal 120 \
  "$build/tests/integration/transport/transport_integration_test" --gtest_filter='RdmaDeviceRemovalTest.*'
# The kernel completes the removal once the test process (which had the device open) is gone.
gone=0
for i in $(seq 1 60); do
  if ! rdma link show 2>/dev/null | grep -q "${RDMAVM_IBDEV:-rxe0}"; then gone=1; break; fi
  sleep 0.5
done
if [ $gone = 1 ]; then
  echo "PASS: device_removal_completes (the device went away once the process let go of it)"
  pass=$((pass + 1))
else
  echo "FAIL: device_removal_completes: ${RDMAVM_IBDEV:-rxe0} still there 30 s after the test process exited"
  fail=$((fail + 1))
  failed+=("device_removal_completes")
fi
if [ "$bench" = 1 ]; then
  # The benchmark needs the device back.
  rdma link add "${RDMAVM_IBDEV:-rxe0}" type rxe netdev rdmavm0 || echo "cannot re-create ${RDMAVM_IBDEV:-rxe0}"
  echo "--- benchmark: 1 MiB reads and writes, RDMA vs TCP (bytes moved per CPU-second)"
  timeout 300 "$build/tests/integration/transport/transport_bench" --host "${RDMAVM_IP}" || { echo "FAIL: benchmark"; fail=$((fail + 1)); }
fi
echo "rdma-vm guest: $pass passed, $fail failed${failed[*]:+ (${failed[*]})}"
[ $fail = 0 ]
