# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13 CPU: a pinned range keeps pip from pulling a multi-GB CUDA build on CPU machines.
TORCH_SPEC ?= torch>=2.6,<=2.13.0

.PHONY: demo test venv install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e .

install-test: $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"

demo: install
	$(VENV)/bin/paravt demo

test: install-test
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
