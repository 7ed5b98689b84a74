"""The largest single CPU allocation made while a function runs: how the tests show that a tensor was never
allocated (edge streaming: no ``num_edges x weight_numel`` tensor), without timing anything.

torch's profiler with ``profile_memory=True`` charges every allocation to the operator that made it, also
inside custom ops' Python kernels and in the backward pass (which a ``TorchDispatchMode`` would not see:
a mode is switched off while it handles a custom op). An operator's ``self_cpu_memory_usage`` is what it
allocated itself, net of what it freed itself; its maximum over all operators bounds the largest tensor made
from below (an operator allocating two tensors counts their sum: conservative for "never allocated").
"""
from __future__ import annotations


def largest_allocation(fn) -> tuple[int, str]:
    """(bytes, operator name) of the largest allocation by any single operator during ``fn()`` on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    best = (0, "")
    for event in prof.events():
        size = int(getattr(event, "self_cpu_memory_usage", 0) or 0)
        if size > best[0]:
            best = (size, event.name)
    return best
