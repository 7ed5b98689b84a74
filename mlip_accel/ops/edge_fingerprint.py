"""The edge list's fingerprint (graph.edge_fingerprint) by the CUDA kernel (runtime.edge_fingerprint) wherever it
runs: int64 ids on a CUDA device where mlip_accel's kernels load. The kernel computes the coefficients the torch
formula multiplies by as it goes, so no table of them is kept on the device (34 MB at 1.26 M edges). Installed
into graph.py when this package is imported (graph.py, a lower layer, may not import the runtime)."""
from __future__ import annotations

import torch

from .. import graph
from .backends import cuda_unavailable_reason, plain_tensors


def fingerprint(edge_dst: torch.Tensor, edge_src: torch.Tensor) -> torch.Tensor | None:
    """:func:`graph.edge_fingerprint` by the kernel, or None where it does not run."""
    if (edge_dst.dtype != torch.int64 or edge_src.dtype != torch.int64 or edge_dst.device.type != "cuda"
            or not plain_tensors(edge_dst, edge_src) or cuda_unavailable_reason() is not None):
        return None
    from ..runtime.edge_fingerprint import fingerprint as kernel  # imports no CuPy until it launches
    return kernel(edge_dst, edge_src)


graph.set_fingerprint_kernel(fingerprint)
