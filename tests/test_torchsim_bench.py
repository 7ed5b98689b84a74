"""scripts/bench_torchsim.py's reporting helpers, which need neither TorchSim nor a GPU (the runs themselves are
tested in test_torchsim.py, in the Python 3.12 environments)."""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


@pytest.fixture(scope="module")
def bench():
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    return importlib.import_module("bench_torchsim")


def test_out_of_memory_inside_torchscript_is_reported_as_such(bench):
    """e3nn's MACE runs as TorchScript: its out-of-memory error arrives as a RuntimeError whose first line is
    the interpreter's, which the report used to show ("The following operation failed ...")."""
    err = RuntimeError("The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript, "
                       "serialized code (most recent call last):\n  File \"code/x.py\", line 144\n"
                       "RuntimeError: CUDA out of memory. Tried to allocate 25.77 GiB. GPU 0 has a total capacity")
    status = bench.error_status(err)
    assert status.startswith("error: OutOfMemoryError (raised in RuntimeError): ")
    assert "Tried to allocate 25.77 GiB" in status


def test_other_errors_keep_their_first_line(bench):
    assert bench.error_status(ValueError("bad thing\nmore")) == "error: ValueError: bad thing"
    assert bench.error_status(KeyError()) == "error: KeyError: "


def test_openequivariance_without_its_torch_classes_is_unavailable_with_the_reason(bench, monkeypatch):
    """OEQ_NOTORCH=1 (set by device scripts that skip OpenEquivariance's extension build) made the wrappers fail
    with AttributeError/ImportError far from the cause; the case now says why it did not run."""
    monkeypatch.setenv("OEQ_NOTORCH", "1")
    assert "OEQ_NOTORCH=1" in bench.oeq_unavailable_reason()
    with pytest.raises(bench.Unavailable, match="OEQ_NOTORCH=1"):
        bench.make_wrapper("mace", "oeq", torch.nn.Linear(1, 1), torch.float32, torch.device("cuda"))


def test_frameworks_option_is_not_passed_to_the_per_framework_runs(bench):
    argv = ["--frameworks", "nequip", "--steps", "3", "--frameworks", "mace", "nequip", "--quick"]
    assert bench._without_option(argv, "--frameworks") == ["--steps", "3", "--quick"]


def test_nequip_gets_a_batch_where_e3nn_fits(bench):
    class Args:
        batches = None
        quick = False

    args = Args()
    args.framework = "nequip"
    assert [b[0] for b in bench.selected_batches(args)] == ["8x1000", "64x64", "16x64"]
    args.framework = "mace"
    assert [b[0] for b in bench.selected_batches(args)] == ["8x1000", "64x64"]


def test_host_diagnostic_of_the_accelerated_mace_path():
    """scripts/diag_torchsim_host.py on a 2 x 64-atom batch: the CUDA path's Python (kernels not run) through
    MACE's TorchSim wrapper does one edge sort per call (two orders of num_edges keys), two host reads, no
    scalar read of its own, and the first layer's backward skips grad x (the parameters are frozen)."""
    pytest.importorskip("torch_sim")
    pytest.importorskip("mace")
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    diag = importlib.import_module("diag_torchsim_host")
    entry = diag.diagnose(["2x2"])["2x2"]
    order = entry["order"]
    assert order["sender_sorted"] and not order["receiver_sorted"] and order["edges"] > 0
    cuda = entry["mlip_accel_cuda_path"]
    ours = {k: v for k, v in cuda["where"].items() if "mlip_accel/" in k}
    sorts = {k: v for k, v in ours.items() if k.startswith("sort ")}
    assert sum(sorts.values()) == 2 and all(k.endswith(f"({order['edges']})") for k in sorts), ours
    assert not [k for k in ours if k.startswith("_local_scalar_dense")], ours
    assert sum(cuda["tolist"].values()) == 2, cuda["tolist"]
    assert entry["edge_sort_cache_sorts"] == 2  # the warm-up call and the counted one: one sort per call
    backward = sorted(k for k in cuda["launch_kernels"] if "_bac_" in k and not k.endswith("_fixup"))
    assert len(backward) == 2 and any("_bac_yw_" in k for k in backward) and any("_bac_xyw_" in k for k in backward)
