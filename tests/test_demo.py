"""`lousho demo` runs offline and shows the resume and the approval."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_lousho_demo_runs_offline_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lousho_sync.cli", "demo", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "agent> Your name is Ali." in out
    assert "tool.call   get_weather({'city': 'Rome'})" in out
    assert "killed child process" in out
    assert "pending() = PendingTurn(status='interrupted'" in out
    assert "resumed: agent> Done: report 2026 ready" in out
    assert "finish_reason=awaiting-approval" in out
    assert "agent> Done: sent 25.00 to Bob." in out
    assert out.rstrip().endswith("demo finished: ok")
    assert (tmp_path / "agent.db").exists()


def test_lousho_demo_on_a_stock_python_prints_no_warning(tmp_path: Path) -> None:
    """The standard sqlite3 module (what a stock Python has, most often with the WAL-reset
    bug, which SqliteStore guards against) and no LOUSHO_ variable: stderr stays empty."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_")}
    proc = subprocess.run([sys.executable, "-m", "lousho_sync", "demo"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.rstrip().endswith("demo finished: ok")


def test_the_install_section_names_the_sqlite_extra() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    setup = readme[readme.index("\n## Set up\n"):readme.index("\n## Quick start")]
    assert "pip install 'lousho[sqlite]'" in setup
