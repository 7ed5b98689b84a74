"""How much of the backward's grad_z gathering a walk over tiles of senders could save (issue 15; CPU only).

The deterministic backward walks the edges by sender and gathers each edge's grad_z row (its receiver's) through L2:
13 KB per edge for MACE-MP-0-medium's 26 output blocks, ~3x the bytes the memory roofline counts (Nsight Compute,
benchmarks/first_use_22nd.md). Neighbouring atoms share most neighbours, so a walk that handled ``k`` consecutive
senders together and loaded each distinct receiver's row once for all of them would gather fewer rows. Per bench
graph (bench_graphs.py: a real neighbour list's order) and tile size k this prints

- ``rows per edge``: distinct receivers of a tile / its edges (1.0 for k = 1: every edge gathers its own row);
- ``lockstep use``: edges / (k x distinct receivers): the share of busy warps if the tile's k warps (one per
  sender) step through the tile's receivers together, idle where their sender has no edge to that receiver;
- the same for tiles of consecutive *receivers* gathering x rows (the forward's side, for comparison).

    python3 scripts/sender_tiles.py [--graphs carbon-1k,carbon-8k] [--tiles 1,2,4,8,16] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_graphs import build_graph  # noqa: E402


def tile_stats(keys: torch.Tensor, others: torch.Tensor, num_nodes: int, k: int) -> tuple[float, float]:
    """(distinct ``others`` per edge, lockstep use) over tiles of ``k`` consecutive ``keys`` (node ids)."""
    tile = keys // k
    pairs = torch.unique(tile * num_nodes + others)  # distinct (tile, other) pairs
    distinct = pairs.numel()
    edges = keys.numel()
    return distinct / edges, edges / (k * distinct)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="carbon-1k,carbon-8k")
    parser.add_argument("--tiles", default="1,2,4,8,16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tiles = [int(t) for t in args.tiles.split(",")]
    lines = ["| graph | nodes | edges | k | grad_z rows per edge (by sender) | lockstep use | x rows per edge (by "
             "receiver) | lockstep use |", "|---|---|---|---|---|---|---|---|"]
    for name in args.graphs.split(","):
        g = build_graph(name)
        dst, src, n = g.edge_dst.long(), g.edge_src.long(), g.num_nodes
        for k in tiles:
            s_rows, s_use = tile_stats(src, dst, n, k)
            r_rows, r_use = tile_stats(dst, src, n, k)
            lines.append(f"| {name} | {n} | {g.num_edges} | {k} | {s_rows:.3f} | {s_use:.2f} | {r_rows:.3f} | "
                         f"{r_use:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
