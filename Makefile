# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13 CPU: a pinned range keeps pip from pulling a multi-GB CUDA build on CPU machines.
TORCH_SPEC ?= torch>=2.6,<=2.13.0

.PHONY: demo test venv install install-test lmms-eval-env clean

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

# opt-in: lmms-eval beside paravt in .venv-lmms (scripts/lmms_eval_env.sh says why it is separate)
lmms-eval-env:
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" scripts/lmms_eval_env.sh .venv-lmms

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
