# day0: `make demo` and `make test` work from a fresh clone; everything is installed here.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
DEMO    ?= .cache/demo

.PHONY: install demo test test-py test-lit bench clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/day0 demo --workdir $(DEMO)

test: install
	$(VPY) -m pytest -q tests
	$(VENV)/bin/lit -v tests/lit

test-lit: install
	$(VENV)/bin/lit -v tests/lit

bench: install
	$(VPY) -m day0.tools.bench --workdir .cache/bench
	$(VPY) -m day0.tools.bench_mxfp4 --json .cache/bench/mxfp4.json
	$(VPY) -m day0.tools.bench_memory --workdir .cache/bench-memory

clean:
	rm -rf $(VENV) .cache
