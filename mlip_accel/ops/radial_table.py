"""A radial network tabulated by edge length, checked to be as accurate as the network run in the model's dtype.

A convolution's per-edge weights ``W = MLP(embedding(r))`` depend on the edge length ``r`` alone (when the
radial network reads nothing else). :func:`build_table` tabulates ``r -> W`` on ``[0, r_max]`` as cubic Hermite
polynomials through the exact values and derivatives (evaluated in float64 at the knots, the derivatives by
forward-mode autograd), then checks the table where a cubic Hermite interpolant errs most (the middle of each
interval for values, ``t = 1/2 -+ 1/(2 sqrt 3)`` for derivatives) against the float64 network, next to the same
network evaluated in the lookup dtype (what the model computes without the table). The table is accepted only
when, output by output, its largest error relative to that output's scale is at most ``ACCURACY_FACTOR`` times
the network's own rounding error in that dtype for that output, or ``FLOORS`` (values and derivatives alike): one
ill-conditioned output does not license a coarse table for the others. The intervals are doubled until it is, up
to ``MAX_INTERVALS``, else :class:`TableRefused` says why.

:func:`table_lookup` (``[E] lengths -> [E, n]``) is one memory-bound pass instead of the network's products; its
backward (forces) is ``sum_j grad W_j dW_j/dr``, one more pass. Anything else (the network's parameter gradients,
a second derivative) is taken through the exact network (``exact``, recomputed from the lengths in that
backward), so training and Hessians get the network's own derivatives, never the table's. A table whose
network's parameter gradients were taken (a training step in eval mode, where the tables apply: the forward
through the table is then wasted work) says so once (:class:`TableInTrainingWarning`), and its
:class:`TableCache` stops offering it while the parameters require grad under autograd (:meth:`TableCache.offers`).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from typing import Callable

import torch
from torch import Tensor

from ..reference import radial_table as reference
from . import backends
from .gradients import wanted

FIRST_INTERVALS = 128
MAX_INTERVALS = 4096
ACCURACY_FACTOR = 2.0
# Relative error floors (the accepted error is never asked below these): a network whose float32 evaluation
# happens to be nearly exact at the check points does not force the table to beat float32 rounding.
FLOORS = {torch.float32: (2.0 ** -23, 2.0 ** -21), torch.float64: (2.0 ** -50, 2.0 ** -48)}
_CHECK_T = (0.5 - 0.5 / math.sqrt(3.0), 0.5, 0.5 + 0.5 / math.sqrt(3.0))


class TableRefused(ValueError):
    """The network could not be tabulated to its own accuracy (the exact network then runs)."""


@dataclasses.dataclass
class RadialTable:
    # [intervals, 4, n] in the lookup dtype (reference.radial_table), a view of [intervals, n, 4] storage: the
    # convolution's walks read a weight's four coefficients side by side (ops.tabulated_conv) from this very
    # storage, so a table is held once (a second layout kept beside it was 29 MB for MACE-MP-0-medium)
    coeffs: Tensor
    r_max: float
    value_error: float  # the table's largest relative error at the check points (values)
    derivative_error: float  # the same for d/dr
    network_value_error: float  # the network's own error in the lookup dtype, same points
    network_derivative_error: float

    @property
    def r_max_tensor(self) -> Tensor:
        """``r_max`` as a one-element tensor beside the coefficients (what the kernels read)."""
        cached = self.__dict__.get("_r_max_tensor")
        if cached is None:
            cached = self.__dict__["_r_max_tensor"] = torch.tensor([self.r_max], dtype=self.coeffs.dtype,
                                                                   device=self.coeffs.device)
        return cached

    def rows(self) -> Tensor:
        """``coeffs`` contiguous, as the unfused lookup kernels read it (runtime.radial_table); made at their first
        call and kept beside the table (the walks, which read the table themselves, never ask)."""
        cached = self.__dict__.get("_rows")
        if cached is None:
            cached = self.__dict__["_rows"] = self.coeffs.contiguous()
        return cached

    @property
    def intervals(self) -> int:
        return self.coeffs.shape[0]

    @property
    def outputs(self) -> int:
        return self.coeffs.shape[2]

    def describe(self) -> str:
        return (f"{self.intervals} intervals x {self.outputs} outputs on [0, {self.r_max:g}]: error "
                f"{self.value_error:.1e} (values) / {self.derivative_error:.1e} (d/dr), the network's own "
                f"{self.network_value_error:.1e} / {self.network_derivative_error:.1e}")


def _values_and_derivatives(fn: Callable[[Tensor], Tensor], r: Tensor) -> tuple[Tensor, Tensor]:
    with torch.enable_grad():
        return torch.func.jvp(fn, (r,), (torch.ones_like(r),))


# Values per tensor in one chunk of the accuracy check (8 MB in float64): the check's temporaries, left cached in
# torch's allocator, once held 0.3-0.5 GB of device memory after a MACE-MP-0-medium-size table was built.
CHECK_CHUNK_VALUES = 1 << 20


def _check_errors(network, coeffs: Tensor, h: float, r_max: float, dtype) -> tuple[Tensor, ...]:
    """Per output, over the check points of every interval (:data:`_CHECK_T`): the table's and the network's (run
    in ``dtype``) largest errors in values and d/dr, each relative to that output's largest exact value (float64).
    The points go in chunks of about :data:`CHECK_CHUNK_VALUES` values per tensor; the maxima are those of the
    whole set (a largest quotient by a positive per-output scale is the largest error over that scale)."""
    intervals, n = coeffs.shape[0], coeffs.shape[2]
    t = torch.tensor(_CHECK_T, dtype=torch.float64, device=coeffs.device)
    step = max(1, CHECK_CHUNK_VALUES // (len(_CHECK_T) * n))
    most = torch.zeros(6, n, dtype=torch.float64, device=coeffs.device)  # |table|, |own| (v, d), |exact| (v, d)
    for start in range(0, intervals, step):
        first = torch.arange(start, min(start + step, intervals), dtype=torch.float64, device=coeffs.device)
        points = ((first.unsqueeze(-1) + t) * h).reshape(-1)
        exact_v, exact_d = _values_and_derivatives(network, points)
        own_v, own_d = _values_and_derivatives(network, points.to(dtype))
        table_v = reference.lookup(coeffs, points.to(dtype), r_max)
        table_d = reference.lookup_derivative(coeffs, points.to(dtype), r_max)
        for row, (value, exact) in enumerate(((table_v, exact_v), (table_d, exact_d), (own_v, exact_v),
                                              (own_d, exact_d), (exact_v, None), (exact_d, None))):
            err = value.double().abs() if exact is None else (value.double() - exact).abs()
            torch.maximum(most[row], err.amax(0), out=most[row])
    scale = most[4:].clamp_min(torch.finfo(torch.float64).tiny)
    return most[0] / scale[0], most[1] / scale[1], most[2] / scale[0], most[3] / scale[1]


def _coefficients(network, intervals: int, h: float, device) -> Tensor:
    """``[intervals, 4, n]`` float64: Hermite cubics through the knots' values and derivatives, except the first
    interval. Radial embeddings divide by r (``sin(w r) / r``): their derivative near r = 0 cancels
    catastrophically, so the first interval's cubic is fixed by values only there: the value at (just above) 0
    and at h / 2, the value and derivative at h (C1 with the next interval)."""
    knots = torch.arange(intervals + 1, dtype=torch.float64, device=device) * h
    knots[0] = h * 1e-6  # the value differs from the limit at 0 by O(r^2)
    v, d = _values_and_derivatives(network, knots)
    coeffs = reference.hermite_coefficients(v, d, h)
    with torch.no_grad():
        mid = network(torch.tensor([0.5 * h], dtype=torch.float64, device=device))[0]
    a, b, c = v[1] - v[0], h * d[1], mid - v[0]
    c3 = 2 * b - 6 * a + 8 * c
    c2 = b - a - 2 * c3
    coeffs[0] = torch.stack((v[0], a - c2 - c3, c2, c3))
    return coeffs


def build_table(network: Callable[[Tensor], Tensor], r_max: float, dtype: torch.dtype, device,
                first_intervals: int = FIRST_INTERVALS, max_intervals: int = MAX_INTERVALS) -> RadialTable:
    """Tabulate ``network`` (``r [m] -> W [m, n]`` in the dtype of ``r``, plain differentiable torch operations)
    on ``[0, r_max]`` for lookups in ``dtype``; :class:`TableRefused` when no table up to ``max_intervals``
    intervals is as accurate as ``network`` evaluated in ``dtype``."""
    r_max = float(r_max)
    if not (math.isfinite(r_max) and r_max > 0):
        raise TableRefused(f"r_max must be a positive number, got {r_max}")
    floor_v, floor_d = FLOORS[dtype]
    intervals = first_intervals
    last = None
    while intervals <= max_intervals:
        h = r_max / intervals
        coeffs = _coefficients(network, intervals, h, device).to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
        table_v, table_d, own_v, own_d = _check_errors(network, coeffs, h, r_max, dtype)
        errs = [float(e.max()) for e in (table_v, table_d, own_v, own_d)]
        if not all(math.isfinite(e) for e in errs):
            raise TableRefused("the network is not finite on [0, r_max]")
        last = RadialTable(coeffs, r_max, *errs)
        # output by output: a well-conditioned output (small own error) asks as much of its table
        if bool((table_v <= torch.clamp(ACCURACY_FACTOR * own_v, min=floor_v)).all()
                and (table_d <= torch.clamp(ACCURACY_FACTOR * own_d, min=floor_d)).all()):
            return last
        intervals *= 2
    raise TableRefused(f"{max_intervals} intervals are not enough for the network's own accuracy "
                       f"({last.describe() if last is not None else 'no table'})")


TABLE_OPTIONS = ("auto", True, False)


def check_table_option(option) -> None:
    if not any(option is o or (isinstance(option, str) and option == o) for o in TABLE_OPTIONS):
        raise ValueError(f"radial_table must be one of {TABLE_OPTIONS}, got {option!r}")


def table_applies(option, training: bool, x: Tensor, tables: TableCache | None = None, params=()) -> bool:
    """Whether a radial network asked to tabulate with ``option`` reads its table for input ``x``: inference only
    (not in training mode, nor while ``tables``, the network's cache, declines for its trainable ``params``:
    :meth:`TableCache.offers`); "auto" on CUDA in float32 (float64 stays exact: no table matches its rounding), True
    wherever the table is accurate enough, False never."""
    if option is False or training or torch.compiler.is_compiling():
        return False
    if tables is not None and not tables.offers(params):
        return False
    return option is True or (x.is_cuda and x.dtype == torch.float32)


class TableInTrainingWarning(UserWarning):
    """A backward took a radial network's parameter gradients through its table: a training step with the model in
    eval mode (the tables apply in eval mode only)."""


TRAINING_IN_EVAL_MODE = (
    "a training step took a radial network's parameter gradients through its radial table (the model is in eval "
    "mode, where the tables apply): the forward read the table and the backward recomputed the network exactly. "
    "The results are right; from the next step on this network runs without its table while its parameters "
    "require grad under autograd (measured: MACE-MP-0-medium, 8000 atoms, fp32, H200: the training step 211 ms "
    "with the table, 147 ms without). Calling model.train() before training avoids the first such step (MACE's "
    "and NequIP's training loops leave the model in training mode); radial_table=False turns the tables off.")


def parameter_gradients_taken(table) -> None:
    """Called by a backward that takes the network's parameter gradients through ``table`` (ops.tabulated_conv,
    :func:`table_lookup`): warns, and tells the table's :class:`TableCache` (if any) to stop offering it while the
    parameters are being trained."""
    owner = table.__dict__.get("_cache")
    cache = owner() if owner is not None else None
    if cache is not None and cache.trained:
        return  # said already (the fused convolution's backward, then its unfused recomputation's lookup)
    warnings.warn(TRAINING_IN_EVAL_MODE, TableInTrainingWarning, stacklevel=3)
    if cache is not None:
        cache.trained = True


class TableCache:
    """The table of one radial network, rebuilt when a tensor it was made from changes (the optimizer's and
    ``load_state_dict``'s in-place updates bump ``_version``); a refusal is kept too (warned once, not retried).
    Not state: a copy or pickle of its module starts empty."""

    def __init__(self):
        self._key, self._entry = None, None
        # set by a backward that took the network's parameter gradients through the table (a training step in
        # eval mode): the network then runs itself while its parameters require grad (offers)
        self.trained = False

    def __getstate__(self):
        return {"_key": None, "_entry": None, "trained": False}

    def __setstate__(self, state):
        self.__dict__.update({"trained": False, **state})

    def offers(self, params) -> bool:
        """Whether the table should be read for this call: not once its parameter gradients have been taken while
        autograd records and one of ``params`` (the network's trainable tensors) requires grad (training in eval
        mode: the network runs itself, as in training mode); forces on frozen or trained parameters still read it.
        Host-only (no device sync)."""
        return not (self.trained and torch.is_grad_enabled() and any(p.requires_grad for p in params))

    def __deepcopy__(self, memo):
        return TableCache()

    @property
    def entry(self):
        """The last table built (or the refusal), None before the first."""
        return self._entry

    def get(self, network: Callable[[Tensor], Tensor], sources, r_max, dtype, device, what: str,
            constants: tuple = ()):
        """The table of ``network`` on ``[0, r_max]`` for ``dtype`` on ``device``, or None where it was refused;
        ``sources``: every tensor the network reads (``r_max`` too where it is a tensor), ``constants``: every other
        number it depends on. Reads no tensor's value unless it builds: a call inside a CUDA-graph capture (or any
        call) must not synchronise with the device."""
        key = (dtype, device, tuple(constants), tuple((t.data_ptr(), t._version) for t in sources))
        if not isinstance(r_max, Tensor):
            key += (float(r_max),)
        if key != self._key:
            try:
                self._entry = build_table(network, float(r_max), dtype, device)
                self._entry.__dict__["_cache"] = weakref.ref(self)  # for parameter_gradients_taken
            except TableRefused as refusal:
                warnings.warn(f"mlip_accel: {what} is not tabulated, it runs as a network: {refusal}", stacklevel=4)
                self._entry = refusal
            self._key = key
        return None if isinstance(self._entry, TableRefused) else self._entry


def _runtime():
    from ..runtime import radial_table as runtime  # imports no CuPy until a kernel is launched
    return runtime


class _TableLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lengths, table, kernel, exact, *params):
        ctx.table, ctx.kernel, ctx.exact = table, kernel, exact
        ctx.order = None
        if kernel:
            # warps take the edges sorted by length: neighbouring warps then read one interval's coefficients
            ctx.order = torch.argsort(lengths)
            out = _runtime().forward(table.rows(), table.r_max_tensor, lengths, ctx.order)
        else:
            out = reference.lookup(table.coeffs, lengths, table.r_max)
        ctx.save_for_backward(lengths, *params)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        lengths, *params = ctx.saved_tensors
        table = ctx.table
        want_params = [wanted(ctx, 4 + k, p) for k, p in enumerate(params)]
        want_r = wanted(ctx, 0, lengths)
        if any(want_params):
            parameter_gradients_taken(table)
        if torch.is_grad_enabled() or any(want_params):
            # a second derivative to come, or the network's parameter gradients: the exact network's own
            create_graph = torch.is_grad_enabled()
            with torch.enable_grad():
                # recorded for a second derivative: the lengths themselves, so that it reaches what they came from
                r = lengths if create_graph else lengths.detach().requires_grad_(want_r)
                out = ctx.exact(r)
                inputs = ([r] if want_r else []) + [p for p, w in zip(params, want_params) if w]
                grads = list(torch.autograd.grad(out, inputs, grad_out, create_graph=create_graph,
                                                 allow_unused=True))
            grad_r = grads.pop(0) if want_r else None
            grad_params = [grads.pop(0) if w else None for w in want_params]
            return (grad_r, None, None, None, *grad_params)
        grad_r = None
        if want_r:
            if ctx.kernel and backends.plain_tensors(lengths, grad_out):
                grad_r = _runtime().backward(table.rows(), table.r_max_tensor, lengths, ctx.order, grad_out)
            else:
                grad_r = reference.lookup_backward(table.coeffs, lengths, table.r_max, grad_out)
        return (grad_r, None, None, None, *([None] * len(params)))


def table_lookup(table: RadialTable, lengths: Tensor, exact: Callable[[Tensor], Tensor], params=(),
                 backend: str = "auto") -> Tensor:
    """``[E] -> [E, n]``: the tabulated network at ``lengths``. ``exact(lengths)`` is the network itself, in the
    lengths' dtype, reading ``params`` (its trainable tensors): the backward takes their gradients, and any
    second derivative, through it."""
    if lengths.dim() != 1 or lengths.dtype != table.coeffs.dtype or lengths.device != table.coeffs.device:
        raise ValueError(f"lengths must be a {table.coeffs.dtype} vector on {table.coeffs.device}, got "
                         f"{lengths.dtype} {tuple(lengths.shape)} on {lengths.device}")
    kernel = (backends.resolve(backend, lengths.device) == "cuda" and not torch.compiler.is_compiling()
              and backends.plain_tensors(lengths))
    return _TableLookup.apply(lengths, table, kernel, exact, *params)
