"""The project's one version number.

``pyproject.toml`` reads it for the ``transformer-explain-service`` distribution (``[tool.setuptools.dynamic]``);
``explain_client/pyproject.toml`` carries the same number for the client's distribution and the ``serve``/``eval``
extras pin the client to it (tests/test_packaging.py checks all three agree). Installed code reads it with
``importlib.metadata.version("transformer-explain-service")``, or from here in a source checkout.
"""

__version__ = "0.2.0"
