# gradcomm: a thin layer over CMake. The build directory is build/ and every
# executable lands in build/bin/.
#
#   make demo   install missing system packages, build, run a 2-rank allreduce
#               sweep over shared memory beside MPI_Allreduce
#   make test   install missing system packages and the Python test
#               environment (pinned torch, scripts/bootstrap-python), build,
#               run the whole test suite
#   make build  configure and build only
#   make sweep  a longer sweep with JSON, CSV and a plot in build/sweep/

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
# ccache (scripts/bootstrap installs it) makes rebuilds in another clone or
# build tree of this machine cheap; paths below this folder hash as relative.
ifneq ($(shell command -v ccache 2>/dev/null),)
CMAKE_FLAGS += -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR := $(CURDIR)
endif
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_btl_tcp_if_include ?= lo
export OMPI_MCA_oob_tcp_if_include ?= lo
# Two ranks on two or more cores: no oversubscription, so no yield-when-idle
# (with it, the ranks' polling loops hand the cores back and forth and small
# messages take tens of microseconds).
MPIRUN = mpirun --bind-to none
# The plot needs matplotlib: Debian's python3 (python3-matplotlib) when it
# has it, since the python3 first on PATH (a pyenv or venv one) may not.
PYTHON ?= $(shell /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 && echo /usr/bin/python3 || echo python3)

.PHONY: all deps deps-python build demo test sweep install clean

all: build

deps:
	@scripts/bootstrap

deps-python:
	@scripts/bootstrap-python

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@echo "== gradcomm demo: allreduce sweep, 2 ranks on this host (shared memory) =="
	$(MPIRUN) -np 2 $(BUILD)/bin/gradcomm-bench -b 8 -e 128M -f 8 -n 20 -w 5 \
	  --algo default,shm,ring,rd --baseline mpi,memcpy -q

test: deps deps-python
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DPython3_EXECUTABLE=$$(scripts/bootstrap-python --print-python)
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 1500

sweep: build
	mkdir -p $(BUILD)/sweep
	$(MPIRUN) -np 2 $(BUILD)/bin/gradcomm-bench -b 8 -e 128M -f 2 -n 20 -w 5 --algo all \
	  --baseline mpi,memcpy,p2p --json $(BUILD)/sweep/sweep.json --csv $(BUILD)/sweep/sweep.csv
	$(PYTHON) bench/plot_sweep.py $(BUILD)/sweep/sweep.json -o $(BUILD)/sweep/sweep.png

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
