"""``python -m servers serve|start|stop``: see :mod:`servers.launcher`."""

import sys

from servers.launcher import main

sys.exit(main())
