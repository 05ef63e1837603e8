"""A tool's description from its docstring: the first paragraph, and per-parameter text
from Google-style ``Args:`` sections and Sphinx ``:param x:`` lines."""

from __future__ import annotations

import inspect
import re

__all__ = ["parse_doc"]

_SECTION = re.compile(
    r"^(args|arguments|parameters|params|keyword args|keyword arguments|other parameters|"
    r"returns?|yields?|raises|examples?|notes?|attributes|see also|warnings?|todo)\s*:\s*$",
    re.IGNORECASE,
)
_ARG_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args",
                 "keyword arguments", "other parameters"}
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:\s*(.*)$")
_GOOGLE_ARG = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_doc(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph and per-parameter descriptions (Google ``Args:`` and ``:param``)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or _SECTION.match(text) or text.startswith(":"):
            break
        summary.append(text)
    params: dict[str, str] = {}
    section_indent: int | None = None  # inside a Google args section when not None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(text)
        if header:
            arg_section = header.group(1).lower() in _ARG_SECTIONS
            section_indent, entry_indent, current = (indent if arg_section else None), None, None
            continue
        sphinx = _SPHINX_PARAM.match(text)
        if sphinx:
            section_indent, current = None, sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            entry_indent = indent
            continue
        if not text or text.startswith(":"):
            current = None if text else current
            continue
        if section_indent is not None:
            if indent <= section_indent:
                section_indent = current = None
                continue
            entry_indent = indent if entry_indent is None else entry_indent
            entry = _GOOGLE_ARG.match(text) if indent == entry_indent else None
            if entry:
                current = entry.group(1)
                params[current] = entry.group(2).strip()
                continue
        if current is not None and entry_indent is not None and indent > entry_indent:
            params[current] = f"{params[current]} {text}".strip()
    return " ".join(summary), params
