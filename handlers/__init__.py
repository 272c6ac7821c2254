"""TorchServe's door: the handler entry points archives name (``text_handler.py``, ``image_handler.py``,
``token_handler.py``, ``generation_handler.py``), the one generic handler they subclass (:mod:`handlers.base`), the
metrics exporter process (:mod:`handlers.exporter`) and TorchServe's own gRPC management stubs (:mod:`handlers.protos`).

Everything else — decoding, serving, encoding, errors, metrics — is the door-neutral serving core,
:mod:`serving_core`, which the other doors (:mod:`servers`: KServe, Ray Serve) call the same way.
"""
