"""The pip line that installs one of mlip_accel's optional extras (nequip, mace, cuda12, cuda13).

mlip_accel is not on PyPI, so ``pip install 'mlip_accel[nequip]'`` fails on a machine that installed it from
a checkout or a wheel. The hint names the extra and the requirements it stands for, read from the installed
package's metadata (pyproject.toml stays the one place that lists them).
"""
from __future__ import annotations

import re


def extra_requirements(extra: str) -> list[str]:
    """The requirement strings of ``extra`` in the installed mlip_accel's metadata ([] when unknown)."""
    from importlib import metadata

    try:
        requires = metadata.requires("mlip_accel") or []
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return []
    marker = re.compile(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""")
    return [req.split(";")[0].strip() for req in requires if ";" in req and marker.search(req.split(";", 1)[1])]


def install_hint(extra: str) -> str:
    """E.g. "pip install 'nequip<0.20,>=0.19' (mlip_accel's [nequip] extra)"."""
    requirements = extra_requirements(extra)
    if not requirements:
        return f"install mlip_accel with its [{extra}] extra"
    return "pip install " + " ".join(f"'{r}'" for r in requirements) + f" (mlip_accel's [{extra}] extra)"
