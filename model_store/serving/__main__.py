"""``python -m model_store.serving serve|start|stop``: see :mod:`model_store.serving.launcher`."""

import sys

from model_store.serving.launcher import main

sys.exit(main())
