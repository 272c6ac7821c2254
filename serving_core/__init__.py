"""The door-neutral serving core: what every front door (TorchServe's handlers, the KServe/OIP and v1 codecs, Ray
Serve replicas) calls to serve a model. It imports no server: no TorchServe, no KServe, no Ray.

- :mod:`~serving_core.config`: a model's typed settings (the ``handler:`` section of its ``model-config.yaml``);
- :mod:`~serving_core.task` and :mod:`~serving_core.registry`: the task contract (decode a row, run a batch, encode an
  outcome, observe metrics) and the registry of tasks by name; :mod:`serving_core.tasks` holds the three tasks
  (classification, token classification, generation);
- :mod:`~serving_core.wire`: the JSON/protobuf envelope, the error answer and rounding, once for every task;
- :mod:`~serving_core.errors`: the one error table (HTTP status and gRPC code of every row-level error);
- :mod:`~serving_core.loading`: devices, checkpoints and tokenizers, loaded the same way by every task;
- :mod:`~serving_core.metrics`: the explanation metrics (prometheus-client, multiprocess);
- :mod:`~serving_core.pools`: which requests an explanation pool serves (plain Python, for the router).
"""
