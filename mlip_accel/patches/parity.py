"""What the NequIP and MACE parity self-checks share: the error, the relative error, the comparison."""
from __future__ import annotations

import torch


class ParityCheckFailed(RuntimeError):
    """The accelerated model's outputs differed from the original's on the probe; the model was left as it was."""


def relative_error(new: torch.Tensor, old: torch.Tensor) -> float:
    """max |new - old| / max |old| in float64 (the plain difference where ``old`` is all zeros; NaN stays NaN)."""
    new, old = new.detach().double(), old.detach().double()
    if old.numel() == 0:
        return 0.0
    scale = old.abs().max().item()
    diff = (new - old).abs().max().item()
    return diff / scale if scale > 0 else diff


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
