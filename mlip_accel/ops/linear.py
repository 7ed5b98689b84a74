"""e3nn's equivariant ``Linear`` in fewer launches (a problem.linear.LinearProblem; any device).

e3nn's generated forward takes each input block with ``narrow``, contracts it with ``einsum`` and multiplies the
result by the path weight; its backward then builds every block's input gradient as a zero-filled full-width
tensor (``narrow``'s backward) and adds them up: per block one fill and one full-width add (MACE-MP-0 medium at
8000 atoms: ~3 ms of an MD step, benchmarks/profile_md_evaluator_10c_shapes_h100.md). Here:

* the path weights are folded into the (small) weight vector once per call (``weight * scale``);
* each instruction is one matrix product written into its slice of the output: on CUDA one generated block
  kernel (codegen.dense_linear) that reads the input block and writes the output block in place (no copies, no
  cuBLAS); elsewhere torch products, for a large block a tall one over a transposed copy of its input block
  (``[N d, mul_in]``), for a small one a batched one on a view of it (``[N, mul_in, d]``, the weight matrix
  broadcast over the nodes), joined by one ``cat`` under functorch transforms;
* the backward is the transposed map, built the same way, and the weight gradient one product per instruction,
  computed only when asked for (torch products: training).

The transposed map's own backward is the map itself, so every order of derivative works (force training).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from ..problem.linear import LinearProblem
from . import backends
from .gradients import wanted


# A block with d > 1 components of at least this many elements (nodes x multiplicity x d) is multiplied as one
# [N d, mul_in] @ [mul_in, mul_out] product on a transposed copy; a smaller one as N small [mul_out, mul_in] @
# [mul_in, d] products on a view (no copies, but cuBLAS's batched kernels run a d-column output at a fraction of
# its speed, while the two copies cost launches that only a large block repays). H100, fp32, forward + input
# gradient as CUDA graph replays (benchmarks/bench_irreps_linear_h100.md): tall/batched 1.9-3.8x on MACE-MP-0
# medium's 128x blocks at 1000-8000 nodes, 0.76-0.84x at 32 nodes; NequIP OAM-L's 32x1o block 0.86x at 1000
# nodes (96,000 elements), 1.57x at 8000; even around 100,000-200,000 elements.
GEMM_MIN_ELEMENTS = 131_072

# On CUDA every product of the map and of its transpose runs in the generated block kernel (runtime.dense_linear:
# reads each input block and writes each output block in place, float32 and float64), not cuBLAS: a step whose
# products make no cuBLAS call keeps cuBLAS off the device, which costs, per thread and stream that ran a product, a
# 32 MiB workspace in torch's allocator and ~70 MB outside it (H200, scripts/cublas_memory_probe.py; MACE's
# 8000-atom ASE call: benchmarks/graph_pool_notes.md). ``MLIP_ACCEL_LINEAR_KERNEL=0`` when the process starts keeps
# cuBLAS (and torch's products for the shifts' small matrices, below).
LINEAR_KERNEL = os.environ.get("MLIP_ACCEL_LINEAR_KERNEL", "1") != "0"


def _runtime():
    from ..runtime import dense_linear as runtime  # imports no CuPy until a kernel is launched
    return runtime


def _kernel_applies(x: Tensor, ws: Tensor) -> bool:
    """Whether this call's products run in the block kernel: CUDA tensors of a float dtype the kernel takes, plain
    (not functorch-wrapped: MACE's vmap over autograd.grad), not traced by torch.compile, CuPy usable."""
    return (LINEAR_KERNEL and x.is_cuda and x.dtype in (torch.float32, torch.float64)
            and backends.plain_tensors(x, ws) and not torch.compiler.is_compiling()
            and backends.cuda_unavailable_reason() is None)


def _product_without_cublas(a: Tensor, b: Tensor) -> Tensor:
    return _runtime().product(a, b) if _kernel_applies(a, b) else a @ b


class _MatrixProduct(torch.autograd.Function):
    """``a @ b`` with a forward-mode derivative (``torch.func.jvp``: a radial table's derivative check), each
    product through :func:`_product_without_cublas` on the plain tensors autograd.Function hands over."""

    @staticmethod
    def forward(a, b):
        return _product_without_cublas(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(*inputs)

    @staticmethod
    def jvp(ctx, ta, tb):
        a, b = ctx.saved_tensors  # functorch may hand these over wrapped: products by the Function itself
        out = None if ta is None else _MatrixProduct.apply(ta, b)
        if tb is not None:
            part = _MatrixProduct.apply(a, tb)
            out = part if out is None else out + part
        return out

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("matrix_product has no reverse-mode derivative: use a @ b where one is needed")


def matrix_product(a: Tensor, b: Tensor) -> Tensor:
    """``a [m, k] @ b [k, n]`` with forward-mode derivatives only (``torch.func.jvp``): where the block kernel
    applies (:func:`_kernel_applies`) made by it, no cuBLAS call (a radial table's construction and its accuracy
    check, once per model), else ``a @ b``."""
    return _MatrixProduct.apply(a, b)


def no_cublas(t: Tensor) -> bool:
    """Whether the small products with ``t`` (the shifts', the cell's) are made without cuBLAS: on CUDA, with
    :data:`LINEAR_KERNEL`."""
    return LINEAR_KERNEL and t.is_cuda


def rows_times(a: Tensor, b: Tensor) -> Tensor:
    """``a [n, k]`` times ``b [k, m]`` (one matrix) or ``b [n, k, m]`` (one per row), for a small k (the edges' unit
    shifts times the cell): where :func:`no_cublas`, as k broadcast products summed in order, which no cuBLAS call
    makes (nor their derivatives), else ``a @ b`` / ``einsum("nk,nkm->nm")``."""
    if not no_cublas(a):
        return a @ b if b.dim() == 2 else torch.einsum("be,bec->bc", a, b)
    return _summed_products(a, b) if b.dim() == 2 else _summed_products(a.unsqueeze(1), b).squeeze(1)


def batched_product(a: Tensor, b: Tensor) -> Tensor:
    """``a [B, n, k] @ b [B, k, m]`` for small matrices (a cell times its displacement): where :func:`no_cublas`,
    as broadcast products summed in order, else ``torch.matmul``."""
    return _summed_products(a, b) if no_cublas(a) else torch.matmul(a, b)


def _summed_products(a: Tensor, b: Tensor) -> Tensor:
    """``a [..., n, k] @ b [..., k, m]`` as k broadcast products summed in order (elementwise kernels only)."""
    out = None
    for j in range(a.shape[-1]):
        term = a[..., j:j + 1] * b[..., j:j + 1, :]
        out = term if out is None else out + term
    return out


def _weight_matrix(ws: Tensor, ins) -> Tensor:
    return ws.narrow(0, ins.offset, ins.mul_in * ins.mul_out).view(ins.mul_in, ins.mul_out)


def apply_map(problem: LinearProblem, x: Tensor, ws: Tensor, transpose: bool) -> Tensor:
    """``y = L x`` (``[N, dim_in] -> [N, dim_out]``) or, with ``transpose``, ``L^T x`` (``dim_out -> dim_in``), for
    the scaled flat weights ``ws``. Not differentiable by itself: :class:`_LinearMap` is."""
    if _kernel_applies(x, ws):
        return _apply_map_kernel(problem, x, ws, transpose)
    src, dst = (problem.blocks_out, problem.blocks_in) if transpose else (problem.blocks_in, problem.blocks_out)
    n = x.shape[0]
    blocks = x.split([m * d for m, d in src], dim=-1)
    # Plain tensors: each product lands in its slice of one output, whereas joining the blocks by a cat kept them
    # and their join alive together (the backward of MACE's linear after the convolution: 2 x 164 MB at 8000
    # atoms, the ASE call's peak). functorch's wrapped tensors (MACE's vmap over autograd.grad) take the cat.
    into = len(dst) > 1 and backends.plain_tensors(x, ws)
    out = x.new_empty(n, sum(m * d for m, d in dst)) if into else None
    starts = _starts(dst)
    acc: list = [None] * len(dst)
    for ins in problem.instructions:
        i_src, i_dst = (ins.i_out, ins.i_in) if transpose else (ins.i_in, ins.i_out)
        w = _weight_matrix(ws, ins)
        m = w if transpose else w.t()  # [rows of dst block, rows of src block]
        mul_src, d = src[i_src]
        if d == 1:
            y = (blocks[i_src] @ m.t()).unsqueeze(-1)
        elif n * mul_src * d < GEMM_MIN_ELEMENTS:  # the weight broadcast over the nodes: batched
            y = torch.bmm(m.expand(n, *m.shape), blocks[i_src].reshape(n, mul_src, d))
        else:  # one tall product over (node, component) rows: the block transposed once, the result back once
            rows = blocks[i_src].reshape(n, mul_src, d).transpose(1, 2).reshape(n * d, mul_src)
            y = (rows @ m.t()).view(n, d, -1).transpose(1, 2)
        # y: [n, mul_dst, d]
        if into:
            part = out.narrow(1, starts[i_dst], y.shape[1] * d).view(n, y.shape[1], d)
            if acc[i_dst]:
                part.add_(y)
            else:
                part.copy_(y)
            acc[i_dst] = True
        else:
            y = y.reshape(n, -1)
            acc[i_dst] = y if acc[i_dst] is None else acc[i_dst] + y
        # this product's temporaries freed before the next one's are made: held by these names, a large block's
        # transposed copy and product (28.7 MB each for MACE-MP-0 medium's l=3 block at 8000 atoms) stayed alive
        # beside the next block's, at the ASE call's peak (the backward of the linear after the convolution)
        y = rows = None
    if into:
        _zero_unwritten(out, dst, starts, acc)
        return out
    parts = [a if a is not None else x.new_zeros(n, m * d) for a, (m, d) in zip(acc, dst)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _starts(blocks) -> list[int]:
    """Each block's first column in a row of ``blocks`` (``(mul, d)`` pairs)."""
    return [sum(m * d for m, d in blocks[:i]) for i in range(len(blocks))]


def _zero_unwritten(out: Tensor, blocks, starts, written) -> None:
    for i, (mul, d) in enumerate(blocks):
        if not written[i]:
            out.narrow(1, starts[i], mul * d).zero_()


def _apply_map_kernel(problem: LinearProblem, x: Tensor, ws: Tensor, transpose: bool) -> Tensor:
    """:func:`apply_map` on CUDA: one block kernel per instruction, reading the input block and writing (or adding
    into) the output block in place; no transposed copies, no cuBLAS."""
    src, dst = (problem.blocks_out, problem.blocks_in) if transpose else (problem.blocks_in, problem.blocks_out)
    x = x.contiguous()
    out = _runtime().output(x.shape[0], sum(m * d for m, d in dst), x)
    src_starts, dst_starts = _starts(src), _starts(dst)
    done = [False] * len(dst)
    for ins in problem.instructions:
        i_src, i_dst = (ins.i_out, ins.i_in) if transpose else (ins.i_in, ins.i_out)
        w = _weight_matrix(ws, ins)  # [mul_in, mul_out]: the map's B, its transpose the transposed map's
        (mul_src, d), (mul_dst, _) = src[i_src], dst[i_dst]
        _runtime().block_product(x.narrow(1, src_starts[i_src], mul_src * d), w.t() if transpose else w,
                                 out.narrow(1, dst_starts[i_dst], mul_dst * d), d, accumulate=done[i_dst])
        done[i_dst] = True
    _zero_unwritten(out, dst, dst_starts, done)
    return out


def weight_gradient(problem: LinearProblem, x_in: Tensor, g_out: Tensor) -> Tensor:
    """d<g_out, L x_in>/d ws: per instruction ``sum_{n,i} x_in[n, i_in][u, i] g_out[n, i_out][w, i]``, flat."""
    n = x_in.shape[0]
    xs = x_in.split(list(problem.dims_in), dim=-1)
    gs = g_out.split(list(problem.dims_out), dim=-1)
    parts = []
    for ins in problem.instructions:
        d = problem.blocks_in[ins.i_in][1]
        xb = xs[ins.i_in].reshape(n, ins.mul_in, d).transpose(0, 1).reshape(ins.mul_in, n * d)
        gb = gs[ins.i_out].reshape(n, ins.mul_out, d).transpose(0, 1).reshape(ins.mul_out, n * d)
        parts.append((xb @ gb.t()).reshape(-1))
    return torch.cat(parts) if parts else x_in.new_zeros(0)


class _LinearMap(torch.autograd.Function):
    """``L x`` or ``L^T x`` for scaled flat weights ``ws``; derivatives by the transposed map and
    :func:`weight_gradient`, themselves differentiable; torch operations only, so functorch transforms (MACE's
    vmap over autograd.grad for dipole derivatives) batch it as they batch those."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, ws, problem, transpose):
        return apply_map(problem, x, ws, transpose)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ws, problem, transpose = inputs
        # x serves only the weights' gradient: not kept when the weights need none (an evaluation for forces with
        # frozen parameters: x may be a convolution's whole output)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, ws)
        ctx.problem, ctx.transpose = problem, transpose

    @staticmethod
    def backward(ctx, g):
        x, ws = ctx.saved_tensors
        grad_x = grad_ws = None
        if wanted(ctx, 0, x):  # forces skip the species embedding's linears (parameters only, trainable or not)
            grad_x = _LinearMap.apply(g, ws, ctx.problem, not ctx.transpose)
        if wanted(ctx, 1, ws):  # not for forces; <g, L x> is bilinear in (input side, output side), either map
            grad_ws = (weight_gradient(ctx.problem, g, x) if ctx.transpose
                       else weight_gradient(ctx.problem, x, g))
        return grad_x, grad_ws, None, None


def linear(x: Tensor, weight: Tensor, scale: Tensor, problem: LinearProblem) -> Tensor:
    """e3nn's ``Linear`` of ``x`` (``[..., dim_in]``) with the flat ``weight`` and the per-weight path weights
    ``scale`` (same length)."""
    lead = x.shape[:-1]
    y = _LinearMap.apply(x.reshape(-1, x.shape[-1]), weight * scale, problem, False)
    return y.reshape(*lead, y.shape[-1])
