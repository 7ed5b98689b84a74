"""The package's import direction (ARCHITECTURE.md): no module imports a layer above its own, and the adapters'
shared parts are in one place."""
from __future__ import annotations

import ast
import pathlib

import torch

import mlip_accel

PACKAGE = pathlib.Path(mlip_accel.__file__).parent

# Bottom to top; a module may import its own layer and those below. graph.py (plain edge data and its sort)
# sits with problem: modules take an EdgeGraph, ops and runtime its edge orders. reference (the pure-PyTorch backend)
# sits with codegen: the runtime falls back to it. The package root (mlip_accel/__init__.py) is the facade
# above everything: it may import any layer, and nothing inside the package imports it.
LAYERS = (
    ("errors",),
    ("problem", "graph"),
    ("codegen", "reference"),
    ("runtime",),
    ("ops",),
    ("modules",),
    ("patches",),
    ("integrations",),
    ("testing",),  # test and benchmark support (cases, timers, the error helper): used by tests and scripts only
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
ROOT_RANK = len(LAYERS)


def _module_name(path: pathlib.Path) -> str:
    parts = ("mlip_accel",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    rel = pathlib.Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def _rank(dotted: str) -> int:
    parts = dotted.split(".")
    return ROOT_RANK if len(parts) == 1 else RANK[parts[1]]


def _imports(path: pathlib.Path):
    """Every mlip_accel module ``path`` imports, at module level or inside a function, as (line, module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "mlip_accel")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mlip_accel":
                continue
            for alias in node.names:  # ``from . import x`` imports the module x where there is one
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else target


def test_every_top_level_module_has_a_layer():
    names = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.name != "__init__.py"}
    assert names <= set(RANK), f"place {sorted(names - set(RANK))} in a layer (tests/test_layers.py, ARCHITECTURE.md)"


def test_no_import_runs_upward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name == "mlip_accel":
            continue  # the facade
        own = _rank(name)
        for line, target in _imports(path):
            if _rank(target) > own:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not upward, "imports against the layer order (ARCHITECTURE.md):\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # the walker itself: a patches module importing integrations, relative and absolute, is found
    fake = PACKAGE / "patches" / "common.py"
    source = "from ..integrations import cli\nimport mlip_accel.integrations.md\nfrom .. import errors\n"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: source if self == fake else "")
    found = [t for _, t in _imports(fake)]
    assert found == ["mlip_accel.integrations.cli", "mlip_accel.integrations.md", "mlip_accel.errors"]
    assert [_rank(t) > _rank("mlip_accel.patches") for t in found] == [True, True, False]


def test_one_tolerance_policy_for_both_probes():
    from mlip_accel.patches import common
    from mlip_accel.patches.mace import probe as mace_probe
    from mlip_accel.patches.nequip import probe as nequip_probe

    assert nequip_probe.tolerance is common.tolerance
    assert (mace_probe.RTOL_FLOAT32, mace_probe.RTOL_FLOAT64, mace_probe.RTOL_FLOAT64_ROUNDED_CG) == (
        common.RTOL_FLOAT32, common.RTOL_FLOAT64, common.RTOL_FLOAT64_ROUNDED_CG)
    assert common.tolerance(torch.float32) == 1e-4 and common.tolerance(torch.float64) == 1e-9
    assert common.tolerance(torch.float64, rounded_constants=True) == 1e-6
    assert common.tolerance(torch.bfloat16) == 1e-2


def test_errors_are_the_public_ones():
    from mlip_accel import errors, patches

    assert mlip_accel.NotAcceleratable is errors.NotAcceleratable is patches.NotAcceleratable
    assert mlip_accel.ParityCheckFailed is errors.ParityCheckFailed is patches.ParityCheckFailed


def test_old_class_paths_of_pickled_models_still_resolve():
    # torch.save of an accelerated MACE model names the class (and its state-dict hooks) by module path
    import pickle

    from mlip_accel.patches.mace import conv, symmetric

    for old, new in (("mlip_accel.patches.mace_conv", conv), ("mlip_accel.patches.mace_symmetric", symmetric)):
        for name in ("MACEFusedConv", "_save_as_plain", "_load_from_plain") if new is conv else (
                "MACESymmetricContraction",):
            # protocol-2 GLOBAL opcode: what a pickle written before the move holds
            blob = b"\x80\x02c" + old.encode() + b"\n" + name.encode() + b"\nq\x00."
            assert pickle.loads(blob) is getattr(new, name)


def test_swap_transaction_undoes_in_reverse_and_reraises():
    from mlip_accel.patches.common import swap_transaction

    done = []
    try:
        with swap_transaction() as undo:
            undo.append(lambda: done.append("first"))
            undo.append(lambda: done.append("second"))
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert done == ["second", "first"]
    with swap_transaction() as undo:
        undo.append(lambda: done.append("never"))
    assert "never" not in done
