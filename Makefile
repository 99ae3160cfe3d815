# ztier — one Makefile for the library, the tool, tests, benchmarks and examples.
#
#   make                 build/libztier.a, build/libztier.so, build/ztier
#   make test            install missing packages (scripts/deps.sh test), build, run
#                        every test, on the host backend and again on sim
#                        (TEST_BACKENDS="host sim")
#   make test SAN=address,undefined   the same, sanitized, in build-address-undefined/
#   make test-gpu        the test suites on the cuda backend (needs a GPU)
#   make demo            install missing packages (scripts/deps.sh demo), build, run
#                        the example training loop
#   make deps            install the missing packages of every purpose (scripts/deps.sh)
#   make install PREFIX=/opt/ztier    (and make uninstall with the same PREFIX)
#   make CUDA=0          leave the CUDA backend out even where nvcc is present
#   make MPI=0           leave comm "mpi" (and libmpi) out even where mpi.h is present
#   make CUDART=static   link the CUDA runtime statically (default: libcudart.so)
#   make gpu-bundle      $(BUNDLE): the stripped tool, tests and run-gpu.sh for a GPU machine
#   make fuzz            the checkpoint parsers under libFuzzer, FUZZ_SECONDS (300) each
#   make fuzz-brief      the same for 20 s each (CI); both skip without clang's libFuzzer
#
# Objects go to $(BUILD) (build/, or build-<sanitizers>/ with SAN).

comma := ,
PREFIX ?= /usr/local
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
# sm_90 (H100/H200) code plus PTX for later GPUs.
GPU_ARCH ?= 90
NVCC_GENCODE ?= -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) \
                -gencode arch=compute_$(GPU_ARCH),code=compute_$(GPU_ARCH)

# CUDA parts are built whenever nvcc is present, unless CUDA=0.
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(wildcard $(NVCC)),1,0)
endif

SAN ?=
ifneq ($(SAN),)
BUILD ?= build-$(subst $(comma),-,$(SAN))
SANFLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
OPT ?= -O1
else
BUILD ?= build
SANFLAGS :=
OPT ?= -O2
endif

CC ?= gcc
# How executables link the library. By default each links the static
# archive, so that the tests reach internal functions too. LINK=shared-internal
# (the GPU bundle, whose folder must travel in 64 MiB) builds
# libztier-internal.so, the library with its internal functions visible
# (ZT_INTERNAL_VISIBLE), and links the executables to it instead of copying
# the library into each. A static cudart inside a shared library exports
# nothing, so test_comm_nccl, which calls the CUDA runtime itself, keeps the
# archive, and the others link no runtime of their own: one that called it
# would fail to link rather than hold a second runtime.
ifeq ($(LINK),shared-internal)
VISIBILITY := default
VISIBILITY_FLAGS := -fvisibility=default -DZT_INTERNAL_VISIBLE
OWN_CUDA_RUNTIME := test_comm_nccl
ZT_LINK_DEP = $(BUILD)/libztier.a $(BUILD)/libztier-internal.so
ZT_LINK_LIB = $(if $(filter $(OWN_CUDA_RUNTIME),$(notdir $@)),$(BUILD)/libztier.a $(LDLIBS),\
                $(BUILD)/libztier-internal.so $(filter-out -lcudart -lcudart_static,$(LDLIBS)))
else
VISIBILITY := hidden
VISIBILITY_FLAGS := -fvisibility=hidden
ZT_LINK_DEP = $(BUILD)/libztier.a
ZT_LINK_LIB = $(BUILD)/libztier.a $(LDLIBS)
endif

# -ffp-contract=off: no fused multiply-add the source did not write, so the
# C kernels compute what optim_math.h says, bit for bit (see that header).
CFLAGS ?= $(OPT) -g
ZT_CFLAGS := -std=gnu11 -Wall -Wextra -Wshadow -Wno-unused-parameter \
             -fPIC $(VISIBILITY_FLAGS) -ffp-contract=off -pthread \
             -Iinclude -Isrc -I. -DZT_HAVE_CUDA=$(CUDA) $(SANFLAGS)
# OpenMPI (Debian's libopenmpi-dev): only src/comm/comm_mpi.c, tests/test_comm.c
# and src/tool/env_report.c (`ztier report`, when MPI=1) include mpi.h, but
# libmpi is linked everywhere libztier is while the comm
# "mpi" backend is in: MPI=1, the default wherever mpi.h is found. MPI=0
# builds src/comm/comm_nompi.c instead (comm "mpi" fails with a sentence
# saying so) and links no libmpi; the tests that launch ranks under mpirun
# skip with "skipped: built without MPI". Each can be set on the command line.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
ifeq ($(origin MPI),undefined)
MPI := $(shell $(CC) $(MPI_CFLAGS) -include mpi.h -E -x c /dev/null >/dev/null 2>&1 && \
         echo 1 || echo 0)
endif
ifeq ($(MPI),1)
MPI_LIBS := $(or $(shell pkg-config --libs ompi-c 2>/dev/null),-lmpi)
MPI_LEFT_OUT := src/comm/comm_nompi.c
else
MPI_LIBS :=
MPI_LEFT_OUT := src/comm/comm_mpi.c
endif
ZT_CFLAGS += -DZT_HAVE_MPI=$(MPI)
LDLIBS_BASE := -lcjson -luring -lnuma -lhwloc $(MPI_LIBS) -lm -lpthread
# The test executables' framework; the GPU bundle links a static one.
CMOCKA_LIBS := -lcmocka

ISA_AVX2 := -mavx2 -mfma -mf16c
ISA_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c

# ---- sources --------------------------------------------------------------

# The library's rooms under src/ (docs/design.md), and offload/ beside them;
# src/tool is the ztier command.
LIB_ROOMS := base cpu backend comm zero engine ckpt
LIB_SRC := $(filter-out src/backend/backend_nocuda.c $(MPI_LEFT_OUT), \
             $(foreach r,$(LIB_ROOMS),$(wildcard src/$(r)/*.c))) $(wildcard offload/*.c)
ifeq ($(CUDA),1)
CU_SRC := $(wildcard cuda/*.cu)
# NCCL (the comm "nccl" backend) ships with the toolkit here; NCCL_HOME
# points elsewhere when it does not.
NCCL_HOME ?= $(CUDA_HOME)
# CUDART=shared (the default) links the CUDA runtime the application's own
# CUDA code uses, so a program has one runtime; CUDART=static carries it
# inside (the GPU bundle: the GPU machine may have another, or none).
CUDART ?= shared
CUDA_LIB_DIRS := $(sort $(CUDA_HOME)/lib64 $(NCCL_HOME)/lib64)
CUDART_LIBS := $(if $(filter static,$(CUDART)),-lcudart_static -ldl -lrt,-lcudart)
LDLIBS_CUDA := $(addprefix -L,$(CUDA_LIB_DIRS)) -lnccl $(CUDART_LIBS) -lstdc++
else
LIB_SRC += src/backend/backend_nocuda.c
CU_SRC :=
LDLIBS_CUDA :=
endif
LDLIBS := $(LDLIBS_BASE) $(LDLIBS_CUDA)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.o)
TOOL_SRC := $(wildcard src/tool/*.c) $(wildcard bench/*.c)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_SUPPORT_SRC := tests/harness.c tests/reference.c
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:%.c=$(BUILD)/%)
# The layer check of docs/design.md (tests/layers.py), run like the others.
TEST_BIN += $(BUILD)/tests/test_layers
# make install, ztier.pc and a program linked by it (tests/install.sh).
TEST_BIN += $(BUILD)/tests/test_install
# Tests in CUDA C++ whose kernels run on the host (tests/test_*_host.cu):
# nvcc compiles them, the C compiler links them, sanitizers included.
ifeq ($(CUDA),1)
CU_TEST_SRC := $(wildcard tests/test_*_host.cu)
TEST_BIN += $(CU_TEST_SRC:%.cu=$(BUILD)/%)
endif
# An example is a folder, examples/<name>/*.c, built into $(BUILD)/examples/<name>;
# its objects go under $(BUILD)/obj/, since the binary takes the folder's name.
EXAMPLES := $(notdir $(patsubst %/,%,$(wildcard examples/*/)))
EXAMPLE_BIN := $(EXAMPLES:%=$(BUILD)/examples/%)

# A change of CUDA, SAN, GPU_ARCH, MPI, CUDART or LINK in the same build folder
# rebuilds everything: the stamp's content changes, so its date does.
STAMP := $(BUILD)/build-settings
# (MPI=0, CUDART=static and LINK=shared-internal only: the stamps of the default
# builds stay as they were.)
SETTINGS := CUDA=$(CUDA) SAN=$(SAN) GPU_ARCH=$(GPU_ARCH)$(if $(filter 0,$(MPI)), MPI=0)$(if \
            $(filter static,$(CUDART)), CUDART=static)$(if \
            $(filter shared-internal,$(LINK)), LINK=shared-internal)
$(shell mkdir -p $(BUILD); [ "$$(cat $(STAMP) 2>/dev/null)" = "$(SETTINGS)" ] || \
  echo "$(SETTINGS)" > $(STAMP))

.PHONY: all lib tool tests examples test test-gpu demo deps install uninstall clean fuzz fuzz-brief \
        fuzzers gpu-bundle
all: lib tool
lib: $(BUILD)/libztier.a $(BUILD)/libztier.so
tool: $(BUILD)/ztier
tests: $(TEST_BIN)
examples: $(EXAMPLE_BIN)

# ---- rules ----------------------------------------------------------------

# Objects depend on the settings stamp too, so a new CUDA, SAN or GPU_ARCH
# recompiles them. Test and example objects are kept between builds.
.SECONDARY:
$(BUILD)/%.o: %.c $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ZT_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/src/cpu/cpu_kernels_avx2.o: ZT_CFLAGS += $(ISA_AVX2)
$(BUILD)/src/cpu/cpu_kernels_avx512.o: ZT_CFLAGS += $(ISA_AVX512)
$(BUILD)/src/comm/comm_mpi.o: ZT_CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tests/test_comm.o: ZT_CFLAGS += $(MPI_CFLAGS)
$(BUILD)/src/tool/env_report.o: ZT_CFLAGS += $(MPI_CFLAGS)
# Its world-size-1 collectives allocate device memory with the CUDA runtime.
$(BUILD)/tests/test_comm_nccl.o: ZT_CFLAGS += $(if $(filter 1,$(CUDA)),-I$(CUDA_HOME)/include)

# --fmad=false: the same reason as -ffp-contract=off above.
$(BUILD)/cuda/%.o: cuda/%.cu $(STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O2 --fmad=false $(NVCC_GENCODE) -Iinclude -Isrc -I. \
	  -I$(NCCL_HOME)/include -Xcompiler -fPIC,-fvisibility=$(VISIBILITY) \
	  $(filter -D%,$(VISIBILITY_FLAGS)) -DZT_HAVE_CUDA=1 \
	  -MMD -MP -c $< -o $@

$(BUILD)/libztier.a: $(LIB_OBJ) $(STAMP)
	@rm -f $@
	$(AR) rcs $@ $(LIB_OBJ)

$(BUILD)/libztier.so: $(LIB_OBJ) src/libztier.map $(STAMP)
	$(CC) -shared $(SANFLAGS) -Wl,--version-script=src/libztier.map \
	  -Wl,-soname,libztier.so.0 -o $@ $(LIB_OBJ) $(LDLIBS)

$(BUILD)/libztier-internal.so: $(LIB_OBJ) $(STAMP)
	$(CC) -shared $(SANFLAGS) -Wl,-soname,libztier-internal.so -o $@ $(LIB_OBJ) $(LDLIBS)

$(BUILD)/ztier: $(TOOL_OBJ) $(ZT_LINK_DEP)
	$(CC) $(SANFLAGS) -pthread -o $@ $(TOOL_OBJ) $(ZT_LINK_LIB)

$(BUILD)/tests/test_layers: tests/layers.py
	@mkdir -p $(dir $@)
	printf '#!/bin/sh\nexec python3 "%s/tests/layers.py" "$$@"\n' "$(CURDIR)" > $@
	chmod +x $@

$(BUILD)/tests/test_install: tests/install.sh
	@mkdir -p $(dir $@)
	printf '#!/bin/sh\nexec bash "%s/tests/install.sh" "%s" "$$@"\n' "$(CURDIR)" \
	  "$(abspath $(BUILD))" > $@
	chmod +x $@

# Tests link the library as LINK says (by default the static archive), so
# that they reach its internal functions too.
$(BUILD)/tests/test_%: $(BUILD)/tests/test_%.o $(TEST_SUPPORT_OBJ) $(ZT_LINK_DEP)
	$(CC) $(SANFLAGS) -pthread -o $@ $< $(TEST_SUPPORT_OBJ) $(CMOCKA_LIBS) $(ZT_LINK_LIB)

# -Xcompiler splits its argument at commas, so each sanitizer goes alone.
NVCC_SANFLAGS := $(if $(SAN),$(foreach s,$(subst $(comma), ,$(SAN)),-Xcompiler -fsanitize=$(s)) \
                 -Xcompiler -fno-omit-frame-pointer -Xcompiler -fno-sanitize-recover=all)
.PRECIOUS: $(BUILD)/tests/%_host.cu.o
$(BUILD)/tests/%_host.cu.o: tests/%_host.cu $(STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O1 --fmad=false -Iinclude -Isrc -I. -Itests \
	  -Xcompiler -fPIC,-ffp-contract=off $(NVCC_SANFLAGS) -DZT_HAVE_CUDA=1 -MMD -MP \
	  -c $< -o $@

# They include the kernels' own code, which declares the library's internal
# functions hidden: they link the archive whatever LINK says.
$(BUILD)/tests/%_host: $(BUILD)/tests/%_host.cu.o $(TEST_SUPPORT_OBJ) $(BUILD)/libztier.a
	$(CC) $(SANFLAGS) -pthread -o $@ $< $(TEST_SUPPORT_OBJ) $(CMOCKA_LIBS) $(BUILD)/libztier.a \
	  $(LDLIBS) -lstdc++

$(BUILD)/obj/examples/%.o: examples/%.c $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ZT_CFLAGS) -MMD -MP -c $< -o $@

# An example reads its command line with the tool's grammar (src/tool/args.c),
# and prints ztier's statistics and draws its loss curve with the files at
# the top of examples/ (run_report.c), which every example links.
EXAMPLE_SHARED_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard examples/*.c))
define example_rule
$(BUILD)/examples/$(1): $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard examples/$(1)/*.c)) \
                        $(EXAMPLE_SHARED_OBJ) $(BUILD)/src/tool/args.o $(ZT_LINK_DEP)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(SANFLAGS) -pthread -o $$@ $$(filter %.o,$$^) $$(ZT_LINK_LIB)
endef
$(foreach e,$(EXAMPLES),$(eval $(call example_rule,$(e))))

# examples/gpt2 multiplies matrices with OpenBLAS (docs/dependencies.md), and
# so does its gradient check, which links the model's files (all but main.c).
GPT2_LIBS := -lopenblas
GPT2_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out %/main.c,$(wildcard examples/gpt2/*.c)))
$(BUILD)/examples/gpt2: private LDLIBS += $(GPT2_LIBS)
$(BUILD)/tests/test_gpt2_grad: $(BUILD)/tests/test_gpt2_grad.o $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) \
                               $(BUILD)/libztier.a
	$(CC) $(SANFLAGS) -pthread -o $@ $< $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) $(BUILD)/libztier.a \
	  $(CMOCKA_LIBS) $(LDLIBS) $(GPT2_LIBS)
$(BUILD)/tests/test_gpt2_zt: $(BUILD)/tests/test_gpt2_zt.o $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) \
                             $(BUILD)/libztier.a
	$(CC) $(SANFLAGS) -pthread -o $@ $< $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) $(BUILD)/libztier.a \
	  $(CMOCKA_LIBS) $(LDLIBS) $(GPT2_LIBS)
# The tokenizer's test links the example's files, for data.c's gpt2_load_text.
$(BUILD)/tests/test_gpt2_bpe: $(BUILD)/tests/test_gpt2_bpe.o $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) \
                              $(BUILD)/libztier.a
	$(CC) $(SANFLAGS) -pthread -o $@ $< $(GPT2_OBJ) $(TEST_SUPPORT_OBJ) $(BUILD)/libztier.a \
	  $(CMOCKA_LIBS) $(LDLIBS) $(GPT2_LIBS)

# ---- commands -------------------------------------------------------------

# scripts/deps.sh installs what is missing of the packages a purpose needs
# (docs/dependencies.md): make deps, every purpose's; make deps-<purpose>, one
# purpose's, as make test and make demo ask for their own.
DEPS_PURPOSES := build demo test bench fuzz bundle
.PHONY: $(DEPS_PURPOSES:%=deps-%)
deps:
	@bash scripts/deps.sh

$(DEPS_PURPOSES:%=deps-%):
	@bash scripts/deps.sh $(@:deps-%=%)

# The suites that ask for a backend run once per backend named here (one
# tally over all: tests/run.sh); sim is the GPU modelled on the CPU.
TEST_BACKENDS ?= host sim
test: deps-test
	@$(MAKE) --no-print-directory lib tool tests examples
	@bash tests/run.sh $(BUILD) $(TEST_BACKENDS)

# The same suites on the cuda backend; each skips where there is no GPU, and
# fails where there is one (tests/run.sh: a GPU suite that skips on a GPU
# machine has tested nothing).
test-gpu: lib tool tests
	@ZT_TEST_BACKEND=cuda bash tests/run.sh $(BUILD)

# The GPU bundle (docs/gpu.md, "The GPU bundle"): a folder of at most 64 MiB
# for a machine with a GPU and none of this machine's libraries. Its objects
# go to $(BUNDLE)-obj/ (MPI=0, -O2 -g0; liburing, libnuma, hwloc, cJSON and
# cmocka static, cudart static, NCCL found at run time); the folder holds the
# stripped tool, test suites and examples, lib/ and run-gpu.sh.
# scripts/check-bundle.sh checks its size and what its binaries load.
BUNDLE ?= $(BUILD)-gpu-bundle
gpu-bundle:
	+@MAKE="$(MAKE)" GPU_ARCH="$(GPU_ARCH)" CUDA_HOME="$(CUDA_HOME)" \
	  bash scripts/gpu-bundle.sh $(BUNDLE)

# The demo's text ships with Debian's base-files package.
DEMO_TEXT ?= /usr/share/common-licenses/GPL-3
# examples/gpt2 at its "small" size (2.5M parameters, byte-level) for 30
# steps at stage 3, parameters and optimizer states on NVMe (a swap folder in
# the build directory), over 2 ranks when mpirun is there and the build has
# comm "mpi" (the sub-make's settings stamp says MPI=0 when it has not), else
# 1. OpenMPI refuses root without its two variables, and 2 ranks on fewer
# cores without --oversubscribe; one BLAS thread a rank keeps the two ranks
# from each starting a thread per core. It prints the losses, ztier's
# statistics, and writes the loss curve and the trained weights.
# (examples/charlm, the smallest example, runs as docs/demo.md shows.)
DEMO_FLAGS = --size small --text $(DEMO_TEXT) --batch 4 --seq 64 --steps 30 --lr 6e-4 \
  --warmup 5 --clip 1 --every 5 --val-every 10 --val-batches 2 --stage 3 \
  --optimizer-tier nvme --param-tier nvme --swap-path $(BUILD)/demo-swap --stats \
  --plot $(BUILD)/gpt2-loss.png --export $(BUILD)/gpt2-demo.safetensors
demo: deps-demo
	@$(MAKE) --no-print-directory lib tool examples
	@mkdir -p $(BUILD)/demo-swap
	@if command -v mpirun >/dev/null && ! grep -q 'MPI=0' $(STAMP); then \
	  set -x; OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 \
	    mpirun --oversubscribe -np 2 $(BUILD)/examples/gpt2 $(DEMO_FLAGS) </dev/null; \
	else \
	  set -x; $(BUILD)/examples/gpt2 $(DEMO_FLAGS); \
	fi

# ---- fuzzing ----------------------------------------------------------------
#
# Each target is one tests/fuzz/fuzz_<name>.c, built by clang with libFuzzer
# and ASan+UBSan together with only the library sources the parsers need, in
# one command: the gcc objects of $(BUILD) are never mixed in.
# tests/fuzz/run.sh skips (with a message) where clang or its libFuzzer is
# missing.
FUZZ_TARGETS := manifest safetensors
FUZZ_CC ?= clang
FUZZ_SRC := src/ckpt/manifest.c src/ckpt/safetensors.c src/base/ckjson.c src/base/errors.c \
            src/base/util.c
FUZZ_BIN := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_SECONDS ?=

# The empty recipe keeps make from saying "Nothing to be done" in every run.
fuzzers: $(FUZZ_BIN)
	@:

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRC) include/ztier.h \
                      $(wildcard src/ckpt/*.h src/base/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -std=gnu11 -Iinclude -Isrc -I. -DZT_HAVE_CUDA=0 -o $@ $< $(FUZZ_SRC) \
	  -lcjson -lpthread -lm

fuzz:
	+@FUZZ_CC=$(FUZZ_CC) bash tests/fuzz/run.sh $(BUILD) $(or $(FUZZ_SECONDS),300) $(FUZZ_TARGETS)

fuzz-brief:
	+@FUZZ_CC=$(FUZZ_CC) bash tests/fuzz/run.sh $(BUILD) $(or $(FUZZ_SECONDS),20) $(FUZZ_TARGETS)

# What install puts where; uninstall removes exactly these files, and the
# docs' own folder (README.md's links into docs/ keep working there).
DOC_DIR := $(PREFIX)/share/doc/ztier
DOCS := $(wildcard docs/*.md)
INSTALLED := $(PREFIX)/include/ztier.h $(PREFIX)/lib/libztier.a $(PREFIX)/lib/libztier.so.0 \
             $(PREFIX)/lib/libztier.so $(PREFIX)/lib/pkgconfig/ztier.pc $(PREFIX)/bin/ztier \
             $(DOC_DIR)/README.md $(addprefix $(DOC_DIR)/,$(DOCS))
# ztier.pc: what a static link needs besides libztier, as the packages that
# have a .pc (Requires.private) and as flags for the rest (Libs.private).
# MPI found without OpenMPI's ompi-c.pc (another MPI, or CC=mpicc) goes in
# as the flags it was linked with: a Requires.private that pkg-config cannot
# find fails every query of ztier.pc.
PC_MPI_PC := $(if $(filter 1,$(MPI)),$(shell pkg-config --exists ompi-c 2>/dev/null && echo 1))
PC_REQUIRES := libcjson liburing numa hwloc$(if $(PC_MPI_PC), ompi-c)
PC_LIBS := -lm -lpthread$(if $(filter 1,$(MPI)),$(if $(PC_MPI_PC),, $(MPI_LIBS)))$(if \
           $(filter 1,$(CUDA)), $(LDLIBS_CUDA))
ZT_VERSION := $(shell sed -n 's/^\#define ZT_VERSION_STRING "\(.*\)"/\1/p' include/ztier.h)

install: lib tool
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(DOC_DIR)/docs
	install -m 644 include/ztier.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libztier.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libztier.so $(DESTDIR)$(PREFIX)/lib/libztier.so.0
	ln -sf libztier.so.0 $(DESTDIR)$(PREFIX)/lib/libztier.so
	install -m 755 $(BUILD)/ztier $(DESTDIR)$(PREFIX)/bin/
	install -m 644 README.md $(DESTDIR)$(DOC_DIR)/
	install -m 644 $(DOCS) $(DESTDIR)$(DOC_DIR)/docs/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(ZT_VERSION)|' \
	  -e 's|@REQUIRES_PRIVATE@|$(PC_REQUIRES)|' -e 's|@LIBS_PRIVATE@|$(PC_LIBS)|' \
	  scripts/ztier.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ztier.pc

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(DOC_DIR)/docs $(DESTDIR)$(DOC_DIR) 2>/dev/null

clean:
	rm -rf build build-*

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
