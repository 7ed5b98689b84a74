"""Convolution/tensor-product problems, graphs and inputs shared by the kernel tests (code generation, CPU
emulation, GPU), the benchmarks and the device scripts."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

from mlip_accel.problem import TPProblem, channelwise_problem, describe

_REPO = Path(__file__).resolve().parents[2]


def _candidates() -> list[Path]:
    """Where problems.json may be: $MLIP_ACCEL_PROBLEMS_JSON; then, for the repository this package sits in and
    for the one the process runs in (the device scripts run tests/ and scripts/ from a checkout while importing
    mlip_accel from an installed copy, whose own folder has no benchmarks/), the session's shared copy next to
    the repository first, then the repository's own."""
    env = os.environ.get("MLIP_ACCEL_PROBLEMS_JSON")
    found = [Path(env)] if env else []
    for repo in (_REPO, Path.cwd(), Path.cwd().parent):
        found += [repo.parent / "shared" / "bench" / "problems.json", repo / "benchmarks" / "problems.json"]
    return found


def problems_json() -> Path | None:
    return next((p for p in _candidates() if p.is_file()), None)


def bench_problem_specs() -> list[dict]:
    """The benchmark problems of problems.json (name, in1, in2, target); [] where no copy is found."""
    path = problems_json()
    return json.loads(path.read_text())["problems"] if path else []

_BENCH: dict[str, TPProblem] = {}

def bench_problem(spec: dict) -> TPProblem:
    if spec["name"] not in _BENCH:
        in1, out, ins = channelwise_problem(spec["in1"], spec["in2"], spec["target"])
        _BENCH[spec["name"]] = describe(in1, spec["in2"], out, ins, shared_weights=False, internal_weights=False)
    return _BENCH[spec["name"]]

def random_uvu_problem(seed: int, muls=(1, 5, 32, 33, 40, 64, 70), lmax: int = 3, mul2s=(1, 1, 2),
                       weightless: float = 0.15) -> TPProblem:
    """A random uvu problem: multiplicities off multiples of 32, in2 multiplicities > 1, paths without
    weights, output irreps written by several paths, and sometimes an input or output irrep no path uses."""
    rng = random.Random(seed)
    while True:
        in1 = [(rng.choice(muls), rng.randint(0, lmax), rng.choice("eo")) for _ in range(rng.randint(1, 3))]
        in2 = [(rng.choice(mul2s), rng.randint(0, lmax), rng.choice("eo")) for _ in range(rng.randint(1, 3))]
        out, instructions = [], []
        for i, (m1, l1, p1) in enumerate(in1):
            for j, (_, l2, p2) in enumerate(in2):
                for l3 in range(abs(l1 - l2), min(l1 + l2, lmax) + 1):
                    if rng.random() < 0.35:
                        continue
                    parity = "e" if (p1 == p2) else "o"
                    ir = (m1, l3, parity)
                    # reuse an existing output irrep sometimes: several paths then sum into it
                    k = next((n for n, o in enumerate(out) if o == ir), None) if rng.random() < 0.5 else None
                    if k is None:
                        k = len(out)
                        out.append(ir)
                    instructions.append((i, j, k, "uvu", rng.random() >= weightless))
        if rng.random() < 0.3:  # an output irrep no path writes: the kernels must still write its zeros
            out.append((rng.choice(muls), rng.randint(0, lmax), rng.choice("eo")))
        if instructions:
            fmt = lambda irreps: "+".join(f"{m}x{l}{p}" for m, l, p in irreps)  # noqa: E731
            return describe(fmt(in1), fmt(in2), fmt(out), instructions, shared_weights=False,
                            internal_weights=False)

def graph(kind: str, num_nodes: int, num_edges: int, seed: int = 0, device="cpu"):
    """(edge_dst, edge_src) int64: 'random', 'isolated' (a third of the nodes have no edges at all),
    'hub' (node 0 receives and sends most edges: a row split across many warps)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
        src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    elif kind == "isolated":
        used = max(1, (2 * num_nodes) // 3)
        nodes = torch.randperm(num_nodes, generator=g)[:used]
        dst = nodes[torch.randint(0, used, (num_edges,), generator=g)]
        src = nodes[torch.randint(0, used, (num_edges,), generator=g)]
    elif kind == "hub":
        dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
        src = torch.randint(0, num_nodes, (num_edges,), generator=g)
        hub = torch.rand(num_edges, generator=g) < 0.8
        dst[hub] = 0
        src[torch.rand(num_edges, generator=g) < 0.8] = 0
    else:
        raise ValueError(kind)
    return dst.to(device), src.to(device)

def inputs(problem: TPProblem, num_nodes: int, num_edges: int, dtype, device="cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)  # noqa: E731
    x = make(num_nodes, problem.dim_in1)
    y = make(num_edges, problem.dim_in2)
    w = make(num_edges, problem.weight_numel)
    grad_z = make(num_nodes, problem.dim_out)
    return x, y, w, grad_z

def channelwise(in1: str, in2: str, lmax: int = 3) -> TPProblem:
    """Every uvu path of in1 x in2 up to lmax, built as MACE/NequIP build theirs."""
    target = "+".join(f"1x{l}{p}" for l in range(lmax + 1) for p in "eo")
    i1, out, ins = channelwise_problem(in1, in2, target)
    return describe(i1, in2, out, ins, shared_weights=False, internal_weights=False)


def incoming_gradients(x, y, w, given=(True, True, True), seed: int = 0) -> list:
    """Random incoming gradients (ggx, ggy, ggw) of a double backward, shaped, typed and placed as x, y, w; None
    where ``given`` says absent."""
    g = torch.Generator().manual_seed(1000 + seed)
    return [torch.randn(t.shape, generator=g, dtype=torch.float64).to(dtype=t.dtype, device=t.device) if n else None
            for t, n in zip((x, y, w), given)]


def double_backward_reference(problem: TPProblem, x, y, w, grad_z, gg, edge_dst, edge_src) -> tuple:
    """The conv's double backward (grads of x, y, w, grad_z) composed from the reference backend's forward and
    backward calls by the identity of ops.custom_ops, in float64; zeros without edges (the reference takes no
    empty batches). ``gg``: (ggx, ggy, ggw), None where absent."""
    from mlip_accel import reference
    from mlip_accel.ops.custom_ops import _double_backward

    up = lambda t: None if t is None else t.double()  # noqa: E731
    x, y, w, grad_z = (up(t) for t in (x, y, w, grad_z))
    gg = [up(t) for t in gg]
    if y.shape[0] == 0:
        return tuple(torch.zeros_like(t) for t in (x, y, w, grad_z))

    def calls(p):
        if p is None:
            return None, None
        return (lambda a, b, c: reference.conv_forward(p, a, b, c, edge_dst, edge_src),
                lambda a, b, c, gz, need: reference.conv_backward(p, a, b, c, gz, edge_dst, edge_src, None, need))
    return _double_backward(*calls(problem), x, y, w, grad_z, *gg, *calls(problem.weighted_part))
