"""``python -m doors serve|start|stop|package``: the launcher (:mod:`doors.launch`).

``python -m doors make-goal SERVER`` prints the Makefile goal a door needs (:func:`doors.make_goal`; standard library
only, so the Makefile can ask before the virtualenv exists).
"""

import sys

if sys.argv[1:2] == ["make-goal"]:
    from doors import make_goal

    print(make_goal(sys.argv[2] if len(sys.argv) > 2 else ""))
    sys.exit(0)

from doors.launch import main

sys.exit(main())
