"""The README cannot drift: every code block in it is run or checked here.

A block's kind is its fence's language and an HTML comment on the line before the fence (GitHub hides it):

* ```python after ``<!-- example: examples/NAME.py -->``: must be that file, word for word (one source); the file
  runs in a fresh process, in the environment of the framework it imports (nequip or mace, by its name), and
  must print which backend runs ("backend: ..."): "cuda" where our CUDA kernels can run in this process, else
  "reference".
* ```bash after ``<!-- run: nequip -->``: cheap commands, run with bash in a temporary folder with the nequip
  environment's scripts first on PATH (the quick start's `mlip-accel md`).
* any other ```bash block (installs, `make`): checked with `bash -n` only: installing or building environments
  inside the test suite would cost minutes and the network.
* ```text blocks are program output, not code.

A code block of any other kind, or a python block without its marker, fails: nothing unrun may be shown.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FENCE = re.compile(r"(?:<!--\s*(?P<marker>[^>]*?)\s*-->\s*\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
RUNNABLE_ENVS = ("nequip",)


def readme_blocks() -> list[dict]:
    return [dict(marker=m["marker"] or "", lang=m["lang"], body=m["body"],
                 line=README.read_text()[:m.start("lang")].count("\n") + 1)
            for m in FENCE.finditer(README.read_text())]


def _framework(example: str) -> str:
    return "mace" if "mace" in Path(example).name else "nequip"


def _examples() -> list[tuple[str, dict]]:
    found = []
    for block in readme_blocks():
        m = re.fullmatch(r"example:\s*(\S+)", block["marker"])
        if block["lang"] == "python" and m:
            found.append((m.group(1), block))
    return found


def _shell_blocks(run: bool) -> list[dict]:
    return [b for b in readme_blocks() if b["lang"] == "bash" and b["marker"].startswith("run:") == run]


def _env(framework: str) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # CI's 2 cores; the examples are tiny
    if framework == "mace":
        # the example must work as pasted: it may not rely on the variable that `make test` sets for MACE
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def test_every_code_block_is_covered():
    kinds = []
    for block in readme_blocks():
        if block["lang"] == "python":
            ok = re.fullmatch(r"example:\s*examples/\S+\.py", block["marker"]) is not None
        elif block["lang"] == "bash":
            ok = block["marker"] in ("",) or re.fullmatch(r"run:\s*(" + "|".join(RUNNABLE_ENVS) + ")",
                                                         block["marker"]) is not None
        else:
            ok = block["lang"] == "text"
        if not ok:
            kinds.append(f"README.md:{block['line']}: ```{block['lang']} block marked {block['marker']!r}")
    assert not kinds, "code blocks no test runs:\n" + "\n".join(kinds)
    assert {_framework(name) for name, _ in _examples()} == {"nequip", "mace"}


def test_examples_folder_and_readme_are_one_source():
    shown = {name: block["body"] for name, block in _examples()}
    on_disk = {f"examples/{p.name}": p.read_text() for p in (REPO / "examples").glob("*.py")}
    assert sorted(shown) == sorted(on_disk), "every examples/*.py is shown in the README, and only those"
    for name, body in shown.items():
        assert body == on_disk[name], f"README's block for {name} differs from the file: copy the file into the README"


def test_relative_links_resolve():
    """README's and docs/'s links to files of the repository point to files that exist."""
    missing = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", page.read_text()):
            if not (page.parent / link).exists():
                missing.append(f"{page.relative_to(REPO)} -> {link}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("block", _shell_blocks(run=False), ids=lambda b: f"line{b['line']}")
def test_shell_block_is_valid_bash(block):
    out = subprocess.run(["bash", "-n"], input=block["body"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _backend_expected() -> str:
    from mlip_accel import cuda_unavailable_reason

    return "reference" if cuda_unavailable_reason() else "cuda"


@pytest.mark.parametrize("name", [pytest.param(name, marks=getattr(pytest.mark, _framework(name)))
                                  for name, _ in _examples()])
def test_example_runs(name, tmp_path):
    pytest.importorskip(_framework(name))
    out = subprocess.run([sys.executable, str(REPO / name)], cwd=tmp_path, env=_env(_framework(name)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"backend: {_backend_expected()}\n" in out.stdout, out.stdout
    assert re.search(r"E = -?\d+\.\d+ eV after \d+ steps", out.stdout), out.stdout


@pytest.mark.nequip
@pytest.mark.parametrize("block", _shell_blocks(run=True), ids=lambda b: f"line{b['line']}")
def test_shell_block_runs(block, tmp_path):
    pytest.importorskip("nequip")
    env = _env("nequip")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block["body"]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
