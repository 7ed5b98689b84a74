"""The fused convolutions the kernel benchmark compares, each built the way its users build it.

Every implementation computes ``out[n] = sum_{e: dst[e] = n} TP(x[src[e]], y[e], w[e])`` for one
channelwise problem of problems.json. :func:`build` returns a :class:`Prepared`: a call taking inputs in
the implementation's own layout, and the index maps that move e3nn-layout tensors into it (for the
correctness check; the timed calls get inputs already laid out, as a model that uses the library
throughout would hold them).

ids and how each is built:
- ``mlip_accel-det`` / ``mlip_accel-atomic``: ``mlip_accel.TensorProductConv.from_e3nn(tp, backend=...,
  deterministic=...)``; the CSR sort (det) is made once outside the timed call, as models do per step;
- ``e3nn``: e3nn's TensorProduct on gathered ``x[src]``, then ``index_add`` over ``dst``;
- ``cueq-uniform_1d``: MACE 0.3.16's conv fusion (mace/modules/wrapper_ops.py): ``cuet.SegmentedPolynomial(
  channelwise_tensor_product(...).flatten_coefficient_modes().squeeze_modes().polynomial,
  method="uniform_1d")`` on ir_mul features, with the O3_e3nn group MACE uses;
- ``cueq-fused_tp``: NequIP 0.19's ``CuEquivarianceTensorProductScatter`` itself (method="fused_tp", with
  the two layout transposes NequIP runs around it); needs nequip importable;
- ``oeq-det`` / ``oeq-atomic``: ``openequivariance.TensorProductConv(TPProblem(...), deterministic=...)``.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Callable

import torch

from mlip_accel.problem.e3nn_compat import default_dtype

IMPLS = ("mlip_accel-det", "mlip_accel-atomic", "e3nn", "cueq-uniform_1d", "cueq-fused_tp", "oeq-det", "oeq-atomic")
PEERS = tuple(i for i in IMPLS if not i.startswith("mlip_accel"))
LABELS = {"mlip_accel-det": "mlip_accel det", "mlip_accel-atomic": "mlip_accel atomic", "e3nn": "e3nn",
          "cueq-uniform_1d": "cuEq uniform_1d (MACE)", "cueq-fused_tp": "cuEq fused_tp (NequIP)",
          "oeq-det": "OEQ det", "oeq-atomic": "OEQ atomic"}


class Unavailable(Exception):
    """This implementation cannot run here (package missing, ...); the message says why."""


@dataclasses.dataclass
class ConvSpec:
    """One benchmark problem on one graph, in e3nn's terms."""

    name: str
    irreps_in1: str
    irreps_in2: str
    irreps_out: str  # MACE's irreps_mid / NequIP's irreps_mid: sorted, not simplified
    instructions: list  # (i_in1, i_in2, i_out, "uvu", True)
    edge_dst: torch.Tensor  # sorted by (dst, src)
    edge_src: torch.Tensor
    num_nodes: int

    @classmethod
    def from_problem(cls, problem: dict, edge_dst, edge_src, num_nodes: int) -> "ConvSpec":
        from mlip_accel.problem import channelwise_problem

        in1, out, ins = channelwise_problem(problem["in1"], problem["in2"], problem["target"])
        in2 = str(_o3().Irreps(problem["in2"]))
        return cls(problem["name"], in1, in2, out, ins, edge_dst, edge_src, num_nodes)


@dataclasses.dataclass
class Prepared:
    impl: str
    call: Callable  # (x, y, w) in native layout -> out in native layout
    note: str = ""
    # native column c holds e3nn column perm[c]; None: same layout as e3nn
    x_perm: torch.Tensor | None = None
    w_perm: torch.Tensor | None = None
    out_perm: torch.Tensor | None = None
    keep: object = None  # the module(s), alive as long as the call

    @staticmethod
    def _to_native(t, perm):
        return t if perm is None else t[:, perm].contiguous()

    @staticmethod
    def _to_e3nn(t, perm):
        if perm is None:
            return t
        out = torch.empty_like(t)
        out[:, perm] = t
        return out

    def inputs_from_e3nn(self, x, y, w):
        return self._to_native(x, self.x_perm), y, self._to_native(w, self.w_perm)

    def grad_out_from_e3nn(self, gz):
        return self._to_native(gz, self.out_perm)

    def out_to_e3nn(self, out):
        return self._to_e3nn(out, self.out_perm)

    def grads_to_e3nn(self, gx, gy, gw):  # a permutation moves gradients as it moves values
        return self._to_e3nn(gx, self.x_perm), gy, self._to_e3nn(gw, self.w_perm)


def _o3():
    from mlip_accel.problem.e3nn_compat import o3
    return o3()




def e3nn_tp(spec: ConvSpec, dtype, device=None):
    device = spec.edge_dst.device if device is None else device
    with default_dtype(dtype):
        tp = _o3().TensorProduct(spec.irreps_in1, spec.irreps_in2, spec.irreps_out, spec.instructions,
                                 shared_weights=False, internal_weights=False)
    return tp.to(device=device, dtype=dtype)


def ir_mul_perm(irreps: str, device) -> torch.Tensor:
    """Index map from e3nn's mul_ir layout to cuEquivariance's ir_mul layout (per irrep block)."""
    idx, offset = [], 0
    for mul, ir in _o3().Irreps(irreps):
        d = ir.dim
        idx += [offset + u * d + i for i in range(d) for u in range(mul)]
        offset += mul * d
    return torch.tensor(idx, dtype=torch.long, device=device)


def _require(module: str, why: str = ""):
    if importlib.util.find_spec(module) is None:
        raise Unavailable(f"{module} is not installed{why}")
    return importlib.import_module(module)


# -- builders ---------------------------------------------------------------------------------------

def _build_e3nn(spec: ConvSpec, dtype, graph_cache) -> Prepared:
    tp = e3nn_tp(spec, dtype)
    dst, src, n = spec.edge_dst, spec.edge_src, spec.num_nodes
    dim_out = tp.irreps_out.dim

    def call(x, y, w):
        return x.new_zeros(n, dim_out).index_add(0, dst, tp(x[src], y, w))

    return Prepared("e3nn", call, keep=tp)


def _build_mlip_accel(spec: ConvSpec, dtype, graph_cache, deterministic: bool) -> Prepared:
    import mlip_accel
    from mlip_accel.ops import backends

    reason = mlip_accel.cuda_unavailable_reason()
    requested = "cuda" if reason is None else "auto"
    conv = mlip_accel.TensorProductConv.from_e3nn(e3nn_tp(spec, dtype), backend=requested,
                                                  deterministic=deterministic)
    resolved = backends.resolve(requested, spec.edge_dst.device)
    note = f"backend={resolved}" + ("" if reason is None else f" (cuda unavailable: {reason})")
    dst, src, n = spec.edge_dst, spec.edge_src, spec.num_nodes
    graph = None
    if deterministic:
        if "mlip_accel" not in graph_cache:  # sorted once per structure, shared by every layer
            graph_cache["mlip_accel"] = mlip_accel.sort_edges(dst, src, n)
        graph = graph_cache["mlip_accel"]

    def call(x, y, w):
        return conv(x, y, w, dst, src, graph)

    impl = "mlip_accel-det" if deterministic else "mlip_accel-atomic"
    return Prepared(impl, call, note=note, keep=conv)


def _cue_irreps(cue, irreps: str):
    from cuequivariance.group_theory.experimental.e3nn import O3_e3nn
    return cue.Irreps(O3_e3nn, irreps)


def _require_cuda(spec: ConvSpec, what: str):
    if spec.edge_dst.device.type != "cuda":
        raise Unavailable(f"{what} runs on CUDA tensors only")


def _build_cueq_uniform_1d(spec: ConvSpec, dtype, graph_cache) -> Prepared:
    _require_cuda(spec, "cuEquivariance")
    cue = _require("cuequivariance")
    cuet = _require("cuequivariance_torch")
    _require("cuequivariance_ops_torch", " (the compiled cuEquivariance ops)")
    poly = cue.descriptors.channelwise_tensor_product(
        _cue_irreps(cue, spec.irreps_in1), _cue_irreps(cue, spec.irreps_in2), _cue_irreps(cue, spec.irreps_out),
    ).flatten_coefficient_modes().squeeze_modes().polynomial
    dst, src = spec.edge_dst, spec.edge_src
    module = cuet.SegmentedPolynomial(poly, math_dtype=dtype, method="uniform_1d").to(dst.device)

    def call(x, y, w):
        return module([w, x, y], {1: src}, {0: x}, {0: dst})[0]

    # channelwise_tensor_product orders its weight segments like its sorted outputs: the weights of the
    # path writing output block k come k-th (e3nn keeps instruction order).
    from mlip_accel.problem import describe
    problem = describe(spec.irreps_in1, spec.irreps_in2, spec.irreps_out, spec.instructions)
    w_perm = torch.cat([torch.arange(p.weight_offset, p.weight_offset + p.weight_numel)
                        for p in sorted(problem.paths, key=lambda p: p.i_out)]).to(dst.device)
    return Prepared("cueq-uniform_1d", call, note="ir_mul features", keep=module, w_perm=w_perm,
                    x_perm=ir_mul_perm(spec.irreps_in1, dst.device), out_perm=ir_mul_perm(spec.irreps_out, dst.device))


def _build_cueq_fused_tp(spec: ConvSpec, dtype, graph_cache) -> Prepared:
    _require_cuda(spec, "cuEquivariance")
    _require("cuequivariance")
    _require("cuequivariance_ops_torch", " (the compiled cuEquivariance ops)")
    _require("nequip", " (this variant is NequIP's own module)")
    from nequip.nn._tp_scatter_cueq import CuEquivarianceTensorProductScatter

    o3 = _o3()
    with default_dtype(dtype):
        module = CuEquivarianceTensorProductScatter(
            feature_irreps_in=o3.Irreps(spec.irreps_in1), irreps_edge_attr=o3.Irreps(spec.irreps_in2),
            irreps_mid=o3.Irreps(spec.irreps_out), instructions=spec.instructions)
    module = module.to(device=spec.edge_dst.device, dtype=dtype)
    dst, src = spec.edge_dst, spec.edge_src

    def call(x, y, w):
        return module(x, y, w, dst, src)

    return Prepared("cueq-fused_tp", call, note="incl. NequIP's mul_ir<->ir_mul transposes", keep=module)


def _build_oeq(spec: ConvSpec, dtype, graph_cache, deterministic: bool) -> Prepared:
    _require_cuda(spec, "OpenEquivariance")
    if os.environ.get("OEQ_NOTORCH") == "1":  # device_env.sh's skip_oeq_build: no torch API, no JIT build
        raise Unavailable("OpenEquivariance without its torch extension here (OEQ_NOTORCH=1, its JIT build skipped)")
    oeq = _require("openequivariance")
    if not getattr(oeq, "BUILT_EXTENSION", True):
        raise Unavailable(f"openequivariance's extension did not build: {getattr(oeq, 'BUILT_EXTENSION_ERROR', '?')}")
    np_dtype = oeq.torch_to_oeq_dtype(dtype)
    tpp = oeq.TPProblem(oeq.Irreps(spec.irreps_in1), oeq.Irreps(spec.irreps_in2), oeq.Irreps(spec.irreps_out),
                        spec.instructions, shared_weights=False, internal_weights=False,
                        irrep_dtype=np_dtype, weight_dtype=np_dtype)
    conv = oeq.TensorProductConv(tpp, deterministic=deterministic)
    dst, src = spec.edge_dst, spec.edge_src
    sender_perm = None
    if deterministic:  # rows (dst) are sorted already; this transposes to column-major order
        if "oeq" not in graph_cache:
            graph_cache["oeq"] = torch.argsort(src, stable=True)
        sender_perm = graph_cache["oeq"]

    def call(x, y, w):
        return conv(x, y, w, dst, src, sender_perm)

    wn = conv.weight_numel
    probe = torch.arange(wn, dtype=torch.float64, device=dst.device)[None].repeat(2, 1)
    w_perm = conv.reorder_weights_from_e3nn(probe, True)[0].round().long()
    if torch.equal(w_perm, torch.arange(wn, device=dst.device)):
        w_perm = None
    return Prepared("oeq-det" if deterministic else "oeq-atomic", call, keep=conv, w_perm=w_perm)


BUILDERS = {
    "mlip_accel-det": lambda s, d, g: _build_mlip_accel(s, d, g, deterministic=True),
    "mlip_accel-atomic": lambda s, d, g: _build_mlip_accel(s, d, g, deterministic=False),
    "e3nn": _build_e3nn,
    "cueq-uniform_1d": _build_cueq_uniform_1d,
    "cueq-fused_tp": _build_cueq_fused_tp,
    "oeq-det": lambda s, d, g: _build_oeq(s, d, g, deterministic=True),
    "oeq-atomic": lambda s, d, g: _build_oeq(s, d, g, deterministic=False),
}


_MODULES = {"mlip_accel-det": ("mlip_accel.runtime.backend",), "mlip_accel-atomic": ("mlip_accel.runtime.backend",),
            "cueq-uniform_1d": ("cuequivariance_torch", "cuequivariance_ops_torch"),
            "cueq-fused_tp": ("cuequivariance_torch", "cuequivariance_ops_torch", "nequip.nn._tp_scatter_cueq"),
            "oeq-det": ("openequivariance",), "oeq-atomic": ("openequivariance",)}


def preload(impls) -> None:
    """Import the libraries of ``impls`` up front, so that a case's setup time is its own construction and
    first call, not a library import (OpenEquivariance JIT-builds its extension on first import).
    Failures are left for :func:`build` to report."""
    for module in dict.fromkeys(m for i in impls for m in _MODULES.get(i, ())):
        try:
            importlib.import_module(module)
        except Exception:
            pass


def build(impl: str, spec: ConvSpec, dtype, graph_cache: dict) -> Prepared:
    """Build ``impl`` for ``spec``; raises :class:`Unavailable` when it cannot run in this environment.

    ``graph_cache`` holds per-graph precomputation (CSR sorts) shared by the implementations of one graph.
    """
    if impl not in BUILDERS:
        raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")
    return BUILDERS[impl](spec, dtype, graph_cache)


def versions() -> dict:
    """Versions of every package the benchmark may use (None when missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("e3nn", "mlip_accel", "cuequivariance", "cuequivariance-torch", "cuequivariance-ops-torch-cu13",
                 "cuequivariance-ops-torch-cu12", "openequivariance", "nequip", "mace-torch", "cupy-cuda13x",
                 "cupy-cuda12x"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    if "mlip_accel" not in out:
        import mlip_accel
        out["mlip_accel"] = mlip_accel.__version__
    if "e3nn" not in out and importlib.util.find_spec("e3nn"):
        from mlip_accel.problem.e3nn_compat import e3nn_version
        out["e3nn"] = e3nn_version()
    return out
