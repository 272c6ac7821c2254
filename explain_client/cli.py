"""``explain``: call the explanation service and show the answer.

Examples::

    explain "the crew was rude and the flight late"                        # the model's default method
    explain "the crew was rude and the flight late" --method relevance
    explain "the crew was rude and the flight late" --below 0.8            # only if the model is unsure
    explain "the crew was rude" --compare attention,rollout,relevance --grpc --html out.html
    explain --model digits --image digit.png --compare rollout,relevance --png out.png
    explain --input tweets.txt --method rollout --jsonl results.jsonl      # one text per line, or JSON lines
    explain records list --model sentiment                                 # the service's records (records_cli)

Where the server is: ``--url``/``--grpc-address`` (or ``$EXPLAIN_URL``/``$EXPLAIN_GRPC_ADDRESS``), else the server
started by ``make start`` or ``explain-serve`` (``--run-dir``, default ``$EXPLAIN_WORKDIR/run``, else ``./run``: its
ports and token file). The token: ``--token=KEY``,
``$EXPLAIN_TOKEN``, ``--token-file``, ``$EXPLAIN_TOKEN_FILE``, else the run folder's ``key_file.json`` (also for an
explicit ``--url``/``--grpc-address``). TorchServe keys may begin with ``-``; ``--token=KEY`` always works, and
``--token KEY`` does too unless KEY is one of this command's options.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from .auth import TOKEN_ENV, TOKEN_FILE_ENV
from .client import ExplainClient
from .entities import terminal_entities
from .inputs import load_requests
from .render import html_page, legend, terminal_compare, terminal_prediction
from .results import Prediction, ServiceError
from .transport import DEFAULT_GRPC_ADDRESS, DEFAULT_REST_URL
from .wire import SERVICE_DEFAULT, PlainInput, Request
from .words import MERGE_RULE

logger = logging.getLogger(__name__)

#: The service's working directory, where ``explain-serve --workdir`` or ``make start`` keeps ``run/``.
WORKDIR_ENV = "EXPLAIN_WORKDIR"


def default_run_dir() -> Path:
    """The run folder of a service started here: ``$EXPLAIN_WORKDIR/run``, else ``./run``."""
    return Path(os.environ.get(WORKDIR_ENV) or ".") / "run"


#: Options whose value may begin with "-" (a TorchServe key is base64url): ``--token -Uz…`` is read as a value.
DASH_VALUE_OPTIONS = ("--token",)


def join_dash_values(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--token -UzNKxHY`` → ``--token=-UzNKxHY``, so that argparse does not take a key that begins with ``-`` for
    an option; a following word that is one of the parser's options (or an abbreviation of one) is left alone.
    """
    known = [option for action in parser._actions for option in action.option_strings]
    joined: list[str] = []
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        if (
            word in DASH_VALUE_OPTIONS
            and following is not None
            and following.startswith("-")
            and following != "--"
            and not any(option.startswith(following.split("=", 1)[0]) for option in known)
        ):
            joined.append(f"{word}={following}")
            index += 2
            continue
        joined.append(word)
        index += 1
    return joined


def _options(values: Sequence[str]) -> dict[str, int | float]:
    """``NAME=NUMBER`` values as method options: an integer literal (``16``) as ``int``, any other number
    (``0.15``, ``1e-3``) as ``float``."""
    options: dict[str, int | float] = {}
    for value in values:
        key, separator, number = value.partition("=")
        if not separator or not key:
            raise argparse.ArgumentTypeError(f"--option expects NAME=NUMBER, got {value!r}")
        try:
            options[key] = int(number)
            continue
        except ValueError:
            pass
        try:
            real = float(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--option {key}: {number!r} is not a number") from None
        if not math.isfinite(real):
            raise argparse.ArgumentTypeError(f"--option {key}: {number!r} is not a finite number")
        options[key] = real
    return options


def build_parser() -> argparse.ArgumentParser:
    """The ``explain`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="explain",
        description="Ask the explanation service for a prediction and its explanation, and show it.",
        epilog=MERGE_RULE,
    )
    parser.add_argument("text", nargs="?", help="the text to explain (omit to read --input or stdin)")
    parser.add_argument(
        "--text-pair", metavar="TEXT", help="the second text of a sentence pair (models that take pairs: NLI, ...)"
    )
    parser.add_argument("--image", type=Path, help="a PNG/JPEG file to explain (image models)")
    parser.add_argument(
        "--input", help="file with many inputs, one per line or JSON lines ({'text'|'image'}); - = stdin"
    )
    parser.add_argument("--model", default="sentiment", help="served model name (default: sentiment)")
    parser.add_argument(
        "--method",
        default=None,
        help="attribution method (default: the model's default method, chosen by the service; the output names it)",
    )
    parser.add_argument(
        "--compare", help="comma-separated methods shown side by side, e.g. attention,rollout,relevance"
    )
    parser.add_argument("--target", help="class to explain (label name or index; default: the predicted class)")
    parser.add_argument(
        "--entity",
        type=int,
        metavar="N",
        help="token classifiers: show the attribution of entity #N only (as numbered in the answer; default: all)",
    )
    unsure = parser.add_mutually_exclusive_group()
    unsure.add_argument(
        "--below",
        type=float,
        metavar="P",
        help="explain only when the prediction's confidence is below P (0 < P <= 1); otherwise say why not",
    )
    unsure.add_argument(
        "--always", action="store_true", help="explain whatever the confidence (overrides the model's explain_below)"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=NUMBER",
        help="method option: an integer (n_steps=16) or a real number (stdev=0.15); repeatable",
    )
    parser.add_argument(
        "--granularity",
        choices=("token", "word", "sentence"),
        help="the units scores are answered in: tokens (default), words or sentences (each the sum of its tokens)",
    )
    parser.add_argument("--grpc", action="store_true", help="call over gRPC instead of REST")
    parser.add_argument("--url", default=os.environ.get("EXPLAIN_URL"), help=f"REST base URL ({DEFAULT_REST_URL})")
    parser.add_argument(
        "--grpc-address",
        default=os.environ.get("EXPLAIN_GRPC_ADDRESS"),
        help=f"gRPC host:port ({DEFAULT_GRPC_ADDRESS})",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="folder of a server started by `make start` or explain-serve (default: $EXPLAIN_WORKDIR/run, else ./run)",
    )
    parser.add_argument(
        "--token",
        metavar="KEY",
        help=f"inference token; write --token=KEY (keys may begin with '-'). Else ${TOKEN_ENV}, --token-file, "
        f"${TOKEN_FILE_ENV}, the run folder's key_file.json",
    )
    parser.add_argument("--token-file", type=Path, help="TorchServe key_file.json or a file holding the token")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per attempt (default 60)")
    parser.add_argument(
        "--retries", type=int, default=1, help="more attempts after a timeout, unreachable server or dead worker (1)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="parallel calls for many inputs (default 8)")
    parser.add_argument("--html", type=Path, help="write a self-contained HTML heatmap page")
    parser.add_argument("--png", type=Path, help="image models: write the patch relevance over the input image")
    parser.add_argument("--jsonl", type=Path, help="write one JSON result per input and method")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="terminal colours")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown for many inputs when tqdm is installed)"
    )
    from . import generation_cli

    generation_cli.add_arguments(parser)
    return parser


def make_client(args: argparse.Namespace) -> ExplainClient:
    """The client the arguments describe: the address given (``--url``/``--grpc-address``), else the run folder's
    ports, else the defaults; the token given (``--token``, ``$EXPLAIN_TOKEN``, ``--token-file``,
    ``$EXPLAIN_TOKEN_FILE``), else the run folder's ``key_file.json`` when there is one, for any address."""
    transport = "grpc" if args.grpc else "rest"
    common: dict[str, Any] = {"timeout": args.timeout, "concurrency": args.concurrency, "retries": args.retries}
    if args.token:
        common["token"] = args.token
    elif args.token_file:
        common["token_file"] = args.token_file
    run_dir = args.run_dir or default_run_dir()
    given = "token" in common or "token_file" in common or os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_FILE_ENV)
    if not given and (run_dir / "key_file.json").is_file():
        common["token_file"] = run_dir / "key_file.json"
    explicit = args.url if transport == "rest" else args.grpc_address
    if not explicit and (args.run_dir or (run_dir / "ports.json").is_file()):
        return ExplainClient.from_run_dir(run_dir, transport, **common)  # type: ignore[arg-type]
    return ExplainClient(
        transport,  # type: ignore[arg-type]
        url=args.url or DEFAULT_REST_URL,
        grpc_address=args.grpc_address or DEFAULT_GRPC_ADDRESS,
        **common,
    )


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[], object]]:
    """A tqdm bar on stderr (the ``progress`` extra) advanced by the function yielded; nothing without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        yield lambda: None
        return
    with tqdm(total=total, desc="explain", unit="call", file=sys.stderr) as bar:
        yield bar.update


def _label(item: PlainInput, index: int) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, tuple):
        return f"{item[0]}  ||  {item[1]}"
    return f"image #{index + 1}"


def _read_inputs(args: argparse.Namespace, stdin: TextIO) -> tuple[list[PlainInput], list[str]]:
    """The inputs and how to display each one."""
    if args.text_pair is not None and args.text is None:
        raise ValueError("--text-pair goes with a text argument (for many pairs: JSON lines with 'text_pair')")
    if args.image is not None:
        return [args.image.read_bytes()], [str(args.image)]
    if args.text is not None:
        item: PlainInput = args.text if args.text_pair is None else (args.text, args.text_pair)
        return [item], [_label(item, 0)]
    if args.input and args.input != "-":
        path = Path(args.input)
        inputs = load_requests(path.read_text(encoding="utf-8").splitlines(), image_base=path.parent)
    else:
        inputs = load_requests(stdin.read().splitlines(), image_base=Path.cwd())
    return inputs, [_label(item, index) for index, item in enumerate(inputs)]


def _target(value: str | None) -> str | int | None:
    if value is None:
        return None
    return int(value) if value.lstrip("-").isdigit() else value


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 some input failed, 2 bad usage). ``explain records ...`` reads
    the service's records (:mod:`explain_client.records_cli`)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["records"]:
        from . import records_cli

        return records_cli.main(given[1:], stdout)
    parser = build_parser()
    args = parser.parse_args(join_dash_values(given, parser))
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        options = _options(args.option)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    color = args.color == "always" or (args.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR"))
    if args.generate or args.chat:
        if args.text is None:
            parser.error("--generate needs the prompt (--chat: the user's message) as the text argument")
        from . import generation_cli

        args.parsed_options = options
        try:
            client = make_client(args)
        except (OSError, ValueError) as error:
            parser.error(str(error))
        with client:
            return generation_cli.run(args, client, out, color)
    if args.compare is not None:
        methods = [name.strip() for name in args.compare.split(",") if name.strip()]
        if not methods:
            parser.error("--compare needs at least one method")
    else:
        methods = [args.method.strip() if args.method else SERVICE_DEFAULT]
    if args.below is not None and not 0 < args.below <= 1:
        parser.error(f"--below must be a probability in (0, 1], got {args.below:g}")
    try:
        inputs, labels = _read_inputs(args, stdin)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    if not inputs:
        parser.error("no input: give a text, --image, --input FILE or lines on stdin")
    target = _target(args.target)
    requests = [
        Request(
            text=item if isinstance(item, str) else item[0] if isinstance(item, tuple) else None,
            image=item if isinstance(item, bytes) else None,
            method=method,
            target=target,
            options=options,
            text_pair=item[1] if isinstance(item, tuple) else None,
            below=args.below,
            always=args.always,
            granularity=args.granularity,
        )
        for item in inputs
        for method in methods
    ]
    try:
        client = make_client(args)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    with client, _progress(len(requests), not args.no_progress and len(inputs) > 1) as step:

        def advance(_index: int, _result: Prediction | ServiceError) -> None:
            step()

        results = client.explain_many(args.model, requests, on_result=advance)
    grouped = [results[index * len(methods) : (index + 1) * len(methods)] for index in range(len(inputs))]
    failed = 0
    explained_text = False  # the legend explains coloured words: printed once, under them, only if some were shown
    for label, item_results in zip(labels, grouped, strict=True):
        if len(inputs) > 1:
            out.write(f"\n== {label}\n")
        predictions = [result for result in item_results if isinstance(result, Prediction)]
        for result, method in zip(item_results, methods, strict=True):
            if isinstance(result, ServiceError):
                failed += 1
                asked = method or "the model's default method"
                out.write(f"error ({asked}): {result.code}: {result.message}\n")
        if not predictions:
            continue
        if predictions[0].token_classification is not None:
            failed += _write_entities(out, predictions, label, color, args.entity)
            continue
        explained = [prediction for prediction in predictions if prediction.explanation is not None]
        if len(methods) > 1 and len(explained) > 1 and len(explained) == len(predictions):
            out.write(terminal_compare(predictions, color) + "\n")
        else:
            for prediction in predictions:
                out.write(terminal_prediction(prediction, color, service_default=methods == [SERVICE_DEFAULT]) + "\n")
        explained_text = explained_text or any(
            prediction.explanation.tokens is not None for prediction in explained if prediction.explanation
        )
    if explained_text:
        out.write(f"({legend(color)})\n")
    if args.jsonl:
        with args.jsonl.open("w", encoding="utf-8") as handle:
            for request, result in zip(requests, results, strict=True):
                record: dict[str, Any] = {"input": request.text if request.text is not None else "<image>"}
                if request.text_pair is not None:
                    record["text_pair"] = request.text_pair
                record["method"] = _method_used(request, result)
                if isinstance(result, Prediction):
                    record.update(result.to_dict())
                else:
                    record["error"] = result.to_dict()
                handle.write(json.dumps(record) + "\n")
    if args.html:
        images = [item if isinstance(item, bytes) else None for item in inputs]
        pairs = zip(requests, results, strict=True)
        used = dict.fromkeys(_method_used(request, result) or "none" for request, result in pairs)
        try:
            page = html_page(list(zip(labels, grouped, strict=True)), f"{args.model}: {', '.join(used)}", images)
        except ImportError as error:
            parser.error(str(error))
        args.html.write_text(page, encoding="utf-8")
        out.write(f"wrote {args.html}\n")
    if args.png:
        try:
            written = _write_pngs(args.png, inputs, grouped)
        except ImportError as error:
            parser.error(str(error))
        if not written:
            parser.error("--png needs an image input (--image or image lines) that was explained")
        out.write("wrote " + ", ".join(str(path) for path in written) + "\n")
    return 1 if failed else 0


def _write_entities(out: TextIO, predictions: Sequence[Prediction], text: str, color: bool, entity: int | None) -> int:
    """Write a token classifier's answers for one text (one per method); 1 if the chosen entity does not exist."""
    chosen = None if entity is None else entity - 1
    try:
        for number, prediction in enumerate(predictions):
            out.write(terminal_entities(prediction, text, color, chosen, header=number == 0) + "\n")
    except ValueError as error:
        out.write(f"error: {error}\n")
        return 1
    return 0


def _method_used(request: Request, result: Prediction | ServiceError) -> str | None:
    """The method that explained ``result`` (the service's choice when the request left it), the one that was
    skipped, or the one asked for (``None``: the model's default, for an error)."""
    if isinstance(result, Prediction) and result.explanation is not None:
        return result.explanation.method
    if isinstance(result, Prediction) and result.skipped is not None:
        return result.skipped.method
    return request.method or None


def _write_pngs(path: Path, inputs: Sequence[PlainInput], grouped: Sequence[Sequence[Any]]) -> list[Path]:
    images = [(index, item) for index, item in enumerate(inputs) if isinstance(item, bytes)]
    written: list[Path] = []
    if not images:
        return written
    from .pictures import image_panel

    for index, image in images:
        predictions = [result for result in grouped[index] if isinstance(result, Prediction) and result.explanation]
        if not predictions:
            continue
        target = path if len(images) == 1 else path.with_name(f"{path.stem}-{index + 1}{path.suffix}")
        image_panel(image, predictions).save(target)
        written.append(target)
    return written


def entry_point() -> None:
    """Console-script entry point (``explain``); a closed pipe (``explain … | head``) ends it quietly."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 0
    sys.exit(status)


if __name__ == "__main__":
    entry_point()
