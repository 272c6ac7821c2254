"""The benchmarks, each run as ``python -m bench.<module>`` (``--help`` says what it measures; docs/SERVING.md and
docs/benchmarks.md hold the results with their commands), and the two modules they share (``memory``, ``common``).

Cost of the methods in process:

- ``explainers``: each method's time and peak memory relative to a plain forward (the ``bench-explainers`` target);
- ``real_sizes``: the same on random models with the exact shapes of real checkpoints;
- ``gpu``: the GPU benchmark in one command (the real-size table on CUDA, and more);
- ``profile``: where an explanation's time goes (stages and top operators);
- ``generation``: explaining generated text, against generation alone and Captum;
- ``token_classification``: explaining a token classifier's entities, against transformers-interpret;
- ``unsure``: explain-when-unsure against a plain forward;
- ``occlusion``: occlusion of a causal LM with and without the prefix's key/value cache;
- ``attention_flow``: attention flow against the input length, beside the authors' implementation;
- ``timing``, ``timing_tasks``: the time estimates against the actual times;
- ``memory``: peak memory of one call, the CPU's resident set or the CUDA allocator's (for ``explainers`` and
  ``real_sizes``).

Agreement with the authors' code and with other methods:

- ``attnlrp_lxt``: ``attnlrp`` / ``cp_lrp`` against the authors' ``lxt``;
- ``citations``: each method's citations against leave-one-document-out and ContextCite.

The served service:

- ``load``: throughput and latency per method, batched against batch size 1, REST and gRPC;
- ``mix``: how explanation rows slow the prediction rows batched with them;
- ``router``: what the router in front of TorchServe costs a prediction;
- ``doors``: scale-out on a local Ray cluster, a replica killed under load, and the doors side by side;
- ``common``: what these four share (request texts and bodies, TorchServe's callers, the archive and profile they
  serve, the closed loop of concurrent clients, the percentile, the load average).

The machine a report names is :func:`explain_eval.provenance.machine`; the means and standard errors of the tables
are :mod:`explain_eval.results`'.
"""
