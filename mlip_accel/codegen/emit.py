"""Pieces every kernel family's emitter shares: the templates under ``templates/`` and an indenting line
builder. (The other shared pieces: ``nonzeros`` (CG nonzero streams), ``literals`` (exact constants),
``schedule`` (accumulator phases), ``launch_plan`` (the launch contract).)"""
from __future__ import annotations

import functools
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates"


@functools.lru_cache(maxsize=None)
def template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


class Lines:
    """Source lines at an indent; ``block(opening)`` writes a braced block around what is emitted inside."""

    def __init__(self, indent: int):
        self.lines: list[str] = []
        self.indent = indent

    def __call__(self, text: str = "") -> None:
        self.lines.append("  " * self.indent + text if text else "")

    def block(self, opening: str = "", comment: str | None = None):
        lines = self

        class _Block:
            def __enter__(self):
                lines((opening + " {" if opening else "{") + (f"  // {comment}" if comment else ""))
                lines.indent += 1

            def __exit__(self, *exc):
                lines.indent -= 1
                lines("}")
        return _Block()

    def text(self) -> str:
        return "\n".join(self.lines)
