"""First use on the GPU (runtime.first_use; the CPU half is test_first_use.py): nequip-benzene's walks, cold (an empty
disk cache, budgets no other test compiles), run first as stand-ins while their modules compile in the background,
then as the modules, bitwise the same and within tolerance of the fp64 references; a CUDA graph captured while a
stand-in runs waits for the module (it replays the module, not the stand-in)."""
from __future__ import annotations

import threading

import pytest
import torch

from kernel_cases import (assert_gradients_match_reference, assert_same_outputs, bench_problem_named,
                          conv_all_directions)
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import compiler, debug, first_use
from mlip_accel.runtime.kernels import module_for
from mlip_accel.testing.timing import cuda_graph

pytestmark = pytest.mark.gpu

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """An empty disk cache, enough compile threads, the background compile held until ``release`` is set."""
    monkeypatch.setenv(compiler.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(compiler.THREADS_ENV, "32")
    release = threading.Event()
    real = first_use._compile

    def held(*args):
        assert release.wait(120), "the test never released the background compile"
        real(*args)
    monkeypatch.setattr(first_use, "_compile", held)
    first_use.forget()
    yield release
    release.set()
    first_use.settle(120)
    first_use.forget()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_stand_ins_then_modules_bitwise_equal(cold, dtype):
    problem = bench_problem_named("nequip-benzene")
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, "hub", 13, "cuda")
    name = {torch.float32: "float32", torch.float64: "float64"}[dtype]
    device = tensors[0].device
    with debug.poison(), cuda.accumulator_budget(forward=40, backward=10):  # sources no other test compiled
        modules = [module_for(problem, name, d, "det") for d in DIRECTIONS]
        first = run()
        running = [first_use.module(gm, device) for gm in modules]
        # every direction's stand-in ran (at these budgets the double backward's walks are above the limit too)
        assert all(r is not gm and r.split for r, gm in zip(running, modules))
        assert first_use.pending()
        cold.set()
        assert first_use.settle(120)
        second = run()
        assert all(first_use.module(gm, device) is gm for gm in modules)
    assert_same_outputs(second, first, "the modules against their stand-ins")
    assert_gradients_match_reference(problem, second, tensors, dtype, "nequip-benzene", backward=True)


def test_a_graph_captured_during_a_stand_in_replays_the_module(cold):
    problem = bench_problem_named("nequip-benzene")
    _, tensors = conv_all_directions(problem, 300, 5000, torch.float32, "random", 14, "cuda")
    x, y, w, _, _, dst, src = tensors
    from mlip_accel.graph import edge_orders, sort_edges
    perm, _ = edge_orders(sort_edges(dst, src, x.shape[0]))
    with cuda.accumulator_budget(forward=36):
        gm = module_for(problem, "float32", "forward", "det")
        eager = cuda.conv_forward(problem, x, y, w, dst, src, perm)
        assert first_use.module(gm, x.device) is not gm  # the stand-in
        threading.Timer(1.0, cold.set).start()  # released while the capture's warm-up waits
        graph, out = cuda_graph(lambda: cuda.conv_forward(problem, x, y, w, dst, src, perm), x.device)
        assert first_use.pending() == [] and first_use.module(gm, x.device) is gm
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
