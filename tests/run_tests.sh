#!/usr/bin/env bash
# run_tests.sh — runs every test program (build/tests/test_*) and every shell
# test (tests/t_*.sh), each with a deadline (test_kernels and test_attn
# twice where the CPU hides AVX512_BF16: see below), and prints the total
# "N passed, N failed".  A test program that crashes or times out without its
# closing line counts as one failure.
set -u
BUILD=${BUILD:-build}
export BUILD
export MOESERVE=${MOESERVE:-$PWD/$BUILD/moeserve}
# hwloc PCI discovery makes every MPI rank start slowly (about 60 s under ASan)
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
TIMEOUT=${TEST_TIMEOUT:-600}
total_pass=0
total_fail=0
failed_names=()
run_one() {
    local name=$1
    shift
    local out
    local start=$SECONDS
    out=$(timeout -k 5 "$TIMEOUT" "$@" 2>&1)
    local rc=$?
    local line
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    local p=0 f=0
    if [ -n "$line" ]; then
        p=$(echo "$line" | awk '{print $1}')
        f=$(echo "$line" | awk '{print $3}')
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    if [ "$f" -ne 0 ]; then
        failed_names+=("$name")
        printf '%s\n' "$out" | tail -n 40 | sed "s/^/  [$name] /"
    fi
    printf '%-28s %4d passed, %d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - start))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# CPUs (VMs) that execute AVX512_BF16 without listing it in CPUID (matmul.c
# probes the instructions): the kernels' BF16 paths once more, forced
if "$MOESERVE" version | grep -q "avx512bf16=0" &&
    MOESERVE_ISA=avx512bf16 "$MOESERVE" version 2>/dev/null | grep -q "kernels: avx512bf16"; then
    for t in test_kernels test_attn; do
        [ -x "$BUILD/tests/$t" ] || continue
        run_one "$t[avx512bf16]" env MOESERVE_ISA=avx512bf16 "$BUILD/tests/$t"
    done
fi
for t in tests/t_*.sh; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t")" bash "$t"
done
if [ ${#failed_names[@]} -gt 0 ]; then echo "failed: ${failed_names[*]}"; fi
echo "${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
