# mini-vLLM Lab - build everything with `make`, run the lab with `make run`,
# test with `make test`. See README.md.
#
# Layout: common/ (shared host code), reference/ (CPU reference, C11),
# kernels/ (CUDA kernels), chapters/NN-name/ (main.c = the chapter's
# executable; other .c files there are library code later chapters reuse;
# chapter 09 is split into model/, runtime/, text/, serve/ and cli/), tests/
# (Criterion tests, one binary per tests/test_*.c). `make help` lists the
# targets.
#
# Variables:
#   CUDA_ARCH="80 86 89 90"  GPU architectures to build for (sm_XX); default: the
#                            GPU of this machine, or 90 when there is none
#   NO_CUDA=1                build the CPU half only, even when nvcc exists
#   SANITIZE=1               AddressSanitizer + UBSan build in build-san/ (CPU half)
#   NO_MPI=1                 build without MPI even when mpicc is found (then
#                            --tensor-parallel-size > 1 is refused)
#   DEPS_PREFIX=/opt/deps    where Debian packages were unpacked with dpkg -x
#                            (the GPU machine, which has no package registry;
#                            Open MPI's mpi.h is looked for there too)
#   MODEL=DIR                `make run` ends by generating from this Hugging Face
#                            Qwen3 directory (weights + tokenizer), PROMPT="..."

BUILD      ?= build
# The real Qwen3 tokenizer and config (no weights) for the tests that need
# them: the lab's shared folder beside the checkout when it is there. CI sets
# it too; without it those tests print SKIP.
MV_QWEN3_DIR ?= $(abspath $(wildcard ../shared/models/qwen3-0.6b))
export MV_QWEN3_DIR
CUDA_HOME  ?= /usr/local/cuda
# The GPU architectures nvcc builds for. Each one is a full compile of every
# kernel, so by default only the GPU in this machine (nvidia-smi's compute
# capability, 9.0 -> 90), or, with no GPU to ask, sm_90 alone (the H200 the
# lab measures on): one compile of the kernels instead of four.
# CUDA_ARCH="80 86 89 90" (A100, A10/3090, L4/4090, H100/H200) builds
# for all of them. Exported, so the sub-makes of `make run` do not ask again
# and print the same reason.
ifeq ($(origin CUDA_ARCH),undefined)
  CUDA_ARCH_FOUND := $(strip $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
                       | grep -E '^[0-9]+\.[0-9]+$$' | tr -d . | sort -u))
  CUDA_ARCH := $(if $(CUDA_ARCH_FOUND),$(CUDA_ARCH_FOUND),90)
  CUDA_ARCH_WHY := $(if $(CUDA_ARCH_FOUND),the GPU found here,no GPU found; CUDA_ARCH='80 86 89 90' builds for all)
endif
export CUDA_ARCH CUDA_ARCH_WHY
SANITIZE   ?= 0
NO_CUDA    ?= 0
NO_MPI     ?= 0
MPICC      ?= mpicc
DEPS_PREFIX ?=

NVCC := $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))

ifeq ($(SANITIZE),1)
  # ASan reserves the low address space the CUDA driver also wants, so the
  # sanitized build is the CPU half; the GPU half has compute-sanitizer.
  BUILD := build-san
  NO_CUDA := 1
endif
ifeq ($(NO_CUDA),1)
  NVCC :=
endif

CC      ?= gcc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror
OPT     := -O2 -g
CPPFLAGS := -I. -MMD -MP

# Record only the shared libraries a program calls into (Ubuntu's default,
# not Debian's): chapter 01 needs neither cuBLAS nor NCCL.
LDFLAGS += -Wl,--as-needed

ifneq ($(DEPS_PREFIX),)
  CPPFLAGS += -I$(DEPS_PREFIX)/usr/include
  LDFLAGS  += -L$(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu -Wl,-rpath,$(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu
endif

ifeq ($(SANITIZE),1)
  OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif

# NCCL (tensor parallelism over several GPUs) comes with the CUDA builds when
# its header is found.
ifneq ($(NVCC),)
  HAVE_NCCL := $(shell printf '\043include <nccl.h>\n' | $(CC) -E -x c -I$(CUDA_HOME)/include - >/dev/null 2>&1 && echo 1 || echo 0)
else
  HAVE_NCCL := 0
endif

ifneq ($(NVCC),)
  HAVE_CUDA := 1
  CPPFLAGS += -DMV_HAVE_CUDA=1 -DMV_HAVE_NCCL=$(HAVE_NCCL) -I$(CUDA_HOME)/include
  GENCODE  := $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(a),code=sm_$(a))
  NVFLAGS  := -O3 -std=c++17 -lineinfo $(GENCODE) -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
              -Werror all-warnings
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(if $(filter 1,$(HAVE_NCCL)),-lnccl) \
               -lcublas -lcudart_static -ldl -lrt -lstdc++
  LINK := $(CXX)
else
  HAVE_CUDA := 0
  CPPFLAGS += -DMV_HAVE_CUDA=0 -DMV_HAVE_NCCL=0
  CUDA_LIBS :=
  LINK := $(CC)
endif
CFLAGS := $(CSTD) $(OPT) $(WARN)

# MPI (the engine's tensor-parallel ranks, chapters/09-engine/parallel/)
# when Open MPI's compiler wrapper is found and its mpi.h compiles: the
# wrapper says which -I and -L/-l flags it would add, and we add them
# ourselves so the compiler stays $(CC). Only tp_comm.c includes mpi.h; the
# programs that link the engine's runtime link libmpi. Without it the engine
# builds and runs with --tensor-parallel-size 1 (Debian: openmpi-bin
# libopenmpi-dev).
ifeq ($(NO_MPI),1)
  HAVE_MPI := 0
else
  MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
  MPI_LIBS   := $(shell $(MPICC) --showme:link 2>/dev/null)
  HAVE_MPI   := $(shell test -n "$(MPI_LIBS)" && printf '\043include <mpi.h>\n' | $(CC) -E -x c $(MPI_CFLAGS) - \
                  >/dev/null 2>&1 && echo 1 || echo 0)
endif
# No mpicc, or none whose mpi.h compiles, but Open MPI's header unpacked
# under DEPS_PREFIX (the GPU machine: it has Open MPI's mpirun and libmpi, and
# libopenmpi-dev's deb travels in .deps/, tests/gpu/tp_check.sh): that
# include directory, and the machine's own libmpi.so.40 (the deb's libmpi.so
# link points into a libopenmpi3 that was not unpacked), when both work.
DEPS_MPI_INC := $(if $(DEPS_PREFIX),$(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu/openmpi/include)
ifeq ($(NO_MPI)$(HAVE_MPI),00)
  ifneq ($(wildcard $(DEPS_MPI_INC)/mpi.h),)
    MPI_CFLAGS := -I$(DEPS_MPI_INC) -I$(DEPS_MPI_INC)/openmpi
    MPI_LIBS   := -l:libmpi.so.40
    HAVE_MPI   := $(shell printf '\043include <mpi.h>\nint main(void) { return MPI_Init(0, 0); }\n' | \
                    $(CC) -x c $(MPI_CFLAGS) - $(MPI_LIBS) -o /dev/null >/dev/null 2>&1 && echo 1 || echo 0)
  endif
endif
ifeq ($(HAVE_MPI),1)
  CPPFLAGS += -DMV_HAVE_MPI=1 $(MPI_CFLAGS)
else
  CPPFLAGS += -DMV_HAVE_MPI=0
  MPI_LIBS :=
endif

# ---- sources, one archive per layer -------------------------------------------
# Each piece of code has one home, and each executable links only the layers
# it uses, each archive once, in dependency order (a layer only calls the
# layers after it on the link line):
#
#   libmv_core     common/, reference/, kernels/ (the CUDA code when built):
#                  what every chapter teaches; needs only libm, pthread and
#                  CUDA / cuBLAS / NCCL
#   libmv_ch03     chapters/03-linear-tp/*.c   tensor-parallel shard loaders
#   libmv_ch04     chapters/04-embedding/*.c   vocab-parallel shard loaders
#   libmv_ch07     chapters/07-attention/*.c   the attention check cases
#   libmv_sched    chapters/08-scheduler/sched/  sequence, block manager, scheduler
#   libmv_ch08     chapters/08-scheduler/*.c   the chapter's simulation
#   libmv_model    chapters/09-engine/model/   config, safetensors, Qwen3 weights and
#                                              their packing (calls chapter 03's and 04's shard
#                                              loaders)
#   libmv_text     chapters/09-engine/text/    tokenizer, chat template
#   libmv_runtime  chapters/09-engine/runtime/ engine loop, runner, backends, sampler
#   libmv_parallel chapters/09-engine/parallel/ the tensor-parallel ranks' communicator (MPI)
#   libmv_serve    chapters/09-engine/serve/   the HTTP server: only minivllm links libmicrohttpd (the tests
#                                              take openai.o, its bodies, which has no HTTP in it)
#   chapters/09-engine/cli/                    the minivllm program (not an archive)
#
# So build/01-activation compiles common/, reference/, kernels/ and its
# main.c and nothing else, and links neither PCRE2, utf8proc, xxHash nor cJSON.
CORE_SRC := $(wildcard common/*.c reference/*.c)
CU_SRC   := $(if $(NVCC),$(wildcard common/*.cu kernels/*.cu))
chapter_lib_src = $(filter-out %/main.c,$(wildcard chapters/$(1)/*.c))
SCHED_SRC   := $(wildcard chapters/08-scheduler/sched/*.c)
MODEL_SRC   := $(wildcard chapters/09-engine/model/*.c)
TEXT_SRC    := $(wildcard chapters/09-engine/text/*.c)
RUNTIME_SRC := $(wildcard chapters/09-engine/runtime/*.c)
PARALLEL_SRC := $(wildcard chapters/09-engine/parallel/*.c)
SERVE_SRC   := $(wildcard chapters/09-engine/serve/*.c)
CLI_SRC     := $(wildcard chapters/09-engine/cli/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(filter %.c,$(1))) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(filter %.cu,$(1)))
L := $(BUILD)/lib
LIB_CORE    := $(L)/libmv_core.a
LIB_CH03    := $(L)/libmv_ch03.a
LIB_CH04    := $(L)/libmv_ch04.a
LIB_CH07    := $(L)/libmv_ch07.a
LIB_SCHED   := $(L)/libmv_sched.a
LIB_CH08    := $(L)/libmv_ch08.a
LIB_MODEL   := $(L)/libmv_model.a
LIB_TEXT    := $(L)/libmv_text.a
LIB_RUNTIME := $(L)/libmv_runtime.a
LIB_PARALLEL := $(L)/libmv_parallel.a
LIB_SERVE   := $(L)/libmv_serve.a

$(LIB_CORE):    $(call obj,$(CORE_SRC) $(CU_SRC))
$(LIB_CH03):    $(call obj,$(call chapter_lib_src,03-linear-tp))
$(LIB_CH04):    $(call obj,$(call chapter_lib_src,04-embedding))
$(LIB_CH07):    $(call obj,$(call chapter_lib_src,07-attention))
$(LIB_SCHED):   $(call obj,$(SCHED_SRC))
$(LIB_CH08):    $(call obj,$(call chapter_lib_src,08-scheduler))
$(LIB_MODEL):   $(call obj,$(MODEL_SRC))
$(LIB_TEXT):    $(call obj,$(TEXT_SRC))
$(LIB_RUNTIME): $(call obj,$(RUNTIME_SRC))
$(LIB_PARALLEL): $(call obj,$(PARALLEL_SRC))
$(LIB_SERVE):   $(call obj,$(SERVE_SRC))
$(L)/%.a:
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# What each program links (the libraries in link order) and the system
# libraries those layers need.
CORE_LDLIBS   := $(CUDA_LIBS) -lpthread -lm
ENGINE_LIBS   := $(LIB_RUNTIME) $(LIB_PARALLEL) $(LIB_TEXT) $(LIB_MODEL) $(LIB_SCHED) $(LIB_CH04) $(LIB_CH03) \
                 $(LIB_CORE)
ENGINE_LDLIBS := -lcjson -lpcre2-8 -lutf8proc -lxxhash $(MPI_LIBS) $(CORE_LDLIBS)
# The server's HTTP library, for build/minivllm alone (no chapter, test or
# check links it; tests/test_layering.c checks).
SERVE_LDLIBS  := -lmicrohttpd
LIBS_01-activation := $(LIB_CORE)
LIBS_02-rmsnorm    := $(LIB_CORE)
LIBS_03-linear-tp  := $(LIB_CH03) $(LIB_CORE)
LIBS_04-embedding  := $(LIB_CH04) $(LIB_CH03) $(LIB_CORE)
LIBS_05-rope       := $(LIB_CORE)
LIBS_06-kv-store   := $(LIB_CORE)
LIBS_07-attention  := $(LIB_CH07) $(LIB_CORE)
LIBS_08-scheduler  := $(LIB_CH08) $(LIB_SCHED) $(LIB_CORE)
LDLIBS_08-scheduler := -lxxhash
# The tests link every layer (each test pulls only the members it calls).
TEST_LIBS   := $(LIB_SERVE) $(LIB_RUNTIME) $(LIB_PARALLEL) $(LIB_TEXT) $(LIB_MODEL) $(LIB_CH08) $(LIB_SCHED) $(LIB_CH07) $(LIB_CH04) $(LIB_CH03) $(LIB_CORE)

CHAPTERS := $(sort $(notdir $(patsubst %/main.c,%,$(wildcard chapters/*/main.c))))
LAB_CHAPTERS := $(CHAPTERS)
LAB_BINS := $(addprefix $(BUILD)/,$(LAB_CHAPTERS))
# Chapter 09's executable is the engine itself.
CHAPTER_BINS := $(LAB_BINS) $(BUILD)/minivllm
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all chapters run check test test-unit test-chapters test-tokenizer fuzz deps deps-test results clean help
.DEFAULT_GOAL := all
# Keep object files that pattern rules build on the way (make would delete them).
.SECONDARY:

all: $(CHAPTER_BINS) $(BUILD)/engine_check $(BUILD)/tp_allreduce
	@echo "built $(words $(CHAPTER_BINS)) chapter executable(s) in $(BUILD)/ $(BUILT_WITH)"

# Chapters 01-08 alone: they build even when the engine's code does not.
chapters: $(LAB_BINS)
	@echo "built $(words $(LAB_BINS)) chapter executable(s) in $(BUILD)/ $(BUILT_WITH)"

comma := ,
space := $(empty) $(empty)
# "(CUDA: yes, sm_90 (no GPU found; ...), NCCL: yes)": what was built, and
# why only those architectures when make chose them.
BUILT_WITH = (CUDA: $(if $(NVCC),yes$(comma) sm_$(subst $(space),/sm_,$(strip $(CUDA_ARCH)))$(if $(CUDA_ARCH_WHY), ($(CUDA_ARCH_WHY)))$(comma) NCCL: $(if $(filter 1,$(HAVE_NCCL)),yes,no),no), MPI: $(if $(filter 1,$(HAVE_MPI)),yes,no))

help:
	@echo "mini-vLLM Lab - make targets (see README.md):"
	@echo "  make                 build every chapter, build/minivllm, build/engine_check and build/tp_allreduce"
	@echo "  make run             every chapter in order, one summary line each, then the engine"
	@echo "  make test            the tests: Criterion, the chapters in CPU mode, the tokenizer vs Hugging Face"
	@echo "  make fuzz            the parsers under libFuzzer (clang, ASan + UBSan), FUZZ_SECONDS each (60)"
	@echo "  make check           every chapter executable with its full output"
	@echo "  make chapters        build chapters 01-08 only (they do not need the engine's code)"
	@echo "  make build/NN-name   one chapter, e.g. make build/01-activation && build/01-activation"
	@echo "  make build/minivllm  the engine (chapter 09)"
	@echo "  make results         docs/results/*.md from the committed --json files"
	@echo "  make clean           remove build/ and build-san/"
	@echo "variables: CUDA_ARCH=\"80 86 89 90\" (default: this machine's GPU, else 90)  NO_CUDA=1  NO_MPI=1  SANITIZE=1  DEPS_PREFIX=/opt/deps  MODEL=DIR PROMPT=..."

# make compares file times only: a CUDA build over a NO_CUDA=1 one in the
# same directory (or another CUDA_ARCH) would keep objects built with the
# old flags. The flags go into a stamp file that every object depends on,
# rewritten only when they change.
FLAGS_NOW   := $(CC) $(CPPFLAGS) $(CFLAGS) $(NVCC) $(NVFLAGS)
FLAGS_STAMP := $(BUILD)/obj/flags.stamp
ifneq ($(FLAGS_NOW),$(shell cat $(FLAGS_STAMP) 2>/dev/null))
  $(shell mkdir -p $(BUILD)/obj && printf '%s' '$(FLAGS_NOW)' > $(FLAGS_STAMP))
endif

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVFLAGS) -c $< -o $@

# Chapter executables: chapters/NN-name/main.c -> build/NN-name.
.SECONDEXPANSION:
$(LAB_BINS): $(BUILD)/%: $(BUILD)/obj/chapters/%/main.o $$(LIBS_$$*)
	$(LINK) $(LDFLAGS) $< $(LIBS_$*) $(LDLIBS_$*) $(CORE_LDLIBS) -o $@

$(BUILD)/minivllm: $(call obj,$(CLI_SRC)) $(LIB_SERVE) $(ENGINE_LIBS)
	$(LINK) $(LDFLAGS) $(call obj,$(CLI_SRC)) $(LIB_SERVE) $(ENGINE_LIBS) $(SERVE_LDLIBS) $(ENGINE_LDLIBS) -o $@

# The engine's GPU check (tests/gpu/engine_check.c): the cuda backend against
# transformers' goldens and the GPU sampler against the CPU reference. Built
# everywhere (--device cpu runs its golden half without a GPU).
$(BUILD)/engine_check: $(BUILD)/obj/tests/gpu/engine_check.o $(ENGINE_LIBS)
	$(LINK) $(LDFLAGS) $< $(ENGINE_LIBS) $(ENGINE_LDLIBS) -o $@

# The tensor-parallel collectives' own cost per step (tests/gpu/tp_allreduce.c,
# run by tests/gpu/tp_check.sh under mpirun). Built everywhere; without CUDA,
# NCCL or MPI it says so.
$(BUILD)/tp_allreduce: $(BUILD)/obj/tests/gpu/tp_allreduce.o $(ENGINE_LIBS)
	$(LINK) $(LDFLAGS) $< $(ENGINE_LIBS) $(ENGINE_LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(LINK) $(LDFLAGS) $< $(TEST_LIBS) -lcriterion $(ENGINE_LDLIBS) -o $@

$(BUILD)/obj/tests/%.o: CPPFLAGS += -DMV_BUILD_DIR='"$(BUILD)"'

# ---- the two commands of the README -------------------------------------------
deps:
	@bash common/deps.sh $(if $(DEPS_PREFIX),--prefix $(DEPS_PREFIX))

deps-test:
	@bash common/deps.sh --test $(if $(DEPS_PREFIX),--prefix $(DEPS_PREFIX))

# Every chapter in order, one summary line each, then the engine: a tiny
# checkpoint from tests/data (no tokenizer, so prompts are token ids), or
# MODEL=DIR with a text prompt.
MODEL  ?=
PROMPT ?= Give me a short introduction to large language models.
run: deps
	@$(MAKE) --no-print-directory chapters
	@echo "== mini-vLLM Lab: every chapter, in order"
	@status=0; for c in $(LAB_CHAPTERS); do ./$(BUILD)/$$c --summary || status=1; done; exit $$status
	@$(MAKE) --no-print-directory -q $(BUILD)/minivllm || $(MAKE) --no-print-directory $(BUILD)/minivllm
ifeq ($(MODEL),)
	@echo "== minivllm generate (CPU backend) on tests/data/tiny-qwen3-tied, prompts from chapters/09-engine/demo.jsonl"
	@./$(BUILD)/minivllm generate --model tests/data/tiny-qwen3-tied --device cpu --input chapters/09-engine/demo.jsonl
else
	@echo "== minivllm generate on $(MODEL) (cuda when a GPU is present, else the CPU backend)"
	@./$(BUILD)/minivllm generate --model $(MODEL) --chat --prompt "$(PROMPT)" --max-tokens 64
endif

# Every chapter executable, full output; fails if any fails.
check: all
	@status=0; for c in $(LAB_CHAPTERS); do ./$(BUILD)/$$c || { echo "FAILED: $$c"; status=1; }; done; exit $$status

test: deps-test
	@$(MAKE) --no-print-directory test-unit test-chapters test-tokenizer

test-unit: $(TEST_BINS)
	@status=0; for t in $(TEST_BINS); do echo "== $$t"; ./$$t --jobs=2 || status=1; done; exit $$status

# tests/test_tokenizer.c and tests/test_cli.c run the programs, so they are built first.
test-unit: $(CHAPTER_BINS)

test-chapters: $(CHAPTER_BINS)
	@echo "== chapters in CPU mode"
	@status=0; for c in $(LAB_CHAPTERS); do ./$(BUILD)/$$c --cpu --summary || status=1; done; exit $$status

# The C tokenizer against Hugging Face, id for id (tests/tokenizer/compare_hf.py).
# It prints SKIP and passes when MV_QWEN3_DIR or the Python packages
# (tests/requirements.txt) are missing; any mismatch fails.
test-tokenizer: $(BUILD)/minivllm
	@echo "== tokenizer vs Hugging Face ($(BUILD)/minivllm)"
	@if command -v python3 >/dev/null 2>&1; then python3 tests/tokenizer/compare_hf.py --minivllm $(BUILD)/minivllm; \
	 else echo "SKIP tokenizer comparison with Hugging Face: python3 not found"; fi

# The parsers under libFuzzer (clang, coverage-guided) with ASan and UBSan: the
# six targets of tests/test_fuzz.c, each built as its own binary and run for
# FUZZ_SECONDS from the committed corpus tests/fuzz/corpus/TARGET/ (new inputs
# go to $(BUILD)/fuzz/corpus-TARGET/). A crash, a leak, UB or a broken
# invariant stops it, with the input that did it saved by libFuzzer
# (crash-*). CI runs it; `make test` runs the same targets under gcc's
# deterministic driver instead.
FUZZ_TARGETS := fuzz_safetensors fuzz_config fuzz_tokenizer_load fuzz_encode fuzz_requests fuzz_api
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_SRC     := $(filter-out %/main.c %/harness.c,$(wildcard common/*.c reference/*.c chapters/03-linear-tp/*.c \
                  chapters/04-embedding/*.c chapters/08-scheduler/sched/*.c chapters/09-engine/model/*.c \
                  chapters/09-engine/text/*.c chapters/09-engine/runtime/*.c chapters/09-engine/parallel/*.c \
                  chapters/09-engine/serve/openai.c))
FUZZ_FLAGS   := -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=c11 \
                -D_GNU_SOURCE -DMV_HAVE_CUDA=0 -DMV_HAVE_NCCL=0 -DMV_HAVE_MPI=0 -DMV_LIBFUZZER
$(BUILD)/fuzz/fuzz_%: tests/test_fuzz.c $(FUZZ_SRC) $(wildcard chapters/09-engine/cli/*.c chapters/09-engine/cli/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter -I%,$(CPPFLAGS)) -DMV_FUZZ_TARGET=fuzz_$* tests/test_fuzz.c $(FUZZ_SRC) \
	  $(filter -L% -Wl%,$(LDFLAGS)) -lcjson -lpcre2-8 -lutf8proc -lxxhash -lm -lpthread -o $@

fuzz: $(addprefix $(BUILD)/fuzz/,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/corpus-$$t; \
	  echo "== libFuzzer $$t, $(FUZZ_SECONDS) s, ASan + UBSan"; \
	  ./$(BUILD)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$t- \
	    $(BUILD)/fuzz/corpus-$$t tests/fuzz/corpus/$$t > $(BUILD)/fuzz/$$t.log 2>&1 \
	    || { tail -40 $(BUILD)/fuzz/$$t.log; echo "FAILED: $$t (log $(BUILD)/fuzz/$$t.log)"; exit 1; }; \
	  grep -E "^stat::(number_of_executed_units|new_units_added)|^Done" $(BUILD)/fuzz/$$t.log; \
	done

# docs/results/*.md from the chapters' --json files (docs/results/json/).
results:
	python3 docs/results/generate.py

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
