"""What e3nn's ``o3.TensorProduct`` offers besides ``forward``, for :class:`~mlip_accel.TensorProduct`.

e3nn accepts inputs of any batch shape (``(..., dim)``: unbatched 1-D inputs, leading dimensions that
broadcast against each other and against per-sample weights) and weights as one flat tensor or as a list
of per-instruction tensors; the custom ops take 2-D ``(rows, dim)`` operands. :func:`flatten_batch`
turns the first into the second (and says clearly what does not fit), the module reshapes the result back.
"""
from __future__ import annotations

import math

import torch

from ..problem import TPProblem, irreps_str


def e3nn_instruction_class():
    """e3nn's ``Instruction`` named tuple (the same fields in e3nn 0.4.4 to 0.6)."""
    from ..problem.e3nn_compat import o3

    o3()
    from e3nn.o3._tensor_product._instruction import Instruction
    return Instruction


def instructions(problem: TPProblem) -> list:
    """The problem's paths as e3nn ``Instruction`` tuples, as ``e3nn_tp.instructions`` lists them."""
    Instruction = e3nn_instruction_class()
    return [Instruction(p.i_in1, p.i_in2, p.i_out, p.mode, p.has_weight, p.path_weight, tuple(p.weight_shape))
            for p in problem.paths]


def join_weights(problem: TPProblem, weight):
    """e3nn also takes the weights as a list of per-instruction tensors (``weight_shape`` each, with the
    batch dimensions in front unless shared): concatenated here into its flat layout."""
    if not isinstance(weight, (list, tuple)):
        return weight
    shapes = [p.weight_shape for p in problem.paths if p.has_weight]
    if len(weight) != len(shapes):
        raise ValueError(f"weight was given as a list of {len(weight)} tensors, but {len(shapes)} instructions "
                         "have weights")
    flat = []
    for n, (w, shape) in enumerate(zip(weight, shapes)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"weight[{n}] must be a torch.Tensor, got {type(w).__name__}")
        numel = math.prod(shape)
        flat.append(w.reshape(numel) if problem.shared_weights else w.reshape(*w.shape[:w.dim() - len(shape)], numel))
    return torch.cat(flat, dim=-1)


def _check_operand(name: str, t, dim: int, width: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() == 0 or t.shape[-1] != dim:
        raise ValueError(f"{name} must have shape (..., {dim}) for {width}, got {tuple(t.shape)}")


def flatten_batch(problem: TPProblem, x, y, w, *, check: bool = True):
    """``(x, y, w, batch_shape)`` with x, y (and per-sample w) broadcast and flattened to 2-D rows.

    ``x`` is ``(..., dim_in1)``, ``y`` ``(..., dim_in2)``, ``w`` ``(weight_numel,)`` when shared, else
    ``(..., weight_numel)``; the leading dimensions broadcast as in e3nn. Inputs that are already 2-D with
    equal rows pass through unchanged (no copy).
    """
    per_sample = not problem.shared_weights and problem.weight_numel > 0
    if check:
        _check_operand("x", x, problem.dim_in1, f"irreps_in1={irreps_str(problem.irreps_in1)}")
        _check_operand("y", y, problem.dim_in2, f"irreps_in2={irreps_str(problem.irreps_in2)}")
        if problem.weight_numel > 0:
            if problem.shared_weights:
                if not isinstance(w, torch.Tensor) or tuple(w.shape) != (problem.weight_numel,):
                    shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                    raise ValueError(f"weight must have shape ({problem.weight_numel},) (shared weights), got {shape}")
            else:
                _check_operand("weight", w, problem.weight_numel, f"weight_numel={problem.weight_numel} "
                               "(per-sample weights)")
    shapes = [x.shape[:-1], y.shape[:-1]] + ([w.shape[:-1]] if per_sample else [])
    if x.dim() == 2 and all(len(s) == 1 and s[0] == x.shape[0] for s in shapes):
        batch = x.shape[:-1]
    else:
        try:
            batch = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            names = ["x", "y"] + (["weight"] if per_sample else [])
            raise ValueError("the batch dimensions of " + ", ".join(
                f"{n} {tuple(s)}" for n, s in zip(names, shapes)) + " do not broadcast") from None
        rows = math.prod(batch)
        x = x.expand(*batch, x.shape[-1]).reshape(rows, x.shape[-1])
        y = y.expand(*batch, y.shape[-1]).reshape(rows, y.shape[-1])
        if per_sample:
            w = w.expand(*batch, w.shape[-1]).reshape(rows, w.shape[-1])
    if problem.weight_numel == 0:
        w = x.new_zeros(0 if problem.shared_weights else (x.shape[0], 0))
    return x, y, w, batch


def runs_on_reference_only(problem: TPProblem, rows: int) -> bool:
    """Degenerate problems (no paths, an empty irreps, no rows) have nothing for a kernel to do."""
    return rows == 0 or len(problem.paths) == 0 or 0 in (problem.dim_in1, problem.dim_in2, problem.dim_out)


def weight_views(problem: TPProblem, weight: torch.Tensor, yield_instruction: bool = False):
    batch = weight.shape[:-1]
    for n, (ins, path) in enumerate(zip(instructions(problem), problem.paths)):
        if path.has_weight:
            view = weight.narrow(-1, path.weight_offset, path.weight_numel).view(*batch, *path.weight_shape)
            yield (n, ins, view) if yield_instruction else view


SCRIPT_MESSAGE = ("mlip_accel's tensor products do not support TorchScript (torch.jit.script): their kernels are "
                  "torch.library custom ops chosen at run time. Use torch.compile instead (or run in eager "
                  "mode); to write a TorchScript file, script the model as it was before mlip_accel.accelerate.")


def share_weight_and_buffers(module, original) -> tuple:
    """``original``'s ``weight`` parameter and its own buffers registered on ``module`` (the same tensors: one
    state, the same ``state_dict`` keys); returns their names, for :func:`original_sharing`."""
    module.weight = original.weight
    names = ["weight"]
    for name, buffer in original.named_buffers(recurse=False):
        module.register_buffer(name, buffer)
        names.append(name)
    return tuple(names)


def original_sharing(module, names) -> "torch.nn.Module":
    """``module._original[0]``, the e3nn / MACE module ``module`` stands in for, with its parameters and buffers
    ``names`` (registered on ``module`` from it: the same tensors at construction) set again from ``module``'s.
    The original lives outside the module tree, and ``model.to()`` / ``.double()`` replace buffers, and
    ``load_state_dict(assign=True)`` parameters too, in the tree only: the parity probe, ``plain()`` and
    ``restore()`` would otherwise run the original with tensors of the old device, dtype or values."""
    original = module._original[0]
    for name in names:
        if name in module._parameters:
            original._parameters[name] = module._parameters[name]
        elif name in module._buffers:
            original._buffers[name] = module._buffers[name]
    return original


class ReadsLikeOriginal:
    """Mixin for a module standing in for an e3nn module held as ``self._original = (module,)``: attributes it does
    not have are read from the e3nn module (frameworks read e3nn internals: MACE's model-config export reads
    ``spherical_harmonics._lmax``), so it is a drop-in for readers too."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original")
            if original is None or name.startswith("__"):
                raise
            return getattr(original[0], name)
