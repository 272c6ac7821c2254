"""TorchServe's door.

- the handler entry points archives name: ``entry.py`` (any task: the archive's ``handler.task``) and the entry
  files the registered tasks' records name (``text_handler.py``, ``image_handler.py``, ``token_handler.py``,
  ``generation_handler.py``), all subclasses of the one handler (:mod:`doors.torchserve.handler`);
- :mod:`doors.torchserve.launch`: the door as the launcher (:mod:`doors.launch`) starts it;
  :mod:`doors.torchserve.process` starts and stops TorchServe, the exporter and the router;
  :mod:`doors.torchserve.supervision` watches them; :mod:`doors.torchserve.config` writes TorchServe's config
  (``config.properties.template``, ``metrics.yaml``, the batching ``profiles.yaml``) and links the per-run model store;
- :mod:`doors.torchserve.exporter`: the explanation-metrics exporter process;
- :mod:`doors.torchserve.router`: the router in front of TorchServe (explanation pools) and
  :mod:`doors.torchserve.openai_door`, its OpenAI API for causal LMs;
- :mod:`doors.torchserve.protos`: TorchServe's own gRPC stubs, generated from its jar.

Everything else — decoding, serving, encoding, errors, metrics — is the door-neutral serving core,
:mod:`serving_core`, which the other doors (:mod:`doors.kserve`: KServe, Ray Serve) call the same way.
"""
