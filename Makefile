# moeserve — one plain GNU Makefile.  `make help` lists the targets.
#
# Sources are found by wildcard: every src/**/*.c except src/main.c goes into
# build/libmoeserve.a; src/main.c links it into build/moeserve; every
# tests/test_*.c becomes build/tests/test_*; every bench/bench_*.c becomes
# build/bench/bench_*.  Flags: SANITIZE=1 (ASan+UBSan), DEBUG=1 (-O0 -g),
# WERROR=1 (-Werror, set by CI), NATIVE=0 (portable x86-64-v3 baseline; AVX-512
# kernels are always chosen at run time by CPU feature checks).

CC      ?= gcc
ifeq ($(origin CC),default)
CC      := gcc
endif
BUILD   ?= build
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter \
               -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Isrc -pthread \
               -march=x86-64-v3 -mtune=native $(MPI_CFLAGS)
ifeq ($(DEBUG),1)
OPT := -O0 -g3
else
OPT := -O2 -g
endif
ifeq ($(SANITIZE),1)
OPT += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
BUILD := build-san
endif
ifeq ($(WERROR),1)
CFLAGS_BASE += -Werror
endif
CFLAGS  := $(CFLAGS_BASE) $(OPT) $(EXTRA_CFLAGS)
LDLIBS  := -lcurl -lmicrohttpd -ljansson -lpcre2-8 -ldnnl $(MPI_LIBS) -lm -pthread $(LDSAN)

LIB_SRC   := $(filter-out src/main.c,$(wildcard src/*/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
DEPS      := $(LIB_OBJ:.o=.d) $(BUILD)/src/main.d

.PHONY: all run train test bench fmt fmt-check clean help fuzz
all: $(BUILD)/moeserve $(TEST_BIN) $(BENCH_BIN)

help:
	@echo "make            build build/moeserve, tests and benchmarks"
	@echo "make run        build, serve models/small-code (the trained model), send a chat and a completion"
	@echo "make train      retrain models/small-code (tools/train/; Debian's python3 + torch, ~5-25 min)"
	@echo "make test       run every test (prints N passed, N failed)"
	@echo "make bench      run the benchmarks, results under bench/"
	@echo "make fuzz       build the libFuzzer targets (clang) and run each briefly"
	@echo "make fmt        clang-format the sources;  make fmt-check  checks only"
	@echo "make clean      remove build outputs"
	@echo "flags: SANITIZE=1 DEBUG=1 WERROR=1"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libmoeserve.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/moeserve: $(BUILD)/src/main.o $(BUILD)/libmoeserve.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/harness.h $(BUILD)/libmoeserve.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libmoeserve.a $(LDLIBS)

# the allocation-counting test wraps the allocator (see tests/test_noalloc.c)
$(BUILD)/tests/test_noalloc: tests/test_noalloc.c tests/harness.h $(BUILD)/libmoeserve.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libmoeserve.a $(LDLIBS) \
	    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=posix_memalign

$(BUILD)/bench/%: bench/%.c $(BUILD)/libmoeserve.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libmoeserve.a $(LDLIBS)

test: $(BUILD)/moeserve $(TEST_BIN)
	@BUILD=$(BUILD) tests/run_tests.sh

bench: $(BUILD)/moeserve $(BENCH_BIN)
	@BUILD=$(BUILD) bench/run_bench.sh

run: $(BUILD)/moeserve
	@BUILD=$(BUILD) tools/run_demo.sh

# the committed checkpoint's recipe (tools/train/README.md); passive OpenMP
# waits only change the speed on a shared machine, not the result
train: $(BUILD)/moeserve
	OMP_WAIT_POLICY=passive /usr/bin/python3 tools/train/train.py --moeserve $(BUILD)/moeserve \
	    --work $(BUILD)/train --out $(BUILD)/train/base --manifest models/small-code/manifest.tsv
	OMP_WAIT_POLICY=passive /usr/bin/python3 tools/train/finetune_ul.py --model $(BUILD)/train/base \
	    --out models/small-code --ids $(BUILD)/train/train.bin --updates 64 --bul 32 --gen 64 \
	    --prefix 16 --prefix-min 4 --line-start --lr 3e-4 --lr-floor 0.1 --alpha 2 --threads 1

fuzz:
	@tools/run_fuzz.sh

FMT_FILES := $(wildcard src/*/*.c src/*/*.h src/*.c tests/*.c tests/*.h bench/*.c fuzz/*.c)
fmt:
	clang-format -i $(FMT_FILES)
fmt-check:
	clang-format --dry-run -Werror $(FMT_FILES)

clean:
	rm -rf build build-san build-fuzz

-include $(DEPS)
