"""The repository's layout: ``pyproject.toml`` holds the package (metadata, dependencies,
build) and ruff's settings, ``setup.cfg`` beside it the configuration of pytest, mypy and
coverage; no setting is written in both, and each tool reads the file it is meant to."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a setup.cfg section -> the pyproject table the same tool would read instead
SAME_TOOL = {
    "tool:pytest": ("tool", "pytest", "ini_options"),
    "mypy": ("tool", "mypy"),
    "coverage:run": ("tool", "coverage", "run"),
    "coverage:report": ("tool", "coverage", "report"),
    "flake8": ("tool", "flake8"),
}


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    assert cfg.read(ROOT / "setup.cfg"), "no setup.cfg at the root"
    return cfg


def test_pyproject_keeps_the_package_and_setup_cfg_the_tools() -> None:
    py = _pyproject()
    assert {"build-system", "project"} <= set(py)
    tools = py.get("tool", {})
    assert isinstance(tools, dict)
    # ruff cannot read setup.cfg, setuptools' package options are build settings
    assert set(tools) <= {"ruff", "setuptools"}, set(tools)
    cfg = _setup_cfg()
    assert {"tool:pytest", "mypy", "coverage:run"} <= set(cfg.sections())
    # setup.cfg holds no package metadata (that is pyproject's, and setuptools would merge it)
    assert not {"metadata", "options"} & set(cfg.sections())


def test_no_setting_is_written_in_both_files() -> None:
    py = _pyproject()
    cfg = _setup_cfg()
    both = []
    for section in cfg.sections():
        path = SAME_TOOL.get(section)
        if path is None:
            continue
        table: object = py
        for part in path:
            table = table.get(part, {}) if isinstance(table, dict) else {}
        assert isinstance(table, dict)
        both += [f"[{section}] {key}" for key in cfg[section] if key in table]
        if table:
            both.append(f"[{section}] is also in pyproject.toml as {'.'.join(path)}")
    assert both == []


def test_pytest_reads_setup_cfg(request: pytest.FixtureRequest) -> None:
    assert request.config.inipath == ROOT / "setup.cfg"
    assert request.config.getini("timeout") == "120"
    assert request.config.getini("testpaths") == ["tests"]


def test_mypy_reads_setup_cfg(tmp_path: Path) -> None:
    """Run from the root with no options, mypy is strict: the config came from setup.cfg."""
    loose = tmp_path / "loose.py"
    loose.write_text("def f(x):\n    return x\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--verbose", "--cache-dir", str(tmp_path),
                           str(loose)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Function is missing a type annotation" in proc.stdout
    assert re.search(r"Config File: +" + re.escape(str(ROOT / "setup.cfg")), proc.stderr)
