"""``python -m servers serve|start|stop``: deprecated alias of ``python -m doors ... --server kserve`` (the door
``SERVER`` names when it is ``ray``), kept for one release (Kubernetes manifests written before the move run it)."""

import os
import sys

from doors.launch import main

door = ["--server", "ray" if os.environ.get("SERVER") == "ray" else "kserve"]
sys.exit(main(sys.argv[1:] + ([] if "--server" in sys.argv else door)))
