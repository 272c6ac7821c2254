"""TorchServe's door as the launcher starts it (:mod:`doors.launch`): TorchServe, the metrics exporter and, where a
model needs it, the router (:mod:`doors.torchserve.process`), supervised until stopped
(:mod:`doors.torchserve.supervision`), and the lines that say how to call them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from doors.torchserve.config import load_profile
from doors.torchserve.process import Server, start
from doors.torchserve.process import stop as stop_torchserve
from doors.torchserve.supervision import supervise
from serving_core.registry import task_facts
from supervise.supervisor import claimed, write_status

if TYPE_CHECKING:
    from doors.launch import LaunchOptions

logger = logging.getLogger(__name__)


def serve(options: LaunchOptions, models: Mapping[str, str], example: tuple[str, str]) -> int:
    """Start TorchServe with ``models`` (name → archive folder, relative to ``options.model_store`` or absolute), say
    how to call it, and supervise it until it is stopped (0) or fails (1)."""
    with claimed(options.run_dir):
        try:
            profile = load_profile(options.profile)
            server = start(options.run_dir, options.model_store, models, overrides={name: profile for name in models})
        except Exception as error:
            logger.error("the service did not start: %s", error, exc_info=not isinstance(error, RuntimeError))
            write_status(options.run_dir, "failed", f"the service did not start: {error}")
            return 1
        text = usage(server, example)
        print(text, flush=True)
        write_status(options.run_dir, "ready", text)
        return supervise(server)


def stop(run_dir: Path) -> bool:
    """Stop the TorchServe door started from ``run_dir``; whether one was running."""
    return stop_torchserve(run_dir)


def usage(server: Server, example: tuple[str, str] = ("sentiment", "text")) -> str:
    """How to call the running service (printed by ``serve``/``start``); ``example`` is the (model, task) the
    commands show, with the task's example calls (:attr:`serving_core.registry.TaskFacts.examples`)."""
    ports = server.ports
    model, task = example
    url = f"http://127.0.0.1:{ports.inference}"
    calls = "".join(
        f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: {call.content_type}' \\\n"
        f"       {url}/{call.route}/{model} {call.data}{f'   # {call.comment}' if call.comment else ''}\n"
        for call in task_facts(task).examples.torchserve
    )
    pools = ""
    if server.pools:
        pools = (
            f"Explanation pools: {', '.join(server.pools)} (requests asking for an explanation are served by "
            f"<name>.explain's own workers; the router on :{ports.inference}/:{ports.grpc_inference} chooses).\n"
        )
    if server.generation:
        pools += (
            f"OpenAI API: {url}/v1 (chat/completions, completions, models) for {', '.join(server.generation)}; the "
            "API key is $TOKEN (docs/SERVING.md, 'OpenAI API').\n"
        )
    return f"""
The explanation service is up (models: {", ".join(server.models)}); tokens are in {server.run_dir}/key_file.json.
{pools}  TOKEN=$(python3 -c 'import json;print(json.load(open("{server.run_dir}/key_file.json"))["inference"]["key"])')
{calls}gRPC: 127.0.0.1:{ports.grpc_inference} (Predictions; input key "body" = the JSON, "request" = ExplainRequest;
      metadata authorization: Bearer $TOKEN). Management 127.0.0.1:{ports.management} (loopback only).
Metrics: TorchServe http://127.0.0.1:{ports.metrics}/metrics, explanations http://127.0.0.1:{ports.exporter}/metrics
Logs: {server.log_dir}. Docs: docs/SERVING.md.
"""
