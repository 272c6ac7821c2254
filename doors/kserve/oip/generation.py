"""The OIP codec of generation models (``generation``: causal LMs).

- Input ``prompt`` (BYTES ``[B]``) and optionally ``continuation`` (BYTES ``[B]``: a continuation produced elsewhere
  to explain instead of generating; ``""`` = generate).
- Request parameters ``max_new_tokens`` (int64; absent: the model's ``default_new_tokens``), the sampling settings
  ``do_sample`` (bool), ``temperature``, ``top_p`` (fp), ``top_k``, ``seed`` (int64), and what to explain:
  ``explain_method`` (:mod:`doors.kserve.oip.asks`; also a per-row input), ``explain_option_<name>`` and
  ``explain_steps``: ``"all"`` (every step, the default), ``"sum"`` (the summed log-probability of the continuation, one
  backward) or a comma-separated list of step indices (``"0,3,-1"``; negative from the end).
- Outputs ``text`` (BYTES ``[B]``), ``generated_tokens`` (BYTES ``[B, T]``), ``probabilities`` (FP32 ``[B, T]``: each
  generated token's probability), ``stop_reason`` (BYTES ``[B]``: ``eos``, ``length`` or ``given``) and, when a row is
  explained, ``explain_method`` (BYTES ``[B]``), ``context_tokens`` (BYTES ``[B, n]``: the prompt's tokens, then the
  generated tokens but the last) and ``scores`` (FP32 ``[B, T, n]``): step ``t``'s attribution over its context in
  order — the prompt, then the generated tokens before it — and 0 beyond; ``explained`` (BOOL ``[B, T]``) says which
  steps were explained. With ``explain_steps="sum"``, ``scores`` is ``[B, 1, n]``: the summed objective's
  attribution over the prompt and the generated tokens. Rows are padded with ``""`` and 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.generation_schema import GenerationOutcome, GenerationRow, decode_generation_body
from serving_core.wire import Body

from .asks import EXPLAIN_METHOD, RowAsk, check_inputs, decode_rows, row_asks
from .codecs import register_codec
from .tensors import OipRequest, Tensor, TensorSpec, batch_size, error_specs, int_value, padded, text_value

#: The parameter choosing which steps are explained.
EXPLAIN_STEPS = "explain_steps"
#: Request parameters → the generation settings of the REST request's ``generation`` object.
SAMPLING_PARAMETERS = ("do_sample", "temperature", "top_k", "top_p", "seed")


def parse_steps(value: Any) -> str | list[int] | None:
    """``explain_steps`` as the REST request's ``explain.steps``: ``None`` (all), ``"sum"`` or step indices.

    Raises:
        RowError: ``invalid_target`` for anything else.
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "all"):
            return None
        if text == "sum":
            return "sum"
        try:
            return [int(part) for part in text.split(",")]
        except ValueError:
            pass
    raise RowError(
        "invalid_target",
        f"{EXPLAIN_STEPS} must be 'all', 'sum' or a comma-separated list of step indices (e.g. '0,3,-1'), "
        f"got {value!r}",
    )


def _request_settings(parameters: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``max_new_tokens`` and the sampling settings named by the request's parameters."""
    max_new_tokens = parameters.get("max_new_tokens")
    if max_new_tokens is not None:
        max_new_tokens = int_value(max_new_tokens, "parameter max_new_tokens")
    sampling = {name: parameters[name] for name in SAMPLING_PARAMETERS if name in parameters}
    return max_new_tokens, sampling


class GenerationCodec:
    """Causal LMs: ``prompt`` in; the continuation, its tokens and probabilities, and each step's scores out."""

    task = "generation"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``prompt``, the optional ``continuation`` and per-row ``explain_method``."""
        return [
            TensorSpec("prompt", "BYTES", (-1,)),
            TensorSpec("continuation", "BYTES", (-1,), optional=True),
            TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
        ]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The continuation, then the explanation and error outputs."""
        return [
            TensorSpec("text", "BYTES", (-1,)),
            TensorSpec("generated_tokens", "BYTES", (-1, -1)),
            TensorSpec("probabilities", "FP32", (-1, -1)),
            TensorSpec("stop_reason", "BYTES", (-1,)),
            TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
            TensorSpec("context_tokens", "BYTES", (-1, -1), optional=True),
            TensorSpec("scores", "FP32", (-1, -1, -1), optional=True),
            TensorSpec("explained", "BOOL", (-1, -1), optional=True),
            *error_specs(),
        ]

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[GenerationRow | RowError]:
        """One row per element of ``prompt``: the same document a REST request would send, decoded by the task."""
        message = "this is a generation model: send input 'prompt'"
        check_inputs(request, "prompt", {"continuation"}, {"text": message, "image": message})
        batch = batch_size(request, "prompt")
        prompts = request.inputs["prompt"].rows()
        continuations: list[Any] = [None] * batch
        if "continuation" in request.inputs:
            continuations = request.inputs["continuation"].rows()
            if len(continuations) != batch:
                raise RowError("invalid_request", f"input 'continuation' must have as many rows as 'prompt' ({batch})")
        steps = parse_steps(request.parameters.get(EXPLAIN_STEPS))
        max_new_tokens, sampling = _request_settings(request.parameters)
        asks = row_asks(request, batch, config, own=(EXPLAIN_STEPS,))

        def build(row: int, ask: RowAsk) -> GenerationRow:
            document: dict[str, Any] = {"prompt": text_value(prompts[row], f"prompt[{row}]")}
            continuation = continuations[row]
            if continuation is not None and text_value(continuation, f"continuation[{row}]"):
                document["continuation"] = text_value(continuation, f"continuation[{row}]")
            else:
                if max_new_tokens is not None:
                    document["max_new_tokens"] = max_new_tokens
                if sampling:
                    document["generation"] = sampling
            if ask.target is not None:
                raise RowError(
                    "invalid_target",
                    "a generation model explains each step's own token: explain_target is for classifiers",
                )
            if ask.method is not None:
                explain: dict[str, Any] = {"method": ask.method, **ask.options}
                if steps is not None:
                    explain["steps"] = steps
                document["explain"] = explain
            elif ask.options:
                raise RowError("invalid_request", "an option was given without a method: name the method too")
            return decode_generation_body(Body(document=document), False, config)

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[GenerationOutcome], config: HandlerConfig) -> list[Tensor]:
        """The continuation's outputs; the explanation's when some row is explained."""
        batch = len(outcomes)
        served = [outcome if outcome.error is None else None for outcome in outcomes]
        steps_width, generated = padded([[s.token for s in o.steps] if o else None for o in served], "")
        _, probabilities = padded([[s.probability for s in o.steps] if o else None for o in served], 0.0)
        outputs = [
            Tensor("text", "BYTES", (batch,), [o.text if o else "" for o in served]),
            Tensor("generated_tokens", "BYTES", (batch, steps_width), generated),
            Tensor("probabilities", "FP32", (batch, steps_width), probabilities),
            Tensor("stop_reason", "BYTES", (batch,), [o.stop_reason if o else "" for o in served]),
        ]
        explained = [o if o is not None and o.method is not None else None for o in served]
        if not any(explained):
            return outputs
        methods = [o.method or "" if o else "" for o in explained]
        contexts = [o.prompt_tokens + [s.token for s in o.steps[:-1]] if o else None for o in explained]
        width, context_tokens = padded(contexts, "")
        summed = any(o is not None and o.summed is not None for o in explained)
        rows = 1 if summed else steps_width
        scores: list[float] = []
        flags: list[bool] = []
        for outcome in explained:
            if outcome is None:
                scores += [0.0] * (rows * width)
                flags += [False] * rows
            elif summed:
                values = list(outcome.sum_scores or [])
                scores += values + [0.0] * (width - len(values))
                flags.append(True)
            else:
                for step in range(rows):
                    entry = outcome.steps[step] if step < len(outcome.steps) else None
                    values = list(entry.scores or []) if entry is not None and entry.explained else []
                    scores += values + [0.0] * (width - len(values))
                    flags.append(entry is not None and entry.explained)
        return [
            *outputs,
            Tensor(EXPLAIN_METHOD, "BYTES", (batch,), methods),
            Tensor("context_tokens", "BYTES", (batch, width), context_tokens),
            Tensor("scores", "FP32", (batch, rows, width), scores),
            Tensor("explained", "BOOL", (batch, rows), flags),
        ]


register_codec(GenerationCodec())
