"""Starting, watching and stopping the service's processes, for every door: the launcher (:mod:`doors.launch`) and
each door's launch module (:mod:`doors.torchserve.launch`, :mod:`doors.kserve.launch`) use it; it imports none of
them.

- :mod:`supervise.processes`: spawning in a session of its own, pid files, readiness, stopping a process group,
  liveness (a zombie is dead) and reaping.
- :mod:`supervise.supervisor`: watches a started service until it is stopped: reports and stops it when an essential
  process ends by itself, starts the others again (counted), runs ``serve`` in the background for ``start``.
- :mod:`supervise.watchdog`: ends a server when the process that owns it ends, however it ends
  (``EXPLAIN_OWNER_PID``, set by the test suite).
- :mod:`supervise.environment`: the run folder, bind addresses and ports every launcher reads from the environment.
"""
