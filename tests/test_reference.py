"""docs/reference.md documents every public name: each name in the ``__all__`` of
``lousho_sync``, ``lousho_aio`` and the store modules, and each public member of each public
class (its methods, properties, attrs fields and class attributes, its own or inherited from
another lousho class), appears in a code span (`` `...` ``) of the reference. A public name
added without documentation fails here, and the failure lists exactly the names to document.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import lousho_sync
from lousho_sync import Session

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"

MODULES = [
    "lousho_sync",
    "lousho_aio",
    "lousho_sync.sqlite",
    "lousho_sync.redis",
    "lousho_sync.postgres",
    "lousho_sync.sse",
    "lousho_aio.sse",
    "lousho_sync.stores.base",
    "lousho_sync.stores.memory",
    "lousho_sync.stores.files",
    "lousho_sync.stores.encrypted",
]
"""The public modules whose ``__all__`` the reference covers (``lousho_sync.sqlite``,
``.redis`` and ``.postgres`` re-export ``lousho_sync.stores.*``)."""


def _ours(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in ("lousho_sync", "lousho_aio")


def public_members(cls: type) -> set[str]:
    """The public members a user can reach on ``cls``: attributes defined by lousho classes
    in its MRO (not by ``object``, ``Exception``, ``Protocol``, ...), attrs fields and
    annotated class attributes."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        names.update(vars(klass))
        names.update(f.name for f in getattr(klass, "__attrs_attrs__", ()))
        names.update(vars(klass).get("__annotations__", {}))
    return {n for n in names if not n.startswith("_")}


def public_names() -> list[str]:
    """``module.Name`` for each name in the modules' ``__all__``, and ``Class.member`` for
    each public member of each public lousho class among them."""
    names: list[str] = []
    classes: dict[int, tuple[str, type]] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            names.append(f"{module_name}.{name}")
            obj = getattr(module, name)
            if inspect.isclass(obj) and _ours(obj):
                classes.setdefault(id(obj), (name, obj))
    for name, cls in classes.values():
        names += [f"{name}.{member}" for member in sorted(public_members(cls))]
    return names


def documented_identifiers(text: str) -> set[str]:
    """Every identifier inside a code span or code block of ``text``."""
    spans = re.findall(r"```.*?```|`[^`]+`", text, re.S)
    return {ident for span in spans for ident in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def undocumented(text: str) -> list[str]:
    """The public names whose last part appears in no code span of ``text``."""
    known = documented_identifiers(text)
    return sorted({n for n in public_names() if n.rsplit(".", 1)[1] not in known})


def test_every_public_name_is_in_the_reference() -> None:
    missing = undocumented(REFERENCE.read_text())
    assert not missing, (
        f"{len(missing)} public name(s) are not documented in docs/reference.md; add each "
        "(as `Name` or `name(...)` in a code span) to its section:\n  " + "\n  ".join(missing))


def test_the_check_finds_a_new_function_without_documentation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def brand_new_helper() -> None:
        """Not documented anywhere."""

    brand_new_helper.__module__ = "lousho_sync"
    monkeypatch.setattr(lousho_sync, "brand_new_helper", brand_new_helper, raising=False)
    monkeypatch.setattr(lousho_sync, "__all__", [*lousho_sync.__all__, "brand_new_helper"])
    text = REFERENCE.read_text()
    assert undocumented(text) == ["lousho_sync.brand_new_helper"]
    exact = r"1 public name\(s\)[^\n]*\n\s+lousho_sync\.brand_new_helper\n"
    with pytest.raises(AssertionError, match=exact):
        test_every_public_name_is_in_the_reference()
    # documented, it passes again
    assert undocumented(text + "\n- `brand_new_helper()` — new.\n") == []


def test_the_check_finds_a_new_method_and_a_new_class_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Session, "rewind_everything", lambda self: None, raising=False)

    class Widget:
        """A new public class with a member."""

        knob: int = 3

        def turn_knob(self) -> None:
            """Not documented."""

    Widget.__module__ = "lousho_sync.widgets"
    monkeypatch.setattr(lousho_sync, "Widget", Widget, raising=False)
    monkeypatch.setattr(lousho_sync, "__all__", [*lousho_sync.__all__, "Widget"])
    text = REFERENCE.read_text()
    assert undocumented(text) == ["Session.rewind_everything", "Widget.knob",
                                  "Widget.turn_knob", "lousho_sync.Widget"]
    # a private member is not public API
    monkeypatch.delattr(Session, "rewind_everything")
    monkeypatch.setattr(Session, "_rewind", lambda self: None, raising=False)
    assert "Session._rewind" not in undocumented(text)
