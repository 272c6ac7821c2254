"""``python -m model_store.serving ...``: deprecated alias of ``python -m doors ...`` (:mod:`doors.launch`), kept for
one release."""

import sys

from doors.launch import main

sys.exit(main())
