#!/usr/bin/env bash
# run_bench.sh — runs every benchmark program build/bench/bench_* (or those
# named as arguments, e.g. `bench/run_bench.sh bench_kernels`) and appends its
# rows, under a header naming the date, commit and CPU, to
# bench/results/<program>.txt.  Extra flags for the programs go in
# BENCH_ARGS (e.g. BENCH_ARGS=--quick).  oneDNN's OpenMP threads are made
# passive so they do not spin against the kernel pool.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.." || exit 1
mkdir -p bench/results
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
progs=("$@")
if [ ${#progs[@]} -eq 0 ]; then
    for p in "$BUILD"/bench/bench_*; do [ -x "$p" ] && progs+=("$(basename "$p")"); done
fi
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
rc=0
for name in "${progs[@]}"; do
    out=bench/results/$name.txt
    {
        echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null) $name ${BENCH_ARGS:-}"
        echo "# cpu: $cpu, $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
    } >>"$out"
    # shellcheck disable=SC2086
    if ! "$BUILD/bench/$name" ${BENCH_ARGS:-} | tee -a "$out"; then
        echo "$name failed" >&2
        rc=1
    fi
done
exit $rc
