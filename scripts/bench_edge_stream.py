#!/usr/bin/env python
"""Edge streaming (issue 18), PyTorch stream vs the unstreamed accelerated model: time and peak GPU memory of
one energy + forces call, force error, per chunk budget. Decides whether ``stream_edges`` may become a default
before the fused kernel exists, and gives the baseline the fused kernel must beat (docs/edge-streaming.md).

Models and graphs are bench_md's (MACE-MP-0-medium size, NequIP OAM-L size; diamond carbon, 6 A cutoff).
Variants: ``unstreamed`` = ``accelerate(model, backend="cuda")``; ``stream-<K>`` = the same with
``stream_edges=True`` and chunks of K edges ("auto": the default 2**26-element budget per chunk's W).

    py_mace   scripts/bench_edge_stream.py --framework mace   --sizes 5 10   # -> $OUT/edge_stream.mace.json
    py_nequip scripts/bench_edge_stream.py --framework nequip --sizes 5 10
    python    scripts/bench_edge_stream.py --framework mace --tiny           # CPU smoke run (reference backend)
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # mlip_accel from this tree

import bench_md  # noqa: E402
from bench_graphs import build_graph  # noqa: E402

from mlip_accel.testing import dtype_of  # noqa: E402


def _tiny(framework: str, dtype):
    """A small model of the same architecture, for the CPU smoke run."""
    if framework == "mace":
        from mlip_accel.testing.mace_models import model_of_class

        return model_of_class("ScaleShiftMACE", dtype=dtype, atomic_numbers=(6,), hidden="5x0e+5x1o",
                              radial_mlp=(7, 5)).eval()
    from nequip.utils.global_state import set_global_state

    set_global_state()
    from nequip.model import NequIPGNNModel

    return NequIPGNNModel(seed=0, model_dtype=str(dtype).removeprefix("torch."), type_names=["C"], r_max=4.0,
                          l_max=1, num_layers=2, num_features=5, radial_mlp_depth=2, radial_mlp_width=7,
                          avg_num_neighbors=20.0, per_type_energy_shifts={"C": 0.0},
                          per_type_energy_scales={"C": 1.0}).eval()


def _variant(base, device, chunk):
    import mlip_accel

    backend = "cuda" if device.type == "cuda" else "reference"
    model = copy.deepcopy(base).to(device)
    if chunk is None:
        return mlip_accel.accelerate(model, backend=backend)
    return mlip_accel.accelerate(model, backend=backend, stream_edges=True,
                                 stream_chunk_edges=None if chunk == "auto" else int(chunk))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("mace", "nequip"), required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 10], help="carbon-<N>c graphs")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--chunks", nargs="+", default=["auto", "16384", "65536"])
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--tiny", action="store_true", help="small model, carbon-1c, few reps (CPU smoke run)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from mlip_accel.integrations.potentials import potential_from_model

    sizes = [1] if args.tiny else args.sizes
    cases = []
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        base = _tiny(args.framework, dtype) if args.tiny else \
            {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](dtype)
        for size in sizes:
            graph = build_graph(f"carbon-{size}c", device=device)
            atoms, edges = graph.num_nodes, graph.num_edges
            pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
            del graph
            reference = None
            for chunk in [None] + list(args.chunks):
                name = "unstreamed" if chunk is None else f"stream-{chunk}"
                case = {"framework": args.framework, "dtype": dtype_name, "graph": f"carbon-{size}c",
                        "atoms": atoms, "edges": edges, "variant": name}
                try:
                    potential = potential_from_model(_variant(base, device, chunk), device=device)
                    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
                    result = bench_md.time_steps(potential, data, device, 0.0 if args.tiny else args.min_seconds,
                                                 3 if args.tiny else 50)
                    case.update(status="ok", **bench_md.errors_vs_reference(result, reference))
                    reference = reference or result
                    case.update({k: v for k, v in result.items() if not k.startswith("_")})
                except torch.cuda.OutOfMemoryError:
                    case["status"] = "out of memory"
                except Exception as err:  # recorded, the run goes on
                    case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
                finally:
                    potential = data = None
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                cases.append(case)
                print(f"[edge_stream] {args.framework} {dtype_name} carbon-{size}c {name:14s} "
                      + (f"{case['ms_median']:9.2f} ms {case['peak_mib']:9.0f} MiB "
                         f"force err {case.get('force_rel_err', 0):.2e}" if case["status"] == "ok"
                         else case["status"][:150]), file=sys.stderr)
    out = {"framework": args.framework, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
           else "cpu", "tiny": args.tiny, "torch": torch.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                            time.gmtime()),
           "cases": cases}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"edge_stream.{args.framework}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(path)
    return out


if __name__ == "__main__":
    main()
