"""Watching what the explanations say (issue 37): attribution drift against a baseline, canaries on identical
inputs, and explanation health, per model × method (× label), exported on the metrics exporter.

Door-neutral: a door (or the serving core) starts a model's :class:`~monitoring.monitor.Monitor` when it loads
(:func:`monitoring.serving.start_monitor`) and hands it each served row (``observe(row, outcome)``, off the request
path); the maths are pure functions.

- :mod:`monitoring.shares`: a row's attribution as shares of its absolute mass over its words or patches; health;
- :mod:`monitoring.sketch`: the heavy-hitters sketch (weighted Space-Saving) and its error bound;
- :mod:`monitoring.window`: the sliding window of mean shares, in panes of sketches;
- :mod:`monitoring.ranking`: nDCG@k, Spearman's ρ over the top-k lists, the mass cosine;
- :mod:`monitoring.drift`: one (method, label)'s window against its baseline;
- :mod:`monitoring.baseline`, :mod:`monitoring.canaries`: the two packaged files, and the canary runner;
- :mod:`monitoring.readers`: what each task's outcome gives the monitor;
- :mod:`monitoring.config`: the ``monitor:`` setting; :mod:`monitoring.metrics`: the exported metrics;
- :mod:`monitoring.monitor`: the per-model monitor (queue and thread);
- :mod:`monitoring.serving`: the seam a door calls (the monitor of a loaded service, its canaries on that service);
- :mod:`monitoring.inprocess`, :mod:`monitoring.reference`, :mod:`monitoring.cli`: ``explain-monitor``.
"""
