# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13 CPU: a pinned range keeps pip from pulling a multi-GB CUDA build on CPU machines.
TORCH_SPEC ?= torch>=2.6,<=2.13.0

.PHONY: demo test venv install install-test chromium lmms-eval-env clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e .

# An editable install leaves src/ uncompiled, and where PYTHONDONTWRITEBYTECODE is set (CI) each of the
# suite's ~90 processes would compile what it imports again: compiled once here, as pip does for a
# regular install. So are pytest's assert-rewritten test modules, which it then keeps nowhere: each of
# the three workers rewrote all of them again as it collected (3.8 of its 7.6 CPU-s of collection).
install-test: $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m compileall -q src tests >/dev/null
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q --collect-only -n 0 -p no:cacheprovider >/dev/null 2>&1 || true

demo: install
	$(VENV)/bin/paravt demo

# The browser tests (the HTML report, paravt app) drive Debian's chromium through Playwright, which
# never downloads a browser. `make test` installs it with apt where it runs as root (or with
# password-less sudo); elsewhere, or with CHROMIUM=no, those tests are skipped and the run's last
# lines say so and how to run them.
CHROMIUM ?= auto

chromium:
	@if [ "$(CHROMIUM)" != no ] && [ ! -x /usr/bin/chromium ]; then \
	  SUDO=""; \
	  if [ "$$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi; \
	  if command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || [ -n "$$SUDO" ]; }; then \
	    echo "installing Debian's chromium for the browser tests (CHROMIUM=no skips this)"; \
	    { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
	      echo "note: installing chromium failed: the browser tests will be skipped" >&2; \
	  else \
	    echo "note: no /usr/bin/chromium and no root or sudo with apt here: the browser tests will be skipped (sudo apt-get install chromium)" >&2; \
	  fi; \
	fi

test: install-test chromium
	$(PY) -m pytest -q

# opt-in: lmms-eval beside paravt in .venv-lmms (scripts/lmms_eval_env.sh says why it is separate)
lmms-eval-env:
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" scripts/lmms_eval_env.sh .venv-lmms

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
