"""``mlip_accel.accelerate`` for NequIP (nequip 0.19): models, loaded models, packaged models, calculators.

The swap itself lives in :mod:`.tp_scatter` and is shared with the ``enable_MlipAccel`` model modifier
(:mod:`.modifier`, registered with nequip by :mod:`mlip_accel.integrations.nequip`); this adapter adds what
a one-call API needs: recognising what it was
given (including the foreign classes of a ``nequip-package`` file, matched by name), refusing compiled
models with a reason, and the parity self-check that undoes the swap if results would change.
"""
from __future__ import annotations

import torch

from ...errors import NotAcceleratable
from ...problem.radial import RadialRefusal
from .. import leaf_swaps
from ..common import check_not_inference, check_options, compare_outputs, swap_transaction, tolerance

_COMPILED_HINT = ("Accelerate the eager model instead: load the checkpoint or package with nequip's loaders "
                  "(nequip.model.ModelFromCheckpoint / ModelFromPackage, or NequIPCalculator._from_saved_model) "
                  "and pass that to mlip_accel.accelerate.")


def _from_nequip(obj) -> bool:
    # nequip's own classes, and those of a package file (module "<torch_package_N>.nequip....")
    for cls in type(obj).__mro__:
        module = cls.__module__.split(">.", 1)[-1]
        if module == "nequip" or module.startswith("nequip."):
            return True
    return False


def _is_calculator(obj) -> bool:
    return _from_nequip(obj) and hasattr(obj, "model") and hasattr(obj, "calculate")


def _compiled_kind(obj) -> str | None:
    """'TorchScript' or 'AOTInductor' if ``obj`` (or the model it wraps) is compiled, else None."""
    seen = 0
    while obj is not None and seen < 4:
        if isinstance(obj, torch.jit.ScriptModule):
            return "TorchScript"
        cls = type(obj)
        if "AOTI" in cls.__name__ or cls.__module__.startswith("torch._inductor") or cls.__module__.startswith(
                "torch._C._aoti"):
            return "AOTInductor"
        obj, seen = getattr(obj, "model", None), seen + 1
    return None


def _scripted_nequip(obj) -> bool:
    # a TorchScript module keeps the names of the classes it was scripted from
    return isinstance(obj, torch.jit.ScriptModule) and any(
        getattr(m, "original_name", None) in ("GraphModel", "TensorProductScatter") for m in obj.modules())


def claims(obj) -> bool:
    from .tp_scatter import is_accelerated, is_tensor_product_scatter

    if _from_nequip(obj) or _scripted_nequip(obj):
        return True
    if isinstance(obj, torch.nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
        return any(is_tensor_product_scatter(m) or is_accelerated(m) for m in obj.modules())
    return False


def _refuse_unless_acceleratable(model) -> None:
    from .modifier import check_supported
    from .tp_scatter import is_accelerated, is_tensor_product_scatter

    kind = _compiled_kind(model)
    if kind is not None:
        raise NotAcceleratable(f"this NequIP model is {kind}-compiled: its convolution is frozen inside the "
                               f"compiled artifact and cannot be swapped. {_COMPILED_HINT}")
    if not isinstance(model, torch.nn.Module):
        raise NotAcceleratable(f"expected a NequIP model (torch.nn.Module) or NequIPCalculator, got "
                               f"{type(model).__name__}")
    if is_tensor_product_scatter(model) or is_accelerated(model):
        raise NotAcceleratable("got a single TensorProductScatter: pass the model that contains it, so the "
                               "layer can be replaced inside its parent")
    if not any(is_tensor_product_scatter(m) or is_accelerated(m) for m in model.modules()):
        raise NotAcceleratable(
            f"this {type(model).__name__} contains no NequIP TensorProductScatter, the convolution mlip_accel "
            "replaces (NequIP GNN models have one per interaction block; other architectures, e.g. Allegro, "
            "are not supported)")
    try:
        check_supported(model)
    except RuntimeError as err:
        raise NotAcceleratable(str(err)) from None


def accelerate(obj, deterministic: bool = True, backend: str = "auto", check: bool = True,
               stream_edges: bool = False, stream_chunk_edges: int | None = None, radial_table="auto"):
    """Swap mlip_accel's fused convolution into a NequIP model or ``NequIPCalculator``, in place.

    ``stream_edges=True`` also streams each interaction block's radial MLP (``edge_mlp``) into its
    convolution: the per-edge weights are made per chunk of ``stream_chunk_edges`` edges, never stored
    (:mod:`.stream`; off by default until the fused GPU kernel is measured: docs/edge-streaming.md). A block
    whose MLP is not streamable keeps the unstreamed convolution, with a warning saying why.

    ``radial_table`` ("auto", True, False): inference (eval mode) reads each block's ``edge_mlp`` from a table by
    normalised edge length (:mod:`.radial_table`, ops.radial_table: built from the weights in float64, accepted only
    when as accurate as the MLP run in the model's dtype, rebuilt when the weights change; training, parameter
    gradients and second derivatives run the MLP itself). "auto": on CUDA in float32; True: wherever it is
    accurate enough (float64 never is); False: never.

    Returns ``obj`` itself. ``check=True`` compares the model before and after on a probe (see
    :mod:`mlip_accel.patches.nequip.probe`) and, on a mismatch, restores the original layers and
    raises ``ParityCheckFailed``. Applying it again is a no-op; with other options the accelerated layers
    are rebuilt with them (and checked again).
    """
    from . import probe
    from ..edge_stream import check_stream_option, report
    from . import radial_table as tables
    from .stream import is_streamed, plan_streaming
    from .tp_scatter import apply, is_accelerated, plan_swaps, undo

    check_options(deterministic, backend, check)
    check_stream_option(stream_edges, stream_chunk_edges)
    tables.check_table_option(radial_table)
    model = obj.model if _is_calculator(obj) else obj
    check_not_inference(model)
    _refuse_unless_acceleratable(model)

    swaps = plan_swaps(model, deterministic=deterministic, backend=backend)
    swaps, decisions = plan_streaming(model, swaps, stream_edges, stream_chunk_edges)
    swaps += leaf_swaps.replacements(model, backend)  # e3nn's harmonics, Linear, Gate: fewer launches
    swaps += tables.replacements(model, swaps, radial_table, backend)
    refused = [(n, w) for n, w in decisions if isinstance(w, RadialRefusal)]
    if refused:
        import warnings
        warnings.warn("mlip_accel stream_edges: " + report(refused), stacklevel=2)
    if not (check and swaps):
        apply(swaps)
        return obj
    # reference outputs first, while the model is still as it was
    references = [(m, probe.probe_structure(m)) for m in model.modules() if probe.is_graph_model(m)]
    references = [(m, data, probe.evaluate(m, data)) for m, data in references]
    names = {id(m): name for name, m in model.named_modules()}
    with swap_transaction() as steps:
        steps.append(lambda: undo(swaps))
        apply(swaps)
        for s in swaps:
            if is_accelerated(s.new) and not is_streamed(s.new):  # streamed layers: the model probe below
                probe.check_layer(s.new, where=".".join(filter(None, (names[id(s.parent)], s.name))))
        for m, data, before in references:
            compare_outputs(before, probe.evaluate(m, data), tolerance(m.model_dtype), where=type(m).__name__)
    return obj
