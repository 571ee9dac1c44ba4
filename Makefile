# make demo  -- set up a virtual environment and run the main job
# make test  -- set up a virtual environment and run the whole test suite
# make test-fast -- the quick set only (skips tests marked slow)

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
RANKS  ?= 4

.PHONY: setup demo test test-fast clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: setup
	$(PY) -m refconv.demo

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
