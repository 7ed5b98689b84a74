#!/usr/bin/env python
"""What the accelerated MACE path does around its kernels in one TorchSim wrapper call, counted on the CPU.

The CUDA backend's Python path (validation, edge sort, launch sequences, buffers) runs on CPU tensors with a
no-op executor standing in for the GPU: kernels are not run (their outputs are left as allocated), everything
around them is. Counts every aten op below autograd (with the sizes of sorts, scalar reads and index ops), the
launches and their grids, and compares with the plain e3nn model through the same wrapper.

    PYTHONPATH=. TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 .venvs/ts-mace/bin/python scripts/diag_torchsim_host.py \
        --batches 8x2 8x3 8x5
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import bench_torchsim as bench  # noqa: E402

SIZED = ("sort", "argsort", "_local_scalar_dense", "nonzero", "unique", "aminmax", "index_select", "index",
         "gather", "scatter_add", "index_add", "cumsum", "_unique2", "unique_consecutive", "sum", "copy_",
         "zeros", "empty", "zero_", "fill_", "cat", "stack", "searchsorted", "bincount")


WHERE = ("sort", "_local_scalar_dense", "nonzero", "_unique2", "unique_consecutive", "aminmax", "bincount")


def _numel(args) -> int:
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return -1 if first is None else int(first.numel())


def _caller() -> str:
    """The innermost frame in mlip_accel, mace or torch_sim (the line that issued the op)."""
    import traceback
    for frame in reversed(traceback.extract_stack()[:-3]):
        f = frame.filename
        if any(k in f for k in ("/mlip_accel/", "/mace/", "/torch_sim/")):
            parts = f.split("/")
            return "/".join(parts[-2:]) + f":{frame.lineno}"
    return "?"


class Recorder(TorchDispatchMode):
    """aten op counts, and the input element counts of the ops in SIZED."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.sizes = collections.defaultdict(list)
        self.where = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] += 1
        if name in SIZED:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            self.sizes[name].append(int(first.numel()) if first is not None else -1)
        if name in WHERE:
            self.where[f"{name} @ {_caller()} ({_numel(args)})"] += 1
        return func(*args, **(kwargs or {}))


class NoOpExecutor:
    """Accepts CPU tensors and launches nothing: what runs around the kernels runs, the kernels do not."""

    def __init__(self):
        self.launches = []

    def accepts(self, device):
        return device.type == "cpu"

    def launch(self, program, plan, grid, block, args, device):
        self.launches.append((plan.kernel, tuple(grid), tuple(block)))


def state_for(frames, dtype):
    import torch_sim as ts
    return ts.io.atoms_to_state(frames, device=torch.device("cpu"), dtype=dtype)


def edge_order(wrapper, state) -> dict:
    """How the wrapper's neighbour list orders the edges (MACE: edge_index[0] sender, [1] receiver)."""
    import torch_sim as ts
    s = state.clone()
    pos = ts.transforms.pbc_wrap_batched(s.positions, s.cell, s.system_idx, s.pbc)
    edge_index, mapping_system, _ = wrapper.neighbor_list_fn(pos, s.row_vector_cell, s.pbc, wrapper.r_max,
                                                             s.system_idx)
    snd, rcv = edge_index[0], edge_index[1]
    runs = lambda t: int((t[1:] != t[:-1]).sum()) + 1  # noqa: E731
    return {"edges": int(snd.numel()), "atoms": int(pos.shape[0]),
            "sender_sorted": bool((snd[1:] >= snd[:-1]).all()), "receiver_sorted": bool((rcv[1:] >= rcv[:-1]).all()),
            "sender_runs": runs(snd), "receiver_runs": runs(rcv),
            "system_sorted": bool((mapping_system[1:] >= mapping_system[:-1]).all())}


def run_case(wrapper, state, executor=None) -> dict:
    rec = Recorder()
    tolist_calls = collections.Counter()
    orig_tolist = torch.Tensor.tolist

    def tolist(self):
        import traceback
        frame = traceback.extract_stack(limit=3)[0]
        tolist_calls[f"{os.path.basename(frame.filename)}:{frame.lineno} ({self.numel()} values)"] += 1
        return orig_tolist(self)

    wrapper(state)  # warm-up: codegen, caches
    if executor is not None:
        executor.launches.clear()
    torch.Tensor.tolist = tolist
    try:
        with rec:
            out = wrapper(state)
    finally:
        torch.Tensor.tolist = orig_tolist
    sizes = {k: {"calls": len(v), "max_numel": max(v), "sum_numel": sum(v)} for k, v in rec.sizes.items()}
    res = {"ops_total": sum(rec.counts.values()), "ops": dict(rec.counts.most_common()), "sized": sizes,
           "tolist": dict(tolist_calls), "where": dict(rec.where), "forces_shape": list(out["forces"].shape)}
    if executor is not None:
        launches = collections.Counter(k for k, _, _ in executor.launches)
        res["launches"] = len(executor.launches)
        res["launch_kernels"] = dict(launches)
        res["grids"] = [(k, g, b) for k, g, b in executor.launches]
    return res


def diagnose(batches) -> dict:
    """{batch: edge order, and per implementation the op counts, sized ops, scalar reads and launches}."""
    import mlip_accel
    from mace.calculators.mace_torchsim import MaceTorchSimModel
    from mlip_accel.ops import backends
    from mlip_accel.runtime.executor import use_executor

    dtype = torch.float32
    base = bench.build_model("mace", dtype, tiny=True)
    nl = bench.neighbor_fn("torch")
    plain = MaceTorchSimModel(copy.deepcopy(base), device=torch.device("cpu"), dtype=dtype, neighbor_list_fn=nl)
    acc_model = copy.deepcopy(base)
    mlip_accel.accelerate(acc_model, backend="reference")
    acc = MaceTorchSimModel(acc_model, device=torch.device("cpu"), dtype=dtype, neighbor_list_fn=nl)
    graphs = next(m.graphs for m in acc_model.modules() if hasattr(m, "graphs"))

    results = {}
    for spec in batches:
        systems, cells = (int(v) for v in spec.split("x"))
        state = state_for(bench.batch_frames(systems, cells), dtype)
        entry = {"order": edge_order(acc, state)}
        entry["e3nn"] = run_case(plain, state)
        entry["mlip_accel_reference"] = run_case(acc, state)
        executor = NoOpExecutor()
        real_resolve = backends.resolve
        backends.resolve = lambda requested, device, problem=None: "cuda"  # the CUDA path's Python on CPU tensors
        sorts0 = graphs.sorts
        try:
            with use_executor(executor):
                entry["mlip_accel_cuda_path"] = run_case(acc, state, executor)
        finally:
            backends.resolve = real_resolve
        entry["edge_sort_cache_sorts"] = graphs.sorts - sorts0  # warm-up call + counted call
        atoms = entry["order"]["atoms"]
        for key in ("e3nn", "mlip_accel_reference", "mlip_accel_cuda_path"):
            entry[key]["ops_per_atom"] = entry[key]["ops_total"] / atoms
        results[spec] = entry
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", default=["8x2", "8x5"], help="SYSTEMSxCELLS (cells per axis)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    results = diagnose(args.batches)
    for spec, entry in results.items():
        atoms = entry["order"]["atoms"]
        cu = entry["mlip_accel_cuda_path"]
        print(f"== {spec}: {atoms} atoms, {entry['order']['edges']} edges; order {entry['order']}")
        print(f"   ops: e3nn {entry['e3nn']['ops_total']}, ours(ref) {entry['mlip_accel_reference']['ops_total']}, "
              f"ours(cuda path, kernels not run) {cu['ops_total']}; launches {cu['launches']}; "
              f"sorts/2 calls {entry['edge_sort_cache_sorts']}")
        print(f"   cuda-path sized ops: {json.dumps(cu['sized'])}")
        print(f"   tolist: {cu['tolist']}")
        for key in ("e3nn", "mlip_accel_cuda_path"):
            print(f"   {key} where:")
            for k, v in sorted(entry[key]["where"].items()):
                print(f"      {v:3d} x {k}")
        print(f"   launches: {cu['launch_kernels']}")
        print(f"   grids: {cu['grids']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
