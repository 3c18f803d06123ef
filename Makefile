# day0: `make demo` and `make test` work from a fresh clone; everything is installed here.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
DEMO    ?= .cache/demo

.PHONY: install demo test lint format test-lit bench bench-serve bench-gpu bench-gpu-plot clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/day0 demo --workdir $(DEMO)

test: install lint
	$(VPY) -m pytest -q -n 2 --dist load --durations=15 tests  # two workers, test by test (tests/conftest.py)
	$(VENV)/bin/lit -v tests/lit

# ruff (pinned; pyproject.toml [tool.ruff]): lint and the formatter's check; `make test` runs it first
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test-lit: install
	$(VENV)/bin/lit -v tests/lit

bench: install
	$(VPY) -m day0.tools.bench.bench_demo --workdir .cache/bench
	$(VPY) -m day0.tools.bench.bench_engine --workdir .cache/bench-engine
	$(VPY) -m day0.tools.bench.bench_mxfp4 --json .cache/bench/mxfp4.json
	$(VPY) -m day0.tools.bench.bench_memory --workdir .cache/bench-memory
	$(VPY) -m day0.tools.bench.bench_glm5 --workdir .cache/bench-glm5
	$(VPY) -m day0.tools.bench.bench_images --workdir .cache/bench-images --json .cache/bench-images/images.json

# day0 serve against the Engine alone, at concurrency 1, 8 and 32 (docs/perf.md, 'day0 serve')
bench-serve: install
	$(VPY) -m day0.tools.bench.bench_serve --workdir .cache/bench-serve

# The GPU benchmark package: compiled here, run on a GPU host with PyTorch and no IREE compiler
# (HOST_PY: the host's Python, for the runtime and transformers wheels; the e2e piece's oracle). Then: sh $(BENCH_GPU)/run.sh on the host,
# bring results.json back, `make bench-gpu-plot RESULTS=results.json`.
BENCH_GPU ?= .cache/bench-gpu
HOST_PY   ?= 3.12
bench-gpu: install
	$(VPY) -m day0.tools.bench.bench_gpu package $(BENCH_GPU)
	$(VPY) -m pip download -q --no-deps --only-binary=:all: --python-version $(HOST_PY) --implementation cp \
		--platform manylinux_2_28_x86_64 -d $(BENCH_GPU)/wheels iree-base-runtime==3.13.0
	$(VPY) -m pip download -q --only-binary=:all: --python-version $(HOST_PY) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform any -d $(BENCH_GPU)/wheels transformers==5.23.0 pillow==13.0.0  # pillow: the vision piece
	$(VPY) -m pip download -q --only-binary=:all: --python-version $(HOST_PY) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform any -d $(BENCH_GPU)/wheels fastapi==0.165.0 uvicorn==0.55.0 sse-starlette==3.7.1 \
		prometheus-client==0.26.0 python-json-logger==4.2.0 jinja2==3.1.6 openai==3.60.0  # the serve piece
	rm -f $(BENCH_GPU)/wheels/numpy-*.whl  # the host's own numpy (its torch was built against it)
	@echo "bench-gpu: copy $(BENCH_GPU) to the GPU host and run: sh run.sh (writes results.json)"

RESULTS ?= $(BENCH_GPU)/results.json
bench-gpu-plot: install
	$(VPY) -m pip install -q matplotlib==3.10.7
	$(VPY) -m day0.tools.bench.bench_gpu plot $(RESULTS) --out docs

clean:
	rm -rf $(VENV) .cache
