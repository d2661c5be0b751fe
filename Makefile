# streambp — build, test, demo.
#
#   make            build/streambp and build/libstreambp.a (float32 and float64 engines)
#   make demo       the three schedules on the bundled tiny Qwen3 model and batch
#   make test       the Check suite (make test SAN=1: the same under ASan + UBSan + LSan)
#   make fuzz       the libFuzzer targets of tests/fuzz, FUZZ_SECONDS each (clang)
#   make format     clang-format every C file
#   make deps       install missing build dependencies with apt-get (done by the targets above)
#
# The numeric code (src/kernels, src/engine) is compiled twice, with real = float and with
# real = double (-DSBP_REAL_F64). Each copy is linked into one relocatable object whose only
# global symbol is its entry point (sbp_engine_grad_f32 / _f64), so both live in one binary.
# No -ffast-math anywhere (no reassociation, NaN/Inf kept). GCC contracts a*b+c into FMA
# (-ffp-contract=fast, its default): exact IEEE operations, so results depend on the compiler
# and flags, but every schedule runs the same machine code and stays bit-identical.
# -fno-trapping-math (no FP trap handlers are installed) lets GCC vectorize selects.

CC       ?= gcc
ifeq ($(origin CC),default)
CC       := gcc
endif
SAN      ?= 0
WERROR   ?= 0
BUILD    := $(if $(filter 1,$(SAN)),build-san,build)

PKGS     := openblas check libcjson
DEB_PKGS := libopenblas-openmp-dev check libcjson-dev pkg-config
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)

SANFLAGS := -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
OPT      := $(if $(filter 1,$(SAN)),-O1 $(SANFLAGS),-O3)
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror)
CFLAGS   := -std=gnu11 -g -march=native -fopenmp -fno-trapping-math $(OPT) $(WARN) \
            $(if $(HAVE_PKGS),$(shell pkg-config --cflags $(PKGS)))
BLAS_DIR := $(if $(HAVE_PKGS),$(shell pkg-config --variable=libdir openblas))
LDLIBS   := $(if $(HAVE_PKGS),$(shell pkg-config --libs openblas libcjson)) -Wl,-rpath,$(BLAS_DIR) -lm
CHECK_LIBS := $(if $(HAVE_PKGS),$(shell pkg-config --libs check))
LDFLAGS  := -fopenmp $(if $(filter 1,$(SAN)),$(SANFLAGS))

COMMON_SRC := $(wildcard src/core/*.c src/io/*.c src/api/*.c)
NUM_SRC    := $(wildcard src/kernels/*.c src/engine/*.c)
CLI_SRC    := $(wildcard src/cli/*.c src/cli/verify/*.c)
VERIFY_SRC := $(wildcard verify/*.c)
REF_SRC    := $(wildcard ref/*.c)
TEST_SRC   := $(wildcard tests/test_*.c)

COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/common/%.o) $(VERIFY_SRC:%.c=$(BUILD)/common/%.o) \
              $(REF_SRC:%.c=$(BUILD)/common/%.o)
F32_OBJ    := $(NUM_SRC:%.c=$(BUILD)/f32/%.o)
F64_OBJ    := $(NUM_SRC:%.c=$(BUILD)/f64/%.o)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/common/%.o)
TESTS      := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

LIB        := $(BUILD)/libstreambp.a
BIN        := $(BUILD)/streambp

.PHONY: all deps demo test format clean check-deps bench bench-torch plots plants fuzz
all: deps
	@$(MAKE) --no-print-directory $(BIN) $(LIB)

# ---- dependencies -------------------------------------------------------------------------------

deps:
	@if pkg-config --exists $(PKGS) 2>/dev/null; then :; else \
	  echo "streambp: installing build dependencies: $(DEB_PKGS)"; \
	  $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    gcc make libc6-dev $(DEB_PKGS); fi

check-deps:
	@pkg-config --exists $(PKGS) || { echo "missing: $(PKGS) (run make deps)"; exit 2; }

# ---- objects ------------------------------------------------------------------------------------

$(BUILD)/common/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/f32/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/f64/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

# One relocatable object per precision; everything but the entry point becomes local.
$(BUILD)/engine_f32.o: $(F32_OBJ)
	$(LD) -r -o $@.tmp $^
	objcopy --keep-global-symbol=sbp_engine_grad_f32 $@.tmp $@
	@rm -f $@.tmp

$(BUILD)/engine_f64.o: $(F64_OBJ)
	$(LD) -r -o $@.tmp $^
	objcopy --keep-global-symbol=sbp_engine_grad_f64 $@.tmp $@
	@rm -f $@.tmp

$(LIB): $(COMMON_OBJ) $(BUILD)/engine_f32.o $(BUILD)/engine_f64.o
	@rm -f $@
	$(AR) rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

# ---- tests --------------------------------------------------------------------------------------
# Kernel tests link the float64 kernel objects directly (they are internal); the others use the
# library and the binary like any user would.

$(BUILD)/tests/%.o: tests/%.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

$(BUILD)/tests/test_%: $(BUILD)/tests/test_%.o $(BUILD)/tests/testutil.o $(F64_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

test: deps
	@$(MAKE) --no-print-directory $(BIN) $(TESTS) plants
	@STREAMBP=$(BIN) BUILD=$(BUILD) tests/run.sh $(TESTS)

# Binaries with one planted bug each, for tests/test_plant.c (tests/plant.sh lists them).
plants: $(BIN)
	@CC="$(CC)" CFLAGS="$(CFLAGS)" LDFLAGS="$(LDFLAGS)" LDLIBS="$(LDLIBS)" LD="$(LD)" \
	  BUILD=$(BUILD) OBJS="$(CLI_OBJ) $(COMMON_OBJ)" F32_OBJ="$(F32_OBJ)" tests/plant.sh

# ---- demo ---------------------------------------------------------------------------------------
# The bundled default: a seeded random Qwen3-tiny (tied embeddings, GQA 2:1, head_dim != C/NH)
# and a B=2, T=96 batch with left and right padding and prompt-masked labels.

DEMO_DIR   := $(BUILD)/demo
DEMO_MODEL := $(DEMO_DIR)/qwen3-tiny
DEMO_BATCH := data/batches/sft-demo.safetensors
DEMO_OPTS  := --block 16 --chunk 32 --logit-chunk 16 --threads 2

demo: all
	@$(BIN) init --config data/models/qwen3-tiny.json --seed 1 --out $(DEMO_MODEL) >/dev/null
	@for s in full ckpt stream; do \
	  echo "== $(BIN) grad --schedule $$s $(DEMO_OPTS)"; \
	  $(BIN) grad --model $(DEMO_MODEL) --batch $(DEMO_BATCH) --schedule $$s $(DEMO_OPTS) \
	    --out $(DEMO_DIR)/grad-$$s.safetensors || exit 1; echo; done
	@echo "== bitwise verdict: $(BIN) verify diff --bitwise <schedule> full"
	@for s in ckpt stream; do printf '%-7s ' "$$s:"; \
	  $(BIN) verify diff --bitwise $(DEMO_DIR)/grad-$$s.safetensors \
	    $(DEMO_DIR)/grad-full.safetensors | tail -2 | tr '\n' ' '; echo; done

# ---- benchmarks (not part of `make test`; they take minutes) -------------------------------------

BENCH_DIR := $(BUILD)/bench
PLAN_T    := 512 1024 2048 4096 8192 16384 32768 65536 131072 262144

bench: all
	@mkdir -p $(BENCH_DIR)
	$(BIN) bench | tee $(BENCH_DIR)/bench.txt
	$(BIN) bench --largest 768M | tee $(BENCH_DIR)/largest.txt
	$(BIN) plan --paper | tee $(BENCH_DIR)/paper.txt

bench-torch: all
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || { $(SUDO) apt-get install -y -q python3-torch; }
	/usr/bin/python3 verify/torch_bench.py --streambp $(BIN)

plots: all
	@command -v gnuplot >/dev/null || { $(SUDO) apt-get install -y -q gnuplot-nox; }
	@mkdir -p $(BENCH_DIR)
	$(BIN) bench --csv > $(BENCH_DIR)/bench.csv
	@for T in $(PLAN_T); do $(BIN) plan --config data/models/bench.json --seq $$T --csv | tail -n +2; done > $(BENCH_DIR)/plan-bench.csv
	@for T in $(PLAN_T); do $(BIN) plan --config data/configs/qwen3-8b.json --storage bf16 --seq $$T --csv | tail -n +2; done > $(BENCH_DIR)/plan-qwen3-8b.csv
	cp $(BENCH_DIR)/bench.csv $(BENCH_DIR)/plan-bench.csv $(BENCH_DIR)/plan-qwen3-8b.csv data/plots/
	gnuplot -e "dir='data/plots'; out='data/plots'" data/plots/plots.gp
	@echo "wrote data/plots/*.png from the CSV files beside them"

# ---- fuzzing (libFuzzer with clang; not part of make test) ---------------------------------------
# make fuzz builds tests/fuzz/fuzz_<target> against src/core and src/io with ASan and UBSan, and
# runs each for FUZZ_SECONDS from its committed corpus (tests/fuzz/corpus/<target>); new inputs go
# to build-fuzz/corpus/<target>, findings (crash-*, leak-*, timeout-*) to build-fuzz/. CI runs it
# for a short fixed time. Needs clang and libclang-rt-14-dev (Debian 12).

FUZZ_TARGETS := safetensors config batch index
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined $(if $(HAVE_PKGS),$(shell pkg-config --cflags libcjson))
FUZZ_OBJ     := $(patsubst %.c,build-fuzz/obj/%.o,$(wildcard src/core/*.c src/io/*.c))

build-fuzz/obj/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) \
	  $(if $(HAVE_PKGS),$(shell pkg-config --libs libcjson)) -lm

fuzz: deps
	@$(FUZZ_CC) --version >/dev/null 2>&1 || { echo "make fuzz needs clang"; exit 2; }
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=4096 \
	    -artifact_prefix=build-fuzz/ -print_final_stats=1 \
	    build-fuzz/corpus/$$t tests/fuzz/corpus/$$t 2>build-fuzz/$$t.log || \
	    { tail -60 build-fuzz/$$t.log; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|Done' build-fuzz/$$t.log | tail -2; done

# ---- housekeeping -------------------------------------------------------------------------------

FORMAT_SRC := $(shell find src ref tests verify cuda -name '*.[ch]' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD) build-fuzz -name '*.d' 2>/dev/null)
