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


def test_shared_fixtures_are_defined_once() -> None:
    """The fixtures every kind of test needs live in tests/conftest.py, not copied per file."""
    shared = ("server", "redis_url", "postgres_url", "postgres_schema", "gate")
    copies = {
        f"{path.name}: {name}"
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        for name in shared
        if re.search(rf"^def {name}\(", path.read_text(), re.M)
    }
    assert copies == set()
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert all(re.search(rf"^def {name}\(", conftest, re.M) for name in shared)


def test_without_postgresql_binaries_the_suite_says_how_to_get_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conftest

    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest.glob, "glob", lambda pattern: [])
    assert conftest.postgres_binaries() is None
    assert "apt-get install postgresql" in conftest.POSTGRES_HOW


def test_debian_postgresql_binaries_off_path_are_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import conftest

    for version in ("9.6", "13", "15"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "initdb").write_text("#!/bin/sh\n")
        (tmp_path / version / "bin" / "initdb").chmod(0o755)
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest.glob, "glob",
                        lambda pattern: [str(p) for p in tmp_path.glob("*/bin")])
    assert conftest.postgres_binaries() == str(tmp_path / "15" / "bin")  # the newest


@pytest.mark.timeout(180)
def test_the_suite_starts_a_throwaway_postgresql_itself() -> None:
    """What the ``postgres_url`` fixture does without LOUSHO_TEST_POSTGRES_URL: a server of
    its own (as the ``postgres`` user when root), reachable, then stopped and removed."""
    import conftest

    psycopg = pytest.importorskip("psycopg")
    bin_dir = conftest.postgres_binaries()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL's binaries are not installed: {conftest.POSTGRES_HOW}")
    with conftest.throwaway_postgres(bin_dir) as (url, ctl):
        assert url.startswith("postgresql://postgres@127.0.0.1:")
        data = Path(ctl.split(" -D ", 1)[1])
        assert data.is_dir()
        with psycopg.connect(url, connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not data.parent.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
