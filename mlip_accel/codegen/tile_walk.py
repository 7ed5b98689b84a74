"""The convolution's backward by sender over tiles (``KernelSpec.sender_tiles``; templates/walk_tiles.cu).

The walk by sender gathers each edge's grad_z row (the receiver's) from L2: for MACE-sized problems ~3x the bytes
the memory roofline counts, and the walk is bound by L2 throughput and issue (benchmarks/first_use_22nd.md).
Neighbouring senders share most receivers (``scripts/sender_tiles.py``: tiles of 8 consecutive senders gather 0.24
distinct rows per edge). This walk gives each block a range of the sender order, sorts it by (group of
``sender_tiles`` senders, receiver) in shared memory, and loads a receiver's grad_z chunk into registers once for
the edges of the group that follow; the group's grad-x accumulators sit in shared memory instead of registers.

It is the looped walk (``chunk_loops``: one warp per 32-channel chunk, the block's warps its chunks, grad y summed
over them per batch of edges as the stacked walk sums it) with one phase, deterministic, untabulated; where a spec
asks for tiles elsewhere, :func:`tiles_apply` says no and generate() makes the ordinary walk.
"""
from __future__ import annotations

from .emit import Lines, template
from .schedule import WARP

# Edges per block: at most TILE_EDGES (its sort keys and ranks sit in shared memory; 11 bits of a key hold the
# position), at least TILE_MIN_EDGES, else about num_edges / TILE_BLOCKS blocks (fewer, longer blocks share more
# rows; more fill the GPU).
TILE_EDGES = 1024
TILE_MIN_EDGES = 128
TILE_BLOCKS = 2048
TILE_SHARED_BYTES = 48 * 1024  # static shared memory of one block
MAX_SENDERS = 64


def check_senders(k, what: str) -> int:
    """``k`` if it is a number of senders per tile (an integer 0..MAX_SENDERS, 0: no tiles), else a ValueError that
    starts with ``what`` (the spec field, the environment variable or the tuning call that was given it)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_SENDERS:
        raise ValueError(f"{what} must be an integer 0..{MAX_SENDERS} (0: no tiles), got {k!r}")
    return k


def edges_per_block_rule():
    """Edges per block of a tiled walk, as an expression of the scalars num_edges and tile_blocks (the sequence's
    tunable :data:`TILE_BLOCKS`: benchmarks sweep it without touching the other walks' edges per warp)."""
    return ("max", TILE_MIN_EDGES, ("min", TILE_EDGES, ("cdiv", "num_edges", "tile_blocks")))


def shared_bytes(spec, acc: int, blocks: int) -> int:
    """Static shared memory of a tiled walk: sort keys, ranks and first positions, the accumulators, grad y's
    stack."""
    scalar = 4 if spec.dtype == "float32" else 8
    gy = blocks * WARP * spec.problem.dim_in2 * scalar if spec.need[1] else 0
    return TILE_EDGES * (8 + 2 + 2) + 32 * 4 + blocks * spec.sender_tiles * acc * WARP * scalar + gy


def tiles_apply(spec, schedule, blocks: int) -> bool:
    """Whether a spec asking for ``sender_tiles`` gets the tiled walk: the deterministic convolution's backward with
    grad x, chunk loops, one phase (one program: nothing to split), no table, no harmonics in the walk, within the
    shared memory."""
    if not spec.sender_tiles:
        return False
    if not (spec.direction == "backward" and spec.variant == "det" and spec.need[0] and spec.chunk_loops
            and not spec.tabulated and spec.harmonics is None and len(schedule.phases) == 1):
        return False
    if blocks * WARP > 1024:
        return False
    return shared_bytes(spec, schedule.phases[0].acc_per_lane, blocks) <= TILE_SHARED_BYTES


def emitter_class(base):
    """The phase emitter of a tiled walk, over the tensor-product family's (``base``): grad_z operands from the
    registers the receiver's row was loaded into, grad y into the block's stack, no hints of grad_z rows."""

    class TileEmitter(base):
        def out_irreps(self) -> list[int]:
            """The output irreps this phase's paths read grad_z of, in order."""
            return sorted({path.i_out for path, _ in self.work})

        def g_name(self, i: int, c: int, k: int) -> str:
            return f"G{i}_{k}" if self.spec.chunk_span == 1 else f"G{i}_{c}_{k}"

        def out_chunks(self, i: int) -> range:
            """The chunks of output irrep ``i`` a warp holds (``chunk_span`` of them, fewer for a narrow irrep)."""
            return range(min(self.spec.chunk_span, -(-self.p.irreps_out[i][0] // WARP)))

        def lane_setup(self, L: Lines, seg):
            self.chunk = seg.chunk  # the chunk whose grad_z registers g_operands reads next
            return super().lane_setup(L, seg)

        def g_operands(self, L: Lines, path, u: str, ok: str | None):
            l3 = self.p.irreps_out[path.i_out][1]
            for k in range(2 * l3 + 1):
                L(f"const T g{k} = {self.g_name(path.i_out, self.chunk, k)};")

        def g_decl(self, L: Lines) -> None:
            for i in self.out_irreps():
                l3 = self.p.irreps_out[i][1]
                for c in self.out_chunks(i):
                    L(f"T {', '.join(f'{self.g_name(i, c, k)} = T(0)' for k in range(2 * l3 + 1))};")

        def g_loads(self, L: Lines) -> None:
            from .tensor_product import _guarded, _node_addr, looped_lane

            L("const T* gr = gz + other * D_OUT;")
            for i in self.out_irreps():
                mul3, l3, _ = self.p.irreps_out[i]
                for c in self.out_chunks(i):
                    u, ok = looped_lane(mul3, c, self.spec.chunk_span, self.blocks)
                    for k in range(2 * l3 + 1):
                        addr = _node_addr("gr", self.p.offsets_out[i], mul3, 2 * l3 + 1, u, k, self.gz_layout)
                        L(f"{self.g_name(i, c, k)} = {_guarded(ok, 'ld_keep(' + addr + ')')};")

        def gy_base(self) -> str:
            return "gy_stack + (by * 32 + b) * GY_WIDTH"

        def gy_adds(self) -> str | None:
            return None

        def prefetch_runs(self):
            return [r for r in super().prefetch_runs() if not r.row.startswith("gz")]

        def columns(self) -> list[tuple[int, int]]:
            """(segment, first column in the lane's accumulator slots) of this phase's segments."""
            out, col = [], 0
            for n, s in enumerate(self.phase.segments):
                out.append((n, col))
                col += s.width
            return out

        def edge(self, L: Lines) -> None:
            """One edge: the backward body into per-edge registers, then added to the sender's slots."""
            with L.block(""):
                self.acc_decl(L)
                self.backward_body(L)
                for n, col in self.columns():
                    width = self.phase.segments[n].width
                    L(" ".join(f"ta[{(col + k) * WARP}] += acc{n}_{k};" for k in range(width)))

        def tile_flush(self, L: Lines) -> None:
            """The group's senders' accumulators to their rows (rank 0: the fixup slot)."""
            from .tensor_product import _node_addr

            with L.block("for (int j = 0; j < TILE_SENDERS; ++j)"):
                L("const int r = group * TILE_SENDERS + j;")
                L("if (r >= senders) break;")
                L("T* dst = r == 0 ? fixup + warp * D_ACC : acc_out + keys[order[q0 + first_of[r]]] * D_ACC;")
                L(f"const T* ts = ta0 + j * ACC * {WARP};")
                for n, col in self.columns():
                    s = self.phase.segments[n]
                    mul = self.acc_irreps[s.irrep][0]
                    u, ok = self.lane(s)
                    stores = [f"*({_node_addr('dst', self.acc_offsets[s.irrep], mul, s.width, u, k, 'mul_ir')}) = "
                              f"ts[{(col + k) * WARP}];" for k in range(s.width)]
                    if ok is None:
                        L(" ".join(stores))
                    else:
                        L(f"if ({ok}) {{ {' '.join(stores)} }}")

    return TileEmitter


def gy_sum(spec) -> tuple[str, str]:
    """grad y's stack and its sum after each batch (nothing without grad y)."""
    if not spec.need[1]:
        return "", ""
    decl = "  __shared__ T gy_stack[BLOCKS * 32 * GY_WIDTH];  // each warp's grad y of the batch's edges"
    total = "\n".join((
        "    // the warps' grad y of each edge of the batch summed in warp order (the stacked walk's sum), written",
        "    // once",
        "    __syncthreads();",
        "    for (int i = threadIdx.x; i < nb * GY_WIDTH; i += blockDim.x) {",
        "      const int t = i / GY_WIDTH;",
        "      const long long e = order[q0 + (long long)(sorted[qb + t] & ((1ull << POS_BITS) - 1))];",
        "      T acc = gy_stack[i];",
        "      for (int c = 1; c < BLOCKS; ++c) acc += gy_stack[c * 32 * GY_WIDTH + i];",
        "      gy_out[e * GY_WIDTH + i % GY_WIDTH] = acc;",
        "    }",
        "    __syncthreads();  // the next batch writes the stack again"))
    return decl, total


def walk_source(emitter, *, title: str, problem: str, schedule: str, prelude: str, plan, acc_width: int) -> str:
    """The tiled walk's kernel (templates/walk_tiles.cu) around ``emitter``'s phase."""
    from .tensor_product import walk_bounds, walk_dims

    spec, p = emitter.spec, emitter.p
    g_decl, g_loads, body, flush = Lines(1), Lines(4), Lines(3), Lines(5)
    emitter.g_decl(g_decl)
    emitter.g_loads(g_loads)
    emitter.edge(body)
    emitter.tile_flush(flush)
    stack_decl, stack_sum = gy_sum(spec)
    return template("walk_tiles.cu").substitute(
        title=title, problem=problem, schedule=schedule, prelude=prelude, dims=walk_dims(p, acc_width),
        tile_senders=spec.sender_tiles, warp_channels=WARP * spec.chunk_span,
        tile_edges=TILE_EDGES, blocks=emitter.blocks, acc=emitter.phase.acc_per_lane, gy_width=p.dim_in2,
        block_threads=plan.grid.block_threads, kernel=plan.kernel, parameters=plan.parameters(),
        gy_stack_decl=stack_decl, g_decl=g_decl.text(), prefetch=emitter.prefetch_text(), flush=flush.text(),
        g_loads=g_loads.text(), body=body.text(), gy_sum=stack_sum, walk_bounds=walk_bounds())
