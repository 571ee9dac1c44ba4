# make demo  -- set up a virtual environment and run the main job
# make test  -- set up a virtual environment and run the whole test suite (what CI runs;
#               the extended set is left out, by pyproject.toml's addopts), on TEST_WORKERS
#               pytest-xdist workers (default 3 on CI's 2 cores; 0 runs it in this process)
# make bytecode -- refconv's, kernels/' and tests/' .pyc written ahead (compileall): every test and demo target runs it
#                 first, because with PYTHONDONTWRITEBYTECODE=1 no process writes them (see the target below)
# make test-fast -- the editing loop, under 2 minutes on 2 cores: the reference, the algorithms and
#                  layers on 1 to 4 simulated ranks, the simulated world, the exercises, the docs
#                  and the architecture rules, with at most 10 Hypothesis examples a test
# make test-extended -- the long set the default run leaves out (fault injection, executed site, ...; the 3
#                      training steps of the plans of resnet50's 2x and 4x wide presets, whose plans
#                      make test checks are resnet50's, which it trains: tests/plan/test_plan.py; and
#                      make gpu-dry-run's rehearsal)
# make gpu-dry-run -- the device check's whole rehearsal on the CPU (scripts/gpu_check.sh --dry-run: every step
#                     under the CUDA simulator with tiny shapes, its summary checked; about 150 s of one core).
#                     Run it before spending device time on scripts/gpu_check.sh.  make test checks the script's
#                     pieces (steps, limits, refusals, the kill at a limit, the report) and its env and ranks steps.

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv

.PHONY: setup bytecode demo test test-fast test-extended gpu-dry-run explore clean

setup: $(VENV)/.installed

# uv installs the packages (pip installs only uv): on CI's two cores a new venv took 102 s with pip (venv 7 s,
# the test extra 55 s, torch 37 s, most of it unpacking and compiling .pyc on one core) and 37 s with uv, the
# same packages at the same versions (docs/benchmarks.md, 2026-12-06, 21:11-23:41 UTC).  --compile-bytecode writes
# the .pyc of every module it installs: left to the first import, they were never written where
# PYTHONDONTWRITEBYTECODE=1 is set, as on our machines, so every process compiled torch's modules again.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	$(UV) pip install --quiet --python $(PY) --compile-bytecode -e '.[test]'
	touch $@

# refconv's own .pyc, written before a run: where PYTHONDONTWRITEBYTECODE=1 is set (our machines and CI's) no
# import writes them, and every process the tests start (mpiexec's ranks, the CLI, the tutorials) compiled
# refconv from source again: tests/mpiexec/test_faults.py took 55.0 and 53.2 s without them, 41.5 and 42.0 s
# with (47 CPU seconds against 32).  A .pyc whose source has changed since is not used (Python checks the
# source's time and size).
bytecode: setup
	$(PY) -m compileall -q -j 0 refconv kernels tests > /dev/null

# Distributed training of the digits CNN on 4 ranks (sample=2 x channel=2, Stationary-X),
# checked step by step against a one-rank replay of its first 5 steps.  `refconv demo`
# (refconv/commands/demo.py) launches mpiexec -n 4 itself; DEMO_ARGS adds refconv train options.
DEMO_ARGS ?=

demo: bytecode
	OMP_NUM_THREADS=1 $(VENV)/bin/refconv demo $(DEMO_ARGS)

# tests/conftest.py keeps a file's tests on one worker, and each mpiexec launch of tests/mpiexec/test_mpi.py
# (one tests/mpiexec/launched file at one world size) on one worker.  Three workers on CI's two cores: for part
# of the suite a worker waits (on mpiexec's children, on the timeouts of the hang and fault tests), and a third
# fills that time.  tests/mpiexec took 203 s on two workers and 157 s on three, back to back beside a nice-19
# job; the whole suite gained little (docs/benchmarks.md, 2026-12-06 18:25).
TEST_WORKERS ?= 3

# One BLAS thread per worker (as mpiexec's ranks get, refconv.testing.mpirun): two workers with OpenBLAS's
# default of a thread per core ran four spinning threads on two cores (refconv/threads.py measured 4.3x for
# two ranks); one training test took 68 CPU seconds so on the loaded machine, 2.8 with one thread.
test: bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The fast tier's files: `--max-ranks 4` (tests/conftest.py) leaves out their items on 5 to 8 simulated
# ranks, and the `fast` Hypothesis profile (refconv/testing/profiles.py) draws fewer examples where a
# test does not set its own number.  `make test` runs all of them, and the rest.
FAST_TESTS := tests/reference tests/architecture tests/simulator/test_simulated.py \
	tests/docs_and_tutorials/test_docs.py tests/docs_and_tutorials/test_exercises.py \
	$(foreach t,collectives distribution grid distconv distconv3d distconv_volume layers fifth_algorithm mutants,\
	          tests/on_ranks/test_$(t).py)

test-fast: bytecode
	HYPOTHESIS_PROFILE=fast OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --max-ranks 4 \
		$(FAST_TESTS)

# make explore -- the suite with random Hypothesis draws (the default profile, ci, is derandomized)
explore: bytecode
	HYPOTHESIS_PROFILE=explore OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-extended: bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m extended

gpu-dry-run: bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -m gpu_dry_run tests/cuda_kernels/test_gpu_check.py

# make zoo -- the MPI zoo (tests/mpi_zoo/): incorrect MPI programs in the MPI Bugs Initiative's nine classes, each
#            with its correct twin, on simulated ranks; prints what refconv.simulated catches, by class
#            (ZOO_ARGS: e.g. --class "Message Race", -v, --write-baseline)
.PHONY: zoo
ZOO_ARGS ?=
zoo: bytecode
	OMP_NUM_THREADS=1 $(PY) tests/mpi_zoo/zoo.py $(ZOO_ARGS)

# make exercises -- every exercise's checker: each skeleton says what is not written yet, each solution passes,
#                  each detective bug planted back is caught (tests/docs_and_tutorials/test_exercises.py, a few examples a part)
.PHONY: exercises
exercises: bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider tests/docs_and_tutorials/test_exercises.py \
		tests/docs_and_tutorials/test_exercise_hints.py tests/docs_and_tutorials/test_exercise_commands.py

# make tutorials -- run the ten notebooks of tutorials/ headless (each ends with its own checks)
# make docs      -- build the site into build/site with mkdocs build --strict (tutorials executed)
.PHONY: tutorials docs
tutorials: bytecode
	$(PY) -m pytest -q tests/docs_and_tutorials/test_tutorials.py

docs: bytecode
	OMP_NUM_THREADS=1 $(VENV)/bin/mkdocs build --strict

# make paper -- docs/paper-scale.md at the paper's sizes (ResNet-50 and 2x/4x wide at 16..1024 ranks, batch 512,
#               224x224; cosmoflow at 64..512; v100-edr and h200-node), through refconv simulate
#               (scripts/paper_scale.py; needs the shapes-only backend).  The page in the tree and its CI test
#               (tests/docs_and_tutorials/test_paper_scale.py) use the reduced sizes: paper_scale.py --quick.
#               Each configuration's row goes to paper-scale.rows.jsonl as it ends, and the page is rewritten:
#               a stopped make paper goes on where it stopped (delete the file to measure afresh).
.PHONY: paper
paper: setup
	OMP_NUM_THREADS=1 $(PY) scripts/paper_scale.py --rows paper-scale.rows.jsonl

# make sweep -- scale bugs, looked for: every preset, one shapes-only training step under its plan at 16, 64, 256
#               and 1024 ranks, each in its own process (scripts/preset_sweep.py; rows to preset_sweep.jsonl as they
#               end, the table at the end).  About 1.5 hours of one core, most of it at 1024 ranks.
.PHONY: sweep
sweep: setup
	OMP_NUM_THREADS=1 $(PY) scripts/preset_sweep.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
