"""User-facing modules: drop-in replacements for e3nn's TensorProduct and its scatter-sum convolution."""
from __future__ import annotations

import torch
from torch import nn

from . import e3nn_api  # the rest of e3nn's TensorProduct interface (batch shapes, weight views, right)
from ..graph import EdgeGraph, check_edge_indices, edge_orders, sort_edges
from ..ops import backends
from ..ops import custom_ops  # noqa: F401  (registers torch.ops.mlip_accel)
from ..problem import TPProblem, build_e3nn_tp, from_e3nn, irreps_str, register_problem
from .validation import check_e3nn_tensor_product, check_flag, check_like_x, check_tensor, check_weights


class _TPBase(nn.Module):
    """Holds the problem description, the backend choice and (optionally) internal weights."""

    def __init__(self, irreps_in1, irreps_in2, irreps_out, instructions, shared_weights=False,
                 internal_weights=False, irrep_normalization=None, path_normalization=None, in1_var=None,
                 in2_var=None, out_var=None, backend="auto"):
        super().__init__()
        e3 = build_e3nn_tp(irreps_in1, irreps_in2, irreps_out, instructions, shared_weights=shared_weights,
                           internal_weights=internal_weights, irrep_normalization=irrep_normalization,
                           path_normalization=path_normalization, in1_var=in1_var, in2_var=in2_var,
                           out_var=out_var)
        self._setup(from_e3nn(e3), backend, getattr(e3, "weight", None) if internal_weights else None)

    @classmethod
    def from_e3nn(cls, e3nn_tp, backend: str = "auto", **kwargs):
        """Same tensor product (normalisation, weight layout, internal weights) as ``e3nn_tp``."""
        check_e3nn_tensor_product(e3nn_tp)
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        internal = getattr(e3nn_tp, "internal_weights", False) and e3nn_tp.weight_numel > 0
        self._setup(from_e3nn(e3nn_tp), backend, e3nn_tp.weight if internal else None, **kwargs)
        return self

    def _setup(self, problem: TPProblem, backend: str, internal_weight=None, **_):
        self.problem = problem
        self.backend = backends.check_backend_name(backend)
        self.problem_key = register_problem(problem)
        if internal_weight is not None:
            self.weight = nn.Parameter(internal_weight.detach().clone().reshape(-1))
        else:
            self.weight = None
        self.internal_weights = internal_weight is not None
        self.shared_weights = problem.shared_weights
        self.weight_numel = problem.weight_numel

    def __setstate__(self, state):  # unpickled models re-register their problem in this process
        super().__setstate__(state)
        self.problem_key = register_problem(self.problem)

    # e3nn-compatible descriptive attributes
    @property
    def irreps_in1(self):
        from ..problem.e3nn_compat import o3
        return o3().Irreps(irreps_str(self.problem.irreps_in1))

    @property
    def irreps_in2(self):
        from ..problem.e3nn_compat import o3
        return o3().Irreps(irreps_str(self.problem.irreps_in2))

    @property
    def irreps_out(self):
        from ..problem.e3nn_compat import o3
        return o3().Irreps(irreps_str(self.problem.irreps_out))

    def extra_repr(self) -> str:
        return f"{self.problem.describe()}, backend={self.backend!r}"

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        raise NotImplementedError(e3nn_api.SCRIPT_MESSAGE)

    def _weight(self, weight, x):
        if weight is None:
            if self.weight is not None:
                return self.weight
            if self.weight_numel == 0:
                return x.new_zeros(0 if self.shared_weights else (x.shape[0], 0))
            raise ValueError("weight is required: this tensor product has no internal weights")
        return weight  # as in e3nn, a weight given overrides the internal weights

    def _check_inputs(self, x, y, w, rows: int, rows_name: str, y_name: str = "y", x_rows_name: str = ""):
        p = self.problem
        check_tensor("x", x, dim=p.dim_in1, width=f"irreps_in1={irreps_str(p.irreps_in1)}", rows_name=x_rows_name)
        check_tensor(y_name, y, dim=p.dim_in2, width=f"irreps_in2={irreps_str(p.irreps_in2)}",
                     dtype=x.dtype, device=x.device, rows=rows, rows_name=rows_name)
        check_weights(p, w, rows=rows, rows_name=rows_name, dtype=x.dtype, device=x.device)


class TensorProduct(_TPBase):
    """``tp(x, y, weight=None)`` equal to e3nn's ``o3.TensorProduct(...)(x, y, weight)``.

    Any tensor product e3nn builds (every connection mode; FullyConnected-, Full-, Elementwise-
    TensorProduct; :class:`TensorSquare`) and any batch shape e3nn accepts: ``x`` ``(..., dim_in1)``,
    ``y`` ``(..., dim_in2)``, per-sample weights ``(..., weight_numel)``, leading dimensions broadcast.
    ``instructions``, ``weight_views()`` and ``right()`` behave as e3nn's.
    """

    @classmethod
    def from_e3nn(cls, e3nn_tp, backend: str = "auto", **kwargs):
        if cls is TensorProduct and isinstance(e3nn_tp, _e3nn_tensor_square()):
            cls = TensorSquare  # e3nn's TensorSquare is called with one input: so is ours
        return super(TensorProduct, cls).from_e3nn(e3nn_tp, backend=backend, **kwargs)

    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        p = self.problem
        w = self._weight(e3nn_api.join_weights(p, weight), x) if p.weight_numel else None
        checking = not torch.compiler.is_compiling()
        # flatten_batch checks each operand (a tensor, floating point, its width, the batch shapes); what is
        # left is one dtype and one device
        x2, y2, w2, batch = e3nn_api.flatten_batch(p, x, y, w, check=checking)
        if checking:
            check_like_x("y", y2, x.dtype, x.device)
            if p.weight_numel:
                check_like_x("weight", w2, x.dtype, x.device)
        # (the problem's cached sizes hold a lock torch.compile cannot trace: looked at in eager mode only)
        if checking and e3nn_api.runs_on_reference_only(p, x2.shape[0]):
            backend = "reference"
        else:
            backend = backends.resolve(self.backend, x.device, self.problem)
        out = torch.ops.mlip_accel.tp_forward(x2, y2, w2, self.problem_key, backend)
        return out if len(batch) == 1 else out.reshape(*batch, out.shape[-1])

    # --- the rest of e3nn's TensorProduct interface --------------------------------------------------
    @property
    def instructions(self) -> list:
        return e3nn_api.instructions(self.problem)

    def _e3nn_weight(self, weight):
        w = e3nn_api.join_weights(self.problem, weight)
        if w is None and self.weight is None:
            if self.weight_numel > 0:
                raise ValueError("weight is required: this tensor product has no internal weights")
            return torch.zeros(0)
        return self.weight if w is None else w

    def weight_views(self, weight: torch.Tensor | None = None, yield_instruction: bool = False):
        """Views of ``weight`` (or the internal weights) per weighted instruction, shaped ``path_shape``."""
        return e3nn_api.weight_views(self.problem, self._e3nn_weight(weight), yield_instruction)

    def weight_view_for_instruction(self, instruction: int, weight: torch.Tensor | None = None) -> torch.Tensor:
        if not self.problem.paths[instruction].has_weight:
            raise ValueError(f"Instruction {instruction} has no weights.")
        return next(v for n, _, v in e3nn_api.weight_views(self.problem, self._e3nn_weight(weight), True)
                    if n == instruction)

    def right(self, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The operator ``(..., dim_in1, dim_out)`` that maps x to ``tp(x, y, weight)`` (e3nn's ``right``)."""
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        eye = torch.eye(self.problem.dim_in1, dtype=y.dtype, device=y.device)
        w = e3nn_api.join_weights(self.problem, weight)
        if w is not None and not self.shared_weights and isinstance(w, torch.Tensor) and w.dim() > 0:
            w = w.unsqueeze(-2)
        return TensorProduct.forward(self, eye, y.unsqueeze(-2) if y.dim() > 0 else y, w)


def _e3nn_tensor_square():
    from ..problem.e3nn_compat import o3
    return o3().TensorSquare


class TensorSquare(TensorProduct):
    """``sq(x, weight=None)`` equal to e3nn's ``o3.TensorSquare(...)(x, weight)``: the tensor product of x
    with itself, its u < v channel pairs once (modes uvu<v / u<vw), as e3nn builds it."""

    def __init__(self, irreps_in, irreps_out=None, filter_ir_out=None, irrep_normalization=None,
                 backend: str = "auto", **kwargs):
        nn.Module.__init__(self)
        e3 = _e3nn_tensor_square()(irreps_in, irreps_out, filter_ir_out, irrep_normalization, **kwargs)
        internal = e3.internal_weights and e3.weight_numel > 0
        self._setup(from_e3nn(e3), backend, e3.weight if internal else None)

    @property
    def irreps_in(self):
        return self.irreps_in1

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:  # noqa: D102
        return super().forward(x, x, weight)


class TensorProductConv(_TPBase):
    """Fused tensor product + scatter-sum over edges.

    ``conv(x, y, w, edge_dst, edge_src, graph=None)`` equals
    ``scatter_sum(e3nn_tp(x[edge_src], y, w), edge_dst, dim_size=x.shape[0])`` without materialising the
    per-edge messages. ``deterministic=True`` uses edges sorted into CSR (``graph=sort_edges(...)``, made
    here when not given) so results are bitwise reproducible; ``False`` accumulates atomically, no sort.
    """

    def _setup(self, problem, backend, internal_weight=None, deterministic: bool = True, **_):
        super()._setup(problem, backend, internal_weight)
        self.deterministic = check_flag("deterministic", deterministic)

    def __init__(self, *args, deterministic: bool = True, **kwargs):
        check_flag("deterministic", deterministic)
        super().__init__(*args, **kwargs)
        self.deterministic = deterministic

    @classmethod
    def from_e3nn(cls, e3nn_tp, backend: str = "auto", deterministic: bool = True):
        return super().from_e3nn(e3nn_tp, backend=backend, deterministic=deterministic)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", deterministic={self.deterministic}"

    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None, edge_dst: torch.Tensor,
                edge_src: torch.Tensor, graph: EdgeGraph | None = None) -> torch.Tensor:
        w = self._weight(weight, y)
        g = self._edge_orders(x, y, w, edge_dst, edge_src, graph)
        backend = backends.resolve(self.backend, x.device, self.problem)
        return torch.ops.mlip_accel.conv_forward(x, y, w, edge_dst.long(), edge_src.long(), *g,
                                                 self.problem_key, backend)

    def forward_tabulated(self, x: torch.Tensor, y: torch.Tensor, table, lengths: torch.Tensor, exact,
                          params, edge_dst: torch.Tensor, edge_src: torch.Tensor,
                          graph: EdgeGraph | None = None, harmonics=None) -> torch.Tensor:
        """``self(x, y, W, edge_dst, edge_src, graph)`` with ``W = table_lookup(table, lengths, exact, params)``
        (ops.radial_table: a radial network tabulated by edge length; ``exact(lengths)`` the network itself,
        reading ``params``), where the CUDA kernels run read inside the walks: W and grad W are never stored
        (ops.tabulated_conv). Elsewhere (CPU, torch.compile, a problem the kernels do not implement) the lookup
        and the convolution run one after the other.

        ``harmonics`` (an :class:`~mlip_accel.problem.spherical_harmonics.SHProblem` whose output is
        irreps_in2): ``y`` is the edges' vectors ``[num_edges, 3]``, whose harmonics the walks evaluate
        themselves (Y and grad Y never stored); elsewhere ``ops.spherical_harmonics`` makes Y first."""
        from ..ops.radial_table import table_lookup
        from ..ops.tabulated_conv import TabulatedCall, packed_coefficients, tabulated_conv

        def unfused(x, y, lengths):
            if harmonics is not None:
                from ..ops.spherical_harmonics import spherical_harmonics
                y = spherical_harmonics(y, harmonics, self.backend)
            return self(x, y, table_lookup(table, lengths, exact, params, self.backend), edge_dst, edge_src,
                        graph=graph)

        if harmonics is not None:
            from ..codegen.tensor_product import check_harmonics
            check_harmonics(self.problem, harmonics)
            check_tensor("vectors", y, dim=3, width="3 (the edges' vectors)", dtype=x.dtype, device=x.device,
                         rows=edge_dst.shape[0], rows_name="num_edges")

        if not self.walks_tabulated(x, y, lengths):
            return unfused(x, y, lengths)
        perm, tperm = self._edge_orders(x, y, None, edge_dst, edge_src, graph, vectors=harmonics is not None)
        if lengths.dim() != 1 or lengths.shape[0] != y.shape[0]:
            raise ValueError(f"lengths must have shape (num_edges={y.shape[0]},), got {tuple(lengths.shape)}")
        check_like_x("lengths", lengths, x.dtype, x.device)
        if table.coeffs.dtype != x.dtype or table.coeffs.device != x.device or table.outputs != self.weight_numel:
            raise ValueError(f"the table ({table.outputs} outputs, {table.coeffs.dtype} on {table.coeffs.device}) "
                             f"does not give this convolution's {self.weight_numel} weights in {x.dtype} on "
                             f"{x.device}")
        packed_coefficients(table)  # made here, not inside a CUDA-graph capture's first backward
        call = TabulatedCall(self.problem, table, edge_dst.long(), edge_src.long(), perm, tperm, unfused, harmonics)
        return tabulated_conv(call, x, y, lengths.contiguous(), tuple(params))

    def walks_tabulated(self, x: torch.Tensor, y: torch.Tensor, lengths) -> bool:
        """Whether :meth:`forward_tabulated` reads the table inside the CUDA walks for these inputs (else it looks
        the table up and convolves, one after the other)."""
        return not (torch.compiler.is_compiling() or not isinstance(lengths, torch.Tensor) or x.device.type != "cuda"
                    or self.weight_numel == 0 or not backends.plain_tensors(x, y, lengths)
                    or backends.resolve(self.backend, x.device, self.problem) != "cuda")

    def takes_vectors(self, x: torch.Tensor, vectors: torch.Tensor, lengths, harmonics) -> bool:
        """Whether :meth:`forward_tabulated` with ``harmonics`` evaluates the harmonics of ``vectors`` inside its
        walks: they run, and this problem's irreps_in2 are those harmonics."""
        from ..codegen.tensor_product import harmonics_mismatch
        return harmonics_mismatch(self.problem, harmonics) is None and self.walks_tabulated(x, vectors, lengths)

    def _edge_orders(self, x, y, w, edge_dst, edge_src, graph, vectors: bool = False):
        """The inputs checked (``w`` None: a tabulated call, no W; ``vectors``: ``y`` holds the edges' vectors,
        checked by the caller) and the edge orders the walks follow (``(perm, transpose_perm)``, both None when the
        sum is atomic)."""
        num_nodes = x.shape[0]
        if not torch.compiler.is_compiling():
            for name, index in (("edge_dst", edge_dst), ("edge_src", edge_src)):
                if not isinstance(index, torch.Tensor):
                    raise TypeError(f"{name} must be a torch.Tensor, got {type(index).__name__}")
            if w is None:
                check_tensor("x", x, dim=self.problem.dim_in1, width=f"irreps_in1={irreps_str(self.problem.irreps_in1)}",
                             rows_name="num_nodes")
                if not vectors:
                    check_tensor("y", y, dim=self.problem.dim_in2,
                                 width=f"irreps_in2={irreps_str(self.problem.irreps_in2)}", dtype=x.dtype,
                                 device=x.device, rows=edge_dst.shape[0], rows_name="num_edges")
            else:
                self._check_inputs(x, y, w, rows=edge_dst.shape[0], rows_name="num_edges", x_rows_name="num_nodes")
            if not self.deterministic:
                check_edge_indices(edge_dst, edge_src, num_nodes, device=x.device)
            elif graph is None:
                # sort_edges below checks the indices themselves (one host sync, not two)
                if isinstance(edge_dst, torch.Tensor) and edge_dst.device != x.device:
                    raise ValueError(f"edge_dst is on {edge_dst.device} but the node features are on {x.device}")
            else:
                # indices in range and the graph sorted from exactly these edges, in one host sync; a stale
                # EdgeSortCache entry comes back sorted again
                graph = check_edge_indices(edge_dst, edge_src, num_nodes, device=x.device, graph=graph)
        if self.deterministic and graph is None:
            graph = sort_edges(edge_dst, edge_src, num_nodes)
        return edge_orders(graph if self.deterministic else None)
