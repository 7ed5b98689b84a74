"""Which input gradients a backward pass will use."""
from __future__ import annotations

import torch


def wanted(ctx, index: int, tensor: torch.Tensor) -> bool:
    """Whether this backward pass uses the gradient of input ``index`` (``tensor``, as saved). ``needs_input_grad``
    only says the input requires grad; forces (``autograd.grad(energy, positions)``) with trainable parameters, as
    in MD with a model fresh from training, do not use the parameters' gradients, and the autograd engine knows:
    their pass is skipped then. ``tensor`` None (an op that did not keep it): whether it requires grad."""
    if not ctx.needs_input_grad[index]:
        return False
    # not saved, or a traced backward (which serves every later pass): nothing to ask
    if tensor is None or torch.compiler.is_compiling():
        return True
    try:
        return bool(torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(tensor).node))
    except (AttributeError, RuntimeError):  # a torch without the query: compute it
        return True
