# The course's commands. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Parts for `make assignment`, a fork for `make colab`, the notebooks for `make notebooks`, the
# rows for `make bench` (words matched against row keys: ROWS="gpt matmul").
PARTS  ?= 1
ROWS   ?=
OUT    ?= assignment
NB     ?=
# Tests run on both cores, one process each (so BLAS gets one thread each); every notebook keeps
# to one worker so its cells run in order.
PYTEST_ARGS ?= -n 2 --dist loadfile
ONE_THREAD  := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# Python keeps the bytecode of what it imports (in __pycache__/ folders, which git ignores) even
# where PYTHONDONTWRITEBYTECODE is set: `make test` starts over a hundred Python processes (a kernel
# per notebook, the graders' runs, ...), and without the caches each one compiles again what it
# imports, and pytest rewrites the tests and its plugins' modules again in each of its processes.
export PYTHONDONTWRITEBYTECODE :=

.DEFAULT_GOAL := help
.PHONY: help setup lab test test-fast test-gpu notebooks assignment grade bench doctor colab syllabus clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-11s %s\n", $$1, $$2}'

# A .venv without pip is what `python3 -m venv` leaves where the python3-venv package is missing
# (Debian, Ubuntu): once that is installed, the next run makes .venv afresh.
$(STAMP): pyproject.toml
	@# A new .venv starts without pip (venv's own copy takes 8 s to install), and this Python's pip
	@# puts uv and pip into it (pip 22.3 or later: --python); without such a pip, venv installs its own.
	@# --no-compile: pip's own modules get their bytecode when pip first runs, not now (1.5 s).
	@test -x $(BIN)/python -a -x $(BIN)/pip || ($(PYTHON) -m venv --clear --without-pip $(VENV) \
	  && $(PYTHON) -m pip --python $(BIN)/python install -q --no-compile uv pip 2>/dev/null) || $(PYTHON) -m venv --clear $(VENV)
	@# uv installs what pip would (the same versions; pip itself upgraded, for later installs by
	@# hand), downloading in parallel, and leaves the bytecode to be compiled as modules are first
	@# imported: a fresh .venv in about a third of the time pip takes. Where uv cannot be
	@# installed or cannot install (no wheel for this machine, a proxy it does not trust), pip does it.
	($(BIN)/python -m uv --version >/dev/null 2>&1 || $(BIN)/python -m pip install -q uv) \
	  && $(BIN)/python -m uv pip install -q --python $(BIN)/python --upgrade-package pip pip -e ".[dev]" \
	  || ($(BIN)/python -m pip install -q --upgrade pip setuptools && $(BIN)/python -m pip install -q -e ".[dev]")
	@touch $(STAMP)

setup: $(STAMP) ## create .venv and install the course with its dependencies

lab: setup ## open JupyterLab at the top of the course: notebooks/ and solutions/ side by side
	$(BIN)/python -m course lab

test: setup ## run every test: unit tests, all notebooks (nbval) and the exercise checks
	$(ONE_THREAD) $(BIN)/python -m pytest $(PYTEST_ARGS) --nbval --nbval-sanitize-with sanitize.cfg --nbval-current-env tests notebooks solutions

test-fast: setup ## only the unit tests of course/
	$(ONE_THREAD) $(BIN)/python -m pytest $(PYTEST_ARGS) tests

test-gpu: setup ## part 6 on this machine's GPU: its tests, then its lessons and solutions run clean (nbval-lax)
	@COURSE_CUDA= $(BIN)/python -c "import sys, course.kernels as K; sys.exit(0 if K.backend() == 'gpu' else 'make test-gpu needs a GPU: ' + K.backend_reason())"
	COURSE_CUDA=gpu $(ONE_THREAD) $(BIN)/python -m pytest $(PYTEST_ARGS) -m part6 tests
	COURSE_CUDA=gpu $(ONE_THREAD) $(BIN)/python -m pytest $(PYTEST_ARGS) --nbval-lax --nbval-current-env notebooks/6-kernels solutions/6-kernels

notebooks: setup ## re-execute notebooks in place in a fresh kernel (all, or NB="path ...")
	$(BIN)/python -m course notebooks $(NB)

assignment: setup ## lesson notebooks without solutions for students (PARTS="1 2" OUT=dir)
	$(BIN)/python -m course assign $(PARTS) --out $(OUT)

grade: OUT = grades.csv
grade: setup ## grade submissions into a gradebook (INSTRUCTORS.md): make grade NB="submissions/*/*.ipynb" OUT=grades.csv
	@test -n "$(NB)" || (echo 'usage: make grade NB="submissions/*/*.ipynb" [OUT=grades.csv]' && exit 2)
	$(BIN)/python -m course grade --out $(OUT) -- $(NB)

bench: setup ## time each engine alone against its reference and print a table (ROWS="gpt matmul"; MARKDOWN=1: into BENCHMARKS.md)
	$(BIN)/python -m benchmarks $(if $(MARKDOWN),--markdown) $(ROWS)

doctor: setup ## print versions, whether graphviz, a GPU and NVVM are there, numba-cuda and its bindings, the CPU kernels' register block
	$(BIN)/python -m course doctor

colab: setup ## point badges and install cells at a fork: make colab REPO=owner/name
	@test -n "$(REPO)" || (echo "usage: make colab REPO=owner/name" && exit 2)
	$(BIN)/python -m course colab $(REPO)

syllabus: setup ## rewrite the syllabus table of README.md from the notebooks
	$(BIN)/python -m course syllabus

clean: ## remove .venv, caches and JupyterLab's checkpoint copies of the notebooks
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
