"""``python -m model_store.package``: see :mod:`model_store.package.cli`."""

import sys

from model_store.package.cli import main

sys.exit(main())
