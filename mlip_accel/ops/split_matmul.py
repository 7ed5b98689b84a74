"""``exact_mm(a, b)``: ``a @ b`` for 2-D tensors, on CUDA float32 through a tensor-core kernel with float32
accuracy ("3xTF32": each operand split into two TF32 parts, three tensor-core products; codegen.split_matmul),
elsewhere ``torch.mm``.

For MACE's radial MLP last layer, whose skinny float32 products (``[E, 64] @ [64, N]``, the input gradient
``[E, N] @ [N, 64]``, the weight gradient ``[64, E] @ [E, N]``) cuBLAS runs on its float32 SIMT path. Plain TF32
would be faster still but errs by ~3e-4; this matches float32's accuracy. The kernel runs when the backend
resolves to "cuda" (ops.backends.resolve: "auto" on a GPU with CuPy) for float32 tensors; torch.mm runs for
float64, on the CPU, under torch.compile and for functorch-wrapped tensors (vmap, grad). The backward is made of
``exact_mm`` itself (``grad_a = g @ b^T``, ``grad_b = a^T @ g``, the transposes read in place), so derivatives
of any order work. Deterministic: a fixed summation order, no atomics (the long-k products are split along k
and the parts summed in order by a second kernel).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import backends
from .gradients import wanted

DTYPES = (torch.float32, torch.float64)


def _runtime():
    from ..runtime import split_matmul as runtime  # imports no CuPy until a kernel is launched
    return runtime


WHERE_FASTER = "where_faster"  # the kernel mode that runs it only on the shapes where it beat cuBLAS
TALL = 65536  # rows (edges) from which the kernel's wins below were measured
HUGE = 600_000  # rows from which the input gradient won


def kernel_pays(m: int, k: int, n: int) -> bool:
    """Whether ``[m, k] @ [k, n]`` ran faster through the kernel than through cuBLAS's float32 on an H100
    (benchmarks/bench_split_matmul_h100.md, E = 158,000, 632,000 and 1,264,000 edges, n = 512 and 1280): a tall
    output from a short k (MACE's radial last layer forward, k = 64: 1.10-1.38x); the weight gradient that reduces
    a tall k into a short output with n = 1280 (1.63-1.84x; at n = 512 it is even at best, 0.75-1.05x: cuBLAS); the
    input gradient ``[E, n] @ [n, 64]`` from about 600,000 rows (1.01-1.18x at 632,000 and 1,264,000; 0.83-0.99x
    at 158,000: cuBLAS)."""
    return ((k <= 64 and n >= 512 and m >= TALL)  # forward
            or (m <= 64 and n >= 1024 and k >= TALL)  # weight gradient
            or (n <= 64 and k >= 512 and m >= HUGE))  # input gradient


def _apply(a: Tensor, b: Tensor, kernel) -> Tensor:
    if kernel == WHERE_FASTER:
        kernel = kernel_pays(a.shape[0], a.shape[1], b.shape[1])
    if kernel and backends.plain_tensors(a, b) and a.dtype == torch.float32 and a.is_cuda:
        return _runtime().matmul(a, b)
    return torch.mm(a, b)


class _ExactMM(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(a, b, kernel):
        return _apply(a, b, kernel)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, kernel = inputs
        ctx.save_for_backward(a, b)
        ctx.kernel = kernel

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        # wanted: forces with trainable radial weights (MD on a model fresh from training, or any calculator that
        # leaves requires_grad on) skip the weight gradient, a [64, E] @ [E, n] product (MACE-MP-0 medium at 8000
        # atoms: ~6 ms of a 67 ms ASE call, benchmarks/profile_ase_call_10c_before_h100.md)
        ga = _ExactMM.apply(grad, b.t(), ctx.kernel) if wanted(ctx, 0, a) else None
        gb = _ExactMM.apply(a.t(), grad, ctx.kernel) if wanted(ctx, 1, b) else None
        return ga, gb, None


def exact_mm(a: Tensor, b: Tensor, backend: str = "auto", where_faster: bool = False) -> Tensor:
    """``a [m, k] @ b [k, n]`` (float32 or float64, one device) with float32 accuracy on CUDA float32 tensors
    (the 3xTF32 kernel), ``torch.mm`` elsewhere; differentiable to any order. ``backend`` as everywhere ("auto",
    "cuda", "reference"; ops.backends.resolve decides; "cuda" on CPU tensors raises BackendUnavailable).
    ``where_faster``: the kernel only for the products (this one and each of its derivatives, decided by shape)
    where it was measured faster than cuBLAS's float32 (:func:`kernel_pays`), ``torch.mm`` for the others."""
    backends.check_backend_name(backend)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise ValueError(f"exact_mm: two tensors expected, got {type(a).__name__} and {type(b).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"exact_mm: 2-D tensors expected, got shapes {list(a.shape)} and {list(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"exact_mm: shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied "
                         f"({a.shape[1]} != {b.shape[0]})")
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        raise ValueError(f"exact_mm: both tensors float32 or both float64 expected, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"exact_mm: both tensors on one device expected, got {a.device} and {b.device}")
    kernel = (backends.resolve(backend, a.device) == "cuda" and a.dtype == torch.float32
              and not torch.compiler.is_compiling())
    return _ExactMM.apply(a, b, (WHERE_FASTER if where_faster else True) if kernel else False)
