# PGXS build of the gpu_ivfpq extension, and its pg_regress and TAP suites.
#
#   make                        the extension; with the CUDA kernels linked into
#                               its GPU process where nvcc is found (see "CUDA"
#                               below; USE_CUDA=0: CPU only)
#   make install                into the server of $(PG_CONFIG) (as root)
#   make installcheck           pg_regress (test/sql, test/expected), then
#                               the TAP files (test/t); TAP_TESTS= skips TAP
#   make prove_installcheck     the TAP files only; PROVE_TESTS=test/t/001_wal.pl
#                               picks files, PROVE_FLAGS=-v is passed to prove
#   make installcheck-service   the pg_regress suite plus service_status on an
#                               instance that preloads gpu_ivfpq, so that the
#                               GPU service serves the scans (its CPU emulation
#                               of the GPU; the GPU with GPU_IVFPQ_EXPECT_GPU=1)
#   make core                   src/libgpu_ivfpq_core.a, see "Core objects"
#   make pgindent               pgindent over the PostgreSQL-side sources
#
# The test targets test the installed extension and start their own
# temporary servers from the installed binaries (pg_regress --temp-instance;
# PostgreSQL::Test::Cluster for TAP), so they run as an ordinary OS user, not
# root (initdb refuses root): CI runs them as the postgres OS user.
# `make installcheck RUNNING_SERVER=1` runs pg_regress against the server
# that PGHOST/PGPORT name instead, as PGXS does by default.
#
# The engine's GoogleTest tests and the kernels' tests and benchmark are
# built with CMake (CMakeLists.txt); scripts/run-tests.sh runs every suite.
#
# Code style: PostgreSQL-side C++ (src/am, src/metric, src/common, src/functions,
# src/service) follows pgindent with the typedefs in src/typedefs.list
# (`make pgindent`); src/engine, src/gpu_process and gpu/ follow
# .clang-format.
# gpu_ivfpq_pgvector: the operator classes and search function overloads
# for pgvector's vector and halfvec types, a companion extension (it
# requires pgvector's `vector`) whose functions live in gpu_ivfpq's library:
# gpu_ivfpq itself builds, installs and runs without pgvector.
EXTENSION = gpu_ivfpq gpu_ivfpq_pgvector
MODULE_big = gpu_ivfpq
# Fresh installs run gpu_ivfpq--<version>.sql; older versions are updated by
# the gpu_ivfpq--<from>--<to>.sql scripts (ALTER EXTENSION gpu_ivfpq UPDATE).
DATA = sql/gpu_ivfpq--0.1.0.sql sql/gpu_ivfpq--0.2.0.sql sql/gpu_ivfpq--0.3.0.sql sql/gpu_ivfpq--0.4.0.sql \
	sql/gpu_ivfpq--0.1.0--0.2.0.sql sql/gpu_ivfpq--0.2.0--0.3.0.sql sql/gpu_ivfpq--0.3.0--0.4.0.sql \
	sql/gpu_ivfpq_pgvector--0.2.0.sql

# The layers, one folder each: the access method, the SQL functions, the GPU
# service and its PostgreSQL-free device layer, the engine.
ENGINE_SRCS = $(sort $(wildcard src/engine/*.cpp src/engine/metric/*.cpp))
# cuda_device.cpp needs the kernels' headers (only with GPU_IVFPQ_CUDA_LIB);
# gpu_process_main.cpp is the GPU process's main(): both go into the GPU
# process program only.
GPU_PROCESS_ONLY = src/gpu_process/cuda_device.cpp src/gpu_process/gpu_process_main.cpp
DEVICE_SRCS = $(sort $(filter-out $(GPU_PROCESS_ONLY),$(wildcard src/gpu_process/*.cpp)))
PG_SRCS = $(sort $(wildcard src/common/*.cpp src/am/*.cpp src/metric/*.cpp src/functions/*.cpp src/service/*.cpp))

# Core objects: the PostgreSQL-free engine and device layer. The extension
# links these objects, and `make core` archives the same files into
# src/libgpu_ivfpq_core.a, which the GoogleTest binaries link (CMake builds
# the archive by calling `make core`). So the unit tests test the objects
# that ship, compiled once, with the extension's flags.
CORE_OBJS = $(DEVICE_SRCS:.cpp=.o) $(ENGINE_SRCS:.cpp=.o)
PG_OBJS = $(PG_SRCS:.cpp=.o)
CORE_LIB = src/libgpu_ivfpq_core.a
OBJS = $(PG_OBJS) $(CORE_OBJS)

# pg_regress: test/sql/NAME.sql against test/expected/NAME.out, in this order.
REGRESS = operators options build_edge scan_basic scan_hints filter_pushdown dml_vacuum search_functions rabitq_codes zero_vectors large_values index_stats privileges index_check model_cache settings gpu_metric extension_update
# Run last, on the preloaded instance only (installcheck-service).
REGRESS_SERVICE = service_status service_rabitq gpu_metric_service
REGRESS_OPTS = --inputdir=test
# Made before pg_regress runs (PGXS reads it when it defines installcheck).
REGRESS_PREP = tmp_check/.dir tmp_check/regress.conf
# The temporary instances use the C locale and UTF8, as CI always has.
ENCODING = UTF8
NO_LOCALE = 1

# TAP: test/t/*.pl (PostgreSQL::Test::Cluster), with FashionMnist.pm, CrashRestart.pm and GpuNode.pm beside them.
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# The GPU process: the program the GPU service starts to own the device
# (installed beside the extension's library), so that a fault in CUDA code
# or the driver never ends a process attached to PostgreSQL's shared memory.
GPU_PROCESS = src/gpu_ivfpq_gpu_process
GPU_PROCESS_OBJS = src/gpu_process/gpu_process_main.o

EXTRA_CLEAN = $(CORE_LIB) $(GPU_PROCESS) $(GPU_PROCESS_OBJS) src/gpu_process/cuda_device.o \
	src/.flags-core src/.flags-pg gpu/.flags-cuda gpu/obj gpu/libgpu_ivfpq_gpu.a

# Debian's PGXS expects clang for LLVM bitcode; the extension needs no JIT.
override with_llvm = no

PG_CONFIG ?= pg_config

# pgvector: pgvector's vector and halfvec columns through gpu_ivfpq_pgvector.
# It needs pgvector (the `vector` extension) installed in the server of
# $(PG_CONFIG): scripts/run-tests.sh builds it from its source tarball when
# that is at hand. Without pgvector the test is left out, and the test
# targets say so.
PGVECTOR_CONTROL := $(wildcard $(shell $(PG_CONFIG) --sharedir 2>/dev/null)/extension/vector.control)
ifneq ($(PGVECTOR_CONTROL),)
REGRESS += pgvector
endif

# The options test reads metapages through contrib's pageinspect: where the
# server has no contrib (the PostgreSQL 16 wheel), it is left out, saying so.
PAGEINSPECT_CONTROL := $(wildcard $(shell $(PG_CONFIG) --sharedir 2>/dev/null)/extension/pageinspect.control)
ifeq ($(PAGEINSPECT_CONTROL),)
REGRESS := $(filter-out options,$(REGRESS))
endif

# Serial OpenBLAS when present (no BLAS thread pool inside a backend).
OPENBLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-serial /usr/include/openblas-serial))
OPENBLAS_LIB := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-serial))
ifneq ($(OPENBLAS_INC),)
ifneq ($(OPENBLAS_LIB),)
BLAS_CPPFLAGS = -DGPU_IVFPQ_HAVE_CBLAS=1 -I$(OPENBLAS_INC)
CORE_LDLIBS = -L$(OPENBLAS_LIB) -Wl,-rpath,$(OPENBLAS_LIB) -lopenblas
endif
endif
# What a program that links the core archive needs besides it (CMake asks
# with `make print-core-ldlibs`, so the BLAS choice is made here only).
CORE_LDLIBS += -lpthread
SHLIB_LINK += $(CORE_LDLIBS)

PG_CPPFLAGS = -I$(srcdir)/src $(BLAS_CPPFLAGS)

# CUDA: where the toolkit is found (nvcc on PATH, else under CUDA_HOME),
# `make` also builds the kernels of gpu/ (nvcc, for the architectures in
# CUDA_ARCHS: `make CUDA_ARCHS="90 80"` adds sm_80) into
# gpu/libgpu_ivfpq_gpu.a and links them into the GPU process;
# `make USE_CUDA=0` builds without them. GPU_IVFPQ_CUDA_LIB=archive links a
# prebuilt archive instead (CMake's, -DGPU_IVFPQ_CUDA=ON). Only the GPU
# process's own objects see the CUDA flags: the extension's library and the
# core objects are the same with or without the kernels.
# `sudo make install` repeats the detection with root's PATH: where nvcc is
# neither on it nor in /usr/local/cuda, pass the same USE_CUDA / CUDA_HOME to
# both commands (paths are compared resolved, so /usr/local/cuda and the
# versioned folder it links to count as the same toolkit).
NVCC_ON_PATH := $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(or $(realpath $(NVCC_ON_PATH)),$(realpath /usr/local/cuda/bin/nvcc),/usr/local/cuda/bin/nvcc))
NVCC ?= $(CUDA_HOME)/bin/nvcc
NVCC_REAL = $(or $(realpath $(NVCC)),$(shell command -v $(NVCC) 2>/dev/null))
USE_CUDA ?= $(if $(NVCC_REAL),1,0)
CUDA_ARCHS ?= 90
GPU_CUDA_OWN_LIB = gpu/libgpu_ivfpq_gpu.a
ifeq ($(USE_CUDA),1)
ifeq ($(GPU_IVFPQ_CUDA_LIB),)
GPU_IVFPQ_CUDA_LIB = $(GPU_CUDA_OWN_LIB)
endif
endif
ifneq ($(GPU_IVFPQ_CUDA_LIB),)
GPU_PROCESS_OBJS += src/gpu_process/cuda_device.o
GPU_PROCESS_LIBS = $(abspath $(GPU_IVFPQ_CUDA_LIB)) -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
endif
PG_CXXFLAGS = -Wno-register
SHLIB_LINK += -lstdc++

# A PostgreSQL configured without --enable-tap-tests (the PyPI wheels) still
# runs the TAP files, with the system's prove and the Perl test modules found
# in its PGXS tree (scripts/install-postgres.sh puts them there).
override enable_tap_tests = yes
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
ifeq ($(strip $(PROVE)),)
PROVE = prove
endif

# PostgreSQL's CXXFLAGS are C-oriented (-O2); the engine's hot loops want -O3
# and OpenMP SIMD hints (no OpenMP runtime). PostgreSQL 16 and later pass
# C-only flags that g++ refuses (-fexcess-precision=standard) or warns
# about: they are dropped. CFLAGS serve only the link (the extension has no
# C file): a flag of a newer gcc than the one here that built the server
# (-Wmissing-variable-declarations, gcc 14) is dropped from them too.
CXX_REFUSED_FLAGS = -O2 -fexcess-precision=standard -Wmissing-prototypes -Wdeclaration-after-statement \
	-Wmissing-variable-declarations -Werror=vla
override CXXFLAGS := $(filter-out $(CXX_REFUSED_FLAGS),$(CXXFLAGS)) -O3 -fopenmp-simd -ffp-contract=off -std=c++17 -Wno-missing-field-initializers
override CFLAGS := $(filter-out -Wmissing-variable-declarations,$(CFLAGS))

# -Wextra on the core only: it includes no PostgreSQL header, whose
# warnings would drown the rest.
$(CORE_OBJS): private override CXXFLAGS += -Wextra

ifneq ($(GPU_IVFPQ_CUDA_LIB),)
# gpu/include's headers include the engine's by name: -iquote, so that no
# engine header can stand in for a system one (error.h and <error.h>).
$(GPU_PROCESS_OBJS): private override CPPFLAGS += -DGPU_IVFPQ_WITH_CUDA=1 -I$(srcdir)/gpu/include -iquote $(srcdir)/src/engine
endif
$(GPU_PROCESS_OBJS): private override CXXFLAGS += -Wextra

# ------------------------------------------------------------------ GPU process
all: $(GPU_PROCESS)
# The kernel archive uses engine routines: the core archive again after it.
$(GPU_PROCESS): $(GPU_PROCESS_OBJS) $(CORE_LIB)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $(GPU_PROCESS_OBJS) $(CORE_LIB) $(GPU_PROCESS_LIBS) \
		$(if $(GPU_PROCESS_LIBS),$(CORE_LIB)) $(CORE_LDLIBS)
install: install-gpu-process
.PHONY: install-gpu-process uninstall-gpu-process
install-gpu-process: $(GPU_PROCESS) installdirs
	$(INSTALL_PROGRAM) $(GPU_PROCESS) '$(DESTDIR)$(pkglibdir)/gpu_ivfpq_gpu_process'
uninstall: uninstall-gpu-process
uninstall-gpu-process:
	rm -f '$(DESTDIR)$(pkglibdir)/gpu_ivfpq_gpu_process'

# ------------------------------------------------------------------ CUDA kernels
# The same sources and flags as gpu/CMakeLists.txt's library: every .cu and
# .cpp of gpu/src through nvcc, host code without fused multiply-add (as the
# rest of the host code), register spills reported.
GPU_CUDA_SRCS = $(sort $(wildcard gpu/src/*.cu gpu/src/*.cpp gpu/src/*/*.cu gpu/src/*/*.cpp))
GPU_CUDA_OBJS = $(patsubst gpu/src/%,gpu/obj/%.o,$(GPU_CUDA_SRCS))
NVCCFLAGS = -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -Xptxas=-warn-spills \
	-Xcompiler=-ffp-contract=off -Xcompiler=-fmacro-prefix-map=$(abspath $(srcdir))/= \
	$(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	-gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS)) \
	-ccbin $(CXX) -I$(srcdir)/gpu/include -I$(srcdir)/src
# The last architecture's PTX is kept too, so newer GPUs can compile it when
# the program loads; older ones need their own entry in CUDA_ARCHS.
gpu/obj/%.o: gpu/src/% gpu/.flags-cuda
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(GPU_CUDA_OBJS): $(wildcard gpu/src/*.h gpu/src/*.cuh gpu/src/*/*.h gpu/src/*/*.cuh gpu/include/*/*.h src/engine/*.h src/engine/*/*.h)
$(GPU_CUDA_OWN_LIB): $(GPU_CUDA_OBJS)
	rm -f $@
	$(AR) crs $@ $^
ifneq ($(GPU_IVFPQ_CUDA_LIB),)
$(GPU_PROCESS): $(GPU_IVFPQ_CUDA_LIB)
endif
.PHONY: cuda-info
cuda-info:
	@echo 'USE_CUDA=$(USE_CUDA) NVCC=$(NVCC_REAL) CUDA_HOME=$(CUDA_HOME) CUDA_ARCHS=$(CUDA_ARCHS) GPU_IVFPQ_CUDA_LIB=$(GPU_IVFPQ_CUDA_LIB)'

# ------------------------------------------------------------------ rebuilds
# Headers are few and shared: rebuild every object when one changes.
$(OBJS) $(GPU_PROCESS_OBJS): $(wildcard src/*/*.h src/*/*/*.h)
src/gpu_process/cuda_device.o: $(wildcard gpu/include/*/*.h)

# Make does not notice changed flags (a build with GPU_IVFPQ_CUDA_LIB after
# one without, another PG_CONFIG, CXXFLAGS on the command line): each group
# of objects depends on a file holding its compile command, rewritten only
# when that command changes. The core's file leaves out the CUDA flags, so
# switching the kernels on or off does not recompile the core.
define write_if_changed
@printf '%s\n' '$(subst ','\'',$(2))' | cmp -s - $(1) || printf '%s\n' '$(subst ','\'',$(2))' >$(1)
endef
.PHONY: FORCE
src/.flags-core: FORCE
	$(call write_if_changed,$@,$(CXX) $(CXXFLAGS) $(CPPFLAGS))
src/.flags-pg: FORCE
	$(call write_if_changed,$@,$(CXX) $(CXXFLAGS) $(CPPFLAGS) $(GPU_IVFPQ_CUDA_LIB))
gpu/.flags-cuda: FORCE
	$(call write_if_changed,$@,$(NVCC_REAL) $(NVCCFLAGS))
$(CORE_OBJS): src/.flags-core
$(PG_OBJS) $(GPU_PROCESS_OBJS): src/.flags-pg

# ------------------------------------------------------------------ core
.PHONY: core print-core-ldlibs
core: $(CORE_LIB)
$(CORE_LIB): $(CORE_OBJS)
	rm -f $@
	$(AR) crs $@ $^
print-core-ldlibs:
	@echo '$(strip $(CORE_LDLIBS))'

# ------------------------------------------------------------------ tests
# pg_regress starts a temporary instance (see the top of this file), under
# tmp_check/ as PGXS's own `make check` does; TEMP_CONFIG adds settings to
# it (e.g. jit = off where the server package has no LLVM).
ifeq ($(RUNNING_SERVER),)
REGRESS_OPTS += --temp-instance=tmp_check/regress $(TEMP_CONF) --temp-config=tmp_check/regress.conf
endif
tmp_check/.dir:
	$(MKDIR_P) tmp_check
	touch $@
# The tests' VACUUMs must remove what they deleted: an autoanalyze of another
# table, whose snapshot predates a DELETE, would hold its rows back.
tmp_check/regress.conf: tmp_check/.dir
	@echo "autovacuum = off" >$@

# The same suite again, then service_status, on an instance whose GPU
# service serves the scans: always a temporary instance (RUNNING_SERVER
# aside), since the preload needs a server of its own. Its output goes to
# tmp_check/service/ (diffs in tmp_check/service/regression.diffs), apart
# from the plain run's results/.
SERVICE_CONF = tmp_check/service.conf
.PHONY: installcheck-service
installcheck-service: tmp_check/.dir
	@echo "shared_preload_libraries = 'gpu_ivfpq'" >$(SERVICE_CONF)
	@echo "gpu_ivfpq.service_emulate_gpu = $(if $(filter 1,$(GPU_IVFPQ_EXPECT_GPU)),off,on)" >>$(SERVICE_CONF)
	@# Two emulated GPUs: every scan of the suite goes through replicas (one GPU process, two devices).
	@echo "gpu_ivfpq.service_emulate_devices = 2" >>$(SERVICE_CONF)
	@# The tests' VACUUMs must remove what they deleted (see tmp_check/regress.conf).
	@echo "autovacuum = off" >>$(SERVICE_CONF)
	$(pg_regress_installcheck) $(filter-out --temp-instance=% --temp-config=%,$(REGRESS_OPTS)) \
	    --temp-instance=tmp_check/service-instance $(TEMP_CONF) --temp-config=$(SERVICE_CONF) \
	    --outputdir=tmp_check/service $(REGRESS) $(REGRESS_SERVICE)

# The pgvector test needs pgvector installed (see REGRESS above).
installcheck installcheck-service: pgvector-note
.PHONY: pgvector-note
pgvector-note:
ifeq ($(PGVECTOR_CONTROL),)
	@echo "pgvector is not installed in $$($(PG_CONFIG) --sharedir): the pgvector regression test is skipped"
endif
ifeq ($(PAGEINSPECT_CONTROL),)
	@echo "pageinspect is not installed in $$($(PG_CONFIG) --sharedir): the options regression test is skipped"
endif

# The TAP files alone (PGXS runs them at the end of installcheck).
.PHONY: prove_installcheck
prove_installcheck:
	$(prove_installcheck)
PG_PROVE_FLAGS += -I $(srcdir)/test/t

# ------------------------------------------------------------------ style
# pgindent over the PostgreSQL-side sources (PGINDENT: PostgreSQL's
# src/tools/pgindent/pgindent, with pg_bsd_indent on PATH). Its typedefs are
# PostgreSQL's own list (PG_TYPEDEFS, beside pgindent by default) plus ours,
# src/typedefs.list: the structs and typedefs of src/am, src/metric, src/common,
# src/functions and src/service, one name a line; add a type there when you
# add one. pgindent is a C indenter: check what it does to the C++ parts
# (namespaces, templates, lambdas) before committing. The engine, the device
# layer and gpu/ follow .clang-format instead. CI applies neither.
PGINDENT ?= pgindent
PG_TYPEDEFS ?= $(dir $(shell command -v $(PGINDENT) 2>/dev/null))typedefs.list
PGINDENT_SRCS = $(sort $(wildcard src/am/*.cpp src/am/*.h src/metric/*.cpp src/metric/*.h src/common/*.cpp src/common/*.h \
	src/functions/*.cpp src/functions/*.h src/service/*.cpp src/service/*.h))
.PHONY: pgindent
pgindent: tmp_check/.dir
	@command -v $(PGINDENT) >/dev/null || { echo "pgindent not found: make pgindent PGINDENT=/path/to/postgresql/src/tools/pgindent/pgindent"; exit 1; }
	@test -f $(PG_TYPEDEFS) || { echo "PostgreSQL's typedefs.list not found: make pgindent PG_TYPEDEFS=/path/to/typedefs.list"; exit 1; }
	cat $(PG_TYPEDEFS) src/typedefs.list >tmp_check/typedefs.list
	$(PGINDENT) --typedefs=tmp_check/typedefs.list $(PGINDENT_SRCS)
