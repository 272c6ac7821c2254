"""Other front doors on the same serving core: KServe's model server (Open Inference Protocol v2 with an explain
extension, KServe v1 ``:predict``/``:explain``) and Ray Serve replicas behind it.

- :mod:`servers.oip`: the OIP explain extension as pure functions, one codec per task (every task has one);
- :mod:`servers.v1`: KServe's v1 protocol as pure functions;
- :mod:`servers.settings`: a model's settings from its archive folder;
- :mod:`servers.batching`: the in-process door's dynamic batcher;
- :mod:`servers.backends`: where rows are served (in-process, or :mod:`servers.ray_deployment`);
- :mod:`servers.kserve_model`, :mod:`servers.kserve_server`: the ``kserve.Model`` and the server around it;
- :mod:`servers.process`, :mod:`servers.launcher`: the server process and ``python -m servers serve|start|stop``
  (spawning, pid files, readiness, stopping and supervision: :mod:`supervise`, shared with TorchServe's launcher).

Like the TorchServe handlers, the doors only decode, call the serving core (:mod:`serving_core`: the model's task
and its service) and encode.
"""
