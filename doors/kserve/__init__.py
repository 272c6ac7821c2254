"""The KServe door on the serving core: KServe's model server (Open Inference Protocol v2 with an explain
extension, KServe v1 ``:predict``/``:explain``) and Ray Serve replicas behind it.

- :mod:`doors.kserve.oip`: the OIP explain extension as pure functions, a codec per task (a task's own, else
  the generic codec of JSON documents);
- :mod:`doors.kserve.v1`: KServe's v1 protocol as pure functions;
- :mod:`doors.kserve.settings`: a model's settings from its archive folder;
- :mod:`doors.kserve.batching`: the in-process door's dynamic batcher;
- :mod:`doors.kserve.backends`: where rows are served (in-process, or :mod:`doors.kserve.ray_deployment`);
- :mod:`doors.kserve.kserve_model`, :mod:`doors.kserve.kserve_server`: the ``kserve.Model`` and the server around it;
- :mod:`doors.kserve.rest_body`: an OIP REST body read as every OIP client sends it (JSON with or without a
  ``Content-Type``, the binary data extension, a compressed body);
- :mod:`doors.kserve.process`, :mod:`doors.kserve.launch`: the server process and how the launcher
  (:mod:`doors.launch`) starts, supervises and stops it (the process mechanics: :mod:`supervise`);
- :mod:`doors.kserve.openai_routes`: the OpenAI API routes of causal LMs on the same server;
- :mod:`doors.kserve.generate_routes`: the OIP generate extension of causal LMs (``/generate``, ``/generate_stream``:
  Triton's shape).
- :mod:`doors.kserve.row_records`: a request's records (its id, each row's index and input), committed where its rows
  are served; :mod:`doors.kserve.records_routes`: ``/v1/records``; :mod:`doors.kserve.request_ids`: every answer's
  ``X-Request-Id``;
- :mod:`doors.kserve.replica_metrics`: the Ray Serve replicas' monitor metrics on the door's ``/metrics``.

Like the TorchServe handlers, the doors only decode, call the serving core (:mod:`serving_core`: the model's task
and its service) and encode.
"""
