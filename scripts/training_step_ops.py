#!/usr/bin/env python
"""The operations of one force-training step of bench_md's NequIP model (OAM-L size) on the 32-atom molecule, counted
on the CPU (aten operations below autograd that launch a kernel on a GPU: views and allocations left out): by phase
(the model's forward, the forces' autograd.grad inside it, loss.backward) and, in the forward, by innermost module
class. On the CPU mlip_accel runs its reference backend, whose kernels are torch operations: its counts are an upper
bound of the GPU's (pending_device_runs.md item 21 measures those).

    python3 scripts/training_step_ops.py e3nn|mlip_accel [float64|float32]
"""
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import bench_md  # noqa: E402
from bench_graphs import build_graph  # noqa: E402
from mlip_accel.integrations.potentials import potential_from_model  # noqa: E402

# operations that launch no kernel on a GPU
VIEWS = {"view", "_unsafe_view", "reshape", "as_strided", "slice", "select", "t", "transpose", "permute", "expand",
         "unsqueeze", "squeeze", "alias", "detach", "narrow", "split", "split_with_sizes", "unbind", "chunk",
         "lift_fresh", "view_as", "empty", "empty_like", "empty_strided", "new_empty", "numel", "sym_size",
         "sym_stride", "size", "stride", "is_same_size", "_reshape_alias", "unflatten", "flatten"}


class StepOps(TorchDispatchMode):
    """Counts by phase and operation, and the forward's by innermost module (``modules``: the stack the hooks keep;
    ``phases``: the phase stack the wrapped autograd calls keep)."""

    def __init__(self, modules: list, phases: list):
        super().__init__()
        self.modules, self.phases = modules, phases
        self.by_module, self.ops, self.by_phase = (collections.Counter() for _ in range(3))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            phase = self.phases[-1]
            self.by_phase[phase] += 1
            self.ops[(phase, name)] += 1
            if phase == "forward":
                self.by_module[self.modules[-1] if self.modules else "(outside modules)"] += 1
        return func(*args, **(kwargs or {}))


def in_phase(phases: list, name: str, fn):
    """``fn`` with ``name`` pushed on ``phases`` while it runs."""
    def call(*args, **kwargs):
        phases.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            phases.pop()
    return call


def main(impl: str, dtype: torch.dtype) -> None:
    cpu = torch.device("cpu")
    pos, cell, pbc, numbers, neighbors = bench_md.structure(build_graph(bench_md.MOLECULE))
    potential = potential_from_model(bench_md.variant("nequip", impl, bench_md.build_nequip(dtype), cpu), device=cpu)
    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
    step = bench_md.make_step(potential, data, "train")
    modules, phases = [], ["forward"]
    for m in potential.model.modules():
        m.register_forward_pre_hook(lambda mod, inp: modules.append(type(mod).__name__))
        m.register_forward_hook(lambda mod, inp, out: modules.pop() and None)
    # the forces' autograd.grad runs inside the model's forward; the loss's backward after it
    grad, backward = torch.autograd.grad, torch.Tensor.backward
    torch.autograd.grad = in_phase(phases, "forces", grad)
    torch.Tensor.backward = in_phase(phases, "loss backward", backward)
    try:
        step()  # first use
        with StepOps(modules, phases) as ops:
            step()
    finally:
        torch.autograd.grad, torch.Tensor.backward = grad, backward
    print(f"{impl} {dtype}: {sum(ops.by_phase.values())} operations, by phase {dict(ops.by_phase)}")
    for module, n in ops.by_module.most_common(25):
        print(f"{n:6d}  forward in {module}")
    for phase in ("forward", "forces", "loss backward"):
        top = [f"{name} {n}" for (p, name), n in ops.ops.most_common() if p == phase][:14]
        print(f"{phase}: " + ", ".join(top))


if __name__ == "__main__":
    main(sys.argv[1], getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.float64)
