"""``mlip_accel.describe(obj)``: which implementation runs each convolution (and each MACE symmetric
contraction) of a model, on which device and dtype, and why a fallback happened.

Works on a plain or accelerated NequIP/MACE model, a standalone TensorProduct(Conv), and the calculators
holding them (AcceleratedCalculator, NequIPCalculator, MACECalculator). It only reads the model: nothing
is imported from NequIP or MACE (their classes are matched by name), and CuPy only when the model is on a
CUDA device (to say whether the kernels can run there).
"""
from __future__ import annotations

import dataclasses

import torch

from ..ops import backends


@dataclasses.dataclass(frozen=True)
class Layer:
    """One convolution, tensor product or MACE symmetric contraction of the model."""

    name: str  # module path in the model ("" for the object itself)
    kind: str  # what it is in its framework, e.g. "NequIP TensorProductScatter"
    implementation: str  # "mlip_accel cuda", "mlip_accel reference", "e3nn (not accelerated)", ...
    requested: str | None  # the backend asked for (mlip_accel layers): "auto", "cuda" or "reference"
    deterministic: bool | None
    reason: str | None  # why this implementation and not the fused CUDA kernels
    # accelerate(..., stream_edges=True): "streamed: <radial network>" or "not streamed: <why>"; None if not asked
    edge_streaming: str | None = None

    @property
    def backend(self) -> str:
        """"cuda", "reference", "unavailable" (the asked-for backend cannot run here) or "e3nn"/other."""
        return self.implementation.split(" ", 1)[1] if self.implementation.startswith("mlip_accel ") else "e3nn"


@dataclasses.dataclass(frozen=True)
class Description:
    """What :func:`describe` found; ``str()`` (and the REPL) shows it as a short report."""

    target: str
    device: str
    dtype: str
    layers: tuple
    cuda: str  # "available", or the reason the CUDA kernels cannot run in this process
    # the smaller e3nn / framework modules accelerate() swapped beside the layers, e.g. "1 SphericalHarmonics (kernels),
    # 9 Linear, 2 Gate" (patches.leaf_swaps, MACE's radial embedding); "" when none
    modules: str = ""
    # the radial MLPs that may read a table by edge length (ops.radial_table): the option and each table's state,
    # e.g. "2 radial MLP(s), radial_table='auto': 2 with 1024 intervals x 512 outputs ..."; "" when none
    radial_tables: str = ""

    @property
    def accelerated(self) -> bool:
        return any(layer.implementation.startswith("mlip_accel") for layer in self.layers)

    @property
    def backends(self) -> tuple:
        """The distinct backends of the layers, e.g. ("cuda",) or ("reference",) or ("e3nn",)."""
        return tuple(dict.fromkeys(layer.backend for layer in self.layers))

    def __str__(self) -> str:
        swapped = sum(layer.implementation.startswith("mlip_accel") for layer in self.layers)
        lines = [self.target,
                 f"  device  : {self.device}",
                 f"  dtype   : {self.dtype}",
                 f"  layers  : {len(self.layers)} layer(s) mlip_accel can run, {swapped} run by mlip_accel"]
        for layer in self.layers:
            options = []
            if layer.requested is not None:
                options.append(f"backend={layer.requested!r}")
            if layer.deterministic is not None:
                options.append("deterministic" if layer.deterministic else "atomic (non-deterministic)")
            text = f"    {layer.name or '<this module>'} ({layer.kind}): {layer.implementation}"
            if options:
                text += f" [{', '.join(options)}]"
            if layer.reason:
                text += f" - {layer.reason}"
            if layer.edge_streaming:
                text += f"; radial MLP {layer.edge_streaming}"
            lines.append(text)
        if not self.layers:
            lines.append("    (no layer that mlip_accel knows: nothing to accelerate)")
        if self.modules:
            lines.append(f"  modules : e3nn/framework modules swapped for mlip_accel's: {self.modules}")
        if self.radial_tables:
            lines.append(f"  radial  : {self.radial_tables}")
        lines.append(f"  CUDA    : {self.cuda}")
        return "\n".join(lines)

    __repr__ = __str__


def _models(obj):
    """(header, [modules], device or None) for a model or a calculator."""
    potential = getattr(obj, "potential", None)
    if potential is not None and isinstance(getattr(potential, "model", None), torch.nn.Module):
        return potential.describe(), [potential.model], potential.device  # AcceleratedCalculator
    if isinstance(obj, torch.nn.Module):
        return f"{type(obj).__module__}.{type(obj).__name__}", [obj], None
    models = getattr(obj, "models", None)  # MACECalculator
    if isinstance(models, (list, tuple)) and models and all(isinstance(m, torch.nn.Module) for m in models):
        return f"{type(obj).__name__} holding {len(models)} model(s)", list(models), None
    model = getattr(obj, "model", None)  # NequIPCalculator
    if isinstance(model, torch.nn.Module):
        return f"{type(obj).__name__} holding a {type(model).__name__}", [model], None
    raise TypeError(f"mlip_accel.describe takes a NequIP or MACE model (plain or accelerated), a TensorProduct(Conv) "
                    f"or a calculator holding one, got {type(obj).__module__}.{type(obj).__name__}")


def _device_and_dtype(modules):
    for module in modules:
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                return tensor.device, tensor.dtype
    return None, None


def _implementation(requested: str, device) -> tuple[str, str | None]:
    """(implementation, reason) of an mlip_accel layer asked for ``requested`` with tensors on ``device``."""
    if requested == "reference":
        return "mlip_accel reference", "backend='reference' was asked for"
    if device is None:
        return "mlip_accel auto", "no parameters to tell the device: cuda on CUDA tensors when the kernels can run"
    if device.type != "cuda":
        if requested == "cuda":
            return "mlip_accel unavailable", f"backend='cuda' needs CUDA tensors but the model is on {device}"
        return "mlip_accel reference", f"the model is on {device}; the CUDA kernels need CUDA tensors"
    reason = backends.cuda_unavailable_reason()
    if reason is None:
        return "mlip_accel cuda", None
    if requested == "cuda":
        return "mlip_accel unavailable", f"backend='cuda' cannot run: {reason}"
    return "mlip_accel reference", f"fallback from the CUDA kernels: {reason}"


def _kind(wrapper) -> str:
    names = [c.__name__ for c in type(wrapper).__mro__]  # the edge-streamed wrappers subclass these
    if "MlipAccelTensorProductScatter" in names:
        return "NequIP TensorProductScatter"
    if "MACEFusedConv" in names:
        return "MACE conv_tp"
    return names[0]


def _edge_streaming(wrapper) -> str | None:
    """How the adapters' stream_edges option left this wrapper (patches/edge_stream.py), None if not asked."""
    radial = getattr(wrapper, "_radial", None)
    if radial:
        return f"streamed into the convolution: {radial[0].description.describe()}"
    refusal = getattr(wrapper, "edge_streaming", None)
    return f"not streamed ({refusal.reason})" if refusal is not None else None


def _plain_kind(name: str, module) -> str | None:
    """What a convolution mlip_accel did not swap is, or None when ``module`` is not one."""
    cls = type(module)
    if cls.__name__ == "TensorProductScatter":  # nequip's, or the copy inside a nequip-package file
        return "NequIP TensorProductScatter"
    if name.rsplit(".", 1)[-1] == "conv_tp":
        return "MACE conv_tp"
    return None


def _layers(modules, device) -> list:
    from ..modules import TensorProduct, TensorProductConv
    from ..modules.symmetric_contraction import SymmetricContraction

    ours = (TensorProduct, TensorProductConv)
    layers, inside = [], set()
    for index, root in enumerate(modules):
        prefix = f"models[{index}]." if len(modules) > 1 else ""
        for name, module in root.named_modules():
            if id(module) in inside:
                continue
            conv = getattr(module, "conv", None)
            contraction = getattr(module, "contraction", None)
            if isinstance(contraction, SymmetricContraction):  # our MACE product-basis swap
                layers.append(_accelerated_layer(prefix + name, "MACE symmetric contraction", contraction, device))
            elif type(module).__name__ == "SymmetricContraction" and type(module).__module__.startswith("mace"):
                layers.append(Layer(prefix + name, "MACE symmetric contraction", "MACE's own (not accelerated)",
                                    None, None, None))
            elif isinstance(conv, ours) and not isinstance(module, ours):  # our wrapper of a framework layer
                inside.add(id(conv))
                layer = _accelerated_layer(prefix + name, _kind(module), conv, device)
                layers.append(dataclasses.replace(layer, edge_streaming=_edge_streaming(module)))
            elif isinstance(module, ours):
                layers.append(_accelerated_layer(prefix + name, type(module).__name__, module, device))
            else:
                kind = _plain_kind(name, module)
                if kind is not None:
                    implementation = "e3nn (not accelerated)" if type(module).__module__.startswith(
                        ("e3nn", "nequip")) or ">." in type(module).__module__ else \
                        f"{type(module).__module__}.{type(module).__name__} (not mlip_accel)"
                    layers.append(Layer(prefix + name, kind, implementation, None, None, None))
    return layers


# MACE's own modules swapped by its adapter, by the class of the replacement (patches.mace.*)
_MACE_SWAPS = {"FusedRadialEmbedding": "RadialEmbeddingBlock", "AtomicEnergiesSum": "AtomicEnergiesBlock"}


def _swapped_modules(modules) -> str:
    """The leaf swaps found in ``modules``, by the class they replaced, e.g. "1 SphericalHarmonics, 9 Linear"."""
    from ..modules.gate import GateLayer
    from ..modules.linear import IrrepsLinear
    from ..modules.spherical_harmonics import SphericalHarmonics

    kinds = ((SphericalHarmonics, "SphericalHarmonics"), (IrrepsLinear, "Linear"), (GateLayer, "Gate"))
    counts: dict = {}
    for root in modules:
        for module in root.modules():
            name = next((n for cls, n in kinds if isinstance(module, cls)), None)
            if name is None:
                name = _MACE_SWAPS.get(type(module).__name__)
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
    order = ("SphericalHarmonics", "RadialEmbeddingBlock", "Linear", "Gate", "AtomicEnergiesBlock")
    return ", ".join(f"{counts[name]} {name}" for name in order if name in counts)


def _radial_tables(modules) -> str:
    """The radial MLPs that may read a table by edge length, their ``radial_table`` option and each one's state."""
    from ..ops.radial_table import RadialTable, TableCache

    options, states = {}, {}
    for root in modules:
        for module in root.modules():
            if not isinstance(module.__dict__.get("tables"), TableCache):
                continue
            options[repr(module.table)] = None
            entry = module.tables.entry
            if module.table is False:
                state = "off"
            elif entry is None:
                state = "no table yet (built at the first call that reads one: inference on CUDA in float32 under 'auto')"
            elif isinstance(entry, RadialTable):
                state = f"table of {entry.describe()}"
            else:
                state = f"refused, the MLP runs: {entry}"
            states[state] = states.get(state, 0) + 1
    if not states:
        return ""
    count = sum(states.values())
    text = (f"{count} radial MLP(s), radial_table={'/'.join(options)}: "
            + "; ".join(f"{n} {state}" for state, n in states.items()))
    from ..patches.harmonics import AcceleratedSphericalHarmonics
    from ..patches.mace.radial_embedding import FusedRadialEmbedding

    def lazy(cls) -> bool:  # a module of ``cls`` that leaves its output to the tables' readers
        return options.keys() != {"False"} and any(isinstance(m, cls) and m.readers
                                                   for root in modules for m in root.modules())
    if lazy(FusedRadialEmbedding):
        text += "; the radial features are not computed in the calls where every block reads its table"
    if lazy(AcceleratedSphericalHarmonics):
        text += ("; the edge harmonics are evaluated inside the convolutions' walks in the inference calls on CUDA "
                 "whose blocks read their tables")
    return text


def _accelerated_layer(name, kind, conv, device) -> Layer:
    implementation, reason = _implementation(conv.backend, device)
    return Layer(name, kind, implementation, conv.backend, getattr(conv, "deterministic", None), reason)


def describe(obj) -> Description:
    """Which implementation runs each convolution of ``obj`` (a model, an accelerated model, or a calculator).

    ``print(mlip_accel.describe(model))`` shows the device, dtype, every convolution layer with its
    backend ("mlip_accel cuda", "mlip_accel reference", "e3nn (not accelerated)") and why the fused
    CUDA kernels do not run where they do not; the returned :class:`Description` has the same as fields.
    """
    header, modules, device = _models(obj)
    found_device, dtype = _device_and_dtype(modules)
    device = device if device is not None else found_device
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    cuda = backends.cuda_unavailable_reason()  # imports CuPy only where torch sees a CUDA device
    return Description(target=header, device=str(device) if device is not None else "unknown (no parameters)",
                       dtype=str(dtype).removeprefix("torch.") if dtype is not None else "unknown (no parameters)",
                       layers=tuple(_layers(modules, device)), cuda="available" if cuda is None else cuda,
                       modules=_swapped_modules(modules), radial_tables=_radial_tables(modules))


__all__ = ["describe", "Description", "Layer"]
