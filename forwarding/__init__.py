"""A REST and gRPC forwarder in front of TorchServe's inference ports, with a per-request policy
(:mod:`forwarding.forwarder`). Two programs are built on it: the per-pod authenticating proxy
(:mod:`deploy.auth_proxy`) and the explanation-pool router (:mod:`doors.torchserve.router`)."""

from forwarding.forwarder import Forwarder, Policy, RefusedError, Reply, Upstream, serve_until_signalled

__all__ = ["Forwarder", "Policy", "RefusedError", "Reply", "Upstream", "serve_until_signalled"]
