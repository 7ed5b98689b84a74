"""Check the device environments made by scripts/device_env.sh: imports, versions, and one tiny fused
convolution through each framework's own cuEquivariance and OpenEquivariance path, compared with e3nn.

    py_nequip scripts/device_env_check.py      # NequIP 0.19's TensorProductScatter modifiers
    py_mace   scripts/device_env_check.py      # MACE's wrapper_ops (conv fusion)

Prints one line per check and exits non-zero if any failed.
"""
from __future__ import annotations

import importlib
import sys
import time
import traceback

import torch

from mlip_accel.testing import rel_err

FAILED: list[str] = []


def check(name, fn):
    t0 = time.perf_counter()
    try:
        info = fn()
        print(f"  ok   {name}: {info} ({time.perf_counter() - t0:.1f} s)", flush=True)
    except Exception as err:  # report and go on: the point is to see every broken piece in one run
        FAILED.append(name)
        print(f"  FAIL {name}: {type(err).__name__}: {err}", flush=True)
        traceback.print_exc(limit=3)


DIST_NAMES = {"mace": "mace-torch", "cupy": "cupy-cuda13x", "cuequivariance_ops_torch": "cuequivariance-ops-torch-cu13"}


def version_of(module: str) -> str:
    mod = importlib.import_module(module)
    version = getattr(mod, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import version as dist_version
    return dist_version(DIST_NAMES.get(module, module.replace("_", "-")))


def tiny_graph(num_nodes=12, num_edges=60, device="cuda"):
    g = torch.Generator().manual_seed(0)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    order = torch.argsort(dst * num_nodes + src)  # row-major sorted, as deterministic kernels want
    return dst[order].to(device), src[order].to(device)


def nequip_checks():
    from e3nn import o3
    from nequip.nn._tp_scatter_base import TensorProductScatter
    from mlip_accel.problem import channelwise_problem

    in1, mid, ins = channelwise_problem("8x0e+8x1o+8x2e", "0e+1o+2e", "8x0e+8x1o+8x2e")
    base = TensorProductScatter(o3.Irreps(in1), o3.Irreps("0e+1o+2e"), o3.Irreps(mid), ins).cuda()
    dst, src = tiny_graph()
    x = torch.randn(12, base.tp.irreps_in1.dim, device="cuda")
    y = torch.randn(60, base.tp.irreps_in2.dim, device="cuda")
    w = torch.randn(60, base.tp.weight_numel, device="cuda")
    ref = base(x, y, w, dst, src)

    def cueq():
        from nequip.nn._tp_scatter_cueq import CuEquivarianceTensorProductScatter
        m = CuEquivarianceTensorProductScatter(base.feature_irreps_in, base.irreps_edge_attr, base.irreps_mid,
                                               base.instructions).cuda()
        return f"nequip fused_tp rel err {rel_err(m(x, y, w, dst, src), ref):.1e}"

    def oeq():
        from nequip.nn._tp_scatter_oeq import OpenEquivarianceTensorProductScatter
        m = OpenEquivarianceTensorProductScatter(base.feature_irreps_in, base.irreps_edge_attr, base.irreps_mid,
                                                 base.instructions, use_opaque=False).cuda()
        return f"nequip OEQ rel err {rel_err(m(x, y, w, dst, src), ref):.1e}"

    check("nequip + cuEquivariance conv", cueq)
    check("nequip + OpenEquivariance conv", oeq)


def mace_checks():
    from e3nn import o3
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions
    from mace.modules.wrapper_ops import CuEquivarianceConfig, OEQConfig, TensorProduct

    in1, in2, target = o3.Irreps("8x0e+8x1o"), o3.Irreps("0e+1o+2e+3o"), o3.Irreps("8x0e+8x1o+8x2e")
    mid, ins = tp_out_irreps_with_instructions(in1, in2, target)
    dst, src = tiny_graph()
    edge_index = torch.stack([src, dst])  # MACE: row 0 sender, row 1 receiver
    e3 = TensorProduct(in1, in2, mid, ins, shared_weights=False, internal_weights=False).cuda()
    x = torch.randn(12, in1.dim, device="cuda")
    y = torch.randn(60, in2.dim, device="cuda")
    w = torch.randn(60, e3.weight_numel, device="cuda")
    ref = torch.zeros(12, mid.dim, device="cuda").index_add(0, dst, e3(x[src], y, w))

    def cueq():
        import cuequivariance as cue
        import cuequivariance_torch as cuet

        cfg = CuEquivarianceConfig(enabled=True, layout="ir_mul", group="O3_e3nn", optimize_all=True,
                                   conv_fusion=True)
        m = TensorProduct(in1, in2, mid, ins, shared_weights=False, internal_weights=False, cueq_config=cfg)
        m = m.cuda() if hasattr(m, "cuda") else m
        to_ir_mul = cuet.TransposeIrrepsLayout(cue.Irreps(cfg.group, in1), source=cue.mul_ir, target=cue.ir_mul,
                                               use_fallback=True).cuda()
        to_mul_ir = cuet.TransposeIrrepsLayout(cue.Irreps(cfg.group, mid), source=cue.ir_mul, target=cue.mul_ir,
                                               use_fallback=True).cuda()
        # channelwise_tensor_product orders its weights by sorted output irrep (MACE's own converter
        # permutes them the same way); here the comparison only needs the forward to run.
        out = to_mul_ir(m(to_ir_mul(x), y, w, edge_index))
        return f"MACE cuEq conv_fusion (uniform_1d) ran, output {tuple(out.shape)}, e3nn {tuple(ref.shape)}"

    def oeq():
        cfg = OEQConfig(enabled=True, optimize_all=True, conv_fusion="atomic")
        m = TensorProduct(in1, in2, mid, ins, shared_weights=False, internal_weights=False, oeq_config=cfg).cuda()
        return f"MACE OEQ conv_fusion=atomic rel err {rel_err(m(x, y, w, edge_index), ref):.1e}"

    check("mace + cuEquivariance conv", cueq)
    check("mace + OpenEquivariance conv", oeq)


def main():
    framework = "mace" if importlib.util.find_spec("mace") else "nequip"
    print(f"== device_env_check ({framework} environment): python {sys.version.split()[0]}, torch {torch.__version__},"
          f" CUDA {torch.version.cuda}, GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    for m in ["e3nn", framework, "ase", "vesin", "matscipy", "cupy", "cuequivariance", "cuequivariance_torch",
              "cuequivariance_ops_torch", "mlip_accel"]:
        check(f"import {m}", lambda m=m: version_of(m))
    check("import openequivariance (JIT-builds its extension once)",
          lambda: f"{version_of('openequivariance')}, extension built: "
                  f"{importlib.import_module('openequivariance').BUILT_EXTENSION}")
    check("mlip_accel CUDA backend", lambda: (
        importlib.import_module("mlip_accel").cuda_unavailable_reason() or "available"))
    if torch.cuda.is_available():
        (mace_checks if framework == "mace" else nequip_checks)()
    print(f"== device_env_check ({framework}): {'FAILED: ' + ', '.join(FAILED) if FAILED else 'all ok'}")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
