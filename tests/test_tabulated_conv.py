"""The convolution walks that read their weights from a radial table by edge length (KernelSpec.tabulated: W and
grad W never stored), run through the CPU emulator with NaN-poisoned outputs, against the reference convolution
fed the table's values (reference/radial_table.py) and the table's own backward."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import cuda_emulator
from kernel_cases import TOL, graph, inputs, random_uvu_problem, rel_err
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.reference import radial_table as table_reference
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
R_MAX = 5.0


def _table(problem, dtype, intervals=12, seed=0):
    """Random Horner coefficients ``[intervals, 4, n]`` (the table's own layout) and the walks' ``[.., n, 4]``."""
    g = torch.Generator().manual_seed(seed)
    coeffs = torch.randn(intervals, 4, problem.weight_numel, generator=g, dtype=dtype)
    return coeffs, coeffs.permute(0, 2, 1).contiguous()


def _lengths(num_edges, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    r = torch.rand(num_edges, generator=g, dtype=dtype) * (R_MAX * 1.2)  # some beyond r_max
    if num_edges > 3:
        r[:3] = torch.tensor([0.0, R_MAX, R_MAX * 0.5], dtype=dtype)  # zero (padding), the cutoff, a knot
    return r


def _case(problem, dtype, kind, num_nodes, num_edges, seed, deterministic, need=(True, True, True)):
    x, y, _, gz = inputs(problem, num_nodes, num_edges, dtype, seed=seed)
    dst, src = graph(kind, num_nodes, num_edges, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    coeffs, packed = _table(problem, dtype, seed=seed)
    r_max = torch.tensor([R_MAX], dtype=dtype)
    r = _lengths(num_edges, dtype, seed)
    w = table_reference.lookup(coeffs, r, R_MAX)
    out = cuda.conv_forward_tabulated(problem, x, y, packed, r_max, r, dst, src, perm)
    assert rel_err(out, reference.conv_forward(problem, x, y, w, dst, src)) <= TOL[dtype]
    got = cuda.conv_backward_tabulated(problem, x, y, packed, r_max, r, gz, dst, src, tperm, need)
    gx, gy, gw = reference.conv_backward(problem, x, y, w, gz, dst, src, None, (need[0], need[1], need[2]))
    want = (gx, gy, None if gw is None else table_reference.lookup_backward(coeffs, r, R_MAX, gw))
    for name, a, b in zip(("x", "y", "lengths"), got, want):
        if b is None:
            assert a is None, f"grad {name} returned although not needed"
        else:
            assert rel_err(a, b) <= TOL[dtype], f"grad {name}: {rel_err(a, b):.3g}"
    return got


@emulated_only
@pytest.mark.parametrize("seed", [0, 2, 5])  # problems with per-edge weights (seed 1 has none)
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("gz_e3nn", [False, True], ids=["gz_gathered", "gz_e3nn"])
def test_tabulated_walks_equal_the_reference_on_the_table_values(emulated, seed, deterministic, gz_e3nn):
    problem = random_uvu_problem(seed)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5), tuning.gz_e3nn(gz_e3nn):
        _case(problem, torch.float64, "hub", 9, 77, seed, deterministic)  # several phases, split rows
        gm = module_for(problem, "float64", "backward", "det" if deterministic else "atomic", tabulated=True)
    gathered = {b.name for b in gm.sequence.buffers} & {"gz_ir_mul"}
    assert gm.spec.gz_e3nn == gz_e3nn and bool(gathered) == (not gz_e3nn)  # every problem here has l > 0 outputs


@emulated_only
@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True),
                                  (True, False, True)])
def test_tabulated_backward_honours_need(emulated, need):
    _case(random_uvu_problem(3), torch.float64, "random", 11, 50, 3, True, need)


@emulated_only
def test_tabulated_walks_in_float32_with_one_phase(emulated):
    problem = random_uvu_problem(4)
    grads = _case(problem, torch.float32, "random", 13, 64, 4, True)
    assert grads[2].dtype == torch.float32


@emulated_only
def test_tabulated_walks_are_bitwise_reproducible(emulated):
    problem = random_uvu_problem(2)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        first = _case(problem, torch.float32, "hub", 9, 77, 2, True)
        second = _case(problem, torch.float32, "hub", 9, 77, 2, True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@emulated_only
def test_tabulated_walks_check_the_table(emulated):
    problem = random_uvu_problem(0)
    x, y, _, _ = inputs(problem, 5, 7, torch.float64, seed=0)
    dst, src = graph("random", 5, 7, seed=0)
    _, packed = _table(problem, torch.float64)
    r_max, r = torch.tensor([R_MAX], dtype=torch.float64), _lengths(7, torch.float64)
    with pytest.raises(ValueError, match="coeffs must have shape"):
        cuda.conv_forward_tabulated(problem, x, y, packed.permute(0, 2, 1).contiguous(), r_max, r, dst, src)
    with pytest.raises(ValueError, match="lengths"):
        cuda.conv_forward_tabulated(problem, x, y, packed, r_max, r[:5], dst, src)
    with pytest.raises(ValueError, match="coeffs is torch.float32"):
        cuda.conv_forward_tabulated(problem, x, y, packed.float(), r_max, r, dst, src)
    with pytest.raises(ValueError, match="16-byte aligned"):
        shifted = torch.empty(packed.numel() + 1, dtype=torch.float64)[1:].view(packed.shape)
        cuda.conv_forward_tabulated(problem, x, y, shifted, r_max, r, dst, src)


def test_tabulated_spec_is_a_convolution_forward_or_backward():
    problem = random_uvu_problem(0)
    for direction, variant in (("double_forward", "det"), ("forward", "tp")):
        with pytest.raises(ValueError, match="tabulated"):
            KernelSpec(problem, "float32", direction, variant, tabulated=True)
    gm = generate(KernelSpec(problem, "float32", "backward", "det", tabulated=True))
    names = [a.name for a in gm.walk_plan.arguments]
    assert "w" not in names and "gw_out" not in names and {"coeffs", "lengths", "gr_out", "intervals"} <= set(names)
    assert "st_stream(gwe" not in gm.source and "_tab_" in gm.walk_plan.kernel
    assert any(s.name == "intervals" and s.rule is None for s in gm.sequence.scalars)


def test_mace_size_tabulated_backward_allocates_nothing_edge_or_node_sized_beside_its_outputs():
    """The ASE call's peak memory (issue 18) is the tabulated backward's: its launch sequence allocates its outputs
    (grad x, the edges' grad y and the lengths' gradient) and, beside them, only rows of x and the deterministic
    walk's per-warp partials - no per-chunk partials of grad y (num_edges x D_IN2 each) and no gathered copy of
    grad_z (nodes x D_OUT): the walk reads grad_z in e3nn's columns."""
    from mlip_accel.codegen.sequence import evaluate
    from mlip_accel.problem.description import channelwise_problem, describe
    from mlip_accel.runtime.sequence import scalars_of

    sh = "1x0e+1x1o+1x2e+1x3o"
    in1, out, ins = channelwise_problem("128x0e+128x1o", sh, "128x0e+128x1o+128x2e+128x3o")  # MACE-MP-0 medium
    problem = describe(in1, sh, out, ins, shared_weights=False, internal_weights=False)
    edges, nodes = 1_264_000, 8000
    for variant in ("det", "atomic"):
        gm = module_for(problem, "float32", "backward", variant, (True, True, True), tabulated=True)
        assert gm.spec.gz_e3nn and not gm.spec.chunk_loops
        scalars = scalars_of(gm.sequence, {"num_edges": edges, "nodes": nodes, "intervals": 1024})
        sizes = {b.name: math.prod(evaluate(d, scalars) for d in b.shape) for b in gm.sequence.buffers}
        assert set(sizes) <= {"x_ir_mul", "fixup"}, sizes
        assert sizes.get("x_ir_mul", 0) == nodes * problem.dim_in1
        assert sizes.get("fixup", 0) <= math.ceil(edges / 32) * problem.dim_in1
        assert [t.name for t in gm.sequence.outputs] == ["acc_out", "gy_out", "gr_out"]


# --- the autograd function (ops.tabulated_conv): the kernels for forces, the unfused path for the rest ---------

def _call(problem, dtype, seed=0, deterministic=True):
    """A tabulated call over a table whose 'exact network' is its own lookup scaled by a parameter (value 1), with
    the reference convolution as the unfused path: everything the function is compared with is plain torch."""
    from mlip_accel.ops.radial_table import RadialTable, table_lookup
    from mlip_accel.ops.tabulated_conv import TabulatedCall

    num_nodes, num_edges = 9, 60
    x, y, _, gz = inputs(problem, num_nodes, num_edges, dtype, seed=seed)
    dst, src = graph("hub", num_nodes, num_edges, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    coeffs, _ = _table(problem, dtype, seed=seed)
    table = RadialTable(coeffs, R_MAX, 0.0, 0.0, 0.0, 0.0)
    scale = torch.ones((), dtype=dtype, requires_grad=True)

    def exact(r):
        return table_reference.lookup(coeffs, r, R_MAX) * scale

    def unfused(x, y, r):
        return reference.conv_forward(problem, x, y, table_lookup(table, r, exact, (scale,), "reference"), dst, src)

    call = TabulatedCall(problem, table, dst, src, perm, tperm, unfused)
    r = _lengths(num_edges, dtype, seed).clamp(0.1, R_MAX * 0.99)  # inside the table: smooth everywhere
    return call, x, y, r, gz, scale


@emulated_only
def test_forces_run_the_tabulated_walks_and_equal_the_unfused_path(emulated):
    from mlip_accel.ops.tabulated_conv import tabulated_conv

    call, x, y, r, gz, scale = _call(random_uvu_problem(0), torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, y, r)]
    before = len(emulated.launches)
    out = tabulated_conv(call, *leaves, (scale,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = torch.autograd.grad(out, leaves, gz)
    assert not caught  # forces with a trainable parameter (MD on a model fresh from training): no warning
    names = [name for name, *_ in emulated.launches[before:]]
    assert any("_tab_for_" in n for n in names) and any("_tab_bac_" in n for n in names), names
    plain = [t.clone().requires_grad_() for t in (x, y, r)]
    want_out = call.unfused(*plain)
    want = torch.autograd.grad(want_out, plain, gz)
    assert rel_err(out, want_out) <= 1e-12
    for a, b in zip(grads, want):
        assert rel_err(a, b) <= 1e-12


@emulated_only
def test_parameter_gradients_and_second_derivatives_take_the_unfused_path(emulated):
    from mlip_accel.ops.tabulated_conv import tabulated_conv

    from mlip_accel.ops.radial_table import TableInTrainingWarning

    call, x, y, r, gz, scale = _call(random_uvu_problem(5), torch.float64, seed=5)
    got, want = [], []
    for fn, into in ((lambda *a: tabulated_conv(call, *a, (scale,)), got), (call.unfused, want)):
        rr = r.clone().requires_grad_()
        xx = x.clone().requires_grad_()
        out = fn(xx, y, rr)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (g_scale,) = torch.autograd.grad((out * gz).sum(), scale, retain_graph=True)
        # the parameter gradient through the table (both paths read it: the unfused one through its lookup): a
        # training step in eval mode, which the user is told about
        assert caught and {w.category for w in caught} == {TableInTrainingWarning}, caught
        assert "model.train()" in str(caught[0].message)
        g_r, g_x = torch.autograd.grad((out * gz).sum(), (rr, xx), create_graph=True)
        (h,) = torch.autograd.grad((g_r.square().sum() + g_x.square().sum()), rr)  # a Hessian-vector product
        into.extend([g_scale, g_r, g_x, h])
    for a, b in zip(got, want):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_tabulated_walks_equal_the_reference_and_store_no_weights(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mlip_accel.runtime import debug

    problem = random_uvu_problem(6)  # 705 weights per edge
    num_nodes, num_edges = 300, 20000
    x, y, _, gz = (t.cuda() for t in inputs(problem, num_nodes, num_edges, dtype, seed=6))
    dst, src = (t.cuda() for t in graph("hub", num_nodes, num_edges, seed=6))
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes))
    coeffs, packed = (t.cuda() for t in _table(problem, dtype, intervals=256, seed=6))
    r_max = torch.tensor([R_MAX], dtype=dtype, device="cuda")
    r = _lengths(num_edges, dtype, 6).cuda()
    with debug.poison():
        cuda.conv_forward_tabulated(problem, x, y, packed, r_max, r, dst, src, perm)  # compiled, warm
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = cuda.conv_forward_tabulated(problem, x, y, packed, r_max, r, dst, src, perm)
        grads = cuda.conv_backward_tabulated(problem, x, y, packed, r_max, r, gz, dst, src, tperm)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    w_bytes = num_edges * problem.weight_numel * x.element_size()
    # outputs and the per-phase grad-y partials only: the unfused pair stores W and grad W (2 x w_bytes)
    assert peak < w_bytes / 2, f"the walks allocated {peak} bytes; W alone would be {w_bytes}"
    w = table_reference.lookup(coeffs, r, R_MAX)
    tol = TOL[dtype]
    assert rel_err(out, reference.conv_forward(problem, x, y, w, dst, src)) <= tol
    gx, gy, gw = reference.conv_backward(problem, x, y, w, gz, dst, src)
    for a, b in zip(grads, (gx, gy, table_reference.lookup_backward(coeffs, r, R_MAX, gw))):
        assert rel_err(a, b) <= tol
    again = cuda.conv_backward_tabulated(problem, x, y, packed, r_max, r, gz, dst, src, tperm)
    assert all(torch.equal(a, b) for a, b in zip(grads, again))  # deterministic: bitwise


def _harmonics_case(problem, sh, dtype, num_nodes, num_edges, seed, deterministic, need=(True, True, True)):
    """The tabulated walks with the harmonics evaluated inside (KernelSpec.harmonics) against the reference chain:
    Y = harmonics of the vectors, W = the table's values, the convolution, and back through both."""
    from mlip_accel.reference import spherical_harmonics as sh_reference

    x, _, _, gz = inputs(problem, num_nodes, num_edges, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    vectors = (torch.randn(num_edges, 3, generator=g, dtype=torch.float64) * 2.0).to(dtype)
    vectors[0] = 0.0  # a padding edge: zero vector, zero length (the normalisation's eps branch)
    r = vectors.norm(dim=1)
    dst, src = graph("hub", num_nodes, num_edges, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    coeffs, packed = _table(problem, dtype, seed=seed)
    r_max = torch.tensor([R_MAX], dtype=dtype)
    y = sh_reference.spherical_harmonics(sh, vectors)
    w = table_reference.lookup(coeffs, r, R_MAX)
    out = cuda.conv_forward_tabulated(problem, x, vectors, packed, r_max, r, dst, src, perm, harmonics=sh)
    assert rel_err(out, reference.conv_forward(problem, x, y, w, dst, src)) <= TOL[dtype]
    got = cuda.conv_backward_tabulated(problem, x, vectors, packed, r_max, r, gz, dst, src, tperm, need, harmonics=sh)
    gx, gy, gw = reference.conv_backward(problem, x, y, w, gz, dst, src, None, need)
    want = (gx, None if gy is None else sh_reference.spherical_harmonics_backward(sh, vectors, gy),
            None if gw is None else table_reference.lookup_backward(coeffs, r, R_MAX, gw))
    for name, a, b in zip(("x", "vectors", "lengths"), got, want):
        if b is None:
            assert a is None, f"grad {name} returned although not needed"
        else:
            assert a.shape == b.shape and rel_err(a, b) <= TOL[dtype], f"grad {name}: {rel_err(a, b):.3g}"
    return got


@emulated_only
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_walks_evaluate_the_edge_harmonics_themselves(emulated, deterministic, dtype):
    """KernelSpec.harmonics: the walks read each edge's vector instead of its harmonics Y and the backward returns
    the vectors' gradient instead of grad Y (neither [num_edges, 16] tensor stored); several phases and split rows
    (small budgets, 5 edges per warp, a hub), partial 32-channel chunks, a zero vector."""
    from kernel_cases import channelwise
    from mlip_accel.problem.spherical_harmonics import SHProblem

    problem = channelwise("33x0e+5x1o+3x2e", "1x0e+1x1o+1x2e+1x3o")
    sh = SHProblem((0, 1, 2, 3), True, "component")
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        _harmonics_case(problem, sh, dtype, 9, 61, 0, deterministic)
        gm = module_for(problem, str(dtype).split(".")[-1], "backward", "det" if deterministic else "atomic", tabulated=True,
                        harmonics=sh)
    assert gm.num_phases > 1 and "_sh0123nc_" in gm.walk_kernel
    names = {t.name for t in gm.sequence.tensors}
    assert {"vectors", "gv_out"} <= names and not names & {"y", "gy_out"}
    for need in ((False, True, False), (True, False, True)):
        _harmonics_case(problem, sh, dtype, 9, 61, 1, deterministic, need)


def test_harmonics_in_the_walk_need_irreps_in2_to_be_them():
    from kernel_cases import channelwise
    from mlip_accel.problem.spherical_harmonics import SHProblem

    problem = channelwise("4x0e+4x1o", "1x0e+1x1o+1x2e")
    with pytest.raises(ValueError, match="not the harmonics"):
        KernelSpec(problem, "float32", "forward", "det", tabulated=True, harmonics=SHProblem((0, 1, 2, 3), True))
    with pytest.raises(ValueError, match="forward or backward"):
        KernelSpec(problem, "float32", "double_backward", "det", harmonics=SHProblem((0, 1, 2), True))
    pseudo = channelwise("4x0e+4x1o", "1x0e+1x1e")  # l = 1 of even parity: not a harmonic
    with pytest.raises(ValueError, match="not the harmonics"):
        KernelSpec(pseudo, "float32", "backward", "det", tabulated=True, harmonics=SHProblem((0, 1), True))
    spec = KernelSpec(problem, "float32", "forward", "det", tabulated=True, harmonics=SHProblem((0, 1, 2), True))
    assert "vectors" in generate(spec).source


@emulated_only
def test_forces_through_the_walks_with_harmonics_inside_equal_the_unfused_chain(emulated):
    """ops.tabulated_conv with ``TabulatedCall.harmonics``: the vectors are the input, the walks evaluate their
    harmonics (forward and backward launches are the ``_sh`` walks), and forces equal the unfused composition
    (harmonics, lookup, convolution) to 1e-12 in fp64; second derivatives take that composition."""
    from kernel_cases import channelwise
    from mlip_accel.ops.tabulated_conv import TabulatedCall, tabulated_conv
    from mlip_accel.problem.spherical_harmonics import SHProblem
    from mlip_accel.reference import spherical_harmonics as sh_reference

    problem = channelwise("33x0e+5x1o", "1x0e+1x1o+1x2e")
    sh = SHProblem((0, 1, 2), True, "component")
    call, x, _, r, gz, scale = _call(problem, torch.float64)
    g = torch.Generator().manual_seed(3)
    direction = torch.nn.functional.normalize(torch.randn(r.shape[0], 3, generator=g, dtype=torch.float64), dim=1)
    vectors = direction * r.unsqueeze(1)

    plain_unfused = call.unfused

    def unfused(x, v, r):
        return plain_unfused(x, sh_reference.spherical_harmonics(sh, v), r)
    call = TabulatedCall(call.problem, call.table, call.edge_dst, call.edge_src, call.perm, call.transpose_perm,
                         unfused, sh)

    def lengths_of(v):
        return v.norm(dim=1)
    leaves = [x.clone().requires_grad_(), vectors.clone().requires_grad_()]
    before = len(emulated.launches)
    out = tabulated_conv(call, leaves[0], leaves[1], lengths_of(leaves[1]), (scale,))
    grads = torch.autograd.grad(out, leaves, gz)
    names = [name for name, *_ in emulated.launches[before:]]
    assert any("_sh012nc_for_" in n for n in names) and any("_sh012nc_bac_" in n for n in names), names
    plain = [x.clone().requires_grad_(), vectors.clone().requires_grad_()]
    want_out = unfused(plain[0], plain[1], lengths_of(plain[1]))
    want = torch.autograd.grad(want_out, plain, gz)
    assert rel_err(out, want_out) <= 1e-12
    for a, b in zip(grads, want):
        assert rel_err(a, b) <= 1e-12
    # a second derivative: the unfused chain, harmonics included
    v = vectors.clone().requires_grad_()
    (gv,) = torch.autograd.grad((tabulated_conv(call, x, v, lengths_of(v), (scale,)) * gz).sum(), v,
                                create_graph=True)
    (h,) = torch.autograd.grad(gv.square().sum(), v)
    v2 = vectors.clone().requires_grad_()
    (gv2,) = torch.autograd.grad((unfused(x, v2, lengths_of(v2)) * gz).sum(), v2, create_graph=True)
    (h2,) = torch.autograd.grad(gv2.square().sum(), v2)
    assert rel_err(gv, gv2) <= 1e-12 and rel_err(h, h2) <= 1e-12


def test_conv_with_harmonics_inside_falls_back_to_harmonics_then_lookup_on_the_cpu():
    """TensorProductConv.forward_tabulated(..., harmonics=sh) where the walks do not run (the CPU): the harmonics
    of the vectors first, then the lookup and the convolution; the same numbers and gradients as handing it Y.
    Vectors of the wrong shape, or harmonics that are not irreps_in2, are refused."""
    from mlip_accel import TensorProductConv
    from mlip_accel.ops.radial_table import RadialTable
    from mlip_accel.problem.spherical_harmonics import SHProblem
    from mlip_accel.reference import spherical_harmonics as sh_reference

    # 8x0e x {0e, 1o, 2e} and 4x1o x {0e, 1o, 2e} into 8x0e+4x0e+8x1o+4x1o+8x2e+4x2o (uvu)
    out = "8x0e+4x0e+8x1o+4x1o+8x2e+4x2o"
    instructions = [(0, 0, 0, "uvu", True), (0, 1, 2, "uvu", True), (0, 2, 4, "uvu", True),
                    (1, 0, 3, "uvu", True), (1, 1, 1, "uvu", True), (1, 2, 5, "uvu", True)]
    conv = TensorProductConv("8x0e+4x1o", "1x0e+1x1o+1x2e", out, instructions, shared_weights=False,
                             internal_weights=False, backend="reference")
    sh = SHProblem((0, 1, 2), True, "component")
    g = torch.Generator().manual_seed(0)
    num_nodes, num_edges = 6, 20
    x = torch.randn(num_nodes, conv.problem.dim_in1, generator=g, dtype=torch.float64)
    vectors = torch.randn(num_edges, 3, generator=g, dtype=torch.float64).requires_grad_()
    dst, src = graph("random", num_nodes, num_edges, seed=0)
    coeffs = torch.randn(12, 4, conv.weight_numel, generator=g, dtype=torch.float64)
    table = RadialTable(coeffs, R_MAX, 0.0, 0.0, 0.0, 0.0)

    def exact(r):
        return table_reference.lookup(coeffs, r, R_MAX)
    r = vectors.norm(dim=1)
    got = conv.forward_tabulated(x, vectors, table, r, exact, (), dst, src, harmonics=sh)
    (g_got,) = torch.autograd.grad(got.square().sum(), vectors)
    r2 = vectors.norm(dim=1)
    want = conv.forward_tabulated(x, sh_reference.spherical_harmonics(sh, vectors), table, r2, exact, (), dst, src)
    (g_want,) = torch.autograd.grad(want.square().sum(), vectors)
    assert rel_err(got, want) <= 1e-12 and rel_err(g_got, g_want) <= 1e-12
    with pytest.raises(ValueError, match="vectors"):
        conv.forward_tabulated(x, vectors[:, :2], table, r, exact, (), dst, src, harmonics=sh)
    with pytest.raises(ValueError, match="not the harmonics"):
        conv.forward_tabulated(x, vectors, table, r, exact, (), dst, src, harmonics=SHProblem((0, 1), True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_walks_with_harmonics_inside_equal_the_reference_and_store_no_harmonics(dtype):
    """On the GPU, NaN-poisoned outputs: the walks that evaluate the edge harmonics themselves against the
    reference chain (harmonics, table values, convolution, and back), MACE-MP-0-medium's second-interaction shape
    (128x0e+128x1o x the harmonics of l <= 3); the peak allocation holds no [num_edges, 16] tensor."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kernel_cases import channelwise
    from mlip_accel.problem.spherical_harmonics import SHProblem
    from mlip_accel.reference import spherical_harmonics as sh_reference
    from mlip_accel.runtime import debug

    problem = channelwise("128x0e+128x1o", "1x0e+1x1o+1x2e+1x3o")
    sh = SHProblem((0, 1, 2, 3), True, "component")
    num_nodes, num_edges = 300, 20000
    x, _, _, gz = (t.cuda() for t in inputs(problem, num_nodes, num_edges, dtype, seed=7))
    g = torch.Generator().manual_seed(7)
    vectors = (torch.randn(num_edges, 3, generator=g, dtype=torch.float64) * 2.0).to(dtype).cuda()
    vectors[0] = 0.0
    r = vectors.norm(dim=1)
    dst, src = (t.cuda() for t in graph("hub", num_nodes, num_edges, seed=7))
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes))
    coeffs, packed = (t.cuda() for t in _table(problem, dtype, intervals=256, seed=7))
    r_max = torch.tensor([R_MAX], dtype=dtype, device="cuda")
    with debug.poison():
        cuda.conv_forward_tabulated(problem, x, vectors, packed, r_max, r, dst, src, perm, harmonics=sh)  # warm
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = cuda.conv_forward_tabulated(problem, x, vectors, packed, r_max, r, dst, src, perm, harmonics=sh)
        grads = cuda.conv_backward_tabulated(problem, x, vectors, packed, r_max, r, gz, dst, src, tperm,
                                             harmonics=sh)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    name = str(dtype).split(".")[-1]
    for direction in ("forward", "backward"):  # no tensor or buffer with a row of harmonics per edge
        seq = module_for(problem, name, direction, "det", tabulated=True, harmonics=sh).sequence
        assert all(problem.dim_in2 not in t.shape for t in (*seq.tensors, *seq.buffers)), direction
    gm = module_for(problem, name, "backward", "det", tabulated=True, harmonics=sh)
    blocks = gm.gy_partials if gm.gy_partials > 1 else 0  # per-block partials of the vectors' and lengths' grads
    # a bound on what is held at once: outputs, both walks' first-row partials (the forward's one row per mean
    # degree of edges, the backward's one per 32), x gathered, those partials; Y would add 16 per edge
    fixups = -(-num_edges // max(32, -(-num_edges // num_nodes))) * problem.dim_out + -(-num_edges // 32) * problem.dim_in1
    held = out.numel() + sum(t.numel() for t in grads) + fixups + x.numel() + blocks * num_edges * 4
    assert peak <= held * x.element_size() + 2 ** 20, (peak, held)
    if dtype == torch.float32:
        # float32 sums over the hub's 20,000 edges cancel: the walk itself is 1.08e-5 (relative to the largest
        # output) from the float64 chain (H200, H100), with or without the harmonics inside. What the harmonics
        # change is checked against the same walk reading Y from the harmonics kernel: the same sums in the same
        # order, only Y's rounding differs. float64 checks the whole chain.
        from mlip_accel.ops.spherical_harmonics import spherical_harmonics
        leaf = vectors.detach().requires_grad_(True)
        y = spherical_harmonics(leaf, sh, "cuda")
        plain = cuda.conv_forward_tabulated(problem, x, y.detach(), packed, r_max, r, dst, src, perm)
        gx, gy, gr = cuda.conv_backward_tabulated(problem, x, y.detach(), packed, r_max, r, gz, dst, src, tperm)
        (gv,) = torch.autograd.grad(y, leaf, gy)
        assert rel_err(out, plain) <= TOL[dtype]
        for a, b in zip(grads, (gx, gv, gr)):
            assert rel_err(a, b) <= TOL[dtype]
        return
    x, vectors, r, coeffs, gz = (t.double() for t in (x, vectors, r, coeffs, gz))
    y = sh_reference.spherical_harmonics(sh, vectors)
    w = table_reference.lookup(coeffs, r, R_MAX)
    tol = TOL[dtype]
    assert rel_err(out, reference.conv_forward(problem, x, y, w, dst, src)) <= tol
    gx, gy, gw = reference.conv_backward(problem, x, y, w, gz, dst, src)
    want = (gx, sh_reference.spherical_harmonics_backward(sh, vectors, gy),
            table_reference.lookup_backward(coeffs, r, R_MAX, gw))
    for a, b in zip(grads, want):
        assert rel_err(a, b) <= tol
