#!/usr/bin/env bash
# run_fuzz.sh — builds every fuzz/fuzz_*.c as a libFuzzer target (clang,
# -fsanitize=fuzzer,address,undefined) into build-fuzz/ and runs each for
# FUZZ_SECONDS (default 20) seconds on its seed corpus.
#
# A target lists the library sources it needs in a comment line
#     // FUZZ_SOURCES: src/model/safetensors.c src/base/error.c ...
# and optionally extra link flags in
#     // FUZZ_LIBS: -ljansson -lm
# (several lines of each are allowed).  Without FUZZ_SOURCES every src/*/*.c
# but src/main.c is compiled in and the full project link line is used.
# Seeds: fuzz/corpus/<target>/ (committed, read-only here); new inputs go to
# build-fuzz/corpus/<target>/, crashes to build-fuzz/artifacts/.  A dictionary
# fuzz/<target>.dict is used when present.
# Env: FUZZ_SECONDS, FUZZ_TARGETS="fuzz_config fuzz_x" (subset), CLANG,
# FUZZ_FLAGS (extra libFuzzer flags).  Exit status non-zero if any target
# fails to build or finds a crash.
set -u
cd "$(dirname "$0")/.."
CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
SECS=${FUZZ_SECONDS:-20}
OUT=build-fuzz
if [ -z "$CLANG" ]; then echo "run_fuzz: clang not found" >&2; exit 1; fi
mkdir -p "$OUT/corpus" "$OUT/artifacts"
MPI_CFLAGS=$(mpicc --showme:compile 2>/dev/null || true)
MPI_LIBS=$(mpicc --showme:link 2>/dev/null || true)
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -march=x86-64-v3 -Isrc -Itests -pthread \
 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $MPI_CFLAGS"
ALL_LIBS="-lmicrohttpd -ljansson -lpcre2-8 -ldnnl $MPI_LIBS -lm -pthread"

targets=()
for src in fuzz/fuzz_*.c; do
    [ -f "$src" ] || continue
    name=$(basename "$src" .c)
    if [ -n "${FUZZ_TARGETS:-}" ] && ! [[ " $FUZZ_TARGETS " == *" $name "* ]]; then continue; fi
    targets+=("$name")
done
if [ ${#targets[@]} -eq 0 ]; then echo "run_fuzz: no targets"; exit 0; fi

fail=0
summary=()
for name in "${targets[@]}"; do
    src=fuzz/$name.c
    srcs=$(sed -n 's#^// *FUZZ_SOURCES:##p' "$src" | tr '\n' ' ')
    libs=$(sed -n 's#^// *FUZZ_LIBS:##p' "$src" | tr '\n' ' ')
    if [ -z "${srcs// /}" ]; then
        srcs=$(ls src/*/*.c | grep -v '^src/main.c$' | tr '\n' ' ')
        libs="$libs $ALL_LIBS"
    fi
    [ -n "${libs// /}" ] || libs="-ljansson -lm -pthread"
    echo "== build $name"
    # shellcheck disable=SC2086
    if ! "$CLANG" $CFLAGS -o "$OUT/$name" "$src" $srcs $libs; then
        summary+=("$name: BUILD FAILED")
        fail=1
        continue
    fi
    mkdir -p "$OUT/corpus/$name"
    seeds=()
    [ -d "fuzz/corpus/$name" ] && seeds=("fuzz/corpus/$name")
    dict=()
    [ -f "fuzz/$name.dict" ] && dict=("-dict=fuzz/$name.dict")
    echo "== run $name for ${SECS}s"
    log="$OUT/$name.log"
    # shellcheck disable=SC2086
    "$OUT/$name" "$OUT/corpus/$name" "${seeds[@]}" "${dict[@]}" -max_total_time="$SECS" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OUT/artifacts/$name-" ${FUZZ_FLAGS:-} >"$log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1)
    if [ $rc -ne 0 ]; then
        fail=1
        tail -n 40 "$log"
        summary+=("$name: FAILED (rc $rc, see $log and $OUT/artifacts/)")
    else
        summary+=("$name: ok, ${runs:-?} runs, ${cov:-cov ?}, ${SECS}s")
    fi
done
printf '%s\n' "${summary[@]}"
exit $fail
