"""torch integration: ``torch.ops.mlip_accel.*`` custom ops and backend selection."""
from . import backends, custom_ops, edge_fingerprint  # noqa: F401  (edge_fingerprint installs itself in graph)
from .backends import BackendUnavailable, cuda_unavailable_reason

__all__ = ["backends", "custom_ops", "BackendUnavailable", "cuda_unavailable_reason"]
