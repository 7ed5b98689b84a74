"""``IrrepsLinear``: e3nn's ``o3.Linear`` (shared internal weights, no biases) over ops.linear: the same function in
fewer launches, the same parameters (the e3nn module's own ``weight``, ``bias`` and ``output_mask`` tensors, so
``state_dict`` keys and values are unchanged)."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.linear import linear
from ..problem.linear import LinearProblem, from_e3nn
from . import e3nn_api
from .e3nn_api import original_sharing, share_weight_and_buffers


class IrrepsLinear(e3nn_api.ReadsLikeOriginal, nn.Module):
    """Drop-in for e3nn's ``Linear`` module ``original`` (see problem.linear.unsupported_reason for which); its
    other attributes (``instructions``, ``weight_numel``, ...) read from it."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.problem: LinearProblem = from_e3nn(original)
        # the same Parameter (training updates both) and e3nn's (empty) bias and output_mask
        self._shared = share_weight_and_buffers(self, original)
        scale = torch.zeros(original.weight.numel(), dtype=original.weight.dtype)
        for ins in self.problem.instructions:
            scale[ins.offset:ins.offset + ins.mul_in * ins.mul_out] = ins.path_weight
        self.register_buffer("scale", scale.to(original.weight.device), persistent=False)
        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    _shared: tuple = ()  # class default: a model pickled before the attribute existed

    @property
    def original(self) -> nn.Module:
        """e3nn's module, with this module's weight and buffers (:func:`~.e3nn_api.original_sharing`)."""
        return original_sharing(self, self._shared)

    def forward(self, features: torch.Tensor, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        if weight is not None or bias is not None:  # weights given at call time: e3nn's own module
            return self.original(features, weight, bias)
        return linear(features, self.weight, self.scale, self.problem)

    def extra_repr(self) -> str:
        return f"{self.irreps_in} -> {self.irreps_out}, {len(self.problem.instructions)} instructions"

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        raise NotImplementedError(e3nn_api.SCRIPT_MESSAGE)
