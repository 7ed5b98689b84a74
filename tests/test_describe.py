"""``mlip_accel.describe`` / ``AcceleratedCalculator.describe()``: which backend runs each convolution, on which
device and dtype, and why the CUDA kernels do not (issue 11 item 4); ``backend="auto"`` on CUDA tensors without
working kernels warns once with the reason."""
import subprocess
import sys
import warnings

import pytest
import torch

import mlip_accel
from mlip_accel.integrations import describe as D
from mlip_accel.ops import backends

NO_CUPY = "CuPy is not importable (No module named 'cupy'); install mlip_accel with the extra matching your CUDA"


@pytest.fixture
def no_cuda_kernels(monkeypatch):
    """This process as on a GPU machine without CuPy: the reason the kernels cannot run, warning not yet given."""
    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: NO_CUPY)
    monkeypatch.setattr(backends, "_warned_fallback", False)


def _conv(**kwargs):
    from helpers import bench_e3nn_tp, bench_problems

    return mlip_accel.TensorProductConv.from_e3nn(bench_e3nn_tp(bench_problems()[0]), **kwargs)


def test_standalone_conv():
    report = mlip_accel.describe(_conv(backend="reference", deterministic=False))
    assert [layer.implementation for layer in report.layers] == ["mlip_accel reference"]
    assert report.layers[0].requested == "reference" and report.layers[0].deterministic is False
    assert report.backends == ("reference",) and report.accelerated
    text = str(report)
    assert "<this module> (TensorProductConv): mlip_accel reference [backend='reference', atomic" in text
    assert "device  : unknown (no parameters)" in text and "CUDA    :" in text
    assert repr(report) == text  # readable in a REPL too


def test_fallback_reasons(no_cuda_kernels):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert D._implementation("auto", cpu) == ("mlip_accel reference",
                                              "the model is on cpu; the CUDA kernels need CUDA tensors")
    assert D._implementation("auto", cuda) == ("mlip_accel reference", f"fallback from the CUDA kernels: {NO_CUPY}")
    assert D._implementation("cuda", cuda) == ("mlip_accel unavailable", f"backend='cuda' cannot run: {NO_CUPY}")
    assert D._implementation("cuda", cpu)[0] == "mlip_accel unavailable"
    assert D._implementation("reference", cuda) == ("mlip_accel reference", "backend='reference' was asked for")


def test_auto_on_cuda_tensors_warns_once_with_the_reason(no_cuda_kernels):
    cuda = torch.device("cuda")
    with pytest.warns(RuntimeWarning, match=r"backend='auto' runs the PyTorch reference implementation on cuda, "
                                            r"not the fused CUDA kernels: CuPy is not importable"):
        assert backends.resolve("auto", cuda) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.resolve("auto", cuda) == "reference"  # once per process
        assert backends.resolve("auto", torch.device("cpu")) == "reference"  # CPU tensors: nothing to say
    with pytest.raises(backends.BackendUnavailable, match="backend='cuda' is unavailable: CuPy is not importable"):
        backends.resolve("cuda", cuda)


def test_cpu_tensors_never_warn(monkeypatch):
    monkeypatch.setattr(backends, "_warned_fallback", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.resolve("auto", torch.device("cpu")) == "reference"


def test_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="mlip_accel.describe takes a NequIP or MACE model"):
        mlip_accel.describe(42)


def test_import_and_describe_pull_in_no_framework():
    code = ("import sys, mlip_accel, e3nn.o3 as o3\n"
            "tp = o3.FullyConnectedTensorProduct('2x0e+2x1o', '1x0e+1x1o', '2x0e+2x1o', shared_weights=False)\n"
            "print(mlip_accel.describe(mlip_accel.TensorProductConv.from_e3nn(tp)))\n"
            "bad = [m for m in ('nequip', 'mace', 'ase') if m in sys.modules]\n"
            "import torch\n"
            "if not torch.cuda.is_available() and 'cupy' in sys.modules: bad.append('cupy')\n"
            "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "mlip_accel" in out.stdout


@pytest.mark.nequip
def test_nequip_model_and_calculator():
    pytest.importorskip("ase")
    pytest.importorskip("vesin")
    import nequip_fixtures as F

    from mlip_accel.integrations.ase import AcceleratedCalculator

    plain = mlip_accel.describe(F.tiny_model("float32", num_layers=2))
    assert [layer.implementation for layer in plain.layers] == ["e3nn (not accelerated)"] * 2
    assert {layer.kind for layer in plain.layers} == {"NequIP TensorProductScatter"}
    assert plain.backends == ("e3nn",) and not plain.accelerated and plain.dtype == "float32"

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64", num_layers=3), device="cpu")
    report = calc.describe()
    assert report == mlip_accel.describe(calc)  # one report, two ways to ask
    assert len(report.layers) == 3 and report.backends == ("reference",) and report.device == "cpu"
    assert report.dtype == "float64"
    text = str(report)
    assert text.splitlines()[0].startswith("nequip model <in memory> [Cu, Ag;")
    assert "3 layer(s) mlip_accel can run, 3 run by mlip_accel" in text
    assert "(NequIP TensorProductScatter): mlip_accel reference [backend='auto', deterministic] - the model is on " \
           "cpu; the CUDA kernels need CUDA tensors" in text
    assert "modules : e3nn/framework modules swapped for mlip_accel's: 1 SphericalHarmonics, " in text
    assert "Linear" in report.modules and "Gate" in report.modules and plain.modules == ""
    # float64 on the CPU: the table stand-ins are in place, no table is read
    assert report.radial_tables.startswith("3 radial MLP(s), radial_table='auto': 3 no table yet") \
        and "  radial  : 3 radial MLP(s)" in text and plain.radial_tables == ""
    unaccelerated = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", accelerate=False)
    assert unaccelerated.describe().backends == ("e3nn",)


@pytest.mark.mace
def test_mace_model():
    import mace_fixtures as M

    model = M.tiny_model(dtype=torch.float64)
    plain = mlip_accel.describe(model)
    assert plain.backends == ("e3nn",)
    kinds = ["MACE conv_tp", "MACE symmetric contraction"]
    assert sorted(layer.kind for layer in plain.layers) == sorted(kinds * 2)
    assert {layer.implementation for layer in plain.layers if "symmetric" in layer.kind} == {
        "MACE's own (not accelerated)"}
    mlip_accel.accelerate(model, backend="reference")
    report = mlip_accel.describe(model)
    assert sorted(layer.kind for layer in report.layers) == sorted(kinds * 2)
    assert [layer.implementation for layer in report.layers] == ["mlip_accel reference"] * 4
    names = {layer.name for layer in report.layers}
    assert {"interactions.0.conv_tp", "products.0.symmetric_contractions"} <= names and report.dtype == "float64"
    assert "4 layer(s) mlip_accel can run, 4 run by mlip_accel" in str(report)
    assert report.modules.startswith("1 SphericalHarmonics, 1 RadialEmbeddingBlock, ") and "Linear" in report.modules


def test_cli_backend_line_gives_the_fallback_reason(monkeypatch):
    from types import SimpleNamespace

    pytest.importorskip("ase")
    from mlip_accel.integrations import cli

    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: NO_CUPY)  # where the CLI looks it up
    calc = SimpleNamespace(potential=SimpleNamespace(accelerated=True, device=torch.device("cuda")), backend="reference")
    assert cli._backend_text(calc) == ("mlip_accel, reference: PyTorch reference implementation (no CUDA kernels); "
                                       f"the CUDA kernels cannot run: {NO_CUPY}")
    calc.potential.device = torch.device("cpu")
    assert cli._backend_text(calc).endswith("(no CUDA kernels)")
