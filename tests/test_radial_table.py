"""A radial network tabulated by edge length (codegen/reference/runtime/ops ``radial_table``): the table's
accuracy check and refusal, the lookup and its derivative against the network, the exact backward for parameter
gradients and second derivatives, the emulated kernels (NaN-poisoned outputs), and in MACE (patches/mace/radial.py)
the option, eval-only use, rebuild after a weight change and energy/forces/stress against the untabulated model."""
from __future__ import annotations

import math

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.codegen.radial_table import radial_table_program
from mlip_accel.ops import radial_table as ops
from mlip_accel.reference import radial_basis as embedding
from mlip_accel.reference import radial_table as reference
from mlip_accel.testing import rel_err

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
R_MAX = 5.0


def _weights(outputs=37, hidden=(16, 16), num_basis=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    dims = (num_basis, *hidden, outputs)
    return [torch.randn(a, b, generator=g, dtype=torch.float64) / math.sqrt(a) for a, b in zip(dims, dims[1:])]


def _network(weights, num_basis=8, r_max=R_MAX):
    freqs = torch.arange(1, num_basis + 1, dtype=torch.float64) * math.pi / r_max

    def net(r):
        dt = r.dtype
        x = embedding.radial_basis(r, freqs.to(dt), torch.tensor(math.sqrt(2 / r_max), dtype=dt),
                                   torch.tensor(r_max, dtype=dt), torch.tensor(5.0, dtype=dt))
        for k, w in enumerate(weights):
            x = x @ w.to(dt)
            if k < len(weights) - 1:
                x = torch.nn.functional.silu(x)
        return x
    return net


def _lengths(n, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (0.2 + (R_MAX + 0.8) * torch.rand(n, generator=g, dtype=torch.float64)).to(dtype)  # some beyond r_max


def test_hermite_coefficients_reproduce_a_cubic_exactly():
    h, knots = 0.25, torch.arange(9, dtype=torch.float64) * 0.25
    f = lambda r: torch.stack((2 * r ** 3 - r + 1, -r ** 2), -1)  # noqa: E731
    d = lambda r: torch.stack((6 * r ** 2 - 1, -2 * r), -1)  # noqa: E731
    coeffs = reference.hermite_coefficients(f(knots), d(knots), h)
    r = torch.linspace(0, 2.0, 57, dtype=torch.float64)
    assert rel_err(reference.lookup(coeffs, r, 2.0), f(r)) <= 1e-14
    assert rel_err(reference.lookup_derivative(coeffs, r, 2.0), d(r)) <= 1e-13


def test_float32_table_is_as_accurate_as_the_network_in_float32():
    net = _network(_weights())
    table = ops.build_table(net, R_MAX, torch.float32, "cpu")
    assert table.value_error <= max(ops.ACCURACY_FACTOR * table.network_value_error, ops.FLOORS[torch.float32][0])
    assert table.derivative_error <= max(ops.ACCURACY_FACTOR * table.network_derivative_error,
                                         ops.FLOORS[torch.float32][1])
    # at fresh lengths (inside and beyond r_max) against the float64 network: float32-rounding-sized errors
    r = _lengths(500, torch.float64)
    exact = net(r)
    got = reference.lookup(table.coeffs, r.float(), R_MAX).double()
    assert rel_err(got, exact) <= 1e-6
    own = net(r.float()).double()
    assert rel_err(got, exact) <= 4 * max(rel_err(own, exact), 1e-7)


def test_a_table_is_stored_once_in_the_walks_layout():
    """The walks' [intervals, n, 4] layout is the table's own storage (no second copy of the table: 29 MB for
    MACE-MP-0-medium); the unfused lookup kernels get the [intervals, 4, n] rows made at their first call."""
    from mlip_accel.ops.tabulated_conv import packed_coefficients

    table = ops.build_table(_network(_weights()), R_MAX, torch.float32, "cpu")
    packed = packed_coefficients(table)
    assert packed.is_contiguous() and packed.data_ptr() == table.coeffs.data_ptr()
    assert torch.equal(packed.permute(0, 2, 1), table.coeffs)
    assert "_rows" not in table.__dict__
    rows = table.rows()
    assert rows.is_contiguous() and torch.equal(rows, table.coeffs) and table.rows() is rows


def test_accuracy_check_in_chunks_finds_what_one_pass_finds(monkeypatch):
    """The check's points go in chunks (its temporaries stayed cached in the device's allocator, 0.3-0.5 GB for
    a MACE-size table): the same table, its errors the maxima over all points (the network's products over fewer
    rows may round their last bits differently)."""
    net = _network(_weights(outputs=37))
    calls = []

    def counted(r):
        calls.append(r.shape[0])
        return net(r)
    monkeypatch.setattr(ops, "CHECK_CHUNK_VALUES", 1 << 30)
    whole = ops.build_table(counted, R_MAX, torch.float32, "cpu")
    one_pass = len(calls)
    calls.clear()
    monkeypatch.setattr(ops, "CHECK_CHUNK_VALUES", 3 * 37 * 5)  # five intervals' points per chunk
    chunked = ops.build_table(counted, R_MAX, torch.float32, "cpu")
    assert len(calls) > one_pass and max(calls) <= max(3 * 5, chunked.intervals + 1)
    assert chunked.intervals == whole.intervals and torch.equal(chunked.coeffs, whole.coeffs)
    for name in ("value_error", "derivative_error", "network_value_error", "network_derivative_error"):
        assert getattr(chunked, name) == pytest.approx(getattr(whole, name), rel=1e-9)


def test_a_network_not_finite_in_one_late_chunk_is_refused(monkeypatch):
    """A non-finite value in any one chunk of the check refuses the table (the maxima keep a NaN)."""
    monkeypatch.setattr(ops, "CHECK_CHUNK_VALUES", 3 * 4)  # four intervals' points per chunk
    net = _network(_weights(outputs=1))
    late_nan = lambda r: torch.where(r > 0.9 * R_MAX, torch.nan, 1.0).to(r.dtype).unsqueeze(-1) * net(r)  # noqa: E731
    with pytest.raises(ops.TableRefused, match="not finite"):
        ops.build_table(late_nan, R_MAX, torch.float32, "cpu")


def test_float64_and_rough_networks_are_refused_with_the_reason():
    with pytest.raises(ops.TableRefused, match="not enough"):
        ops.build_table(_network(_weights()), R_MAX, torch.float64, "cpu", max_intervals=256)
    rough = lambda r: torch.sin(400.0 * r).unsqueeze(-1) * torch.ones(1, 3, dtype=r.dtype)  # noqa: E731
    with pytest.raises(ops.TableRefused, match="not enough"):
        ops.build_table(rough, R_MAX, torch.float32, "cpu", max_intervals=256)
    with pytest.raises(ops.TableRefused, match="not finite"):
        ops.build_table(lambda r: torch.log(r - 2.0).unsqueeze(-1), R_MAX, torch.float32, "cpu")
    with pytest.raises(ops.TableRefused, match="r_max"):
        ops.build_table(_network(_weights()), float("nan"), torch.float32, "cpu")


def _table_and_params(dtype=torch.float32):
    weights = [w.to(dtype).requires_grad_() for w in _weights()]
    net64 = _network([w.detach() for w in weights])
    table = ops.build_table(net64, R_MAX, dtype, "cpu")
    exact = _network(weights)
    return table, weights, exact


def test_forces_use_the_table_derivative_and_parameters_the_exact_network():
    table, weights, exact = _table_and_params()
    r = _lengths(300, torch.float32).requires_grad_()
    out = ops.table_lookup(table, r, exact, weights)
    g = torch.randn_like(out)
    (gr,) = torch.autograd.grad(out, r, g, retain_graph=True)
    want = torch.autograd.grad(exact(r), r, g)[0]
    assert rel_err(gr, want) <= 1e-4  # the table's derivative vs the float32 network's, both ~1e-5 from exact
    # parameter gradients (training) come from the network itself
    got = torch.autograd.grad(out, weights, g)
    want = torch.autograd.grad(exact(r), weights, g)
    assert all(rel_err(a, b) <= 1e-6 for a, b in zip(got, want))


def test_second_derivatives_come_from_the_network():
    table, weights, exact = _table_and_params()
    r = _lengths(50, torch.float32).requires_grad_()
    (gr,) = torch.autograd.grad(ops.table_lookup(table, r, exact, weights).sum(), r, create_graph=True)
    (ggr,) = torch.autograd.grad(gr.sum(), r)
    (want_gr,) = torch.autograd.grad(exact(r).sum(), r, create_graph=True)
    (want_ggr,) = torch.autograd.grad(want_gr.sum(), r)
    assert rel_err(ggr, want_ggr) <= 1e-6


def test_lookup_checks_its_inputs():
    table, weights, exact = _table_and_params()
    with pytest.raises(ValueError, match="vector"):
        ops.table_lookup(table, torch.ones(3, 1), exact, weights)
    with pytest.raises(ValueError, match="float32"):
        ops.table_lookup(table, torch.ones(3, dtype=torch.float64), exact, weights)


def test_nan_lengths_give_nan_and_lengths_beyond_r_max_the_constant():
    table, weights, exact = _table_and_params()
    r = torch.tensor([float("nan"), R_MAX, R_MAX + 1.0, 1e9])
    out = reference.lookup(table.coeffs, r, R_MAX)
    assert torch.isnan(out[0]).all() and torch.equal(out[2], out[1]) and torch.equal(out[3], out[1])
    assert torch.equal(reference.lookup_derivative(table.coeffs, r, R_MAX)[2:], torch.zeros(2, table.outputs))


def test_program_states_the_launch_contract():
    program = radial_table_program(37, "float32")
    for plan in program.plans:
        assert LaunchPlan.from_json(plan.to_json()) == plan and f"{plan.kernel}(" in program.source
    with pytest.raises(ValueError):
        radial_table_program(0, "float32")
    with pytest.raises(ValueError):
        radial_table_program(3, "float16")


def test_lanes_access_the_widest_vector_the_outputs_divide_into():
    from mlip_accel.codegen.radial_table import access_width

    assert [access_width(n, "float32")[0] for n in (1280, 38, 37)] == [4, 2, 1]
    assert [access_width(n, "float64")[0] for n in (1280, 38, 37)] == [2, 2, 1]
    source = radial_table_program(1280, "float32").source
    assert "typedef float4 V;" in source and "w.w = c0.w" in source


@emulated_only
@pytest.mark.parametrize("outputs", [37, 38, 40], ids=["scalar", "pairs", "quads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_emulated_kernels_equal_the_torch_lookup(emulated, dtype, outputs):
    from mlip_accel.runtime import radial_table as runtime

    coeffs = torch.randn(16, 4, outputs, dtype=dtype)
    r_max = torch.tensor([R_MAX], dtype=dtype)
    r = torch.cat([_lengths(70, dtype), torch.tensor([float("nan"), 0.0, R_MAX], dtype=dtype)])
    order = torch.argsort(r)
    out = runtime.forward(coeffs, r_max, r, order)
    want = reference.lookup(coeffs, r, R_MAX)
    assert torch.isnan(out[70]).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    keep = torch.arange(len(r)) != 70
    assert rel_err(out[keep], want[keep]) <= tol
    g = torch.randn(len(r), outputs, dtype=dtype)
    gr = runtime.backward(coeffs, r_max, r[keep], torch.argsort(r[keep]), g[keep])
    assert rel_err(gr, reference.lookup_backward(coeffs, r[keep], R_MAX, g[keep])) <= tol
    # a gradient that starts one value into its storage (not 16-byte aligned) is read right all the same
    rows = int(keep.sum())
    shifted = torch.empty(rows * outputs + 1, dtype=dtype)[1:].view(rows, outputs)
    shifted.copy_(g[keep])
    assert shifted.data_ptr() % 16 != 0
    assert torch.equal(runtime.backward(coeffs, r_max, r[keep], torch.argsort(r[keep]), shifted), gr)


@emulated_only
def test_autograd_runs_the_kernels(emulated):
    table, weights, exact = _table_and_params()
    r = _lengths(40, torch.float32).requires_grad_()
    before = len(emulated.launches)
    out = ops._TableLookup.apply(r, table, True, exact, *weights)
    (gr,) = torch.autograd.grad(out.square().sum(), r)
    assert len(emulated.launches) == before + 2  # forward and the lengths' gradient
    plain = ops._TableLookup.apply(r, table, False, exact, *weights)
    assert rel_err(out, plain) <= 1e-6
    assert rel_err(gr, torch.autograd.grad(plain.square().sum(), r)[0]) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_kernels_equal_the_torch_lookup(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mlip_accel.runtime import debug
    from mlip_accel.runtime import radial_table as runtime

    coeffs = torch.randn(512, 4, 1312, dtype=dtype, device="cuda")
    r_max = torch.tensor([R_MAX], dtype=dtype, device="cuda")
    r = _lengths(20_000, dtype).cuda()
    order = torch.argsort(r)
    g = torch.randn(len(r), 1312, dtype=dtype, device="cuda")
    with debug.poison():
        out = runtime.forward(coeffs, r_max, r, order)
        gr = runtime.backward(coeffs, r_max, r, order, g)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    assert rel_err(out, reference.lookup(coeffs, r, R_MAX)) <= tol
    assert rel_err(gr, reference.lookup_backward(coeffs, r, R_MAX, g)) <= tol


def test_table_cache_reads_no_tensor_value_unless_it_builds(monkeypatch):
    # a CUDA-graph capture fails on a host read of a device tensor: a cache hit must read only versions and addresses
    weights = _weights()
    net = _network(weights)
    r_max = torch.tensor(R_MAX, dtype=torch.float64)
    cache = ops.TableCache()
    first = cache.get(net, weights + [r_max], r_max, torch.float32, torch.device("cpu"), "the test network")
    assert isinstance(first, ops.RadialTable)

    def no_read(*args):
        raise AssertionError("a tensor's value was read on a cache hit")
    for name in ("__float__", "item", "tolist", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, no_read)
    assert cache.get(net, weights + [r_max], r_max, torch.float32, torch.device("cpu"), "the test network") is first
    monkeypatch.undo()
    with torch.no_grad():
        weights[-1].mul_(2.0)  # in place: a new version, a new table
    second = cache.get(net, weights + [r_max], r_max, torch.float32, torch.device("cpu"), "the test network")
    assert second is not first and not torch.equal(second.coeffs, first.coeffs)


def test_table_cache_training_mark_is_not_state():
    """The mark a training step in eval mode leaves on a TableCache (ops.radial_table.parameter_gradients_taken)
    steers only this process: a pickle or copy starts unmarked, and a cache pickled before the mark existed unpickles
    with it off (no AttributeError in offers)."""
    import copy
    import pickle

    trainable = torch.zeros(2, requires_grad=True)
    weights = _weights()
    r_max = torch.tensor(R_MAX, dtype=torch.float64)
    cache = ops.TableCache()
    table = cache.get(_network(weights), weights + [r_max], r_max, torch.float32, torch.device("cpu"), "the test net")
    assert cache.offers([trainable])
    with pytest.warns(ops.TableInTrainingWarning):
        ops.parameter_gradients_taken(table)
    assert cache.trained and not cache.offers([trainable])
    assert cache.offers([trainable.detach()])  # frozen parameters: the table again
    with torch.no_grad():
        assert cache.offers([trainable])
    for other in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
        assert not other.trained and other.offers([trainable])
    old = ops.TableCache.__new__(ops.TableCache)
    old.__setstate__({"_key": None, "_entry": None})  # pickled before the mark existed
    assert not old.trained and old.offers([trainable])
