"""Shared test helpers: e3nn references, random e3nn problems and graphs (the helpers scripts need too live in
:mod:`mlip_accel.testing`)."""
from __future__ import annotations

import random

import torch

from mlip_accel.integrations.cuda_graphs import GraphCache
from mlip_accel.problem import channelwise_problem
from mlip_accel.problem.e3nn_compat import default_dtype, o3
from mlip_accel.testing.conv_cases import bench_problem_specs as bench_problems  # noqa: F401
from mlip_accel.testing.errors import TOL, rel_err  # noqa: F401


def e3nn_tp(irreps_in1, irreps_in2, irreps_out, instructions, dtype=torch.float64, **kwargs):
    kwargs.setdefault("shared_weights", False)
    kwargs.setdefault("internal_weights", False)
    with default_dtype(dtype):
        return o3().TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **kwargs)


def bench_e3nn_tp(problem: dict, dtype=torch.float64):
    in1, out, ins = channelwise_problem(problem["in1"], problem["in2"], problem["target"])
    return e3nn_tp(in1, problem["in2"], out, ins, dtype=dtype)


def random_irreps(rng: random.Random, lmax: int = 4, max_terms: int = 3, odd_muls: bool = True) -> str:
    terms = []
    for _ in range(rng.randint(1, max_terms)):
        mul = rng.choice([1, 3, 5, 7]) if odd_muls else rng.randint(1, 6)
        terms.append(f"{mul}x{rng.randint(0, lmax)}{rng.choice('eo')}")
    return str(o3().Irreps("+".join(terms)).simplify())


def random_problem(rng: random.Random, mode: str, dtype=torch.float64, lmax: int = 4, **kwargs):
    """A random e3nn TensorProduct with at least one path of the given mode."""
    while True:
        in1 = o3().Irreps(random_irreps(rng, lmax))
        in2 = o3().Irreps(random_irreps(rng, lmax) if mode in ("uvu", "uvw") else str(in1))
        out_terms, instructions = [], []
        for i, (m1, ir1) in enumerate(in1):
            for j, (m2, ir2) in enumerate(in2):
                if mode in ("uuu", "uuw") and m1 != m2:
                    continue
                for ir in ir1 * ir2:
                    if ir.l > lmax or rng.random() < 0.3:
                        continue
                    mul_out = m1 if mode in ("uvu", "uuu") else rng.choice([1, 3, 5])
                    instructions.append((i, j, len(out_terms), mode, True))
                    out_terms.append(f"{mul_out}x{ir}")
        if instructions:
            return e3nn_tp(in1, in2, "+".join(out_terms), instructions, dtype=dtype, **kwargs)


def random_graph(num_nodes: int, num_edges: int, generator=None, device="cpu"):
    dst = torch.randint(0, num_nodes, (num_edges,), generator=generator).to(device)
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator).to(device)
    return dst, src


def random_inputs(tp, num_nodes: int, num_edges: int, dtype, device="cpu", requires_grad=False):
    x = torch.randn(num_nodes, tp.irreps_in1.dim, dtype=dtype, device=device, requires_grad=requires_grad)
    y = torch.randn(num_edges, tp.irreps_in2.dim, dtype=dtype, device=device, requires_grad=requires_grad)
    wshape = (tp.weight_numel,) if tp.shared_weights else (num_edges, tp.weight_numel)
    w = torch.randn(*wshape, dtype=dtype, device=device, requires_grad=requires_grad)
    return x, y, w


def e3nn_conv(tp, x, y, w, dst, src):
    return torch.zeros(x.shape[0], tp.irreps_out.dim, dtype=x.dtype, device=x.device).index_add(
        0, dst, tp(x[src], y, w))


def default_model_calculator(dtype="float64", **kwargs):
    """The embedded default model's AcceleratedCalculator on the GPU (CUDA backend). No neighbour-list skin
    unless asked: the graph tests count lists, captures and host operations of a list built every call."""
    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.ase import AcceleratedCalculator

    kwargs.setdefault("neighbor_skin", 0.0)
    return AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cuda", dtype=dtype, backend="cuda",
                                           **kwargs)


def graph_report(**values):
    """One JSON line of numbers a GPU test records, appended to $MLIP_GRAPH_REPORT when set (the device scripts
    bring the file back)."""
    import json
    import os

    path = os.environ.get("MLIP_GRAPH_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(values) + "\n")


def max_rel(a, b) -> float:
    """:func:`rel_err` of host arrays, numbers or CPU tensors (ASE's numpy results, our device outputs moved back)."""
    import numpy as np

    return rel_err(torch.as_tensor(np.asarray(a, dtype=np.float64)), torch.as_tensor(np.asarray(b, dtype=np.float64)))


# --- the graph cache on a CPU: its bookkeeping run for real, the CUDA capture replaced ---------------------

class ReplayByRunning:
    """Stands in for a CUDA graph on a CPU: a replay runs the evaluation on the static input buffers and writes
    the static outputs, as a real replay would."""

    def __init__(self, step, outputs):
        self.step, self.outputs = step, outputs

    def replay(self):
        for key, value in self.step().items():
            self.outputs[key].copy_(value)

    def reset(self):
        pass


class CpuGraphCache(GraphCache):
    """The graph cache with its CUDA capture replaced (_record): everything else, which inputs are copied into
    the static buffers and when, which graph is replayed, runs as on a GPU."""

    def _record(self, step, inputs, device):
        outputs = step()
        return ReplayByRunning(step, outputs), outputs, 0


def cpu_graphed(calc):
    evaluator = calc.evaluator
    evaluator.pad_edges, evaluator._pad_for_graphs_only = True, True
    evaluator.graphs = CpuGraphCache(calc.potential, max_graph_edges=10 ** 9, warn_large=False)
    return evaluator.graphs
