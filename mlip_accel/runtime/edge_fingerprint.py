"""Launching the edge-list fingerprint kernel (codegen.edge_fingerprint) through the one launch path. Importing
this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.edge_fingerprint import EDGES_PER_THREAD, edge_fingerprint_program
from .launch_plan import launch


def fingerprint(edge_dst: torch.Tensor, edge_src: torch.Tensor) -> torch.Tensor:
    """``graph.edge_fingerprint`` of int64 edge ids (1-D, same length and device): a 0-d int64 tensor."""
    for name, t in (("edge_dst", edge_dst), ("edge_src", edge_src)):
        if t.dtype != torch.int64 or t.dim() != 1 or t.shape != edge_dst.shape or t.device != edge_dst.device:
            raise ValueError(f"{name} must be a 1-D int64 tensor like edge_dst, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")
    program = edge_fingerprint_program()
    out = torch.empty(1, dtype=torch.int64, device=edge_dst.device)  # zeroed by the launch
    launch(program, program.plans[0], dict(edge_dst=edge_dst.contiguous(), edge_src=edge_src.contiguous(), out=out,
                                           n=edge_dst.shape[0], per=EDGES_PER_THREAD), edge_dst.device)
    return out.reshape(())
