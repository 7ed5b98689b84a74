"""What the NequIP and MACE adapters share: option checks, the swap transaction, the parity check with its one
tolerance policy, and the call of a fused convolution on the model's shared edge graph."""
from __future__ import annotations

import contextlib
import copy
import itertools

import torch

from ..errors import ParityCheckFailed
from ..ops.backends import check_backend_name
from ..ops.tabulated_conv import tabulated_source
from .harmonics import harmonics_source, materialized

# Relative tolerance of both parity probes, max|accelerated - original| <= RTOL * max|original| per output.
# A real mismatch (a wrong path, weight layout or normalisation) changes outputs by 1e-2 and more.
#   float32: measured error budgets against the same parameters in float64 with exact constants
#            (scripts/mace_fp32_error_budget.py -> benchmarks/mace_fp32_error_budget.md; every MACE model
#            class x interaction block): e3nn fp32 vs fp64 <= 7.7e-6, ours fp32 vs fp64 <= 7.2e-6 (ours tracks
#            e3nn's own rounding), so |ours - e3nn| <= 1.5e-5 by the triangle inequality (2.0e-6 measured).
#            1e-4 leaves a 6x margin over that bound and stays 100x under a real mismatch; 1e-5 (NequIP's
#            former tolerance, MACE's conversion tests') sits at e3nn's own float32 error, so a deeper model
#            or a larger structure could refuse a correct swap.
#   float64, e3nn constants exact (the model built under float64): <= 1e-13 measured; 1e-9 is generous and
#            still 1e7 under a real mismatch.
#   float64 with Clebsch-Gordan constants computed in float32 and cast (an e3nn 0.4.4 module built in
#            float32 then .double(); rel. error up to 6e-8, ours exact): <= 2e-10 measured; bound set from the
#            constants' error with a 15x margin.
#   other dtypes (bfloat16/float16 models): 1e-2.
RTOL_FLOAT32 = 1e-4
RTOL_FLOAT64 = 1e-9
RTOL_FLOAT64_ROUNDED_CG = 1e-6
RTOL_LOW_PRECISION = 1e-2


def tolerance(dtype: torch.dtype, rounded_constants: bool = False) -> float:
    """The parity tolerance for outputs of ``dtype`` (see the table above)."""
    if dtype == torch.float64:
        return RTOL_FLOAT64_ROUNDED_CG if rounded_constants else RTOL_FLOAT64
    return RTOL_FLOAT32 if dtype == torch.float32 else RTOL_LOW_PRECISION


def check_options(deterministic, backend, check=True) -> None:
    """The options every ``accelerate`` takes, checked before anything changes."""
    check_backend_name(backend)
    for name, value in (("deterministic", deterministic), ("check", check)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def check_not_inference(model) -> None:
    """accelerate() builds modules and runs its parity probe with autograd (forces): refuse, saying what to
    do, inside ``torch.inference_mode()`` or on a model whose parameters are inference tensors."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError("mlip_accel.accelerate cannot run inside torch.inference_mode(): it builds the new "
                           "layers and checks the model's energy and forces before and after (autograd). Call "
                           "mlip_accel.accelerate(model) once before entering inference mode, then run the "
                           "model inside it")
    if isinstance(model, torch.nn.Module) and any(p.is_inference() for p in model.parameters()):
        raise RuntimeError("this model's parameters are inference tensors (it was built or loaded inside "
                           "torch.inference_mode()): build or load it outside inference mode, call "
                           "mlip_accel.accelerate(model), then run it inside inference mode")


@contextlib.contextmanager
def swap_transaction():
    """All or nothing: yields a list to which each step appends the callable undoing it; if anything in the
    block raises (a refused layer, a failed parity check, Ctrl-C), the steps are undone, last first, and the
    error propagates. Never hand back a model whose results changed."""
    undo: list = []
    try:
        yield undo
    except BaseException:
        for step in reversed(undo):
            step()
        raise


@contextlib.contextmanager
def originals_in(blocks, attr: str, swapped_class: type):
    """Each block's ``attr`` that is one of our ``swapped_class`` swaps holds its ``.original`` for the duration
    of the block (the plain model a parity check compares against), then our module again."""
    swapped = [(b, getattr(b, attr)) for b in blocks if isinstance(getattr(b, attr, None), swapped_class)]
    for block, fast in swapped:
        setattr(block, attr, fast.original)
    try:
        yield
    finally:
        for block, fast in swapped:
            setattr(block, attr, fast)


def relative_error(new: torch.Tensor, old: torch.Tensor) -> float:
    """max |new - old| / max |old| in float64 (the plain difference where ``old`` is all zeros; NaN stays NaN)."""
    new, old = new.detach().double(), old.detach().double()
    if old.numel() == 0:
        return 0.0
    scale = old.abs().max().item()
    diff = (new - old).abs().max().item()
    return diff / scale if scale > 0 else diff


def host_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` on the CPU, its parameters and buffers copied straight to the host (a deep copy on the
    device first would allocate the whole model there)."""
    memo: dict = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type != "cpu" and id(t) not in memo:
            host = t.detach().to("cpu", copy=True)
            memo[id(t)] = torch.nn.Parameter(host, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else host
    return copy.deepcopy(model, memo).cpu()


def reference_on_host(run, model: torch.nn.Module, batch: dict, device: torch.device) -> dict:
    """``run(model, batch)`` (the parity probe's original model, dict of output tensors) on a host copy of the
    model when ``device`` is a GPU, the outputs moved back to ``device``. The original model's products are
    cuBLAS's: run on the GPU they would leave cuBLAS's workspaces and its own device memory behind, ~0.1-0.2 GB
    held for the process's lifetime that the accelerated model, which makes no cuBLAS call, never needs
    (benchmarks/graph_pool_notes.md). Where the copy cannot run on the host, the probe runs on the device."""
    if device.type == "cpu":
        return run(model, batch)
    try:
        host = host_copy(model)
        out = run(host, {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()})
    except Exception:  # a module holding device tensors outside its parameters and buffers, say
        return run(model, batch)
    return {k: v.to(device) for k, v in out.items()}


def compare_outputs(reference: dict, accelerated: dict, rtol: float, where: str) -> None:
    """Raise :class:`ParityCheckFailed` naming every output missing, reshaped or off by more than ``rtol``."""
    problems = []
    for key in sorted(reference):
        ref, acc = reference[key], accelerated.get(key)
        if acc is None or acc.shape != ref.shape:
            problems.append(f"output {key!r} missing or reshaped "
                            f"({None if acc is None else tuple(acc.shape)} vs {tuple(ref.shape)})")
            continue
        err = relative_error(acc, ref)
        if not err <= rtol:  # also catches NaN
            problems.append(f"output {key!r} changed by {err:.3g} (relative; tolerance {rtol:g})")
    if problems:
        raise ParityCheckFailed(f"{where}: parity self-check failed, the model was left as it was: "
                                + "; ".join(problems))


def conv_on_shared_graph(conv, edge_sort, x, edge_attr, edge_weight, edge_dst, edge_src):
    """Call a :class:`~mlip_accel.TensorProductConv` the way every adapter's fused layer does: with the edge
    graph all layers of one model share (``edge_sort``, an :class:`~mlip_accel.graph.EdgeSortCache`, sorts the
    edges once per forward pass) when the sum is deterministic, with none (atomic accumulation) otherwise; where
    ``edge_weight`` is a tabulated radial network's placeholder, with the table read inside the walks
    (``TensorProductConv.forward_tabulated``), and where ``edge_attr`` is also a harmonics placeholder, with the
    harmonics evaluated there from the vectors; any other placeholder of harmonics is made into them first."""
    graph = shared_graph(conv, edge_sort, x, edge_dst, edge_src)
    source = tabulated_source(edge_weight)
    vectors = harmonics_source(edge_attr)  # the harmonics left uncomputed (patches/harmonics): (vectors, module)
    if vectors is not None and (source is None or not conv.takes_vectors(x, vectors[0], source[1],
                                                                         vectors[1].problem)):
        edge_attr, vectors = materialized(edge_attr), None
    if source is None:
        return conv(x, edge_attr, edge_weight, edge_dst, edge_src, graph=graph)
    # a tabulated radial network's placeholder (ops.tabulated_conv): the walks read its table, W is never made
    if tuple(edge_weight.shape) != (edge_attr.shape[0], conv.weight_numel):
        raise ValueError(f"the tabulated radial network gave {tuple(edge_weight.shape)} weights for "
                         f"{edge_attr.shape[0]} edges of {conv.weight_numel}")
    table, lengths, exact, params = source
    if vectors is not None:  # and its harmonics evaluated inside the walks too: Y is never made either
        return conv.forward_tabulated(x, vectors[0], table, lengths, exact, params, edge_dst, edge_src, graph=graph,
                                      harmonics=vectors[1].problem)
    return conv.forward_tabulated(x, edge_attr, table, lengths, exact, params, edge_dst, edge_src, graph=graph)


def shared_graph(conv, edge_sort, x, edge_dst, edge_src):
    """The shared edge graph ``conv`` walks (None when its sum is atomic)."""
    return edge_sort.graph(edge_dst, edge_src, x.shape[0]) if conv.deterministic else None
