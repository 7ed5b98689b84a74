#!/usr/bin/env python
"""How exact are fp32 forces? The bench MACE model (MACE-MP-0-medium size) at 216 and 1000 carbon atoms: forces
of e3nn in fp32 and of mlip_accel in fp32 against e3nn in fp64 with the same parameters (built under fp64, so
its constants are exact), and against each other. Symmetrix-XL is compared with e3nn fp32 in bench_md_sweep.

    py_mace scripts/mace_force_error_vs_fp64.py --out $OUT      # -> mace_force_error_vs_fp64.{json,md}
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # mlip_accel from this working tree when it is not installed
sys.path.insert(0, HERE)


def forces(model, graph_structure, device) -> torch.Tensor:
    from mlip_accel.integrations.potentials import potential_from_model

    pos, cell, pbc, numbers, neighbors = graph_structure
    potential = potential_from_model(model, device=device)
    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
    for p in potential.model.parameters():
        p.requires_grad_(False)
    return potential.model(dict(data), compute_stress=False, training=False)["forces"].detach().cpu()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--graphs", nargs="+", default=["carbon-3c", "carbon-5c"])
    args = parser.parse_args(argv)
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.testing import rel_err as _rel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base32 = bench_md.build_mace(torch.float32)
    base64 = bench_md.build_mace(torch.float64)  # exact constants; then the fp32 model's parameter values
    base64.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in base32.state_dict().items()})
    rows = []
    for name in args.graphs:
        graph = build_graph(name, device=device)
        s = bench_md.structure(graph)
        ref = forces(bench_md.variant("mace", "e3nn", base64, device), s, device)
        e3nn32 = forces(bench_md.variant("mace", "e3nn", base32, device), s, device)
        ours32 = forces(bench_md.variant("mace", "mlip_accel", base32, device), s, device)
        ours64 = forces(bench_md.variant("mace", "mlip_accel", base64, device), s, device)
        rows.append({"graph": name, "atoms": graph.num_nodes, "edges": graph.num_edges,
                     "e3nn_fp32_vs_fp64": _rel(e3nn32, ref), "mlip_accel_fp32_vs_fp64": _rel(ours32, ref),
                     "mlip_accel_fp32_vs_e3nn_fp32": _rel(ours32, e3nn32), "mlip_accel_fp64_vs_fp64": _rel(ours64, ref)})
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "model": bench_md.MODEL_INFO["mace"], "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mace_force_error_vs_fp64.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# fp32 MACE forces against fp64 ({result['device']})", "", result["model"] + "; max |F - F_ref| / "
             "max |F_ref| over all atoms; reference: e3nn in fp64 with the fp32 model's parameter values.", "",
             "| graph | atoms | e3nn fp32 vs fp64 | mlip_accel fp32 vs fp64 | mlip_accel fp32 vs e3nn fp32 | "
             "mlip_accel fp64 vs e3nn fp64 |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['graph']} | {r['atoms']} | {r['e3nn_fp32_vs_fp64']:.1e} | {r['mlip_accel_fp32_vs_fp64']:.1e} | "
              f"{r['mlip_accel_fp32_vs_e3nn_fp32']:.1e} | {r['mlip_accel_fp64_vs_fp64']:.1e} |" for r in rows]
    with open(os.path.join(args.out, "mace_force_error_vs_fp64.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
