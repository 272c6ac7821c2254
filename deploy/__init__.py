"""Deployment files of the explanation service (compose, Prometheus, Grafana, Kubernetes, KServe) and the per-pod
authenticating proxy (:mod:`deploy.auth_proxy`)."""
