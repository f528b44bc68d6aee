# PGXS build of the gpu_ivfpq extension: `make`, `make install`,
# `make installcheck` (pg_regress: test/sql against test/expected). The
# engine's unit tests and the CUDA kernels are built with CMake (see
# README.md).
EXTENSION = gpu_ivfpq
MODULE_big = gpu_ivfpq
DATA = sql/gpu_ivfpq--0.1.0.sql

# The layers, one folder each (README "Layout"): the access method, the SQL
# functions, the GPU service and its PostgreSQL-free device layer, the engine.
ENGINE_SRCS = $(sort $(wildcard src/engine/*.cpp))
# cuda_device.cpp needs the kernels' headers: only with GPU_IVFPQ_CUDA_LIB.
DEVICE_SRCS = $(sort $(filter-out src/service/device/cuda_device.cpp,$(wildcard src/service/device/*.cpp)))
PG_SRCS = $(sort $(wildcard src/common/*.cpp src/am/*.cpp src/functions/*.cpp src/service/*.cpp))
OBJS = $(PG_SRCS:.cpp=.o) $(DEVICE_SRCS:.cpp=.o) $(ENGINE_SRCS:.cpp=.o)

# pgvector's test layout: test/sql, test/expected, test/t (TAP), test/unit.
REGRESS = operators options build_edge scan_basic dml_vacuum search_functions
REGRESS_OPTS = --inputdir=test

# Debian's PGXS expects clang for LLVM bitcode; the extension needs no JIT.
override with_llvm = no

PG_CONFIG ?= pg_config

# Serial OpenBLAS when present (no BLAS thread pool inside a backend).
OPENBLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-serial /usr/include/openblas-serial))
OPENBLAS_LIB := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-serial))
ifneq ($(OPENBLAS_INC),)
ifneq ($(OPENBLAS_LIB),)
BLAS_CPPFLAGS = -DGPU_IVFPQ_HAVE_CBLAS=1 -I$(OPENBLAS_INC)
SHLIB_LINK += -L$(OPENBLAS_LIB) -Wl,-rpath,$(OPENBLAS_LIB) -lopenblas
endif
endif

PG_CPPFLAGS = -I$(srcdir)/src $(BLAS_CPPFLAGS)

# Optional: link the CUDA kernels (CMake, -DGPU_IVFPQ_CUDA=ON) so that the GPU
# service can open the device, e.g.
#   make GPU_IVFPQ_CUDA_LIB=build-gpu/gpu/libgpu_ivfpq_gpu.a
CUDA_HOME ?= /usr/local/cuda
ifneq ($(GPU_IVFPQ_CUDA_LIB),)
PG_CPPFLAGS += -DGPU_IVFPQ_WITH_CUDA=1 -I$(srcdir)/gpu/include -I$(srcdir)/src/engine
OBJS += src/service/device/cuda_device.o
SHLIB_LINK += $(abspath $(GPU_IVFPQ_CUDA_LIB)) -L$(CUDA_HOME)/lib64 -lcublas -lcudart
endif
PG_CXXFLAGS = -Wno-register
SHLIB_LINK += -lstdc++ -lpthread

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PostgreSQL's CXXFLAGS are C-oriented (-O2); the engine's hot loops want -O3
# and OpenMP SIMD hints (no OpenMP runtime).
override CXXFLAGS := $(filter-out -O2,$(CXXFLAGS)) -O3 -fopenmp-simd -std=c++17 -Wno-missing-field-initializers

# Headers are few and shared: rebuild every object when one changes.
$(OBJS): $(wildcard src/*/*.h src/*/*/*.h)
