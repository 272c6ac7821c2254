"""``tritonclient.grpc`` calls in a process of their own, for tests/integration/test_oip_clients.py.

NVIDIA's gRPC stubs and KServe's (which the project's own OIP client, :class:`bench.oip_client.GrpcOip`, uses) both
register the OIP's ``inference.*`` protobuf messages in protobuf's default pool, and one process cannot hold both: the
second import fails with "duplicate symbol". The tests therefore run ``python -m tests.tritonclient_grpc_probe`` with
one JSON request on stdin and read one JSON answer on stdout:

- ``{"action": "infer", "target": "host:port", "model": ..., "inputs": [[name, datatype, [values]], ...],
  "parameters": {...}}``, BYTES values as base64 text: ``{"outputs": {name: [shape, flat data]}}`` (BYTES elements as
  UTF-8 text), or ``{"error": message}``;
- ``{"action": "metadata", "target": ..., "model": ...}``: ``{"server_ready", "model_ready", "inputs", "outputs"}``
  (tensor names).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import numpy as np

_DTYPES = {"INT64": np.int64, "INT32": np.int32, "FP64": np.float64, "FP32": np.float32, "BOOL": np.bool_}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request (the module docstring gives both forms)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(request["target"])
    try:
        if request["action"] == "metadata":
            metadata = client.get_model_metadata(request["model"])
            return {
                "server_ready": client.is_server_ready(),
                "model_ready": client.is_model_ready(request["model"]),
                "inputs": [tensor.name for tensor in metadata.inputs],
                "outputs": [tensor.name for tensor in metadata.outputs],
            }
        inputs = []
        for name, datatype, values in request["inputs"]:
            tensor = grpcclient.InferInput(name, [len(values)], datatype)
            if datatype == "BYTES":
                array = np.array([base64.b64decode(value) for value in values], dtype=np.object_)
            else:
                array = np.array(values, dtype=_DTYPES[datatype])
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        try:
            result = client.infer(
                request["model"], inputs, parameters=request.get("parameters") or None, client_timeout=120.0
            )
        except InferenceServerException as error:
            return {"error": error.message(), "status": error.status()}
        outputs: dict[str, Any] = {}
        for output in result.get_response().outputs:
            values = result.as_numpy(output.name).reshape(-1).tolist()
            if output.datatype == "BYTES":
                values = [value.decode("utf-8") for value in values]
            outputs[output.name] = [list(output.shape), values]
        return {"outputs": outputs}
    finally:
        client.close()


if __name__ == "__main__":
    json.dump(answer(json.load(sys.stdin)), sys.stdout)
