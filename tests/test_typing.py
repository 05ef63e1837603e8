"""The README's code passes ``mypy --strict``: every ``python`` block as written, and
tests/typed_usage.py (also checked by pyright when it is installed), which pins what a type
checker infers: events narrow on ``event.type``, ``store=``/``compaction=`` refuse bad
types."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TYPED = Path(__file__).with_name("typed_usage.py")
ROOT = TYPED.parent.parent


@pytest.mark.timeout(600)
def test_readme_usage_and_every_readme_block_pass_mypy_strict(tmp_path: Path) -> None:
    """tests/typed_usage.py, and every ``python`` block of the README as written (each its
    own module), in one ``mypy --strict`` run."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    from test_readme import PYTHON_BLOCKS

    sections = {}
    for n, (heading, code) in enumerate(PYTHON_BLOCKS):
        block = tmp_path / f"readme_block_{n:02d}.py"
        block.write_text(code)
        sections[block.name] = heading
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(TYPED),
         *(str(tmp_path / name) for name in sections)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    where = "\n".join(f"{name}: README section {heading!r}" for name, heading in sections.items()
                      if name in done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr + where


@pytest.mark.timeout(600)
def test_readme_usage_passes_pyright() -> None:
    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is not installed")
    done = subprocess.run([pyright, str(TYPED)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stdout


def test_a_bad_compaction_is_refused_at_run_time_too() -> None:
    from lousho_sync import ConfigError, ScriptedProvider, create_agent

    with pytest.raises(ConfigError, match="compaction must be a Compaction"):
        create_agent(provider=ScriptedProvider(), compaction=42)  # type: ignore[arg-type]


def test_event_types_are_the_same_strings_on_class_and_instance() -> None:
    from lousho_sync import RunDone, TextDelta
    from lousho_sync.events import Event, ListenerEvent

    assert TextDelta.type == "text.delta"
    assert TextDelta(run_id="r", seq=0, text="x").type == "text.delta"
    assert RunDone.type == "run.done"
    assert len({cls.type for cls in Event.__args__}) == len(Event.__args__)  # type: ignore[attr-defined]
    assert {cls.type for cls in ListenerEvent.__args__} == {  # type: ignore[attr-defined]
        "compaction.start", "compaction.done", "context.cleared"}
