"""TorchServe server configuration (``config.properties.template``, ``metrics.yaml``) and the launcher that starts
and stops TorchServe and the explanation-metrics exporter (``python -m model_store.serving serve|start|stop``)."""
