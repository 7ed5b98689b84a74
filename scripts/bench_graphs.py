"""Benchmark graphs of ../shared/bench/problems.json, built with torch (on the GPU when given one).

- ``carbon-1k`` / ``carbon-8k``: diamond carbon (a = 3.567 A, cubic 8-atom cell) repeated 5^3 / 10^3 times,
  periodic, every ordered pair of atoms within 6.0 A (about 158 neighbours per atom);
- ``small-molecule``: the 32 atoms of the diamond lattice nearest to one atom, non-periodic, cutoff 5.0 A;
- ``carbon-<N>c``: the diamond cell repeated N times along each axis (bench_md's size sweep), cutoff 6.0 A.

Edges come sorted by receiver then sender (``edge_dst`` = the central atom i, ``edge_src`` = its neighbour j,
``edge_vec`` = r_j - r_i + shift), the order a CSR kernel wants and the order cell-list neighbour lists
give. Periodic images are summed over every lattice shift within the cutoff, so a box smaller than twice
the cutoff gets its repeated neighbours too; for carbon-1k and -8k that is the minimum image.

Used by scripts/bench_kernels.py and scripts/bench_md.py; needs only torch.
"""
from __future__ import annotations

import dataclasses
import math
import re

import torch

DIAMOND_A = 3.567  # lattice constant of diamond, Angstrom
CARBON_CUTOFF = 6.0
MOLECULE_CUTOFF = 5.0
MOLECULE_ATOMS = 32

# Fractional coordinates of the 8 atoms of the cubic diamond cell.
_DIAMOND_BASIS = ((0.0, 0.0, 0.0), (0.0, 0.5, 0.5), (0.5, 0.0, 0.5), (0.5, 0.5, 0.0),
                  (0.25, 0.25, 0.25), (0.25, 0.75, 0.75), (0.75, 0.25, 0.75), (0.75, 0.75, 0.25))


@dataclasses.dataclass
class Graph:
    name: str
    positions: torch.Tensor  # (num_nodes, 3), Angstrom
    cell: torch.Tensor | None  # (3,) lengths of the orthorhombic box, None if not periodic
    cutoff: float
    edge_dst: torch.Tensor  # (num_edges,) int64, receiver i
    edge_src: torch.Tensor  # (num_edges,) int64, sender j
    edge_vec: torch.Tensor  # (num_edges, 3): r_j - r_i (+ the lattice shift)

    @property
    def num_nodes(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_dst.shape[0])

    def describe(self) -> str:
        return (f"{self.name}: {self.num_nodes} atoms, {self.num_edges} edges "
                f"({self.num_edges / max(self.num_nodes, 1):.1f} per atom), cutoff {self.cutoff} A"
                f"{', periodic' if self.cell is not None else ''}")


def diamond_positions(reps: int, a: float = DIAMOND_A, device="cpu", dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Diamond cell repeated ``reps`` times along each axis: (positions (8 reps^3, 3), box lengths (3,))."""
    if not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be a positive int, got {reps!r}")
    basis = torch.tensor(_DIAMOND_BASIS, dtype=dtype, device=device)
    r = torch.arange(reps, dtype=dtype, device=device)
    cells = torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 1, 3)
    positions = ((cells + basis) * a).reshape(-1, 3)
    return positions, torch.full((3,), reps * a, dtype=dtype, device=device)


def _lattice_shifts(cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """Every integer shift n (times the box) that can bring an image within ``cutoff``; (0,0,0) first."""
    k = [math.ceil(cutoff / float(length)) for length in cell]
    rng = [torch.arange(-ki, ki + 1, device=cell.device) for ki in k]
    shifts = torch.stack(torch.meshgrid(*rng, indexing="ij"), dim=-1).reshape(-1, 3)
    order = torch.argsort((shifts != 0).any(dim=1).to(torch.int8), stable=True)
    return shifts[order].to(cell.dtype)


def radius_graph(positions: torch.Tensor, cutoff: float, cell: torch.Tensor | None = None,
                 chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All ordered pairs (i, j), i != j or a nonzero image, with |r_j - r_i + shift| < cutoff.

    ``cell`` gives the lengths of an orthorhombic periodic box (positions inside it), None for an open
    system. Work is chunked over receivers so an 8000-atom box needs ~100 MB at a time.
    Returns (edge_dst, edge_src, edge_vec) sorted by (dst, src, shift).
    """
    if cutoff <= 0:
        raise ValueError(f"cutoff must be positive, got {cutoff}")
    if positions.dim() != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {tuple(positions.shape)}")
    n = positions.shape[0]
    shifts = (_lattice_shifts(cell, cutoff) * cell if cell is not None
              else positions.new_zeros(1, 3))
    dst_parts, src_parts, vec_parts = [], [], []
    idx = torch.arange(n, device=positions.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        # (rows, shifts, n, 3): displacement of every image of every atom from each receiver of the chunk
        d = positions[None, None, :, :] + shifts[None, :, None, :] - positions[start:stop, None, None, :]
        within = (d * d).sum(-1) < cutoff * cutoff
        within[:, 0, :] &= idx[None, :] != idx[start:stop, None]  # no self-pair without a shift
        rows, s, cols = within.nonzero(as_tuple=True)
        dst_parts.append(rows + start)
        src_parts.append(cols)
        vec_parts.append(d[rows, s, cols])
    edge_dst, edge_src, edge_vec = torch.cat(dst_parts), torch.cat(src_parts), torch.cat(vec_parts)
    order = torch.argsort(edge_dst * n + edge_src, stable=True)
    return edge_dst[order], edge_src[order], edge_vec[order]


def carbon_graph(reps: int, cutoff: float = CARBON_CUTOFF, device="cpu", name: str | None = None) -> Graph:
    positions, cell = diamond_positions(reps, device=device)
    dst, src, vec = radius_graph(positions, cutoff, cell)
    return Graph(name or f"carbon-{reps}c", positions, cell, cutoff, dst, src, vec)


def small_molecule_graph(num_atoms: int = MOLECULE_ATOMS, cutoff: float = MOLECULE_CUTOFF, device="cpu") -> Graph:
    """The ``num_atoms`` lattice sites nearest to one atom of a 4^3 diamond block, as an open cluster."""
    positions, _ = diamond_positions(4, device=device)
    center = positions[(positions - positions.mean(0)).norm(dim=1).argmin()]
    dist = (positions - center).norm(dim=1)
    # ties (equal shells) are broken by site index, so the cluster is the same on every device
    keys = torch.round(dist * 1e6) * positions.shape[0] + torch.arange(positions.shape[0], device=device)
    cluster = positions[torch.argsort(keys)[:num_atoms]] - center
    dst, src, vec = radius_graph(cluster, cutoff)
    return Graph("small-molecule", cluster, None, cutoff, dst, src, vec)


NAMED = {"carbon-1k": 5, "carbon-8k": 10}


def build_graph(name: str, device="cpu") -> Graph:
    """A graph of problems.json by name ("carbon-1k", "carbon-8k", "small-molecule") or "carbon-<N>c"."""
    if name in NAMED:
        return carbon_graph(NAMED[name], device=device, name=name)
    if name == "small-molecule":
        return small_molecule_graph(device=device)
    m = re.fullmatch(r"carbon-(\d+)c", name)
    if m:
        return carbon_graph(int(m.group(1)), device=device)
    raise ValueError(f"unknown graph {name!r}: use carbon-1k, carbon-8k, small-molecule or carbon-<N>c")


if __name__ == "__main__":
    import sys

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for graph_name in sys.argv[1:] or ["small-molecule", "carbon-1k"]:
        print(build_graph(graph_name, device=dev).describe())
