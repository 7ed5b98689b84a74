"""mlip_accel.TensorProduct as a drop-in for every tensor product e3nn (0.4.4 in the MACE env, 0.6 in the
NequIP env) builds: values, first and second derivatives to 1e-12 in float64, equivariance, batch shapes,
empty irreps and inputs, the rest of e3nn's interface (instructions, weight_views, right), TorchScript."""
from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch

import mlip_accel
from mlip_accel.problem import from_e3nn
from mlip_accel.problem.e3nn_compat import default_dtype, o3

F64 = torch.float64
TOL = 1e-12
MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw")


def _random_irreps(rng: random.Random, lmax: int = 2, max_terms: int = 3, muls=(1, 2, 3)) -> str:
    return "+".join(f"{rng.choice(muls)}x{rng.randint(0, lmax)}{rng.choice('eo')}"
                    for _ in range(rng.randint(1, max_terms)))


def _mode_tp(mode: str, rng: random.Random, weighted: bool, **kwargs):
    """An e3nn TensorProduct with paths of ``mode`` (with or without weights) on random irreps, plus one
    uvw path when the irreps allow, so that modes mix in one problem as in e3nn's own tests."""
    while True:
        in1 = o3().Irreps(_random_irreps(rng))
        same_mul = mode in ("uuw", "uuu", "uvu<v", "u<vw")
        in2 = o3().Irreps(str(in1) if same_mul else _random_irreps(rng))
        out, ins = [], []
        for i, (m1, ir1) in enumerate(in1):
            for j, (m2, ir2) in enumerate(in2):
                if same_mul and (m1 != m2 or (mode in ("uvu<v", "u<vw") and (i != j or m1 < 2))):
                    continue
                for ir in ir1 * ir2:
                    mul = {"uvu": m1, "uvv": m2, "uuu": m1, "uvuv": m1 * m2, "uvu<v": m1 * (m1 - 1) // 2,
                           "uuw": 1 if not weighted else 2}.get(mode, rng.choice([1, 2, 3]))
                    ins.append((i, j, len(out), mode, weighted or mode in ("uvw", "u<vw")))
                    out.append((mul, ir))
        if ins:
            if rng.random() < 0.5 and out[0][1] in list(in1[0][1] * in2[0][1]):
                ins.append((0, 0, 0, "uvw", True, 0.5))
            return o3().TensorProduct(in1, in2, o3().Irreps(out), ins, **kwargs)


def _case(name: str, seed: int):
    rng = random.Random(seed)
    with default_dtype(F64):
        if name.startswith("mode:"):
            _, mode, weights = name.split(":")
            weighted = weights != "noweight"
            kwargs = {"shared": dict(shared_weights=True, internal_weights=False),
                      "internal": dict(shared_weights=True, internal_weights=True),
                      "external": dict(shared_weights=False, internal_weights=False),
                      "noweight": dict(shared_weights=False, internal_weights=False)}[weights]
            return _mode_tp(mode, rng, weighted, **kwargs)
        a, b = _random_irreps(rng), _random_irreps(rng)
        if name == "FullyConnected":
            return o3().FullyConnectedTensorProduct(a, b, _random_irreps(rng))
        if name == "FullyConnected:external":
            return o3().FullyConnectedTensorProduct(a, b, _random_irreps(rng), shared_weights=False)
        if name == "Full":
            return o3().FullTensorProduct(a, b)
        if name == "Full:filtered":
            return o3().FullTensorProduct(a, b, filter_ir_out=["0e", "1o", "2e"])
        if name == "Elementwise":
            return o3().ElementwiseTensorProduct("2x0e+3x1o+1x2e", "3x1e+2x0o+1x1o")
        if name == "Square":
            return o3().TensorSquare(a)
        if name == "Square:filtered":
            return o3().TensorSquare(a, filter_ir_out=["0e", "1e", "2e"])
        if name == "Square:irreps_out":
            return o3().TensorSquare(a, "2x0e+2x1e+1x1o+2x2e")
        if name == "Square:irreps_out:external":
            return o3().TensorSquare(a, "2x0e+2x1e+2x2e", shared_weights=False)
    raise KeyError(name)


CASES = ([f"mode:{m}:{w}" for m in MODES for w in ("shared", "internal", "external", "noweight")
          if not (w == "noweight" and m in ("uvw", "u<vw"))]
         + ["FullyConnected", "FullyConnected:external", "Full", "Full:filtered", "Elementwise", "Square",
            "Square:filtered", "Square:irreps_out", "Square:irreps_out:external"])


def _is_square(tp) -> bool:
    return isinstance(tp, o3().TensorSquare)


def _inputs(tp, batch=(4,), seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, tp.irreps_in1.dim, dtype=F64, generator=g)
    y = torch.randn(*batch, tp.irreps_in2.dim, dtype=F64, generator=g)
    if tp.weight_numel == 0 or tp.internal_weights:
        w = None
    elif tp.shared_weights:
        w = torch.randn(tp.weight_numel, dtype=F64, generator=g)
    else:
        w = torch.randn(*batch, tp.weight_numel, dtype=F64, generator=g)
    return x, y, w


def _call(tp, x, y, w):
    args = (x,) if _is_square(tp) or isinstance(tp, mlip_accel.TensorSquare) else (x, y)
    return tp(*args) if w is None else tp(*args, w)


def _close(a, b, tol=TOL):
    assert a.shape == b.shape, (a.shape, b.shape)
    a, b = a.detach(), b.detach()
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= tol * scale, f"max abs error {err:.3g} (scale {scale:.3g})"


def _grads(tp, x, y, w, seed=2):
    """Values, first derivatives and second derivatives (of <d<out, g>/d(x, y, w, internal weight), v>)."""
    square = _is_square(tp) or isinstance(tp, mlip_accel.TensorSquare)
    xx = x.clone().requires_grad_()
    yy = None if square else y.clone().requires_grad_()
    ww = None if w is None else w.clone().requires_grad_()
    leaves = [t for t in (xx, yy, ww) if t is not None]
    if tp.internal_weights and tp.weight_numel:
        leaves.append(tp.weight)
    out = _call(tp, xx, yy, ww)
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(out.shape, dtype=F64, generator=gen)
    first = torch.autograd.grad(out, leaves, g, create_graph=True, allow_unused=True)
    first = [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, first)]
    vs = [torch.randn(t.shape, dtype=F64, generator=gen) for t in leaves]
    s = sum((d * v).sum() for d, v in zip(first, vs))
    second = torch.autograd.grad(s, leaves, allow_unused=True) if s.requires_grad else [None] * len(leaves)
    second = [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, second)]
    return out.detach(), [d.detach() for d in first], second


def _pair(name, seed=0):
    e3 = _case(name, seed)
    ours = mlip_accel.TensorProduct.from_e3nn(e3)
    return e3, ours


# --- values and derivatives --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_equals_e3nn_with_first_and_second_derivatives(name):
    e3, ours = _pair(name)
    assert isinstance(ours, mlip_accel.TensorSquare) == _is_square(e3)
    x, y, w = _inputs(e3)
    ref_out, ref_first, ref_second = _grads(e3, x, y, w)
    out, first, second = _grads(ours, x, y, w)
    _close(out, ref_out)
    for a, b in zip(first + second, ref_first + ref_second):
        _close(a, b)


@pytest.mark.parametrize("name", ["mode:uvv:external", "mode:uvuv:shared", "mode:uvu<v:internal",
                                  "mode:u<vw:external", "Square:irreps_out"])
def test_gradcheck_and_gradgradcheck(name):
    e3, ours = _pair(name, seed=3)
    x, y, w = _inputs(e3, batch=(2,))
    leaves = [t.requires_grad_() for t in (x, y, w) if t is not None]
    square = isinstance(ours, mlip_accel.TensorSquare)
    if square:
        leaves = [leaves[0]] + leaves[2:]

    def f(*ts):
        return _call(ours, ts[0], None if square else ts[1], ts[-1] if w is not None else None)
    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


def _wigner_d(irreps, R):
    return irreps.D_from_matrix(R) if irreps.dim else torch.zeros(0, 0, dtype=F64)


# --- equivariance ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_equivariant_under_rotations_and_parity(name):
    e3, ours = _pair(name, seed=4)
    x, y, w = _inputs(e3, batch=(3,))
    torch.manual_seed(5)
    for parity in (1.0, -1.0):
        with default_dtype(F64):
            R = o3().rand_matrix(dtype=F64) * parity
            d1, d2, do = (_wigner_d(irreps, R) for irreps in (e3.irreps_in1, e3.irreps_in2, e3.irreps_out))
        rotated_after = _call(ours, x, y, w) @ do.T
        rotated_before = _call(ours, x @ d1.T, y @ d2.T, w)
        _close(rotated_before, rotated_after, 1e-10)


# --- batch shapes, empty irreps and inputs ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["mode:uvu:external", "FullyConnected", "FullyConnected:external", "Full",
                                  "Square:irreps_out:external"])
def test_batch_shapes_as_e3nn(name):
    e3, ours = _pair(name, seed=6)
    g = torch.Generator().manual_seed(7)
    per_sample = not e3.shared_weights and e3.weight_numel > 0
    shapes = [((), (), ()), ((2, 1, 3), (4, 1), (2, 4, 3)), ((5,), (1,), (5,)), ((0,), (0,), (0,)),
              ((2, 0, 3), (1, 3), (2, 1, 3))]
    for sx, sy, sw in shapes:
        x = torch.randn(*sx, e3.irreps_in1.dim, dtype=F64, generator=g)
        y = torch.randn(*sy, e3.irreps_in2.dim, dtype=F64, generator=g)
        w = torch.randn(*(sw if per_sample else ()), e3.weight_numel, dtype=F64, generator=g) \
            if e3.weight_numel and not e3.internal_weights else None
        if per_sample and not sw:
            w = w[None]  # e3nn wants a batch dimension on per-sample weights
        if _is_square(e3):
            y = x
        _close(_call(ours, x, y, w), _call(e3, x, y, w))


def test_empty_irreps_and_inputs_as_e3nn():
    with default_dtype(F64):
        e3 = o3().FullyConnectedTensorProduct("0e + 1e", o3().Irreps([]), "0e + 1e")
        ours = mlip_accel.TensorProduct.from_e3nn(e3)
        out = ours(torch.randn(1, 2, 4, dtype=F64), torch.randn(2, 1, 0, dtype=F64))
        assert out.shape == (2, 2, 4) and not out.any()
        e3 = o3().FullyConnectedTensorProduct("0e + 1e", "0e + 1e", "0e + 1e")
        ours = mlip_accel.TensorProduct.from_e3nn(e3)
    x = torch.randn(2, 1, 0, 1, 4, dtype=F64, requires_grad=True)
    out = ours(x, torch.randn(1, 2, 0, 3, 4, dtype=F64))
    assert out.shape == (2, 2, 0, 3, 4)
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert ours.right(torch.randn(1, 2, 0, 3, 4, dtype=F64)).shape == (1, 2, 0, 3, 4, 4)
    with default_dtype(F64):
        e3 = o3().TensorProduct("2x0e", "2x0e", o3().Irreps([]), [])
    ours = mlip_accel.TensorProduct.from_e3nn(e3)
    assert ours(torch.randn(3, 2, dtype=F64), torch.randn(3, 2, dtype=F64)).shape == (3, 0)


def test_bad_shapes_are_clear_errors():
    e3, ours = _pair("FullyConnected:external")
    x, y, w = _inputs(e3)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., "):
        ours(x[:, 1:], y, w)
    with pytest.raises(ValueError, match="do not broadcast"):
        ours(x, y[:3], w)
    with pytest.raises(ValueError, match="weight must have shape"):
        ours(x, y, w[:, 1:])
    with pytest.raises(ValueError, match="weight is required"):
        ours(x, y)


# --- weights -----------------------------------------------------------------------------------------------

def test_weight_overrides_internal_weights_and_lists_as_e3nn():
    e3, ours = _pair("FullyConnected")
    assert ours.internal_weights and torch.equal(ours.weight, e3.weight)
    x, y, _ = _inputs(e3)
    w = torch.randn(e3.weight_numel, dtype=F64)
    _close(ours(x, y, w), e3(x, y, w))
    _close(ours(x, y), e3(x, y))
    as_list = [v.clone() for v in e3.weight_views(w)]
    _close(ours(x, y, as_list), e3(x, y, as_list))
    e3, ours = _pair("FullyConnected:external")
    x, y, w = _inputs(e3)
    as_list = [v.clone() for v in e3.weight_views(w)]
    _close(ours(x, y, as_list), e3(x, y, as_list))


@pytest.mark.parametrize("name", ["FullyConnected", "FullyConnected:external", "mode:u<vw:shared",
                                  "Square:irreps_out", "Full"])
def test_instructions_weight_views_and_right_as_e3nn(name):
    e3, ours = _pair(name, seed=8)
    assert ours.instructions == e3.instructions
    assert ours.weight_numel == e3.weight_numel
    assert (ours.irreps_in1, ours.irreps_in2, ours.irreps_out) == (e3.irreps_in1, e3.irreps_in2, e3.irreps_out)
    x, y, w = _inputs(e3)
    views_e3 = list(e3.weight_views(w, yield_instruction=True))
    views = list(ours.weight_views(w, yield_instruction=True))
    assert [(i, ins) for i, ins, _ in views] == [(i, ins) for i, ins, _ in views_e3]
    for (_, _, a), (_, _, b) in zip(views, views_e3):
        assert torch.equal(a, b)
    for i, ins in enumerate(e3.instructions):
        if ins.has_weight:
            assert torch.equal(ours.weight_view_for_instruction(i, w), e3.weight_view_for_instruction(i, w))
    # e3nn 0.6 compiles right() only on request (compile_right=True): the reference is its forward
    right = ours.right(y, w)
    assert right.shape == (*y.shape[:-1], e3.irreps_in1.dim, e3.irreps_out.dim)
    _close(torch.einsum("zi,zij->zj", x, right), o3().TensorProduct.forward(e3, x, y, w))


def test_constructor_of_tensor_square_matches_e3nn():
    torch.manual_seed(9)
    with default_dtype(F64):
        ours = mlip_accel.TensorSquare("2x0e+2x1o", "1x0e+2x1e")
        e3 = o3().TensorSquare("2x0e+2x1o", "1x0e+2x1e")
    assert ours.internal_weights and ours.irreps_in == e3.irreps_in
    x = torch.randn(5, e3.irreps_in.dim, dtype=F64)
    _close(ours(x, e3.weight), e3(x))


# --- modules, pickling, TorchScript, CUDA fallback ---------------------------------------------------------

def test_deepcopy_and_pickle_keep_results():
    e3, ours = _pair("Square:irreps_out")
    x, y, w = _inputs(e3)
    ref = _call(ours, x, y, w)
    _close(_call(copy.deepcopy(ours), x, y, w), ref, 0)
    _close(_call(pickle.loads(pickle.dumps(ours)), x, y, w), ref, 0)


def test_torchscript_is_refused_naming_torch_compile():
    _, ours = _pair("FullyConnected")
    with pytest.raises(NotImplementedError, match="torch.compile"):
        torch.jit.script(ours)
    with pytest.raises(NotImplementedError, match="torch.compile"):
        torch.jit.script(torch.nn.Sequential(ours))


@pytest.mark.parametrize("name", ["FullyConnected:external", "Square:irreps_out"])
def test_torch_compile_fullgraph_is_the_way_instead_of_torchscript(name):
    e3, ours = _pair(name)
    x, y, w = _inputs(e3, batch=(2, 3))
    x.requires_grad_()

    def energy(x, y, w):
        return _call(ours, x, y, w).pow(2).sum()
    compiled = torch.compile(energy, fullgraph=True, backend="aot_eager")
    e, e_ref = compiled(x, y, w), energy(x, y, w)
    _close(e, e_ref)
    _close(torch.autograd.grad(e, x)[0], torch.autograd.grad(e_ref, x)[0])


def test_vmap_over_gradients_as_e3nn():
    # jacobians by torch.vmap over autograd.grad (MACE's dielectric model takes its derivatives this way)
    e3, ours = _pair("FullyConnected:external")
    x, y, w = _inputs(e3, batch=(3,))

    def jacobian(tp):
        xx = x.clone().requires_grad_()
        out = tp(xx, y, w).sum(0)
        eye = torch.eye(out.shape[0], dtype=F64)
        return torch.vmap(lambda v: torch.autograd.grad(out, xx, v, retain_graph=True, create_graph=True)[0])(eye)
    _close(jacobian(ours), jacobian(e3))
    assert jacobian(ours).requires_grad


def test_convolution_takes_the_new_modes():
    from helpers import e3nn_conv
    e3 = _case("mode:uvv:external", 10)
    conv = mlip_accel.TensorProductConv.from_e3nn(e3)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, e3.irreps_in1.dim, dtype=F64, generator=g)
    y = torch.randn(9, e3.irreps_in2.dim, dtype=F64, generator=g)
    w = torch.randn(9, e3.weight_numel, dtype=F64, generator=g)
    dst, src = torch.randint(0, 5, (9,), generator=g), torch.randint(0, 5, (9,), generator=g)
    _close(conv(x, y, w, dst, src), e3nn_conv(e3, x, y, w, dst, src))


def test_cuda_backend_refuses_the_new_modes_with_the_reason(monkeypatch):
    from mlip_accel.ops import backends
    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: None)
    problem = from_e3nn(_case("mode:uvuv:noweight", 12))
    assert "'uvuv'" in backends.problem_unsupported_reason(problem)
    with pytest.raises(backends.BackendUnavailable, match="'uvuv'"):
        backends.resolve("cuda", torch.device("cuda"), problem)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Full", "Square:irreps_out", "mode:uvv:external", "mode:uvu:external"])
def test_cuda_device_equals_e3nn(name):
    # uvu with per-sample weights runs the generated kernels, the others the reference (one warning each)
    e3, ours = _pair(name)
    x, y, w = _inputs(e3, batch=(2, 3))
    cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    _close(_call(ours.cuda(), cuda(x), cuda(y), cuda(w)).cpu(), _call(e3, x, y, w), 1e-10)
