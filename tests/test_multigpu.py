"""Several GPUs in one process: every op on any device index, per-device kernel handles, mixed devices refused.

The CPU tests check the logic without a GPU (a fake driver records which context each module was loaded in
and each launch ran in; meta tensors stand in for a second device). The GPU tests (marker gpu) need two GPUs
and skip with the reason below that; scripts/multigpu_check.sh runs them on the 2-GPU device machine.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from kernel_cases import TOL, graph, inputs, random_uvu_problem, rel_err
from mlip_accel import reference
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.problem import describe
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import executor

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
NEED_TWO = pytest.mark.skipif(not TWO_GPUS, reason=f"needs 2 CUDA GPUs, this machine has "
                              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} "
                              "(run scripts/multigpu_check.sh on the nvidia-h200-x2 device machine)")


# --- CPU: mixed devices refused before any launch --------------------------------------------------------------

class _RecordingExecutor:
    """Accepts CPU and meta tensors and records launches (none may happen for refused input)."""

    def __init__(self):
        self.launches = []

    def accepts(self, device):
        return device.type in ("cpu", "meta")

    def launch(self, program, plan, grid, block, args, device):
        self.launches.append(plan.kernel)


def _small_problem(shared_weights=False):
    return describe("4x0e+4x1o", "1x0e+1x1o", "4x0e+4x1o", [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True),
                                                         (0, 1, 1, "uvu", True)],
                    shared_weights=shared_weights, internal_weights=False)


def _cpu_inputs(problem, nodes=5, edges=7):
    x, y, w, gz = inputs(problem, nodes, edges, torch.float64)
    dst, src = graph("random", nodes, edges)
    return x, y, w, gz, dst, src


@pytest.mark.parametrize("moved", ["y", "w", "grad_z", "edge_src", "transpose_perm"])
def test_mixed_devices_refused_naming_both_before_any_launch(moved):
    problem = _small_problem()
    x, y, w, gz, dst, src = _cpu_inputs(problem)
    g = sort_edges(dst, src, x.shape[0])
    args = dict(y=y, w=w, grad_z=gz, edge_src=src, transpose_perm=g.transpose_perm)
    args[moved] = args[moved].to("meta")
    recorder = _RecordingExecutor()
    with executor.use_executor(recorder), pytest.raises(ValueError) as err:
        cuda.conv_backward(problem, x, args["y"], args["w"], args["grad_z"], dst, args["edge_src"],
                           args["transpose_perm"])
    message = str(err.value)
    assert "cpu" in message and "meta" in message and "one device" in message, message
    assert recorder.launches == []


def test_mixed_devices_refused_on_the_reference_fallback_too():
    # shared weights: a problem the kernels hand to the reference backend, which would otherwise fail inside
    # PyTorch with a RuntimeError (or after work on the first device)
    problem = _small_problem(shared_weights=True)
    x, y, _, gz, dst, src = _cpu_inputs(problem)
    w = torch.randn(problem.weight_numel, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x, y, edge_dst, edge_src on cpu; w on meta"):
        cuda.conv_forward(problem, x, y, w.to("meta"), dst, src)
    with pytest.raises(ValueError, match=r"grad_z on meta"):
        cuda.tp_backward(problem, x, torch.randn(x.shape[0], problem.dim_in2, dtype=torch.float64), w,
                         gz.to("meta"))


def test_one_device_check_accepts_one_device_and_skips_none():
    t = torch.zeros(1)
    cuda.check_one_device(a=t, b=None, c=t.clone())
    with pytest.raises(ValueError, match=r"a, c on cpu; b on meta"):
        cuda.check_one_device(a=t, b=t.to("meta"), c=t)


# --- CPU: per-device loading and launching through a fake driver ----------------------------------------------

class _FakeDriver:
    """The driver/runtime calls the executor makes, with one current context per (fake) thread."""

    def __init__(self):
        self.current = 0  # no context current: a fresh thread
        self.set_device_calls = []
        self.modules = []  # (context it was loaded in, image)
        self.functions = {}  # handle -> (context, name)
        self.launches = []  # (function's context, current context, stream)

    # runtime
    def setDevice(self, index):
        self.set_device_calls.append(index)
        self.current = 1000 + index  # the primary context of device ``index``

    # driver
    def ctxGetCurrent(self):
        return self.current

    def ctxGetDevice(self):
        return self.current - 1000 if self.current >= 1000 else self.current

    def moduleLoadData(self, image):
        assert self.current, "module loaded with no current context"
        self.modules.append((self.current, image))
        return len(self.modules)

    def moduleGetFunction(self, handle, name):
        func = 100 * handle + len(self.functions)
        self.functions[func] = (self.modules[handle - 1][0], name)
        return func

    def launchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((self.functions[func][0], self.current, stream))


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two fake GPUs of one architecture: the driver is fake, NVRTC is real (it needs no GPU)."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")
    from mlip_accel.runtime import compiler
    fake = _FakeDriver()
    guards = []

    @contextlib.contextmanager
    def device(index):
        guards.append(index)
        yield

    monkeypatch.setattr(executor, "_driver_api", lambda: (fake, fake))
    monkeypatch.setattr(executor, "CONTEXTS", executor.DeviceContexts())
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index: types.SimpleNamespace(cuda_stream=5000 + index))
    monkeypatch.setenv(compiler.CACHE_ENV, "off")
    monkeypatch.setattr(compiler, "_MEMORY", {})
    fake.guards = guards
    return fake


def _fake_module():
    """A program of two kernels with their plans (x, then a count), as codegen makes them."""
    from mlip_accel.codegen.launch_plan import Argument, GridRule, LaunchPlan
    source = ('extern "C" __global__ void walk(float* x, long long n) { x[threadIdx.x] += 1.0f; }\n'
              'extern "C" __global__ void fix(float* x, long long n) { x[threadIdx.x] *= 2.0f; }\n')
    args = (Argument("x", "float*", "output", "[n]"), Argument("n", "long long", "scalar"))
    plans = tuple(LaunchPlan(family="test", kernel=k, arguments=args,
                             grid=GridRule(items="n", threads_per_item=1, block_threads=32)) for k in ("walk", "fix"))
    return types.SimpleNamespace(source=source, plans=plans, walk=plans[0], fix=plans[1])


def test_kernel_parameters_point_at_values_of_the_plans_types():
    """The driver's parameter array: one pointer per argument, to a value of the plan's C type (the types are
    worked out once per plan; every launch builds its own values)."""
    import ctypes

    from mlip_accel.codegen.launch_plan import Argument, GridRule, LaunchPlan
    args = (Argument("x", "float*", "output", "[n]"), Argument("n", "long long", "scalar"),
            Argument("k", "int", "scalar"))
    plan = LaunchPlan(family="test", kernel="walk", arguments=args,
                      grid=GridRule(items="n", threads_per_item=1, block_threads=32))
    for x, n, k in ((0xDEAD00, 3, -2), (0, -(1 << 40), 7)):
        keep, params = executor._c_params(plan, [x, n, k])
        assert len(params) == 3 and len(keep) == 3
        assert (ctypes.c_void_p.from_address(params[0]).value or 0) == x
        assert ctypes.c_longlong.from_address(params[1]).value == n
        assert ctypes.c_int.from_address(params[2]).value == k


def test_compiled_once_per_architecture_loaded_and_launched_per_device(fake_gpus):
    from mlip_accel.runtime import compiler
    exe, module = executor.CudaExecutor(), _fake_module()
    compiled = compiler.STATS.compiled
    for index in (1, 0, 1, 0):
        exe.launch(module, module.walk, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", index))
        exe.launch(module, module.fix, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", index))
    assert compiler.STATS.compiled == compiled + 1  # one architecture: one compile
    assert [ctx for ctx, _ in fake_gpus.modules] == [1001, 1000]  # loaded once per device, in its context
    assert exe.loaded_devices() == {0, 1}
    for func_ctx, current, stream in fake_gpus.launches:
        assert func_ctx == current  # never a handle of another device's context
        assert stream == 5000 + current - 1000  # that device's current torch stream
    assert [c for _, c, _ in fake_gpus.launches] == [1001, 1001, 1000, 1000] * 2
    assert set(fake_gpus.guards) == {0, 1}  # every load and launch under torch's device guard


def test_context_set_only_when_not_current_and_foreign_context_refused(fake_gpus):
    exe, module = executor.CudaExecutor(), _fake_module()
    exe.launch(module, module.walk, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", 1))
    calls = len(fake_gpus.set_device_calls)
    exe.launch(module, module.walk, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", 1))
    assert len(fake_gpus.set_device_calls) == calls  # already current: one driver query, no switch
    fake_gpus.current = 0  # a fresh thread: no context current
    exe.launch(module, module.walk, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", 1))
    assert fake_gpus.launches[-1][:2] == (1001, 1001)

    # a context pushed by hand that cudaSetDevice does not replace: refuse rather than launch in it
    fake_gpus.setDevice = lambda index: None
    fake_gpus.current = 7
    with pytest.raises(RuntimeError, match="refusing to launch"):
        exe.launch(module, module.walk, (1, 1, 1), (32, 1, 1), [0, 3], torch.device("cuda", 1))
    assert fake_gpus.launches[-1][:2] == (1001, 1001)


def test_executor_refuses_non_cuda_devices_naming_them():
    with pytest.raises(ValueError, match="meta"):
        executor.executor_for(torch.device("meta"))


# --- GPU: two devices in one process ---------------------------------------------------------------------------

def _reference(problem, x, y, w, gz, dst, src):
    up = lambda t: t.double()  # noqa: E731
    z = reference.conv_forward(problem, up(x), up(y), up(w), dst, src)
    grads = reference.conv_backward(problem, up(x), up(y), up(w), up(gz), dst, src)
    return z, grads


def _check_conv_on(device, problem, dtype, deterministic, seed=0):
    x, y, w, gz = inputs(problem, 40, 300, dtype, device=device, seed=seed)
    dst, src = graph("hub", 40, 300, seed=seed, device=device)
    perm, tperm = edge_orders(sort_edges(dst, src, 40) if deterministic else None)
    z = cuda.conv_forward(problem, x, y, w, dst, src, perm)
    grads = cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm)
    want_z, want_grads = _reference(problem, x, y, w, gz, dst, src)
    assert z.device == torch.device(device)
    assert rel_err(z, want_z) <= TOL[dtype]
    for a, b in zip(grads, want_grads):
        assert a.device == torch.device(device) and rel_err(a, b) <= TOL[dtype]


@pytest.fixture
def default_on_cuda0():
    if not TWO_GPUS:
        pytest.skip("needs 2 CUDA GPUs")
    torch.cuda.set_device(0)
    busy = torch.ones(1 << 20, device="cuda:0")  # cuda:0 holds the default device and memory
    torch.cuda.synchronize(0)
    yield busy
    torch.cuda.set_device(0)


def _allocated():
    return [torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())]


@NEED_TWO
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,deterministic", [(torch.float32, True), (torch.float64, False)])
def test_every_op_on_cuda1_while_cuda0_is_the_default(default_on_cuda0, dtype, deterministic):
    problem = random_uvu_problem(11)
    before0 = torch.cuda.memory_allocated(0)
    _check_conv_on("cuda:1", problem, dtype, deterministic)
    x, y, w, gz = inputs(problem, 33, 33, dtype, device="cuda:1")
    z = cuda.tp_forward(problem, x, y, w)
    want = reference.tp_forward(problem, x.double(), y.double(), w.double())
    assert z.device == torch.device("cuda:1") and rel_err(z, want) <= TOL[dtype]
    for a, b in zip(cuda.tp_backward(problem, x, y, w, gz),
                    reference.tp_backward(problem, x.double(), y.double(), w.double(), gz.double())):
        assert rel_err(a, b) <= TOL[dtype]
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0, "the caller's current device changed"
    assert torch.cuda.memory_allocated(0) == before0, "memory allocated on cuda:0 by a call on cuda:1"


@NEED_TWO
@pytest.mark.gpu
def test_two_models_on_two_devices_alternately(default_on_cuda0):
    import mlip_accel
    conv = mlip_accel.TensorProductConv("8x0e+8x1o", "1x0e+1x1o", "8x0e+8x1o",
                                        [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True),
                                         (1, 0, 1, "uvu", True)], backend="cuda")
    models = {i: copy.deepcopy(conv).to(f"cuda:{i}") for i in (0, 1)}
    for step in range(3):
        for i in (1, 0):
            device, other = f"cuda:{i}", 1 - i
            x, y, w, gz = inputs(conv.problem, 30, 200, torch.float32, device=device, seed=step)
            dst, src = graph("random", 30, 200, seed=step, device=device)
            x.requires_grad_(True)
            before = torch.cuda.memory_allocated(other)
            z = models[i](x, y, w, dst, src)
            (gx,) = torch.autograd.grad(z, x, gz)
            torch.cuda.synchronize(i)
            assert torch.cuda.memory_allocated(other) == before, f"a call on {device} allocated on cuda:{other}"
            assert torch.cuda.current_device() == 0
            want_z, want_grads = _reference(conv.problem, x.detach(), y, w, gz, dst, src)
            assert z.device == torch.device(device) and rel_err(z, want_z) <= TOL[torch.float32]
            assert rel_err(gx, want_grads[0]) <= TOL[torch.float32]
            del x, y, w, gz, dst, src, z, gx, want_z, want_grads
    assert executor.executor_for(torch.device("cuda:0")).loaded_devices() >= {0, 1}


@NEED_TWO
@pytest.mark.gpu
def test_model_moved_to_cuda1_after_use_keeps_working(default_on_cuda0):
    import mlip_accel
    conv = mlip_accel.TensorProductConv("8x0e+8x1o", "1x0e+1x1o", "8x0e+8x1o",
                                        [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True)], backend="cuda")
    for device in ("cuda:0", "cuda:1", "cuda:0"):
        conv = conv.to(device)
        x, y, w, _ = inputs(conv.problem, 30, 200, torch.float64, device=device)
        dst, src = graph("random", 30, 200, device=device)
        z = conv(x, y, w, dst, src)
        want = reference.conv_forward(conv.problem, x, y, w, dst, src)
        assert z.device == torch.device(device) and rel_err(z, want) <= TOL[torch.float64]


@NEED_TWO
@pytest.mark.gpu
def test_accelerated_nequip_model_moved_between_gpus(default_on_cuda0):
    pytest.importorskip("nequip")
    import mlip_accel
    import nequip_fixtures as F

    plain = F.tiny_model("float64", l_max=2, num_features=8)
    fast = mlip_accel.accelerate(copy.deepcopy(plain).to("cuda:0"), backend="cuda")
    frames = F.batch(F.emt_structures(3))
    for device in ("cuda:0", "cuda:1", "cuda:0", "cuda:1"):
        fast, plain = fast.to(device), plain.to(device)
        data = {k: v.to(device) for k, v in frames.items()}
        got = F.evaluate(fast, data)
        assert all(v.device == torch.device(device) for v in got.values() if isinstance(v, torch.Tensor))
        F.assert_same_outputs(got, F.evaluate(plain, data), "float64")
        assert torch.cuda.current_device() == 0


@NEED_TWO
@pytest.mark.gpu
def test_inputs_on_two_gpus_refused_naming_both(default_on_cuda0):
    problem = random_uvu_problem(3)
    x, y, w, gz = inputs(problem, 20, 50, torch.float32, device="cuda:0")
    dst, src = graph("random", 20, 50, device="cuda:0")
    before = _allocated()
    with pytest.raises(ValueError, match=r"cuda:0.*cuda:1"):
        cuda.conv_forward(problem, x, y.to("cuda:1"), w, dst, src)
    moved = y.to("cuda:1")
    with pytest.raises(ValueError, match=r"cuda:1"):
        cuda.conv_backward(problem, x, y, w, gz, dst, src.to("cuda:1"))
    with pytest.raises(ValueError, match=r"cuda:1"):
        cuda.tp_forward(problem, x[:20], moved[:20].contiguous(), w[:20].contiguous())
    assert _allocated()[0] == before[0]


_ONLY_CUDA1 = textwrap.dedent("""
    import ctypes, json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from kernel_cases import TOL, graph, inputs, random_uvu_problem, rel_err
    from mlip_accel import reference
    from mlip_accel.graph import sort_edges
    from mlip_accel.runtime import backend as cuda
    device = sys.argv[2]
    problem = random_uvu_problem(5)
    x, y, w, gz = inputs(problem, 40, 300, torch.float32, device=device)
    dst, src = graph("random", 40, 300, device=device)
    z = cuda.conv_forward(problem, x, y, w, dst, src, sort_edges(dst, src, 40).perm)
    cuda.conv_backward(problem, x, y, w, gz, dst, src, None)
    torch.cuda.synchronize(device)
    err = rel_err(z, reference.conv_forward(problem, x.double(), y.double(), w.double(), dst, src))
    libcuda = ctypes.CDLL("libcuda.so.1")
    active = []
    for ordinal in range(torch.cuda.device_count()):
        dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert libcuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
        assert libcuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
        active.append(bool(on.value))
    print(json.dumps({"err": err, "active": active, "allocated": [torch.cuda.memory_allocated(i)
                      for i in range(torch.cuda.device_count())], "current": torch.cuda.current_device()}))
""")


def _run_only_on(device: str, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, **(env_extra or {}))
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _ONLY_CUDA1, tests_dir, device], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@NEED_TWO
@pytest.mark.gpu
def test_a_process_using_only_cuda1_creates_no_context_or_memory_on_cuda0():
    out = _run_only_on("cuda:1")
    assert out["err"] <= TOL[torch.float32]
    assert out["active"][1] and not out["active"][0], f"a CUDA context was created on cuda:0: {out}"
    assert out["allocated"][0] == 0


@NEED_TWO
@pytest.mark.gpu
def test_cuda_visible_devices_reordered():
    out = _run_only_on("cuda:0", {"CUDA_VISIBLE_DEVICES": "1,0"})  # cuda:0 is the physical second GPU
    assert out["err"] <= TOL[torch.float32]
    assert out["active"][0] and not out["active"][1], out


# --- CPU: the training report's checks (scripts/multigpu_train.py) ----------------------------------------------

def _train_script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "multigpu_train.py"
    spec = importlib.util.spec_from_file_location("multigpu_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_records(out, tag, ranks, losses, hashes, elsewhere=0, pids=None):
    for rank in range(ranks):
        steps = [{"step": i, "loss": losses[rank][i], "seconds": 0.1, "samples": 6, "param_sha256": hashes[rank][i],
                  "param_norm": 1.0, "device": rank, "peak_bytes": 2**20, "allocated_elsewhere": {1 - rank: elsewhere}}
                 for i in range(len(losses[rank]))]
        (out / f"{tag}_rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "world_size": ranks, "steps": steps, "pid": (pids or [100, 101])[rank],
             "gpu_uuid": f"GPU-{rank}"}))
        torch.save(torch.ones(4), out / f"{tag}_rank{rank}.pt")


@pytest.mark.parametrize("fault", [None, "loss", "params", "memory", "nvidia-smi"])
def test_training_report_flags_each_fault(tmp_path, fault):
    script = _train_script()
    _write_records(tmp_path, "mace_1", 1, [[1.0, 0.5]], [["a", "b"]])
    losses = [[0.9, 0.5], [1.1, 0.5 * (1.01 if fault == "loss" else 1.0)]]  # mean over ranks = the 1-GPU loss
    hashes = [["a", "b"], ["a", "c" if fault == "params" else "b"]]
    _write_records(tmp_path, "mace_2", 2, losses, hashes, elsewhere=512 if fault == "memory" else 0)
    smi = tmp_path / "smi.csv"
    rows = ["pid, process_name, gpu_uuid, used_gpu_memory [MiB]", "100, python3, GPU-0, 900 MiB",
            "101, python3, GPU-1, 900 MiB"] + (["101, python3, GPU-0, 500 MiB"] if fault == "nvidia-smi" else [])
    smi.write_text("\n".join(rows) + "\n")
    result = script.compare(tmp_path, "mace", 2, 1e-4, smi)
    assert result["ok"] is (fault is None), result
    assert script.report(tmp_path, 2, 1e-4, smi) == (0 if fault is None else 1)
    assert (tmp_path / "multigpu_train.md").read_text().count("| mace |") == 1


def test_training_report_gives_each_steps_time_and_the_ranks_entry_skew(tmp_path):
    """The report keeps every step's time per rank and how far apart the ranks entered each step (a rank
    entering late makes the other wait in the all-reduce: that wait is in the other's step time)."""
    script = _train_script()
    _write_records(tmp_path, "mace_1", 1, [[1.0, 0.5, 0.4]], [["a", "b", "c"]])
    _write_records(tmp_path, "mace_2", 2, [[1.0, 0.5, 0.4]] * 2, [["a", "b", "c"]] * 2)
    for rank, late in ((0, 0.0), (1, 0.25)):
        path = tmp_path / f"mace_2_rank{rank}.json"
        record = json.loads(path.read_text())
        for i, step in enumerate(record["steps"]):
            step["began_unix_s"] = 1000.0 + i + (late if i else 0.0)  # step 0 (warm-up) is not counted
        path.write_text(json.dumps(record))
    result = script.compare(tmp_path, "mace", 2, 1e-4)
    assert result["median_entry_skew_s"] == pytest.approx(0.25)
    assert result["ranks"][1]["step_seconds"] == [0.1, 0.1, 0.1]
    assert result["single"]["samples_per_s"] == pytest.approx(6 / 0.1)  # per rank: its own samples / its step


def test_training_throughput_leaves_the_warm_up_steps_out(tmp_path):
    """Throughput comes from the second half of the steps: on the H200 MACE's first five steps (kernel loads,
    library handles, allocator growth) took 0.4-1.9 s against 0.06 s after, and a median over all but the
    first step reported 15 samples/s per rank where training ran at 100."""
    script = _train_script()
    _write_records(tmp_path, "mace_1", 1, [[1.0] * 8], [["a"] * 8])
    _write_records(tmp_path, "mace_2", 2, [[1.0] * 8] * 2, [["a"] * 8] * 2)
    for tag, ranks, warm, step in (("mace_1", 1, 0.5, 0.12), ("mace_2", 2, 0.5, 0.06)):
        for rank in range(ranks):
            path = tmp_path / f"{tag}_rank{rank}.json"
            record = json.loads(path.read_text())
            for i, entry in enumerate(record["steps"]):
                entry["seconds"] = warm if i < 5 else step
            path.write_text(json.dumps(record))
    result = script.compare(tmp_path, "mace", 2, 1e-4)
    assert result["ranks"][0]["median_step_s"] == pytest.approx(0.06)
    assert result["throughput_ratio"] == pytest.approx(2 * 0.12 / 0.06)
    assert script.report(tmp_path, 2, 1e-4) == 0
    assert "| 4.00x |" in (tmp_path / "multigpu_train.md").read_text()


def test_training_report_gives_per_rank_batch_runs_as_throughput_only(tmp_path):
    """A run where every rank takes the 1-GPU batch trains on another global batch: its loss is not compared
    with one GPU, but its parameters must still agree across ranks and its throughput is reported."""
    script = _train_script()
    _write_records(tmp_path, "mace_1", 1, [[1.0, 0.5]], [["a", "b"]])
    _write_records(tmp_path, "mace_weak_2", 2, [[3.0, 2.0], [1.0, 0.1]], [["x", "y"], ["x", "y"]])
    result = script.compare(tmp_path, "mace", 2, 1e-4, weak=True)
    assert result["ok"] and result["throughput_ratio"] == pytest.approx(2.0)
    assert script.report(tmp_path, 2, 1e-4) == 0  # 1-GPU run kept for the weak rows only: no same-batch row
    assert "| mace |" not in (tmp_path / "multigpu_train.md").read_text()
    _write_records(tmp_path, "mace_2", 2, [[0.9, 0.5], [1.1, 0.5]], [["a", "b"]] * 2)
    assert script.report(tmp_path, 2, 1e-4) == 0
    assert "| mace |" in (tmp_path / "multigpu_train.md").read_text()
    table = (tmp_path / "multigpu_train.md").read_text()
    assert "| mace, 12 per rank | 2 | - | True | - |" in table
    _write_records(tmp_path, "mace_weak_2", 2, [[3.0, 2.0], [1.0, 0.1]], [["x", "y"], ["x", "z"]])
    assert not script.compare(tmp_path, "mace", 2, 1e-4, weak=True)["ok"]
