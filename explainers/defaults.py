"""The default attribution method: what :func:`explainers.explain`, :func:`explainers.explain_generation`,
:func:`explainers.explain_tokens` and the service use when a caller names no method.

AttnLRP (Achtibat et al., ICML 2024): the most faithful method measured here (``explain-eval``), at one forward and
one modified-gradient pass, and accepted by every supported family and task (docs/SERVING.md, "Default method"). A
deployment serves another default with the model setting ``default_method`` or, for all its models,
``EXPLAIN_DEFAULT_METHOD`` (``explain-serve --default-method``).
"""

from __future__ import annotations

#: The registry name of the default method (a key of :func:`explainers.available_methods`).
DEFAULT_METHOD = "attnlrp"

__all__ = ["DEFAULT_METHOD"]
