# streambp — build, test, demo.
#
#   make            build/streambp and build/libstreambp.a (float32 and float64 engines)
#   make demo       the three schedules on the bundled tiny Qwen3 model and batch
#   make train-demo 50 training steps with full, ckpt and stream, and a kill + resume: byte for byte
#   make test       the Check suite (make test SAN=1: the same under ASan + UBSan + LSan)
#   make fuzz       the libFuzzer targets of tests/fuzz, FUZZ_SECONDS each (clang)
#   make format     clang-format every C file
#   make deps       install missing build dependencies with apt-get (done by the targets above)
#
# The numeric code (src/kernels, src/engine) is compiled twice, with real = float and with
# real = double (-DSBP_REAL_F64). Each copy is linked into one relocatable object whose only
# global symbols are its entry points (sbp_engine_grad_f32 / _f64 and the portable product), so
# both live in one binary.
# No -ffast-math anywhere (no reassociation, NaN/Inf kept) and no contraction
# (-ffp-contract=off): a fused multiply-add happens where the source writes fma() and nowhere
# else, so the portable numerics give the same bits with any compiler (docs/numerics.md §2).
# -fno-trapping-math (no FP trap handlers are installed) lets GCC vectorize selects.
# -mprefer-vector-width=512: where the target has AVX-512, GCC otherwise vectorizes with 256-bit
# registers, and the portable product's register tile (gemm.c, then 8 × 32) spilled to the
# stack; 512-bit lanes run the same per-element operations, so no bit changes (golden digests).

CC       ?= gcc
ifeq ($(origin CC),default)
CC       := gcc
endif
SAN      ?= 0
COV      ?= 0
WERROR   ?= 0
ARCH     ?= native
BUILD    ?= $(if $(filter 1,$(SAN)),build-san,$(if $(filter 1,$(COV)),build-cov,build))

PKGS     := openblas check libcjson libcrypto
DEB_PKGS := libopenblas-openmp-dev check libcjson-dev libssl-dev pkg-config g++
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)

# float-cast-overflow (a double outside the integer type's range converted to it: undefined) is
# not part of -fsanitize=undefined in GCC or clang; both have it, so it is named here.
SANFLAGS := -fsanitize=address -fsanitize=undefined -fsanitize=float-cast-overflow \
            -fno-sanitize-recover=undefined,float-cast-overflow -fno-omit-frame-pointer
# COV=1 (make coverage): clang's source-based coverage, whose counters cost the numeric code
# about 1.7x where gcov's cost 8-12x (docs/verify.md#coverage).
COVFLAGS := -fprofile-instr-generate -fcoverage-mapping
OPT      := $(if $(filter 1,$(SAN)),-O1 $(SANFLAGS),-O3 $(if $(filter 1,$(COV)),$(COVFLAGS)))
VECW     := -mprefer-vector-width=512
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror)
CFLAGS   := -std=gnu11 -g -march=$(ARCH) -fopenmp -ffp-contract=off -fno-trapping-math $(VECW) $(OPT) $(WARN) \
            $(if $(HAVE_PKGS),$(shell pkg-config --cflags $(PKGS)))
BLAS_DIR := $(if $(HAVE_PKGS),$(shell pkg-config --variable=libdir openblas))
LDLIBS   := $(if $(HAVE_PKGS),$(shell pkg-config --libs openblas libcjson libcrypto)) -Wl,-rpath,$(BLAS_DIR) -lm
CHECK_LIBS := $(if $(HAVE_PKGS),$(shell pkg-config --libs check))
LDFLAGS  := -fopenmp $(if $(filter 1,$(SAN)),$(SANFLAGS)) $(if $(filter 1,$(COV)),$(COVFLAGS))

# MPI (src/dist, docs/distributed.md): found like nvcc: mpicc on the PATH builds src/dist/mpi.c
# with its flags (only that file), MPI=0 skips it, MPI=1 requires it; without it src/dist/none.c
# (one process) takes its place, so nothing else changes.
MPICC    ?= $(shell command -v mpicc 2>/dev/null)
MPI      ?= $(if $(and $(MPICC),$(wildcard src/dist/mpi.c)),1,0)
ifeq ($(MPI),1)
ifeq ($(MPICC),)
$(error MPI=1 but no mpicc: apt-get install openmpi-bin libopenmpi-dev, or MPI=0)
endif
MPI_CFLAGS := $(shell $(MPICC) --showme:compile)
MPI_LIBS   := $(shell $(MPICC) --showme:link)
endif
DIST_SRC := $(filter-out src/dist/mpi.c src/dist/none.c,$(wildcard src/dist/*.c)) \
            src/dist/$(if $(filter 1,$(MPI)),mpi,none).c

COMMON_SRC := $(wildcard src/core/*.c src/io/*.c src/api/*.c src/train/*.c src/bench/*.c) $(DIST_SRC)
NUM_SRC    := $(wildcard src/kernels/*.c src/kernels/fast/*.c src/engine/*.c src/engine/*/*.c)
CLI_SRC    := $(wildcard src/cli/*.c)
VERIFY_SRC := $(wildcard verify/*.c)
REF_SRC    := $(wildcard ref/*.c)
TEST_SRC   := $(wildcard tests/test_*.c)

COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/common/%.o) $(VERIFY_SRC:%.c=$(BUILD)/common/%.o) \
              $(REF_SRC:%.c=$(BUILD)/common/%.o)
F32_OBJ    := $(NUM_SRC:%.c=$(BUILD)/f32/%.o)
F64_OBJ    := $(NUM_SRC:%.c=$(BUILD)/f64/%.o)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/common/%.o) $(BUILD)/gen/golden_data.o
# The command line (src/cli) names the verifier's headers from the top of the tree:
# #include "verify/matrix.h".
$(CLI_SRC:%.c=$(BUILD)/common/%.o): CFLAGS += -I.
TESTS      := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

LIB        := $(BUILD)/libstreambp.a
BIN        := $(BUILD)/streambp

.PHONY: all deps demo train-demo test format clean check-deps bench bench-torch bench-blas plots bench-compare \
        portable-builds portable-golden golden plants fuzz linkcheck doctest test-avx2 bench-pgemm
# build/accuracy too: run by hand (docs/accuracy.md), it must not lag the library it measures
all: deps
	@$(MAKE) --no-print-directory $(BIN) $(LIB) $(BUILD)/accuracy

# ---- dependencies -------------------------------------------------------------------------------

deps:
	@if pkg-config --exists $(PKGS) 2>/dev/null; then :; else \
	  echo "streambp: installing build dependencies: $(DEB_PKGS)"; \
	  $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    gcc make libc6-dev $(DEB_PKGS); fi

# The CUDA toolkit the GPU build needs, when nvcc is there (CUDA=0, or no nvcc: the GPU build is
# skipped, and the emulator needs only g++): nvcc 11 or newer and the static runtime it links.
deps: cuda-deps
.PHONY: cuda-deps
cuda-deps:
	@if [ "$(CUDA)" != 1 ]; then echo "streambp: no nvcc (or CUDA=0): the GPU build is skipped"; \
	else v=$$($(NVCC) --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p'); \
	  [ -n "$$v" ] && [ "$$v" -ge 11 ] || { echo "streambp: $(NVCC) is CUDA $${v:-?}; 11 or newer needed (or CUDA=0)"; exit 2; }; \
	  [ -e "$(CUDA_HOME)/lib64/libcudart_static.a" ] || [ -e "$(CUDA_HOME)/lib/libcudart_static.a" ] || \
	    { echo "streambp: missing $(CUDA_HOME)/lib64/libcudart_static.a (the CUDA runtime; or CUDA=0)"; exit 2; }; fi

check-deps:
	@pkg-config --exists $(PKGS) || { echo "missing: $(PKGS) (run make deps)"; exit 2; }

# ---- objects ------------------------------------------------------------------------------------

$(BUILD)/common/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/common/src/dist/mpi.o: CFLAGS += $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)

$(BUILD)/f32/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/f64/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

# The golden cases built into the binary for `streambp verify golden`: the digests, the configs
# of the families they name and the tiny batches (src/cli/golden_embed.sh).
# The long cases (data/golden/long/cases, verify/golden.h) add their manifest, digests, configs and
# batches.
GOLDEN_LONG  := $(shell awk -F'|' '!/^ *(\#|$$)/ { gsub(/ /, ""); \
                  print "data/models/" $$2 ".json"; print "data/batches/" $$3 ".safetensors" }' \
                  data/golden/long/cases | sort -u)
GOLDEN_FILES := $(wildcard data/golden/*.txt) \
                $(sort $(foreach g,$(wildcard data/golden/*.txt),$(wildcard data/models/$(word 1,$(subst -sft-, ,$(subst -dpo-, ,$(subst -grpo-, ,$(notdir $(g)))))).json))) \
                data/batches/sft-tiny.safetensors data/batches/dpo-tiny.safetensors \
                data/batches/grpo-tiny.safetensors \
                data/golden/long/cases $(wildcard data/golden/long/*.txt) $(GOLDEN_LONG)

$(BUILD)/gen/golden_data.c: $(GOLDEN_FILES) src/cli/golden_embed.sh
	@mkdir -p $(dir $@)
	src/cli/golden_embed.sh $@ $(GOLDEN_FILES)

$(BUILD)/gen/golden_data.o: $(BUILD)/gen/golden_data.c src/cli/golden_data.h
	$(CC) $(CFLAGS) -Isrc/cli -c $< -o $@

# One relocatable object per precision; everything but the entry points becomes local (the
# planted binaries' engines too, tests/plant.sh).
ENGINE_KEEP = $(foreach f,sbp_engine_grad sbp_portable_gemm sbp_engine_seq_grain,--keep-global-symbol=$(f)_$(1))
$(BUILD)/engine_f32.o: $(F32_OBJ)
	$(LD) -r -o $@.tmp $^
	objcopy $(call ENGINE_KEEP,f32) $@.tmp $@
	@rm -f $@.tmp

$(BUILD)/engine_f64.o: $(F64_OBJ)
	$(LD) -r -o $@.tmp $^
	objcopy $(call ENGINE_KEEP,f64) $@.tmp $@
	@rm -f $@.tmp

$(LIB): $(COMMON_OBJ) $(BUILD)/engine_f32.o $(BUILD)/engine_f64.o
	@rm -f $@
	$(AR) rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

# The distributed failure tests' build of the command (tests/faults.c, tests/mpi_ranks.sh): the
# linker routes every call of the library to an engine entry point through tests/faults.c, which
# plants a dead, silent or non-finite rank where SBP_FAULT says. The library has no test hook.
FAULTS_BIN := $(BUILD)/tests/streambp-faults
$(FAULTS_BIN): $(CLI_OBJ) $(LIB) $(BUILD)/tests/faults.o
	$(CC) $(LDFLAGS) -Wl,--wrap=sbp_engine_grad_f32,--wrap=sbp_engine_grad_f64 -o $@ \
	  $(CLI_OBJ) $(BUILD)/tests/faults.o $(LIB) $(LDLIBS)

# ---- tests --------------------------------------------------------------------------------------
# Kernel tests link the float64 kernel objects directly (they are internal); the others use the
# library and the binary like any user would.

$(BUILD)/tests/%.o: tests/%.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

$(BUILD)/tests/test_%: $(BUILD)/tests/test_%.o $(BUILD)/tests/testutil.o $(F64_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# make test SUITES="io train emu": only those suites (tests/test_<name>.c, emu = the emulator's own
# test); every suite otherwise. The golden digests of the other builds run with the full set only.
# tests/run.sh then runs the Python helper's tests (python/tests, with Debian's python3-torch and
# python3-pytest when installed); the reruns of test_golden with other binaries leave them out.
RUN_TESTS = $(if $(SUITES),$(filter $(addprefix %/test_,$(SUITES)),$(TESTS)),$(TESTS))
# tests/mpi_ranks.sh (mpirun): with every suite, or SUITES naming dist (test_dist, the protocol, too)
RUN_DIST  = $(if $(SUITES),$(filter dist,$(SUITES)),1)
# With every suite the C bench program outside `all` (bench/pgemm_rates.c) is built too: it links
# against kernel internals, and an interface change had broken it unseen.

# The builds `make test` needs run on every core when the command line gave no -j (README's `make
# test`: a clean clone's took 11 min 22 s with one compile at a time on 2 vCPUs, 2026-12-06).
JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc))

# tests/mpi_ranks.sh, whose ranks mostly wait (on mpirun's start-ups and each other: about 50 s of
# CPU in its 215 s on the Zen 3 VM, 2026-12-07), runs beside the suites that share the cores
# (tests/run.sh's SBP_BESIDE) on the plain build, and after the suites under the sanitizers, where
# its timed fault checks get the cores to themselves. After the suites, the doc-tests; beside
# them, one job after another, the golden digests on the CUDA kernels in the SIMT emulator (one
# core, 49-61 s on the Zen 3 VM), the portable builds and their golden digests (side by side,
# 35-36 and 47-53 s). Their output follows, and any of them failing fails the target.
MPI_RANKS = echo "== tests/mpi_ranks.sh (mpirun)"; STREAMBP=$(BIN) FAULTS=$(FAULTS_BIN) \
  SBP_SAN=$(SAN) tests/mpi_ranks.sh
MPI_BESIDE = $(and $(RUN_DIST),$(filter 1,$(MPI)),$(filter 0,$(SAN)),1)
test: deps $(if $(SUITES),,linkcheck)
	@$(MAKE) --no-print-directory $(JOBS) $(BIN) $(RUN_TESTS) $(if $(filter %/test_plant %/test_selftest %/test_reach,$(RUN_TESTS)),plants) \
	  $(if $(SUITES),,$(BUILD)/bench/pgemm_rates) $(if $(and $(RUN_DIST),$(filter 1,$(MPI))),$(FAULTS_BIN))
	@STREAMBP=$(BIN) BUILD=$(BUILD) $(if $(MPI_BESIDE),SBP_BESIDE='$(MPI_RANKS)') tests/run.sh $(RUN_TESTS)
	@rc=0 bg= log=; \
	if [ "$(SAN)$(SUITES)" = 0 ]; then log=$$(mktemp) || exit 1; \
	  ( r=0; echo "== golden digests on the CUDA kernels in the SIMT emulator, shuffled thread order"; \
	    SBP_GOLDEN_DEVICE=cuda-emu SBP_EMU_ORDER=shuffle:7 STREAMBP=$(BIN) SBP_PYTHON_TESTS=0 \
	      tests/run.sh $(BUILD)/tests/test_golden || r=1; \
	    $(MAKE) --no-print-directory portable-golden || r=1; exit $$r ) >"$$log" 2>&1 & bg=$$!; fi; \
	if [ -n "$(RUN_DIST)" ] && [ -z "$(MPI_BESIDE)" ]; then if [ "$(MPI)" = 1 ]; then \
	  $(MPI_RANKS) || rc=1; else echo "== tests/mpi_ranks.sh: skipped (no MPI)"; fi; fi; \
	if [ -n "$$bg" ]; then $(MAKE) --no-print-directory doctest || rc=1; \
	  echo "== run beside $(if $(MPI_BESIDE),,tests/mpi_ranks.sh and )the doc-tests:"; \
	  wait $$bg || rc=1; cat "$$log"; rm -f "$$log"; fi; \
	exit $$rc

# Every relative markdown link and every docs/<page>.md §N or docs/<page>.md#anchor citation
# in the tree resolves, nothing cites a document outside the repository, and each fact of
# tests/facts.txt is spelled out only in its home (tests/linkcheck.py; docs/README.md says how §
# numbers map to headings). Python 3 standard library only. Part of
# the whole `make test` (not of `make test SUITES=...`).
linkcheck:
	@python3 tests/linkcheck.py

# Every ```sh block of README.md and docs/*.md runs as written (from the repository root, each
# page in a scratch directory that stands for /tmp/), and the numbers the pages quote from a
# command are the ones it prints (tests/doctest.py; its markers skip blocks that need torch, a
# GPU or minutes, with the reason printed). Blocks name build/streambp, so it checks the plain
# build; part of the whole `make test` without SAN (not of `make test SUITES=...`).
doctest:
	@$(MAKE) --no-print-directory $(JOBS) BUILD=build build/streambp
	@echo "== tests/doctest.py (README.md, docs/*.md)"
	@python3 tests/doctest.py

# ---- portable numerics: the same digests from other compilers and instruction sets --------------
# The sources built a second time with clang and a third time for baseline x86-64 (SSE2 only:
# no AVX, no hardware FMA, so fma() runs in software); `make test` checks that both give the
# golden digests of data/golden/. `make golden` rewrites those (a deliberate change of the
# portable arithmetic only).

PORTABLE_BUILDS := build-clang build-x86-64

portable-builds:
	@command -v clang >/dev/null || { $(SUDO) apt-get install -y -q --no-install-recommends clang libomp-dev; }
	@$(MAKE) --no-print-directory $(JOBS) BUILD=build-clang CC=clang EMU=0 build-clang/streambp
	@$(MAKE) --no-print-directory $(JOBS) BUILD=build-x86-64 ARCH=x86-64 EMU=0 build-x86-64/streambp

# Both builds' golden digests, side by side (one core each).
portable-golden: portable-builds
	@rc=0 pids= logs=$$(mktemp -d) || exit 1; \
	for b in $(PORTABLE_BUILDS); do \
	  STREAMBP=$$b/streambp SBP_PYTHON_TESTS=0 tests/run.sh $(BUILD)/tests/test_golden \
	    >"$$logs/$$b" 2>&1 & pids="$$pids $$!"; done; \
	for p in $$pids; do wait $$p || rc=1; done; \
	for b in $(PORTABLE_BUILDS); do cat "$$logs/$$b"; done; rm -rf "$$logs"; exit $$rc

# The AVX2 + FMA path (gemm.c's AVX2 micro-kernel and packs, tile_mm.c's AVX2 branch) on an
# x86 with AVX2 and AVX-512 (without AVX-512, make test's native build is that path): the tree
# built for x86-64-v3 into build-avx2 (checked to hold no AVX-512 instruction), then the suites that pin its bits: the golden digests (the
# same as every other build's), the schedules, the kernels and the product against the scalar
# chains (test_pgemm, and the fast mode's folded product, test_pgemmfold), the portable
# attention's per-tile output (test_attnout), and the fast mode's gradients against a float64
# truth within their bounds (test_accuracy: the AVX2 products and key-tile transposes computing
# the right thing, which bitwise agreement between schedules alone would not show). Part of CI.
# The Python helper's tests ran with the main build's binary; not again here (SBP_PYTHON_TESTS=0).
AVX2_BUILD := build-avx2
test-avx2:
	@if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then \
	  echo "test-avx2: skipped (this CPU has no AVX2 + FMA)"; exit 0; fi; \
	if ! grep -qw avx512f /proc/cpuinfo; then \
	  echo "test-avx2: skipped (no AVX-512 here: make test's native build already ran the AVX2 path)"; exit 0; fi; \
	$(MAKE) --no-print-directory BUILD=$(AVX2_BUILD) ARCH=x86-64-v3 $(AVX2_BUILD)/streambp && \
	if objdump -d $(AVX2_BUILD)/streambp | grep -q zmm; then \
	  echo "test-avx2: $(AVX2_BUILD)/streambp holds AVX-512 instructions"; exit 1; fi && \
	SBP_PYTHON_TESTS=0 $(MAKE) --no-print-directory BUILD=$(AVX2_BUILD) ARCH=x86-64-v3 test \
	  SUITES="golden schedules kernels pgemm pgemmfold attnout accuracy vexp vtanh"

golden: all
	@$(MAKE) --no-print-directory $(BUILD)/tests/test_golden
	SBP_GOLDEN_UPDATE=1 STREAMBP=$(BIN) tests/run.sh $(BUILD)/tests/test_golden

# Binaries with one planted bug each, for tests/test_plant.c, test_selftest.c and test_reach.c
# (tests/plant.sh lists them).
plants: $(BIN)
	@CC="$(CC)" CFLAGS="$(CFLAGS)" LDFLAGS="$(LDFLAGS)" LDLIBS="$(LDLIBS)" LD="$(LD)" \
	  BUILD=$(BUILD) OBJS="$(CLI_OBJ) $(COMMON_OBJ) $(BACKEND_OBJ)" F32_OBJ="$(F32_OBJ)" \
	  ENGINE_KEEP="$(call ENGINE_KEEP,f32)" tests/plant.sh

# ---- demo ---------------------------------------------------------------------------------------
# The bundled default: a seeded random Qwen3-tiny (tied embeddings, GQA 2:1, head_dim != C/NH)
# and a B=2, T=96 batch with left and right padding and prompt-masked labels.

DEMO_DIR   := $(BUILD)/demo
DEMO_MODEL := $(DEMO_DIR)/qwen3-tiny
DEMO_BATCH := data/batches/sft-demo.safetensors
DEMO_OPTS  := --block 16 --chunk 32 --logit-chunk 16 --threads 2

# Recipes that pipe a command's output through tail/tee/tr run under bash -o pipefail, so the
# command's failure fails the target (a non-bitwise demo verdict once printed FAIL and exited 0).
demo bench bench-blas plots: SHELL := /bin/bash
demo bench bench-blas plots: .SHELLFLAGS := -o pipefail -c

demo: all
	@$(BIN) init --config data/models/qwen3-tiny.json --seed 1 --out $(DEMO_MODEL) --force >/dev/null
	@for s in full ckpt stream; do \
	  echo "== $(BIN) grad --schedule $$s $(DEMO_OPTS)"; \
	  $(BIN) grad --model $(DEMO_MODEL) --batch $(DEMO_BATCH) --schedule $$s $(DEMO_OPTS) \
	    --out $(DEMO_DIR)/grad-$$s.safetensors || exit 1; echo; done
	@echo "== bitwise verdict: $(BIN) verify diff --bitwise <schedule> full"
	@for s in ckpt stream; do printf '%-7s ' "$$s:"; \
	  $(BIN) verify diff --bitwise $(DEMO_DIR)/grad-$$s.safetensors \
	    $(DEMO_DIR)/grad-full.safetensors | tail -2 | tr '\n' ' ' || exit 1; echo; done

# ---- training demo -------------------------------------------------------------------------------
# 50 AdamW steps of the tiny Qwen3 on data/train/counting.jsonl with each schedule, then a stream
# run killed with SIGKILL after its checkpoint at step 20 and resumed with ckpt: the weights and the
# loss log must be the same bytes every time.

TRAIN_DIR  := $(BUILD)/train-demo
TRAIN_OPTS := --model $(TRAIN_DIR)/model --jsonl data/train/counting.jsonl --seq 64 --batch-size 4 \
              --steps 50 --lr 1e-2 --warmup-steps 5 --shuffle --weight-decay 0.01 --block 16 \
              --chunk 32 --logit-chunk 16 --threads 2

train-demo: all
	@rm -rf $(TRAIN_DIR)
	@$(BIN) init --config data/models/qwen3-tiny.json --seed 1 --out $(TRAIN_DIR)/model >/dev/null
	@for s in full ckpt stream; do echo "== $(BIN) train --schedule $$s --out $(TRAIN_DIR)/$$s"; \
	  $(BIN) train $(TRAIN_OPTS) --schedule $$s --out $(TRAIN_DIR)/$$s --log-every 10 \
	    $$([ $$s = full ] && echo --plot) >/dev/null || exit 1; done
	@echo "== stream with --save-every 5, killed (SIGKILL) after checkpoint-20, resumed with ckpt"
	@d=$(TRAIN_DIR)/killed; $(BIN) train $(TRAIN_OPTS) --schedule stream --out $$d --save-every 5 \
	  >/dev/null 2>&1 & pid=$$!; \
	while [ ! -f $$d/checkpoint-20/trainer_state.json ] && kill -0 $$pid 2>/dev/null; do sleep 0.01; done; \
	kill -9 $$pid 2>/dev/null; wait $$pid 2>/dev/null; \
	echo "   killed after $$(($$(wc -l < $$d/loss.csv) - 1)) logged steps; resuming"; \
	$(BIN) train $(TRAIN_OPTS) --schedule ckpt --out $$d --save-every 5 --resume $$d >/dev/null 2>&1 || exit 1
	@echo "== byte-identical to full (cmp model.safetensors, loss.csv)"
	@for r in ckpt stream killed; do \
	  if cmp -s $(TRAIN_DIR)/full/model.safetensors $(TRAIN_DIR)/$$r/model.safetensors && \
	     cmp -s $(TRAIN_DIR)/full/loss.csv $(TRAIN_DIR)/$$r/loss.csv; \
	  then echo "   $$r: identical"; else echo "   $$r: DIFFERENT"; exit 1; fi; done
	@awk -F, 'NR == 2 {a = $$3} END {printf "   loss %.4f at step 1, %.4f at step %d\n", a, $$3, $$1}' \
	  $(TRAIN_DIR)/full/loss.csv

# ---- benchmarks (not part of `make test`; they take minutes) -------------------------------------

BENCH_DIR := $(BUILD)/bench
PLAN_T    := 512 1024 2048 4096 8192 16384 32768 65536 131072 262144

bench: all
	@mkdir -p $(BENCH_DIR)
	$(BIN) bench | tee $(BENCH_DIR)/bench.txt
	$(BIN) bench --largest 768M | tee $(BENCH_DIR)/largest.txt
	$(BIN) plan --paper | tee $(BENCH_DIR)/paper.txt

# Data parallel over processes (docs/distributed.md): 1 process x 2 threads against mpirun -np 2
# x 1 thread, the bench model, 4 micro-batches a step of T = $(T) tokens (default 512).
# Sequence parallel (docs/distributed.md §8): 2 processes x 1 thread sharing one sequence of T
# tokens (--seq-ranks 2) against 1 process x 2 threads, the bench model, stream; SEQ_T="8192
# 16384" for more lengths (default 8192), ROUNDS=2 interleaved rounds.
.PHONY: bench-dist bench-seq
bench-dist: MPI_BENCH = bench/dist.sh $(BIN) $(BENCH_DIR)/dist $(or $(T),512)
bench-seq: MPI_BENCH = bench/seq.sh $(BIN) $(BENCH_DIR)/seq $(or $(SEQ_T),8192)
bench-dist bench-seq: SHELL := /bin/bash
bench-dist bench-seq: .SHELLFLAGS := -o pipefail -c
bench-dist bench-seq: all
	@[ "$(MPI)" = 1 ] || { echo "$@: this build has no MPI (apt-get install openmpi-bin libopenmpi-dev)"; exit 2; }
	@mkdir -p $(BENCH_DIR)
	$(MPI_BENCH) | tee $(BENCH_DIR)/$(@:bench-%=%).txt

# Float32 accuracy against a float64 truth, per tensor (docs/accuracy.md, bench/accuracy.c):
# qwen3, qwen2, llama3, gemma3 at T = 512, 2048, 8192 (about 6 minutes); ACC_SEQ=512,...,32768
# adds the long ones (T = 32768: about 30 minutes a family on a loaded 2-vCPU machine). With the
# HF venv (ACC_PY), torch float32's errors come first (python/tests/accuracy_torch.py) and the
# table adds the ratios ours / torch.
ACC_SEQ ?= 512,2048,8192
ACC_PY  ?= $(BUILD)/torch-venv/bin/python
# ACC_TORCH_ARGS=--rope64: torch float32 with float64 rotary tables (docs/accuracy.md);
# ACC_ARGS=--wide: the measuring models at a real model's widths (hidden 1024, F 3072, head_dim 128)
ACC_TORCH_ARGS ?=
ACC_ARGS ?=
.PHONY: accuracy
accuracy: SHELL := /bin/bash
accuracy: .SHELLFLAGS := -o pipefail -c
accuracy: $(BUILD)/accuracy
	@mkdir -p $(BENCH_DIR)
	@if [ -x "$(ACC_PY)" ] && "$(ACC_PY)" -c 'import torch, transformers' 2>/dev/null; then \
	  $(BUILD)/accuracy --write-models $(BENCH_DIR)/accuracy-models $(ACC_ARGS) && \
	  "$(ACC_PY)" python/tests/accuracy_torch.py $(BENCH_DIR)/accuracy-models --seq $(ACC_SEQ) \
	    $(ACC_TORCH_ARGS) --out $(BENCH_DIR)/accuracy-torch.txt && torch="--torch $(BENCH_DIR)/accuracy-torch.txt"; \
	else echo "accuracy: no torch at $(ACC_PY): the torch column is left out"; fi; \
	$(BUILD)/accuracy --seq $(ACC_SEQ) $(ACC_ARGS) $$torch | tee $(BENCH_DIR)/accuracy.txt

# The same over ACC_SEEDS draws of the weights and tokens (python/tests/accuracy_seeds.py; needs the
# HF venv): each tensor's error as the RMS over the draws, ours / torch's per tensor. One draw's
# largest ratio is the largest of many noisy ones (docs/accuracy.md, "Over several draws");
# e.g. make accuracy-seeds ACC_SEQ=512,4096 ACC_TORCH_ARGS=--rope64 (8 draws: 4 minutes)
ACC_SEEDS ?= 8
.PHONY: accuracy-seeds
accuracy-seeds: $(BUILD)/accuracy
	@mkdir -p $(BENCH_DIR)
	@"$(ACC_PY)" -c 'import torch, transformers' 2>/dev/null || \
	  { echo "accuracy-seeds: needs torch and transformers at $(ACC_PY) (make bench-torch installs them)"; exit 2; }
	"$(ACC_PY)" python/tests/accuracy_seeds.py --accuracy $(BUILD)/accuracy --seeds $(ACC_SEEDS) \
	  --seq $(ACC_SEQ) $(ACC_ARGS) $(ACC_TORCH_ARGS) --out $(BENCH_DIR)/accuracy-seeds.txt

$(BUILD)/accuracy: bench/accuracy.c bench/accuracy.h $(LIB)
	$(CC) $(CFLAGS) -o $@ bench/accuracy.c $(LIB) $(LDFLAGS) $(LDLIBS)

# PyTorch 2.x and HF transformers from PyPI in a venv (what users run); Debian's torch 1.13 when
# PyPI cannot be reached.
TORCH_VENV := $(BUILD)/torch-venv
bench-torch: all
	@if [ ! -x $(TORCH_VENV)/bin/python ]; then \
	  python3 -m venv $(TORCH_VENV) && $(TORCH_VENV)/bin/pip install -q torch==2.6.0 \
	    transformers==4.51.3 || rm -rf $(TORCH_VENV); fi
	@if [ -x $(TORCH_VENV)/bin/python ]; then \
	  $(TORCH_VENV)/bin/python bench/torch_bench.py --streambp $(BIN) $(ISA_FLAG) $(TORCH_ARGS); else \
	  echo "bench-torch: no PyPI; Debian's torch 1.13 instead"; \
	  /usr/bin/python3 -c 'import torch' 2>/dev/null || $(SUDO) apt-get install -y -q python3-torch; \
	  /usr/bin/python3 bench/torch_bench.py --streambp $(BIN) $(ISA_FLAG) $(TORCH_ARGS); fi

# The same against HF at real shapes (random weights, cold and warm steps; docs/performance.md):
# REAL_CONFIGS at REAL_SEQ on 2 threads, 2 paired rounds. A model whose HF step does not fit the
# machine's memory prints "failed" for HF's rows.
REAL_CONFIGS ?= data/configs/qwen3-0.6b.json data/configs/llama-3.2-1b.json \
	data/configs/gemma3-1b.json data/configs/qwen3-1.7b.json
REAL_SEQ ?= 2048
.PHONY: bench-torch-real
bench-torch-real:
	@$(MAKE) --no-print-directory bench-torch \
	  TORCH_ARGS="$(foreach c,$(REAL_CONFIGS),--config $(c)) --seq $(REAL_SEQ) --threads 2 --rounds 2"

# The BLAS at our shapes: OpenBLAS (the default) against BLIS (Debian) and MKL (PyPI's mkl-devel
# in a venv), interleaved rounds at 1 and 2 threads, bench/blas.sh (ROUNDS=N, default 5).
MKL_VENV := $(BUILD)/mkl-venv
bench-blas:
	@[ -e /usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so ] || \
	  $(SUDO) apt-get install -y -q libblis-openmp-dev || echo "bench-blas: BLIS not installed"
	@[ -e $(MKL_VENV)/include/mkl.h ] || { python3 -m venv $(MKL_VENV) && \
	  $(MKL_VENV)/bin/pip install -q mkl-devel; } || { rm -rf $(MKL_VENV); echo "bench-blas: no MKL"; }
	@mkdir -p $(BENCH_DIR)
	CC="$(CC)" BLAS_ISA=$(if $(ISA_FLAG),avx2) bench/blas.sh $(BENCH_DIR)/blas $(or $(ROUNDS),5) \
	  $(BLAS_DIR) $(MKL_VENV) | tee $(BENCH_DIR)/blas.txt

# The AVX2 path on an AVX-512 machine: a build for an ARCH without AVX-512 (make ... BUILD=build-avx2
# ARCH=x86-64-v3) benchmarks against the BLAS libraries' and torch's AVX2 kernels too (bench-blas:
# BLAS_ISA=avx2 in bench/blas.sh; bench-torch: torch_bench.py --avx2; bench-pgemm: OpenBLAS's
# Haswell kernels), so that both sides run what a CPU without AVX-512 (AMD Zen 2/3) would.
ISA_FLAG = $(if $(shell $(CC) -march=$(ARCH) -dM -E -x c /dev/null 2>/dev/null | grep __AVX512F__),,$(if \
             $(shell $(CC) -march=$(ARCH) -dM -E -x c /dev/null 2>/dev/null | grep __AVX2__),--avx2))

# The portable product against OpenBLAS at the products of a fast-mode step, in this build's
# instruction set (bench/pgemm_rates.c; decides PGEMM_TUNED in src/kernels/kernels.h):
#   make bench-pgemm [BUILD=build-avx2 ARCH=x86-64-v3] [THREADS=1] [ROUNDS=7]
PGEMM_RATES_OBJ := $(addprefix $(BUILD)/f32/src/kernels/,gemm.o linear.o fast/linear.o)
bench-pgemm: $(BUILD)/bench/pgemm_rates
	OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-$(if $(ISA_FLAG),Haswell)} \
	  $(BUILD)/bench/pgemm_rates $(or $(THREADS),1) $(or $(ROUNDS),7)

$(BUILD)/bench/pgemm_rates: bench/pgemm_rates.c $(PGEMM_RATES_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

# Fast mode against an earlier revision, same machine, interleaved rounds (no-regression check):
# make bench-compare OLD=<git revision> [ROUNDS=N] (default 5; docs/performance-log.md: ROUNDS=10)
bench-compare: all
	@test -n "$(OLD)" || { echo "usage: make bench-compare OLD=<git revision>"; exit 2; }
	rm -rf build-old && mkdir -p build-old/src
	git archive $(OLD) | tar -x -C build-old/src
	$(MAKE) -C build-old/src CUDA=0 build/streambp
	/usr/bin/python3 bench/bench_compare.py build-old/src/build/streambp $(BIN) --seq 2048 --rounds $(or $(ROUNDS),5)

plots: all
	@command -v gnuplot >/dev/null || { $(SUDO) apt-get install -y -q gnuplot-nox; }
	@mkdir -p $(BENCH_DIR)
	$(BIN) bench --csv > $(BENCH_DIR)/bench.csv
	@for T in $(PLAN_T); do $(BIN) plan --config data/models/bench.json --seq $$T --csv | tail -n +2; done > $(BENCH_DIR)/plan-bench.csv
	@for T in $(PLAN_T); do $(BIN) plan --config data/configs/qwen3-8b.json --storage bf16 --seq $$T --csv | tail -n +2; done > $(BENCH_DIR)/plan-qwen3-8b.csv
	cp $(BENCH_DIR)/bench.csv $(BENCH_DIR)/plan-bench.csv $(BENCH_DIR)/plan-qwen3-8b.csv data/plots/
	gnuplot -e "dir='data/plots'; out='data/plots'" data/plots/plots.gp
	@echo "wrote data/plots/*.png from the CSV files beside them"

# ==== CUDA: nvcc compile check and the SIMT emulator (cuda/) =====================================
# Self-contained: everything CUDA lives in this section.
#   make, make test   also compile every cuda/**/*.cu with nvcc (compile only, no GPU needed: sm_80
#                     code and compute_80 PTX) when nvcc is on the PATH (or in /usr/local/cuda);
#                     CUDA=0 skips nvcc. Objects go to build/nvcc whatever SAN is.
#   make test         also builds and runs $(BUILD)/emu/test_emu: the same .cu sources compiled by
#                     g++ as host C++ against the emulator in cuda/emu (under ASan with SAN=1).
# Numerics as docs/numerics.md §11: nvcc -fmad=false (no contraction; IEEE division, square root
# and subnormals are nvcc's defaults, spelled out), g++ -ffp-contract=off, never fast-math. g++
# builds for the host's ARCH as the C tree does: with FMA the kernels' explicit fma() is one
# instruction instead of a call into libm, the same correctly rounded result; one of test_cuda_emu's
# emulated verify runs (with --no-ref) took 2.4 s so against 6.4 s (Zen 3 VM, 2026-12-07).

ifeq ($(origin CXX),default)
CXX        := g++
endif
NVCC       ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA       ?= $(if $(NVCC),1,0)
NVCC_ARCH  ?=
NVCC_FLAGS := -std=c++17 -fmad=false -prec-div=true -prec-sqrt=true -ftz=false \
              $(if $(NVCC_ARCH),-arch=$(NVCC_ARCH),-gencode arch=compute_80,code=[sm_80,compute_80]) \
              -Icuda \
              $(if $(filter 1,$(WERROR)),-Werror all-warnings)
EMU_CXXFLAGS := -std=c++17 -g -march=$(ARCH) -ffp-contract=off -fno-fast-math \
              $(if $(filter 1,$(SAN)),-O1 $(SANFLAGS),-O2) \
              -Wall -Wextra -Wshadow -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror) \
              -Icuda $(if $(HAVE_PKGS),$(shell pkg-config --cflags check))

CUDA_SRC     := $(shell find cuda -name '*.cu' 2>/dev/null)
NVCC_OBJ     := $(CUDA_SRC:%.cu=build/nvcc/%.o)
EMU_TEST_OBJ := $(BUILD)/emu/cuda/emu/cuda_emu.o $(BUILD)/emu/tests/test_emu.o \
                $(patsubst %.cu,$(BUILD)/emu/%.o,$(wildcard cuda/emu/tests/*.cu))
EMU_TEST     := $(BUILD)/emu/test_emu
TESTS        += $(EMU_TEST)

# The CUDA op tables (cuda/*.cu) in the library: built against the emulator always (g++ is
# enough), for the GPU when nvcc is there; each in float and double (-DSBP_REAL_F64), each build
# in a namespace of its own (cuda/cuda.cuh). cuda/registry.cc hands them to src/api.
# EMU=0 leaves the emulator's tables out (the portable builds, which only run the CPU's golden
# digests: 22 C++ compiles a build less); CUDA=0 the GPU's. The registry is compiled again when
# either changes (registry.flags holds them), so that a build directory used both ways never
# links one against the other's objects.
EMU          ?= 1
BACKEND_SRC  := $(wildcard cuda/*.cu)
REGISTRY_OBJ := $(BUILD)/cuda/registry.o
BACKEND_OBJ  := $(REGISTRY_OBJ) \
                $(if $(filter 1,$(EMU)),$(BACKEND_SRC:%.cu=$(BUILD)/emu32/%.o) \
                                        $(BACKEND_SRC:%.cu=$(BUILD)/emu64/%.o) \
                                        $(BUILD)/emu/cuda/emu/cuda_emu.o) \
                $(if $(filter 1,$(CUDA)),$(BACKEND_SRC:%.cu=build/nvcc32/%.o) \
                                         $(BACKEND_SRC:%.cu=build/nvcc64/%.o))
CUDA_HOME    := $(patsubst %/bin/nvcc,%,$(NVCC))
$(LIB): $(BACKEND_OBJ)
LDLIBS       += -lstdc++ $(if $(filter 1,$(CUDA)),-L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread)

$(BUILD)/emu32/%.o: %.cu | cxx-deps
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/emu64/%.o: %.cu | cxx-deps
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

build/nvcc32/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

build/nvcc64/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -DSBP_REAL_F64 -MMD -MP -c $< -o $@

$(REGISTRY_OBJ): cuda/registry.cc $(BUILD)/cuda/registry.flags | cxx-deps
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -DSBP_HAVE_EMU=$(EMU) -DSBP_HAVE_NVCC=$(CUDA) -MMD -MP -c $< -o $@

.PHONY: registry-flags
$(BUILD)/cuda/registry.flags: registry-flags
	@mkdir -p $(dir $@)
	@echo 'EMU=$(EMU) CUDA=$(CUDA)' | cmp -s - $@ || echo 'EMU=$(EMU) CUDA=$(CUDA)' >$@

.PHONY: cuda cxx-deps format-cuda
all test: cuda
cuda: $(if $(filter 1,$(CUDA)),$(NVCC_OBJ))

build/nvcc/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

# g++ is not in every minimal image (gcc is); installed like the other dependencies.
cxx-deps:
	@command -v $(CXX) >/dev/null || { echo "streambp: installing g++"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -q --no-install-recommends g++; }

$(BUILD)/emu/%.o: %.cu | cxx-deps
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/emu/%.o: %.cc | cxx-deps
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(EMU_TEST): $(EMU_TEST_OBJ)
	$(CXX) $(if $(filter 1,$(SAN)),$(SANFLAGS)) -o $@ $^ $(CHECK_LIBS)

# On a machine with a GPU: the CUDA backend built for it, then cuda/gpu-check.sh: the golden
# digests and the verifier's devices group on it (every launch synchronized and checked,
# SBP_CUDA_SYNC=1), compute-sanitizer (memcheck, racecheck, synccheck) over one small run, and a
# Qwen3-0.6B-shaped benchmark at T = 4096. Sized for a ten-minute GPU session (it prints its
# time estimate first); gpu-check-long adds T = 8192 and 32768 and the largest T in 85% of the
# free device memory. The script runs under pipefail: no failing stage is hidden by a pipe.
.PHONY: gpu-check gpu-check-long
gpu-check gpu-check-long:
	@command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "$@: no GPU here"; exit 2; }
	rm -rf build/nvcc32 build/nvcc64
	@$(MAKE) --no-print-directory NVCC_ARCH=native all $(BUILD)/tests/test_golden
	STREAMBP=$(BIN) GOLDEN_TEST=$(BUILD)/tests/test_golden OUT=$(BUILD) \
	  cuda/gpu-check.sh $(if $(filter gpu-check-long,$@),long,short)

format: format-cuda
format-cuda:
	clang-format -i $(shell find cuda tests -name '*.cc' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null)

-include $(shell find build/nvcc build/nvcc32 build/nvcc64 -name '*.d' 2>/dev/null)

# ---- coverage: the lines `streambp verify` executes (docs/verify.md#coverage) ----------------------
# make coverage builds the tree with clang's source-based coverage into build-cov (CUDA=0: the CUDA
# mirror is not measured; MPI as found), runs the default `streambp verify` (with COV_SUITE=1 also
# `streambp verify --suite`; with MPI, `verify --ranks 2` under mpirun), each process writing its
# own profile, and prints the lines that ran per file of src/engine, src/kernels and src/dist
# (tests/coverage.py, llvm-cov). It fails when verify fails, or when the lines of src/engine +
# src/kernels that ran are fewer than COV_MIN percent (COV_MIN_SUITE with the suite).
# tests/coverage-exclude.txt names every line the default verify cannot reach, and why.
COV_MIN       := 97
COV_MIN_SUITE := 99
COV_BUILD     := build-cov
COV_RUN        = LLVM_PROFILE_FILE=$(COV_BUILD)/prof/%p.profraw GOMP_SPINCOUNT=1000 KMP_BLOCKTIME=1
.PHONY: coverage
coverage: SHELL := /bin/bash
coverage: .SHELLFLAGS := -o pipefail -c
coverage: deps
	@command -v clang >/dev/null || $(SUDO) apt-get install -y -q --no-install-recommends clang libomp-dev
	@{ command -v llvm-cov >/dev/null || ls /usr/bin/llvm-cov-* >/dev/null 2>&1 || \
	  $(SUDO) apt-get install -y -q --no-install-recommends llvm; }
	@$(MAKE) --no-print-directory COV=1 CC=clang CUDA=0 BUILD=$(COV_BUILD) $(COV_BUILD)/streambp
	@rm -rf $(COV_BUILD)/prof && mkdir -p $(COV_BUILD)/prof
	@echo "== $(COV_BUILD)/streambp verify (coverage build; output in $(COV_BUILD)/verify.txt)"
	@start=$$(date +%s); $(COV_RUN) $(COV_BUILD)/streambp verify > $(COV_BUILD)/verify.txt 2>&1 || \
	  { tail -40 $(COV_BUILD)/verify.txt; echo "coverage: streambp verify failed"; exit 1; }; \
	  tail -1 $(COV_BUILD)/verify.txt; echo "   $$(($$(date +%s) - start)) s"
	@if [ "$(MPI)" = 1 ] && command -v mpirun >/dev/null; then \
	  echo "== mpirun -np 2 $(COV_BUILD)/streambp verify --ranks 2"; \
	  $(COV_RUN) OMP_NUM_THREADS=1 timeout 300 mpirun --oversubscribe --allow-run-as-root \
	    --mca btl self,vader -x LLVM_PROFILE_FILE -x GOMP_SPINCOUNT -x KMP_BLOCKTIME -x OMP_NUM_THREADS -np 2 \
	    $(COV_BUILD)/streambp verify --ranks 2 > $(COV_BUILD)/ranks.txt 2>&1 || \
	  { tail -20 $(COV_BUILD)/ranks.txt; echo "coverage: streambp verify --ranks 2 failed"; exit 1; }; \
	  tail -2 $(COV_BUILD)/ranks.txt; fi
	@if [ "$(COV_SUITE)" = 1 ]; then echo "== $(COV_BUILD)/streambp verify --suite"; \
	  $(COV_RUN) $(COV_BUILD)/streambp verify --suite > $(COV_BUILD)/suite.txt 2>&1 || \
	  { tail -40 $(COV_BUILD)/suite.txt; echo "coverage: streambp verify --suite failed"; exit 1; }; \
	  tail -2 $(COV_BUILD)/suite.txt; fi
	@$$(command -v llvm-profdata || ls /usr/bin/llvm-profdata-* | tail -1) merge -sparse \
	  $(COV_BUILD)/prof/*.profraw -o $(COV_BUILD)/verify.profdata
	@python3 tests/coverage.py --bin $(COV_BUILD)/streambp --profdata $(COV_BUILD)/verify.profdata \
	  --exclude tests/coverage-exclude.txt --json $(COV_BUILD)/coverage.json \
	  --min $(if $(filter 1,$(COV_SUITE)),$(COV_MIN_SUITE),$(COV_MIN))

# ---- fuzzing (libFuzzer with clang; not part of make test) ---------------------------------------
# make fuzz builds tests/fuzz/fuzz_<target> against src/core and src/io with ASan and UBSan, and
# runs each for FUZZ_SECONDS from its committed corpus (tests/fuzz/corpus/<target>); new inputs go
# to build-fuzz/corpus/<target>, findings (crash-*, leak-*, timeout-*) to build-fuzz/. CI runs it
# for a short fixed time. Needs clang and libclang-rt-14-dev (Debian 12).

FUZZ_TARGETS := safetensors config batch index adapter_config jsonl trainer_state
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fsanitize=float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow \
                $(if $(HAVE_PKGS),$(shell pkg-config --cflags libcjson))
FUZZ_OBJ     := $(patsubst %.c,build-fuzz/obj/%.o,$(wildcard src/core/*.c src/io/*.c))
# a target's own objects beyond those: fuzz_jsonl's JSONL reader
FUZZ_OBJ_jsonl := build-fuzz/obj/src/train/data.o
.SECONDARY: $(FUZZ_OBJ) $(FUZZ_OBJ_jsonl)
build-fuzz/fuzz_jsonl: $(FUZZ_OBJ_jsonl)

build-fuzz/obj/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(FUZZ_OBJ_$*) \
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

# tests/accuracy_bounds.h is a table that test_accuracy prints (SBP_ACC_PRINT=1): one row a line
FORMAT_SRC := $(filter-out tests/accuracy_bounds.h,$(shell find src ref tests verify bench cuda -name '*.[ch]' 2>/dev/null))
format:
	clang-format -i $(FORMAT_SRC)

clean:
	rm -rf build build-san build-old build-fuzz build-cov $(PORTABLE_BUILDS)

-include $(shell find $(BUILD) build-fuzz -name '*.d' 2>/dev/null)
