"""e3nn's equivariant ``Linear`` (``o3.Linear``) as plain data: the input and output blocks and the weighted
instructions between them.

Per instruction ``(i_in -> i_out)`` with weight ``w`` (``[mul_in, mul_out]``, a slice of the module's flat
``weight`` parameter) and e3nn's ``path_weight`` (its normalisation):
``out[n, i_out][w, i] += path_weight * sum_u w[u, w] * x[n, i_in][u, i]`` (blocks in e3nn's ``mul_ir`` layout),
outputs without instructions are zeros. Biases, ``f_in``/``f_out`` and external weights are not described:
:func:`unsupported_reason` says so and the adapters keep e3nn's module for those.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LinearInstruction:
    i_in: int
    i_out: int
    mul_in: int
    mul_out: int
    path_weight: float
    offset: int  # of this instruction's [mul_in, mul_out] weights in the flat weight vector


@dataclasses.dataclass(frozen=True)
class LinearProblem:
    blocks_in: tuple[tuple[int, int], ...]  # (mul, ir dim) per input irrep, in order
    blocks_out: tuple[tuple[int, int], ...]
    instructions: tuple[LinearInstruction, ...]

    def __post_init__(self):
        for ins in self.instructions:
            if self.blocks_in[ins.i_in] != (ins.mul_in, self.blocks_in[ins.i_in][1]) or \
                    self.blocks_out[ins.i_out] != (ins.mul_out, self.blocks_out[ins.i_out][1]):
                raise ValueError(f"instruction {ins} does not match the blocks' multiplicities")
            if self.blocks_in[ins.i_in][1] != self.blocks_out[ins.i_out][1]:
                raise ValueError(f"instruction {ins} joins irreps of different dimensions")

    @property
    def dims_in(self) -> tuple[int, ...]:
        return tuple(m * d for m, d in self.blocks_in)

    @property
    def dims_out(self) -> tuple[int, ...]:
        return tuple(m * d for m, d in self.blocks_out)

    @property
    def weight_numel(self) -> int:
        return sum(i.mul_in * i.mul_out for i in self.instructions)


def from_e3nn(module) -> LinearProblem:
    """The problem of e3nn's ``Linear`` module (raises ValueError if :func:`unsupported_reason` is not None)."""
    reason = unsupported_reason(module)
    if reason is not None:
        raise ValueError(reason)
    offset, instructions = 0, []
    for ins in module.instructions:
        mul_in, mul_out = ins.path_shape
        if mul_in and mul_out:  # e3nn generates no code (and holds no weights) for empty instructions
            instructions.append(LinearInstruction(ins.i_in, ins.i_out, mul_in, mul_out, float(ins.path_weight), offset))
            offset += mul_in * mul_out
    return LinearProblem(tuple((mul, ir.dim) for mul, ir in module.irreps_in),
                         tuple((mul, ir.dim) for mul, ir in module.irreps_out), tuple(instructions))


def unsupported_reason(module) -> str | None:
    """None when :class:`LinearProblem` describes e3nn's ``Linear`` ``module``, else why not."""
    if getattr(module, "f_in", None) is not None or getattr(module, "f_out", None) is not None:
        return "f_in/f_out (batched channels) are not described"
    if not (getattr(module, "internal_weights", False) and getattr(module, "shared_weights", False)):
        return "weights given at call time (internal_weights/shared_weights off)"
    if getattr(module, "bias_numel", 0):
        return "biases are not described"
    if any(ins.i_in == -1 for ins in module.instructions):
        return "bias instructions are not described"
    import torch

    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
        return "its weight is not a flat parameter"
    if sum(a * b for a, b in (ins.path_shape for ins in module.instructions)) != weight.numel():
        return "its weight does not hold the instructions' weights"
    return None
