"""MACE adapter (mace-torch 0.3.16): the fused convolution in every interaction block, through MACE's conv_fusion hook.

Each supported interaction block gets ``conv_tp = MACEFusedConv(old conv_tp)`` and a ``conv_fusion``
attribute, the switch MACE's blocks test before calling ``conv_tp(node_feats, edge_attrs, tp_weights,
edge_index)``; nothing else in the model changes. All blocks of one model share one
:class:`~mlip_accel.graph.EdgeSortCache`, so the edges are sorted once per forward pass, not once per layer.
"""
from __future__ import annotations

import torch

from ...errors import NotAcceleratable, ParityCheckFailed
from ...graph import EdgeSortCache
from ...ops.radial_table import check_table_option
from ...problem.e3nn_compat import o3
from ...problem.radial import RadialRefusal
from ..common import check_not_inference, check_options, compare_outputs, reference_on_host, swap_transaction
from ..edge_stream import check_stream_option, report as stream_report
from .. import leaf_swaps
from . import atomic_energies as mace_atomic_energies
from . import displacement as mace_displacement
from . import radial as mace_radial
from . import radial_embedding as mace_radial_embedding
from . import skip as mace_skip
from . import stream as mace_stream
from . import symmetric as mace_symmetric
from . import virials as mace_virials
from .conv import MACEFusedConv, set_harmonics_readers
from .probe import model_device, probe_batch, run_probe, tolerance

CONV_FUSION_TAG = "mlip_accel"

# Interaction blocks of mace-torch 0.3.16 that own a conv_tp and call it through the conv_fusion
# convention (checked at run time too: see _fusion_aware). A subclass may override forward: not trusted.
SUPPORTED_BLOCKS = (
    "RealAgnosticInteractionBlock",
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
    "RealAgnosticAttResidualInteractionBlock",
    "RealAgnosticResidualNonLinearInteractionBlock",
)
# The model classes of mace-torch 0.3.16 tested (tests/test_mace_models.py). Any other model whose
# interaction blocks are all among SUPPORTED_BLOCKS is accelerated too: the blocks call conv_tp, the model
# only calls the blocks, and the parity probe runs the model itself before anything is kept.
SUPPORTED_MODELS = ("MACE", "ScaleShiftMACE", "AtomicDipolesMACE", "EnergyDipolesMACE", "AtomicDielectricMACE")

__all__ = ["claims", "accelerate", "restore", "is_accelerated", "ParityCheckFailed", "SUPPORTED_BLOCKS"]


def _supported_block_classes() -> dict:
    from mace.modules import blocks
    return {getattr(blocks, name): name for name in SUPPORTED_BLOCKS if hasattr(blocks, name)}


def _calculator_class():
    from mace.calculators.mace import MACECalculator
    return MACECalculator


def _fusion_aware(cls) -> bool:
    """Whether this block class's forward tests ``conv_fusion`` (it holds the name as a string constant)."""
    return "conv_fusion" in cls.forward.__code__.co_consts


def _type_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__name__}"


def _from_mace(cls) -> bool:
    return any((c.__module__ or "").split(".")[0] == "mace" for c in cls.__mro__)


def _scripted_mace(obj) -> bool:
    # a TorchScript module (a *_compiled.model file) keeps the name of the class it was scripted from
    return isinstance(obj, torch.jit.ScriptModule) and getattr(obj, "original_name", None) in SUPPORTED_MODELS


def claims(obj) -> bool:
    if isinstance(obj, _calculator_class()) or _scripted_mace(obj):
        return True
    return _from_mace(type(obj)) and hasattr(obj, "interactions")


def is_accelerated(model) -> bool:
    return any(isinstance(getattr(m, "conv_tp", None), MACEFusedConv) for m in model.modules())


# --- validation: everything is refused before anything is changed ---------------------------------

def _enabled(config) -> bool:
    return bool(config is not None and getattr(config, "enabled", False))


def _plan(model) -> list:
    """The interaction blocks to accelerate, or NotAcceleratable saying why this model cannot be."""
    if not isinstance(getattr(model, "interactions", None), torch.nn.ModuleList):
        raise NotAcceleratable(f"{_type_name(model)} has no MACE interaction blocks (a ModuleList "
                               "'interactions'): mlip_accel accelerates MACE models built from them")
    known = _supported_block_classes()
    blocks = [m for m in model.modules() if hasattr(m, "conv_tp")]
    unknown = [b for b in list(model.interactions) + blocks if type(b) not in known]
    if unknown:
        raise NotAcceleratable(
            f"interaction block {_type_name(unknown[0])} is not one mlip_accel knows (it would give wrong "
            f"results, so the model is left unchanged); supported: {', '.join(SUPPORTED_BLOCKS)}")
    e3nn_tp_cls = o3().TensorProduct
    for block in blocks:
        name = known[type(block)]
        if not _fusion_aware(type(block)):
            raise NotAcceleratable(f"{name}.forward of the installed MACE does not use the conv_fusion "
                                   "convention mlip_accel plugs into (mace-torch 0.3.16 does)")
        if isinstance(block.conv_tp, MACEFusedConv):
            continue
        if _enabled(getattr(block, "cueq_config", None)) or _enabled(getattr(block, "oeq_config", None)) \
                or hasattr(block, "conv_fusion") or type(block.conv_tp) is not e3nn_tp_cls:
            raise NotAcceleratable(
                f"{name} has already been converted (conv_tp is {_type_name(block.conv_tp)}, conv_fusion="
                f"{getattr(block, 'conv_fusion', None)!r}): mlip_accel accelerates plain e3nn MACE models. "
                "Convert the model back with mace_cueq_to_e3nn / mace.cli.convert_oeq_e3nn first")
    return blocks


# --- the swap ------------------------------------------------------------------------------------------

def _install(blocks, backend: str, deterministic: bool) -> list:
    """Swap the fused convolution into ``blocks``; returns undo records for :func:`_uninstall`."""
    shared = next((b.conv_tp.graphs for b in blocks if isinstance(b.conv_tp, MACEFusedConv)), None)
    shared = shared or EdgeSortCache()
    undo = []
    for block in blocks:
        conv = block.conv_tp
        if isinstance(conv, MACEFusedConv):  # already accelerated: take the requested settings
            undo.append((block, conv, conv.options))
            conv.set_options(backend=backend, deterministic=bool(deterministic))
            continue
        try:
            fused = MACEFusedConv(conv, shared, backend=backend, deterministic=deterministic)
        except NotImplementedError as err:
            _uninstall(undo)
            raise NotAcceleratable(f"{type(block).__name__}.conv_tp: {err}") from None
        fused.train(conv.training)
        undo.append((block, conv, None))
        block.conv_tp = fused
        block.conv_fusion = CONV_FUSION_TAG
    return undo


def _install_streaming(model, blocks, stream_edges: bool, chunk_edges) -> list:
    """Stream (or unstream) every block, after :func:`_install`; returns the undo callables. A block whose
    radial MLP is refused keeps the unstreamed fused convolution; the reasons are on ``conv_tp.edge_streaming``
    and warned about."""
    undo, decisions = [], []
    names = {id(m): n for n, m in model.named_modules()}
    for block in blocks:
        if stream_edges:
            what, step = mace_stream.stream(block, chunk_edges)
            decisions.append((names.get(id(block), type(block).__name__), what))
        else:
            step = mace_stream.unstream(block)
        undo.append(step)
    refused = [(n, w) for n, w in decisions if isinstance(w, RadialRefusal)]
    if refused:
        import warnings
        warnings.warn("mlip_accel stream_edges: " + stream_report(refused), stacklevel=3)
    return undo


def _uninstall(undo) -> None:
    for block, conv, settings in reversed(undo):
        if settings is None:
            block.conv_tp = conv
            del block.conv_fusion
        else:
            conv.set_options(**settings)


def _plain_outputs(model, blocks, batch):
    """Probe outputs with e3nn's convolution in every block, also when some were accelerated before."""
    swapped = [(b, b.conv_tp) for b in blocks if isinstance(b.conv_tp, MACEFusedConv)]
    radials = [mace_stream.unstream_radial(b) for b in blocks]
    for block, fused in swapped:
        block.conv_tp = fused.e3nn_module
        del block.conv_fusion
    try:
        with mace_symmetric.plain(model), mace_skip.plain(model), mace_radial.plain(model), \
                leaf_swaps.plain(model), mace_radial_embedding.plain(model), \
                mace_atomic_energies.plain(model):
            return reference_on_host(run_probe, model, batch, model_device(model))
    finally:
        for block, fused in swapped:
            block.conv_tp = fused
            block.conv_fusion = CONV_FUSION_TAG
        for step in radials:
            step()


def _probe_plain(model, blocks, batch):
    try:
        return _plain_outputs(model, blocks, batch)
    except Exception as err:
        raise NotAcceleratable(
            f"the parity probe could not run {_type_name(model)} as MACE models are called "
            f"({type(err).__name__}: {err}); the model is left unchanged. mlip_accel.accelerate(model, "
            "check=False) skips the probe: compare the model's outputs with and without it yourself") from err


def _accelerate_models(models, backend: str, deterministic: bool, check: bool, stream_edges: bool = False,
                       stream_chunk_edges=None, radial_table="auto") -> None:
    check_options(deterministic, backend, check)
    check_table_option(radial_table)
    check_stream_option(stream_edges, stream_chunk_edges)
    for model in models:
        check_not_inference(model)
    plans = [(_plan(model), mace_symmetric.plan(model), mace_skip.plan(model)) for model in models]
    with swap_transaction() as undo:
        # process-wide and kept, before the plain probe: its stress call would load the device's LU solver for
        # torch.linalg.det (~0.1 GB held for good; see the module)
        mace_virials.install()
        for model, (blocks, products, skips) in zip(models, plans):
            batch = probe_batch(model) if check else None
            reference = _probe_plain(model, blocks, batch) if check else None
            convs = _install(blocks, backend, deterministic)
            undo.append(lambda convs=convs: _uninstall(convs))
            radials = mace_radial.candidates(model)
            unfolded = mace_radial.unfold(radials)  # e3nn's radial MLPs back while edge streaming decides
            undo.append(lambda unfolded=unfolded: mace_radial.uninstall(unfolded))
            streams = _install_streaming(model, blocks, stream_edges, stream_chunk_edges)
            undo.append(lambda streams=streams: [step() for step in reversed(streams)])
            contractions = mace_symmetric.install(products, backend)
            undo.append(lambda contractions=contractions: mace_symmetric.uninstall(contractions))
            skip_undo = mace_skip.install(skips, backend)
            undo.append(lambda skip_undo=skip_undo: mace_skip.uninstall(skip_undo))
            folded = mace_radial.install(radials, backend, radial_table)  # the blocks not streamed
            undo.append(lambda folded=folded: mace_radial.uninstall(folded))
            leaves = leaf_swaps.replacements(model, backend)  # e3nn's harmonics, Linear, Gate: fewer launches
            leaf_swaps.apply(leaves)
            undo.append(lambda leaves=leaves: leaf_swaps.undo(leaves))
            embedding = mace_radial_embedding.replacements(model, backend)  # Bessel x cutoff: two kernels
            mace_radial_embedding.apply(embedding)
            undo.append(lambda embedding=embedding: mace_radial_embedding.undo(embedding))
            mace_radial_embedding.set_readers(model)  # features not computed where only tables are read
            energies = mace_atomic_energies.replacements(model)  # no cuBLAS call left in a step
            mace_atomic_energies.apply(energies)
            undo.append(lambda energies=energies: mace_atomic_energies.undo(energies))
            set_harmonics_readers(model)  # nor the harmonics where the walks evaluate them
            mace_displacement.install()  # process-wide and kept (see its module); the probe below covers it
            if check:
                e3nn_tps = [b.conv_tp.e3nn_module for b in blocks]
                compare_outputs(reference, run_probe(model, batch), tolerance(model, e3nn_tps),
                                where=type(model).__name__)


def accelerate(obj, deterministic: bool = True, backend: str = "auto", check: bool = True,
               stream_edges: bool = False, stream_chunk_edges: int | None = None, radial_table="auto"):
    """Swap the fused convolution into a MACE model, or into every model of a ``MACECalculator``, in place.

    ``radial_table`` ("auto", True, False): inference (eval mode) reads each block's radial MLP from a table by
    edge length (ops.radial_table: built from the model's weights in float64 and accepted only when as accurate
    as the MLP run in the model's dtype; rebuilt when the weights change; training, parameter gradients and
    second derivatives always run the MLP itself). "auto": on CUDA in float32; True: wherever it is accurate
    enough (float64 never is); False: never.

    ``stream_edges=True`` also streams the radial MLP's last layer into the convolution (per-edge weights
    never stored, :mod:`.stream`; off by default until the fused GPU kernel is measured: docs/edge-streaming.md);
    a block whose radial MLP is not streamable keeps the unstreamed convolution, with a warning saying why.

    ``check=True`` runs a small probe structure through the model before and after and raises
    :class:`ParityCheckFailed` (leaving the model as it was) when energy, forces, stress or node features
    differ beyond the tolerance of the model's dtype. Accelerating twice changes nothing (the second call
    applies its ``backend``/``deterministic``). Returns ``obj``.
    """
    if isinstance(obj, _calculator_class()):
        if getattr(obj, "use_compile", False):
            raise NotAcceleratable("this MACECalculator's models are torch.compile'd; create it with "
                                   "compile_mode=None, then call mlip_accel.accelerate(calc)")
        if getattr(obj, "_uses_accelerated_backend", False):
            raise NotAcceleratable("this MACECalculator was created with enable_cueq/enable_oeq; create it "
                                   "without them to use mlip_accel")
        _accelerate_models(list(obj.models), backend, deterministic, check, stream_edges, stream_chunk_edges,
                           radial_table)
        return obj
    if _scripted_mace(obj):
        raise NotAcceleratable("this MACE model is TorchScript-compiled (a *_compiled.model file); its "
                               "convolution cannot be swapped: load the .model file it was compiled from")
    if not claims(obj):
        raise NotAcceleratable(f"not a MACE model or MACECalculator: {_type_name(obj)}")
    _accelerate_models([obj], backend, deterministic, check, stream_edges, stream_chunk_edges, radial_table)
    return obj


def restore(obj):
    """Undo :func:`accelerate` in place: the original e3nn convolution back in every block. Returns ``obj``."""
    models = list(obj.models) if isinstance(obj, _calculator_class()) else [obj]
    for model in models:
        mace_symmetric.restore(model)
        mace_skip.restore(model)
        mace_radial.restore(model)
        leaf_swaps.restore(model)
        mace_radial_embedding.restore(model)
        mace_atomic_energies.restore(model)
        for block in model.modules():
            mace_stream.unstream_radial(block)
            conv = getattr(block, "conv_tp", None)
            if isinstance(conv, MACEFusedConv):
                block.conv_tp = conv.e3nn_module
                if getattr(block, "conv_fusion", None) == CONV_FUSION_TAG:
                    del block.conv_fusion
    return obj
