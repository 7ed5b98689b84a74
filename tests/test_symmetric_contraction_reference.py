"""The symmetric-contraction problem read from MACE's module, and the pure-PyTorch reference against MACE's own
``SymmetricContraction`` (mace-torch 0.3.16) in float64: forward, first and second derivatives, gradcheck."""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("mace")

from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.problem.symmetric_contraction import from_mace, weight_tensors  # noqa: E402
from mlip_accel.reference.symmetric_contraction import check_inputs, symmetric_contraction  # noqa: E402
from mlip_accel.testing import rel_err as _rel  # noqa: E402

pytestmark = pytest.mark.mace

EXACT = 1e-12
COUPLING = {1: "0e+1o", 2: "0e+1o+2e", 3: "0e+1o+2e+3o"}  # MACE's product input by max_ell
TARGET = {0: "0e", 1: "0e+1o", 2: "0e+1o+2e"}  # hidden irreps by their largest l


def _irreps(ir: str, channels: int) -> str:
    return "+".join(f"{channels}x{i}" for i in ir.split("+"))


def _cueq_available() -> bool:
    from mace.tools import cg

    return bool(cg.CUET_AVAILABLE)


@functools.lru_cache(maxsize=None)
def _mace_module(max_ell: int, hidden_l: int, correlation, elements: int, channels: int, reduced: bool, seed: int):
    """MACE's SymmetricContraction built in float64; ``correlation`` an int or a per-output tuple (MACE 0.3.16
    takes no per-irrep dict in its constructor, so those contractions are rebuilt one by one)."""
    from e3nn import o3
    from mace.modules.symmetric_contraction import Contraction, SymmetricContraction

    torch.manual_seed(seed)
    irreps_in, irreps_out = o3.Irreps(_irreps(COUPLING[max_ell], channels)), o3.Irreps(_irreps(TARGET[hidden_l], channels))
    with default_dtype(torch.float64):
        first = correlation if isinstance(correlation, int) else correlation[0]
        module = SymmetricContraction(irreps_in, irreps_out, first, num_elements=elements, use_reduced_cg=reduced)
        if not isinstance(correlation, int):
            for i, (corr, (_, ir)) in enumerate(zip(correlation, irreps_out)):
                module.contractions[i] = Contraction(irreps_in, o3.Irreps(str(ir)), corr, num_elements=elements,
                                                     use_reduced_cg=reduced)
    return module


def _inputs(problem, nodes: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, problem.channels, problem.dim_in, generator=g, dtype=torch.float64)
    elements = torch.randint(0, problem.num_elements, (nodes,), generator=g)
    return x, elements


CASES = [  # (max_ell, hidden_l, correlation, elements)
    (1, 0, 1, 1), (1, 1, 2, 3), (2, 1, 3, 3), (3, 1, 3, 89), (3, 0, 3, 2), (2, 2, 2, 4), (3, 2, 2, 1),
    (1, 2, 3, 2), (2, 1, (3, 1), 3), (3, 2, (1, 3, 2), 2),
]


def _case_id(case):
    max_ell, hidden_l, corr, elements = case
    return f"ell{max_ell}-L{hidden_l}-corr{'-'.join(map(str, corr)) if isinstance(corr, tuple) else corr}-E{elements}"


@pytest.mark.parametrize("reduced", [False, True], ids=["full_cg", "reduced_cg"])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_reference_equals_mace_forward_and_two_derivatives(case, reduced):
    if reduced and not _cueq_available():
        pytest.skip("use_reduced_cg needs cuequivariance (without it MACE builds the full CG, covered by full_cg)")
    module = _mace_module(*case, channels=3, reduced=reduced, seed=0)
    problem = from_mace(module)
    x, elements = _inputs(problem, nodes=7)
    one_hot = torch.nn.functional.one_hot(elements, problem.num_elements).double()
    weights = weight_tensors(module)

    xa = x.clone().requires_grad_()
    ours = symmetric_contraction(problem, xa, elements, torch.cat(weights, dim=1))
    xb = x.clone().requires_grad_()
    theirs = module(xb, one_hot)
    assert ours.shape == theirs.shape
    assert _rel(ours, theirs) <= EXACT

    g = torch.Generator().manual_seed(5)
    v = torch.randn(theirs.shape, generator=g, dtype=torch.float64)
    u = torch.randn(x.shape, generator=g, dtype=torch.float64)
    trainable = [w for w in weights if w.requires_grad]
    first = []
    for out, xin in ((ours, xa), (theirs, xb)):
        grads = torch.autograd.grad((out * v).sum(), [xin, *trainable], create_graph=True)
        second = torch.autograd.grad((grads[0] * u).sum(), [xin, *trainable], allow_unused=True)
        first.append((grads, second))
    (g_ours, h_ours), (g_theirs, h_theirs) = first
    for a, b in zip(g_ours, g_theirs):
        assert _rel(a, b) <= EXACT
    for a, b in zip(h_ours, h_theirs):
        if b is None or a is None:  # a correlation-1 term has no second derivative in x
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            assert _rel(a, b) <= EXACT


@pytest.mark.parametrize("case", [(1, 1, 2, 3), (2, 1, 3, 2), (1, 2, (3, 1, 2), 2)], ids=_case_id)
def test_reference_gradcheck_and_gradgradcheck(case):
    module = _mace_module(*case, channels=2, reduced=False, seed=2)
    problem = from_mace(module)
    x, elements = _inputs(problem, nodes=3)
    w = torch.cat([p.detach() for p in weight_tensors(module)], dim=1)
    x.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: symmetric_contraction(problem, a, elements, b)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_problem_reads_buffers_and_weights_in_order():
    module = _mace_module(2, 1, 3, 3, channels=4, reduced=False, seed=0)
    problem = from_mace(module)
    assert problem.channels == 4 and problem.coupling_irreps == ((0, 1), (1, -1), (2, 1))
    assert [o.irrep for o in problem.outputs] == [(0, 1), (1, -1)]
    assert [o.correlation for o in problem.outputs] == [3, 3]
    contraction = module.contractions[1]
    # nu = correlation is MACE's weights_max, nu = 1 its last weights entry
    assert weight_tensors(module)[5] is contraction.weights_max
    assert weight_tensors(module)[3] is contraction.weights[1]
    u3 = contraction.U_matrix_3
    term = problem.outputs[1].terms[2]
    assert term.num_params == u3.shape[-1] and len(term.nonzeros) == int((u3 != 0).sum())
    m, idx, k, value = term.nonzeros[0]
    assert value == float(u3[(m, *idx, k)])
    assert problem.num_params == sum(int(w.shape[1]) for w in weight_tensors(module))
    assert problem.key.startswith("symcon_") and problem.key == from_mace(module).key


def test_bad_inputs_are_refused_with_value_errors():
    module = _mace_module(1, 1, 2, 3, channels=3, reduced=False, seed=0)
    problem = from_mace(module)
    x, elements = _inputs(problem, nodes=4)
    w = torch.cat(weight_tensors(module), dim=1).detach()
    check_inputs(problem, x, elements, w)
    with pytest.raises(ValueError, match="x must be"):
        check_inputs(problem, x[:, :2], elements, w)
    with pytest.raises(ValueError, match="elements must be"):
        check_inputs(problem, x, elements[:3], w)
    with pytest.raises(ValueError, match="elements must be an int"):
        check_inputs(problem, x, elements.double(), w)
    with pytest.raises(ValueError, match="weights must be"):
        check_inputs(problem, x, elements, w[:, 1:])
    with pytest.raises(ValueError, match="weights are"):
        check_inputs(problem, x, elements, w.float())
