"""TorchServe handlers of the explanation service.

Each row of a TorchServe batch is decoded on its own (JSON or the protobuf ``ExplainRequest`` of
``proto/explain.proto``), the valid rows are explained together by :mod:`handlers.service` with one forward, and
each row is encoded back in the encoding it came in. Errors are per row (:mod:`handlers.errors`).
"""
