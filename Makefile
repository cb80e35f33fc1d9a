# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test bench clean

$(VENV)/.installed-%: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-demo
	$(PY) -m pipelines.continual_count --output out --truth

test: $(VENV)/.installed-test
	$(PY) -m pytest -q --doctest-modules dp_beam tests

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/state_size.py

clean:
	rm -rf $(VENV) out
