"""The inference token (TorchServe's inference key): where a call's token comes from and how a token file is read,
and how the service's refusal of a token is recognised and explained.

The token comes from, in order: the ``token`` argument, ``$EXPLAIN_TOKEN``, the ``token_file`` argument,
``$EXPLAIN_TOKEN_FILE``. A token file is either TorchServe's ``key_file.json`` (the ``inference`` key is used) or a
text file holding the token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .results import ServiceError

TOKEN_ENV = "EXPLAIN_TOKEN"
TOKEN_FILE_ENV = "EXPLAIN_TOKEN_FILE"


def read_token_file(path: Path) -> str:
    """Read a token from TorchServe's ``key_file.json`` (its ``inference`` key) or from a plain text file.

    Raises:
        ValueError: if the file is empty or a JSON file without an inference key.
    """
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("{"):
        document = json.loads(text)
        try:
            return str(document["inference"]["key"])
        except (KeyError, TypeError):
            raise ValueError(f"{path}: a JSON token file needs {{'inference': {{'key': ...}}}}") from None
    if not text:
        raise ValueError(f"{path} is empty: expected a token")
    return text


def token_file_in_use(token: str | None = None, token_file: str | Path | None = None) -> Path | None:
    """The token file :func:`resolve_token` reads (``None`` when the token comes from ``token`` or
    ``$EXPLAIN_TOKEN``, or when there is none)."""
    if token or os.environ.get(TOKEN_ENV):
        return None
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    return Path(path) if path else None


def resolve_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The token to send: ``token``, else ``$EXPLAIN_TOKEN``, else the token file (argument, then
    ``$EXPLAIN_TOKEN_FILE``); ``None`` when none is given (a server with token auth off).

    Args:
        token: the inference key itself.
        token_file: TorchServe's ``key_file.json`` (its inference key is read), or a file holding the key alone.
    """
    if token:
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = token_file_in_use(token, token_file)
    return read_token_file(path) if path else None


TOKEN_SOURCES = (
    "TorchServe writes its keys to key_file.json in the folder it was started from (run/key_file.json for "
    "`make start`); give its inference key as token_file=/token= (CLI: --token-file FILE, --token=KEY, or "
    f"--run-dir), or in ${TOKEN_FILE_ENV} / ${TOKEN_ENV}"
)


def token_hint(error: ServiceError, sent: str | None, token_file: Path | None) -> ServiceError:
    """The service's refusal of a call's token, with what was sent and where a token comes from.

    Args:
        error: the refusal (code ``unauthorized``).
        sent: the token the call sent (``None``: none was).
        token_file: the file that token was read from (``None``: it was given directly, or there was none).
    """
    if sent is None:
        what = "no token was sent"
    elif token_file is not None:
        what = f"the token from {token_file} was refused (a key of another or restarted server?)"
    else:
        what = "the token sent was refused (a key of another or restarted server?)"
    return ServiceError(error.code, f"{error.message}: {what}. {TOKEN_SOURCES}", error.http_status, error.grpc_code)


def refused_token(message: str) -> bool:
    """Whether TorchServe refused the call for its token ("Token Authorization failed", 400 on REST)."""
    return "token" in message.lower()
