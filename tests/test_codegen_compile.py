"""CI compile check (CPU only): every kernel family x dtype x problem of problems.json compiles with NVRTC
for sm_80 and sm_90 (the convolution's forward and backward walks also reading a radial table), the fused double backward's walks with every incoming gradient given and, on one problem,
with each subset of them, and there every family generated with chunk loops and with prefetch hints. NVRTC runs without a GPU; the disk
cache is bypassed (each case really compiles)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os

import pytest

from kernel_cases import bench_problem, bench_problem_specs, problems_json
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.runtime.backend import budget_for
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")

FAMILIES = [("forward", "tp"), ("backward", "tp"), ("forward", "det"), ("backward", "det"),
            ("forward", "atomic"), ("backward", "atomic"), ("double_forward", "det"), ("double_backward", "det"),
            ("double_forward", "atomic"), ("double_backward", "atomic")]
# the walks that read their weights from a radial table (KernelSpec.tabulated)
TABULATED = [("forward", "det"), ("backward", "det"), ("forward", "atomic"), ("backward", "atomic")]
# the double walks' subsets of given incoming gradients (ggx, ggy, ggw), compiled on one problem
GIVEN = [g for g in itertools.product((True, False), repeat=3) if any(g) and not all(g)]
GIVEN_PROBLEM = "mace-medium"
DTYPES = ["float32", "float64"]
ARCHS = ["sm_80", "sm_90"]
NAMES = [p["name"] for p in bench_problem_specs()]


def _compile(job):
    """Compile one (source, arch, name): (image bytes, error)."""
    from mlip_accel.runtime import compiler
    source, arch, name = job
    try:
        image = compiler._compile(source, (*compiler.BASE_OPTIONS, f"-arch={arch}"), "cubin", name)
        return len(image), None
    except Exception as err:  # reported by the test of this case
        return 0, str(err)[:4000]


def _compile_programs(job):
    """Compile each (source, name) of ``job``'s programs for its arch: (total image bytes, first error)."""
    programs, arch = job
    size = 0
    for source, name in programs:
        n, error = _compile((source, arch, name))
        if error is not None:
            return 0, f"{name}: {error}"
        size += n
    return size, None


def _walk(gm, arch):
    """The job of a generated module's walk: its programs (one, or a split walk's parts and fixup)."""
    return tuple((p.source, p.name) for p in gm.programs), arch


@pytest.fixture(scope="module")
def compiled():
    """All cases compiled once, in parallel over the CPU's cores: {(name, dtype, family, arch): (size, error)}."""
    jobs = {}
    for spec in bench_problem_specs():
        problem = bench_problem(spec)
        for dtype in DTYPES:
            for direction, variant in FAMILIES:
                gm = module_for(problem, dtype, direction, variant)  # what the runtime generates by default
                for arch in ARCHS:
                    jobs[(spec["name"], dtype, f"{direction}-{variant}", arch)] = _walk(gm, arch)
                for program in gm.sequence.programs:  # the steps around the walk: gathers, ordered sums
                    if program not in gm.programs:
                        for arch in ARCHS:
                            jobs[("steps", program.name, arch)] = ((program.source, program.name),), arch
            for direction, variant in TABULATED:
                if problem.weight_numel:
                    gm = module_for(problem, dtype, direction, variant, tabulated=True)
                    for arch in ARCHS:
                        jobs[(spec["name"], dtype, f"{direction}-{variant}-tab", arch)] = _walk(gm, arch)
            for direction, mode in itertools.product(("backward", "double_backward"), ("stacked", "in_place")):
                with tuning.grad_y_sum(mode):  # grad y summed without partials, where that applies
                    gm = module_for(problem, dtype, direction, "det")
                if gm.spec.grad_y_sum == mode:
                    for arch in ARCHS:
                        jobs[(spec["name"], dtype, f"{direction}-det-{mode}", arch)] = _walk(gm, arch)
            # the options off by default: the backward over tiles of senders (where it applies: MACE's looped
            # backward), the walks by sender contracting once (the double backward does by default), three chunks per
            # warp in the looped walks (partial blocks: 128 channels in blocks of 96) and tiles at two chunks per warp
            options = {"tiles": (lambda: tuning.sender_tiles(4), lambda spec: spec.sender_tiles),
                       "once": (tuning.contract_once, lambda spec: spec.contract_once),
                       "span": (lambda: tuning.chunk_span(3), lambda spec: spec.chunk_span == 3),
                       "tiles-span": (lambda: _both(tuning.sender_tiles(4), tuning.chunk_span(2)),
                                      lambda spec: spec.sender_tiles and spec.chunk_span == 2)}
            for key, (setting, applied) in options.items():
                with setting():
                    gm = module_for(problem, dtype, "backward", "det")
                if applied(gm.spec):
                    for arch in ARCHS:
                        jobs[(spec["name"], dtype, f"backward-det-{key}", arch)] = _walk(gm, arch)
            sh = _harmonics_of(problem)
            for direction in ("forward", "backward") if sh is not None and problem.weight_numel else ():
                gm = module_for(problem, dtype, direction, "det", tabulated=True, harmonics=sh)
                for arch in ARCHS:
                    jobs[(spec["name"], dtype, f"{direction}-sh", arch)] = _walk(gm, arch)
            if spec["name"] != GIVEN_PROBLEM:
                continue
            for direction, variant in FAMILIES:
                gm = generate(KernelSpec(problem, dtype, direction, variant, budget=budget_for(direction, dtype),
                                         chunk_loops=True))
                for arch in ARCHS:
                    jobs[(spec["name"], dtype, f"{direction}-{variant}-loops", arch)] = _walk(gm, arch)
                # with prefetch hints (KernelSpec.prefetch: inline PTX), unrolled and looped
                for level, loops in (("L2", False), ("L1", True)):
                    gm = generate(KernelSpec(problem, dtype, direction, variant, budget=budget_for(direction, dtype),
                                             chunk_loops=loops, prefetch=level))
                    for arch in ARCHS:
                        jobs[(spec["name"], dtype, f"{direction}-{variant}-pf{level}", arch)] = _walk(gm, arch)
            for direction, given in itertools.product(("double_forward", "double_backward"), GIVEN):
                gm = generate(KernelSpec(problem, dtype, direction, "det", given, budget_for(direction, dtype)))
                for arch in ARCHS:
                    jobs[(spec["name"], dtype, f"{direction}-{_given_id(given)}", arch)] = _walk(gm, arch)
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = pool.map(_compile_programs, jobs.values(), chunksize=1)
        return dict(zip(jobs, results))


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _harmonics_of(problem):
    """The harmonics (normalised, component) that are the problem's irreps_in2, or None: a walk that evaluates
    them itself (KernelSpec.harmonics) applies."""
    from mlip_accel.codegen.tensor_product import harmonics_mismatch
    from mlip_accel.problem.spherical_harmonics import SHProblem
    try:
        sh = SHProblem(tuple(l for _, l, *_ in problem.irreps_in2), True, "component")
    except ValueError:
        return None
    return None if harmonics_mismatch(problem, sh) else sh


def _given_id(given) -> str:
    return "gg" + "".join(n for n, f in zip("xyw", given) if f)


def test_problems_json_is_found():
    assert problems_json() is not None, "../shared/bench/problems.json (or benchmarks/problems.json) is missing"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", [f"{d}-{v}" for d, v in FAMILIES])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_compiles_with_nvrtc(compiled, name, dtype, family, arch):
    size, error = compiled[(name, dtype, family, arch)]
    assert error is None, error
    assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", [f"{d}-{v}-tab" for d, v in TABULATED] + ["forward-sh", "backward-sh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_tabulated_walks_compile_with_nvrtc(compiled, name, dtype, family, arch):
    """The walks that read a radial table (``-tab``), and those that also evaluate the edge harmonics themselves
    (``-sh``, KernelSpec.harmonics)."""
    key = (name, dtype, family, arch)
    if key not in compiled:
        pytest.skip(f"{name}: no per-edge weights to tabulate, or (-sh) irreps_in2 are not spherical harmonics")
    size, error = compiled[key]
    assert error is None, error
    assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", [f"{d}-{v}-pf{level}" for d, v in FAMILIES for level in ("L1", "L2")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefetch_hints_compile(compiled, dtype, family, arch):
    """The walks with prefetch hints (inline PTX ``prefetch.global.L1/L2``; L1 looped, L2 unrolled)."""
    if GIVEN_PROBLEM not in NAMES:
        pytest.skip(f"{GIVEN_PROBLEM} is not in problems.json")
    size, error = compiled[(GIVEN_PROBLEM, dtype, family, arch)]
    assert error is None, error
    assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["stacked", "in_place"])
def test_grad_y_sum_walks_compile(compiled, dtype, arch, mode):
    """The walks by sender summing grad y without partials (KernelSpec.grad_y_sum: stacked, a shared buffer and a
    barrier; in place, a y_block argument and a load-add-store), for every bench problem where the mode applies (at
    least the MACE problems' looped backward)."""
    cases = {k: v for k, v in compiled.items() if k[1:2] == (dtype,) and k[-2].endswith(f"-det-{mode}")
             and k[-1] == arch}
    assert any(k[0].startswith("mace") for k in cases), sorted(cases)
    for key, (size, error) in cases.items():
        assert error is None, f"{key}: {error}"
        assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", ["tiles", "once", "span", "tiles-span"])
def test_backward_options_compile(compiled, dtype, arch, option):
    """The backward's options off by default (KernelSpec.sender_tiles: shared-memory sort and accumulators, barriers;
    KernelSpec.contract_once; KernelSpec.chunk_span at three, and two with tiles) for every bench problem they apply to
    (at least mace-medium)."""
    cases = {k: v for k, v in compiled.items() if k[1:2] == (dtype,) and k[-2] == f"backward-det-{option}"
             and k[-1] == arch}
    assert any(k[0] == "mace-medium" for k in cases), sorted(cases)
    for key, (size, error) in cases.items():
        assert error is None, f"{key}: {error}"
        assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", [f"{d}-{v}" for d, v in FAMILIES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_loops_compile(compiled, dtype, family, arch):
    if GIVEN_PROBLEM not in NAMES:
        pytest.skip(f"{GIVEN_PROBLEM} is not in problems.json")
    size, error = compiled[(GIVEN_PROBLEM, dtype, f"{family}-loops", arch)]
    assert error is None, error
    assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("given", [_given_id(g) for g in GIVEN])
@pytest.mark.parametrize("direction", ["double_forward", "double_backward"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_double_walks_with_some_incoming_gradients_compile(compiled, dtype, direction, given, arch):
    if GIVEN_PROBLEM not in NAMES:
        pytest.skip(f"{GIVEN_PROBLEM} is not in problems.json")
    size, error = compiled[(GIVEN_PROBLEM, dtype, f"{direction}-{given}", arch)]
    assert error is None, error
    assert size > 0
def test_sequence_steps_compile_with_nvrtc(compiled):
    steps = {k: v for k, v in compiled.items() if k[0] == "steps"}
    assert any("gather" in k[1] for k in steps) and any("ordered_sum" in k[1] for k in steps)
    for key, (size, error) in steps.items():
        assert error is None and size > 0, f"{key}: {error}"


# --- symmetric-contraction family (MACE's product basis): problems read from MACE modules (MACE environment) ---

from symcon_cases import CASES as SYMCON_CASES, LARGE as SYMCON_LARGE  # noqa: E402

SYMCON_NAMES = [*SYMCON_CASES, *SYMCON_LARGE]
SYMCON_DIRECTIONS = ("forward", "backward", "backward_w", "double_backward", "weight_sum")


def _compile_symcon(job):
    import os

    os.environ["MLIP_ACCEL_CACHE_DIR"] = "off"  # each case really compiles
    from mlip_accel.runtime import compiler
    source, arch, name = job
    try:
        return len(compiler.compile_source(source, compiler.Target(f"-arch={arch}", "cubin"), name=name)), None
    except Exception as err:  # reported by the test of this case
        return 0, str(err)[:4000]


@pytest.fixture(scope="module")
def symcon_compiled():
    pytest.importorskip("mace", reason="symmetric-contraction problems are read from MACE modules")
    from symcon_cases import problem
    from mlip_accel.codegen.symmetric_contraction import SymconSpec, generate_symmetric_contraction

    jobs = {}
    for name in SYMCON_NAMES:
        p = problem(name)
        for dtype in DTYPES:
            for direction in SYMCON_DIRECTIONS:
                kernel = generate_symmetric_contraction(SymconSpec(p, dtype, direction))
                for arch in ARCHS:
                    jobs[(name, dtype, direction, arch)] = (kernel.source, arch, f"{kernel.plan.kernel}.cu")
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip(jobs, pool.map(_compile_symcon, jobs.values(), chunksize=1)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("direction", SYMCON_DIRECTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", SYMCON_NAMES)
def test_symmetric_contraction_compiles_with_nvrtc(symcon_compiled, name, dtype, direction, arch):
    size, error = symcon_compiled[(name, dtype, direction, arch)]
    assert error is None, error
    assert size > 0


# --- element-linear family (MACE's skip linear): MACE-MP-0-medium's irreps (l 0..3, 128 channels), an odd shape ---

ELEMENT_LINEAR_SHAPES = [(1, 128, 128), (3, 128, 128), (5, 128, 128), (7, 128, 128), (3, 33, 5)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_element_linear_compiles_with_nvrtc(dtype, arch):
    from mlip_accel.codegen.element_linear import (ElementLinearSpec, ElementWeightGradSpec, generate_element_linear,
                                                   generate_element_weight_grad)

    for rows, inner, cols in ELEMENT_LINEAR_SHAPES:
        for kernel in (generate_element_linear(ElementLinearSpec(rows, inner, cols, dtype)),
                       generate_element_weight_grad(ElementWeightGradSpec(rows, inner, cols, dtype))):
            size, error = _compile((kernel.source, arch, kernel.plan.kernel))
            assert error is None, error
            assert size > 0


# --- dense-linear family (e3nn's Linear on CUDA): MACE-MP-0-medium's blocks, NequIP's 32x, tails, accumulation ---

DENSE_LINEAR_SPECS = [(1, 128, 128, False), (3, 128, 128, True), (7, 128, 128, False), (3, 32, 96, False),
                      (5, 17, 70, True)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_linear_compiles_with_nvrtc(dtype, arch):
    from mlip_accel.codegen.dense_linear import ROW_TILES, DenseLinearSpec, generate_dense_linear

    for d, k, n, accumulate in DENSE_LINEAR_SPECS:
        for bm in ROW_TILES:
            kernel = generate_dense_linear(DenseLinearSpec(d, k, n, dtype, accumulate, bm))
            size, error = _compile((kernel.source, arch, kernel.plan.kernel))
            assert error is None, error
            assert size > 0


def _assert_program_compiles(program, arch: str) -> None:
    """Every kernel of a generated program compiles with NVRTC for ``arch`` to a non-empty image."""
    for plan in program.plans:
        size, error = _compile((program.source, arch, plan.kernel))
        assert error is None, error
        assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_kernels_compile_with_nvrtc(dtype, arch):
    from mlip_accel.codegen.activation import silu_program

    _assert_program_compiles(silu_program(dtype), arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ls, normalize, normalization", [((0, 1, 2, 3), True, "component"),
                                                          ((0, 1, 2, 3, 4), False, "integral"), ((1, 2), True, "norm")])
def test_spherical_harmonics_kernels_compile_with_nvrtc(dtype, arch, ls, normalize, normalization):
    from mlip_accel.codegen.spherical_harmonics import sh_program
    from mlip_accel.problem.spherical_harmonics import SHProblem

    _assert_program_compiles(sh_program(SHProblem(ls, normalize, normalization), dtype), arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_radial_basis_kernels_compile_with_nvrtc(dtype, arch):
    from mlip_accel.codegen.radial_basis import radial_basis_program

    _assert_program_compiles(radial_basis_program(8, dtype), arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_radial_table_kernels_compile_with_nvrtc(dtype, arch):
    from mlip_accel.codegen.radial_table import radial_table_program

    for outputs in (37, 38, 1280):  # one value, pairs and (fp32) quads per lane access
        _assert_program_compiles(radial_table_program(outputs, dtype), arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_neighbor_list_kernels_compile_with_nvrtc(arch):
    from mlip_accel.codegen.neighbor_list import neighbor_list_program

    _assert_program_compiles(neighbor_list_program(), arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_md_update_kernels_compile_with_nvrtc(arch):
    from mlip_accel.codegen.md_update import KERNELS, md_update_program

    program = md_update_program()
    assert [p.kernel for p in program.plans] == [f"mla_md_{k}" for k in KERNELS]
    size, error = _compile((program.source, arch, program.name))
    assert error is None, error
    assert size > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_edge_fingerprint_kernel_compiles_with_nvrtc(arch):
    from mlip_accel.codegen.edge_fingerprint import edge_fingerprint_program

    _assert_program_compiles(edge_fingerprint_program(), arch)
