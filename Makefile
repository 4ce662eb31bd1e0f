# mini-vLLM Lab - build everything with `make`, run the lab with `make run`,
# test with `make test`. See README.md.
#
# Layout: common/ (shared host code), reference/ (CPU reference, C11),
# kernels/ (CUDA kernels), chapters/NN-name/ (main.c = the chapter's
# executable; other .c files there are library code later chapters reuse),
# tests/ (Criterion tests, one binary per tests/test_*.c).
#
# Variables:
#   CUDA_ARCH="80 86 89 90"  GPU architectures to build for (sm_XX)
#   NO_CUDA=1                build the CPU half only, even when nvcc exists
#   SANITIZE=1               AddressSanitizer + UBSan build in build-san/ (CPU half)
#   DEPS_PREFIX=/opt/deps    where Debian packages were unpacked with dpkg -x
#                            (the GPU machine, which has no package registry)
#   MODEL=DIR                `make run` ends by generating from this Hugging Face
#                            Qwen3 directory (weights + tokenizer), PROMPT="..."

BUILD      ?= build
# The real Qwen3 tokenizer and config (no weights) for the tests that need
# them: the lab's shared folder beside the checkout when it is there. CI sets
# it too; without it those tests print SKIP.
MV_QWEN3_DIR ?= $(abspath $(wildcard ../shared/models/qwen3-0.6b))
export MV_QWEN3_DIR
CUDA_HOME  ?= /usr/local/cuda
CUDA_ARCH  ?= 80 86 89 90
SANITIZE   ?= 0
NO_CUDA    ?= 0
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
LDLIBS  := -lcjson -lpcre2-8 -lutf8proc -lxxhash -lpthread -lm

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

# ---- sources ------------------------------------------------------------------
HOST_SRC := $(wildcard common/*.c reference/*.c) \
            $(filter-out %/main.c,$(wildcard chapters/*/*.c))
CU_SRC   := $(if $(NVCC),$(wildcard common/*.cu kernels/*.cu))
CHAPTERS := $(sort $(notdir $(patsubst %/main.c,%,$(wildcard chapters/*/main.c))))
# Chapter 09's executable is the engine itself.
CHAPTER_BINS := $(foreach c,$(CHAPTERS),$(if $(filter 09-engine,$(c)),$(BUILD)/minivllm,$(BUILD)/$(c)))
LAB_CHAPTERS := $(filter-out 09-engine,$(CHAPTERS))
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

HOST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(HOST_SRC))
CU_OBJ   := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC))
LIB_HOST := $(BUILD)/libmv_host.a
LIB_CUDA := $(if $(CU_SRC),$(BUILD)/libmv_cuda.a)
LIBS     := $(LIB_HOST) $(LIB_CUDA)

.PHONY: all run check test test-unit test-chapters test-tokenizer deps deps-test results clean help
.DEFAULT_GOAL := all
# Keep object files that pattern rules build on the way (make would delete them).
.SECONDARY:

all: $(CHAPTER_BINS) $(BUILD)/engine_check
	@echo "built $(words $(CHAPTER_BINS)) chapter executable(s) in $(BUILD)/ (CUDA: $(if $(NVCC),yes$(comma) sm_$(subst $(space),/sm_,$(strip $(CUDA_ARCH)))$(comma) NCCL: $(if $(filter 1,$(HAVE_NCCL)),yes,no),no))"

comma := ,
space := $(empty) $(empty)

help:
	@sed -n '1,16p' Makefile

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVFLAGS) -c $< -o $@

$(LIB_HOST): $(HOST_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libmv_cuda.a: $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Chapter executables: chapters/NN-name/main.c -> build/NN-name.
# The libraries are listed twice because host code calls kernels and kernels
# call host helpers (error messages, shape checks).
$(BUILD)/0%: $(BUILD)/obj/chapters/0%/main.o $(LIBS)
	$(LINK) $(LDFLAGS) $< $(LIBS) $(LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

$(BUILD)/minivllm: $(BUILD)/obj/chapters/09-engine/main.o $(LIBS)
	$(LINK) $(LDFLAGS) $< $(LIBS) $(LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

# The engine's GPU check (tests/gpu/engine_check.c): the cuda backend against
# transformers' goldens and the GPU sampler against the host's. Built
# everywhere (--device cpu runs its golden half without a GPU).
$(BUILD)/engine_check: $(BUILD)/obj/tests/gpu/engine_check.o $(LIBS)
	$(LINK) $(LDFLAGS) $< $(LIBS) $(LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(LINK) $(LDFLAGS) $< $(LIBS) $(LIBS) $(CUDA_LIBS) $(LDLIBS) -lcriterion -o $@

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
	@$(MAKE) --no-print-directory all
	@echo "== mini-vLLM Lab: every chapter, in order"
	@status=0; for c in $(LAB_CHAPTERS); do ./$(BUILD)/$$c --summary || status=1; done; exit $$status
ifeq ($(MODEL),)
	@echo "== minivllm generate (CPU backend) on tests/data/tiny-qwen3-tied, prompts from chapters/09-engine/demo.jsonl"
	@./$(BUILD)/minivllm generate --model tests/data/tiny-qwen3-tied --input chapters/09-engine/demo.jsonl
else
	@echo "== minivllm generate (CPU backend) on $(MODEL)"
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

# docs/results/*.md from the chapters' --json files (docs/results/json/).
results:
	python3 docs/results/generate.py

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
