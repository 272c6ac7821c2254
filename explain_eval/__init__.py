"""``explain-eval``: the faithfulness evaluation (the perturbation test of Chefer et al.) of the served models'
explanation methods, run in-process on a model's checkpoint (torch, transformers, :mod:`explainers`) or through the
running service with :mod:`explain_client`. Part of the server's distribution, not of the client's."""
