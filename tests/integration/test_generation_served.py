"""A generation model (a tiny causal LM checkpoint written in the test) served by the real TorchServe: REST and gRPC
through ``ExplainClient.generate`` equal the same checkpoint explained in-process, rows of a concurrent batch are
answered each as it asks (bad rows with their error code, the others served), and the exporter has the ``generate``
stage and the generated-tokens counter."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, start, stop
from explain_client import ExplainClient, ServiceError
from model_store.package import Settings, package
from tests.generation_checkpoint import PROMPTS, causal_lm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return causal_lm(tmp_path_factory.mktemp("lm") / "model")


@pytest.fixture(scope="module")
def writer(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("store")
    run_dir = tmp_path_factory.mktemp("run")
    settings = Settings(max_length=32, batch_size=8, max_batch_delay=20, max_new_tokens=8, default_new_tokens=4)
    packaged = package(checkpoint, "writer", store, settings)  # what `make serve MODELS=writer=PATH` runs
    assert packaged.checkpoint.task == "generation" and packaged.checkpoint.default_method == "attnlrp"
    try:
        yield start(run_dir, store, {"writer": "writer"}, Ports.free(), timeout=240)
    finally:
        stop(run_dir)


def _clients(server: Server) -> list[ExplainClient]:
    token = server.keys["inference"]
    return [
        ExplainClient("rest", url=server.inference_url, token=token),
        ExplainClient("grpc", grpc_address=f"127.0.0.1:{server.ports.grpc_inference}", token=token),
    ]


def test_rest_and_grpc_equal_the_checkpoint_explained_in_process(writer: Server, checkpoint: Path) -> None:
    from explainers import explain_generation

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    expected = explain_generation(
        model, tokenizer([PROMPTS[0]], return_tensors="pt"), method="attnlrp", max_new_tokens=5
    )
    steps = int(expected.generated_mask[0].sum())
    for client in _clients(writer):
        with client:
            answer = client.generate("writer", PROMPTS[0], max_new_tokens=5, method="attnlrp")
            assert [step.token_id for step in answer.steps] == expected.generated[0, :steps].tolist()
            assert answer.text == tokenizer.decode(expected.generated[0, :steps], skip_special_tokens=True)
            for index, step in enumerate(answer.steps):
                assert step.scores == pytest.approx(expected.context_scores(0, index).tolist(), rel=1e-4, abs=1e-5)
                assert step.probability == pytest.approx(float(expected.probabilities[0, index]), rel=1e-4)
            plain = client.generate("writer", PROMPTS[0], max_new_tokens=5)
            assert plain.method is None and all(step.scores is None for step in plain.steps)
            summed = client.generate("writer", PROMPTS[1], method="grad_x_input", steps="sum", contrast="good")
            assert summed.summed == (0, len(summed.steps)) and summed.sum_scores is not None
            given = client.generate(
                "writer", PROMPTS[0], continuation=[step.token_id for step in answer.steps], method="attnlrp"
            )
            assert given.stop_reason == "given"
            for mine, theirs in zip(given.steps, answer.steps, strict=True):
                assert mine.scores == pytest.approx(theirs.scores, rel=1e-5, abs=1e-6)
            for call, code in (
                ({"method": "saliency"}, "unknown_method"),
                ({"method": "relevance"}, "unsupported_method"),
                ({"method": "rollout", "steps": [7]}, "invalid_target"),
                ({"method": "rollout", "contrast": "zebra"}, "invalid_target"),
                ({"max_new_tokens": 50}, "too_many_tokens"),
            ):
                with pytest.raises(ServiceError) as raised:
                    client.generate("writer", PROMPTS[0], **call)
                assert raised.value.code == code


def test_a_concurrent_batch_answers_each_row(writer: Server) -> None:
    calls: list[dict[str, Any]] = [
        {"method": "rollout"},
        {"method": "saliency"},
        {"sampling": {"do_sample": True, "seed": 5}, "method": "grad_x_input", "steps": [0]},
        {"max_new_tokens": 99},
        {},
        {"method": "attnlrp", "steps": "sum"},
    ] * 2
    with _clients(writer)[0] as client, ThreadPoolExecutor(max_workers=len(calls)) as pool:

        def send(call: dict[str, Any]) -> Any:
            try:
                return client.generate("writer", PROMPTS[len(call) % 3], **call)
            except ServiceError as error:
                return error

        results = list(pool.map(send, calls))
    codes = [result.code if isinstance(result, ServiceError) else "ok" for result in results]
    assert codes == ["ok", "unknown_method", "ok", "too_many_tokens", "ok", "ok"] * 2
    # the same seed: the same sample, whatever the batch
    assert [step.token_id for step in results[2].steps] == [step.token_id for step in results[8].steps]
    with urllib.request.urlopen(f"http://127.0.0.1:{writer.ports.exporter}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'stage="generate"' in metrics and 'model="writer"' in metrics
    assert "explain_generated_tokens_total" in metrics


def test_the_cli_generates_on_both_transports(writer: Server, tmp_path: Path) -> None:
    import io

    from explain_client.cli import main

    token = writer.keys["inference"]
    transports = [
        ["--url", writer.inference_url],
        ["--grpc", "--grpc-address", f"127.0.0.1:{writer.ports.grpc_inference}"],
    ]
    pages = []
    for index, transport in enumerate(transports):
        out = io.StringIO()
        html, png = tmp_path / f"page{index}.html", tmp_path / f"matrix{index}.png"
        status = main(
            [PROMPTS[0], "--generate", "--model", "writer", "--method", "attnlrp", "--max-new-tokens", "3",
             f"--token={token}", "--color", "never", "--html", str(html), "--png", str(png), *transport],
            stdout=out,
        )  # fmt: skip
        assert status == 0, out.getvalue()
        assert "generated (" in out.getvalue() and "<-" in out.getvalue()
        assert png.read_bytes().startswith(b"\x89PNG")
        pages.append(html.read_text(encoding="utf-8"))
    import re

    def without_data(page: str) -> str:  # REST rounds scores to 6 digits, gRPC sends float32
        return re.sub(r'<script type="application/json" class="data">.*?</script>', "", page, flags=re.S)

    assert without_data(pages[0]) == without_data(pages[1])  # the same tokens and layout over REST and gRPC
    out = io.StringIO()
    assert main([PROMPTS[0], "--generate", "--model", "writer", "--method", "saliency", f"--token={token}",
                 "--url", writer.inference_url], stdout=out) == 1  # fmt: skip
    assert "unknown_method" in out.getvalue()
