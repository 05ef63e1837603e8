"""The package's structure, read from its imports (ast): no import cycle, every import goes
down the documented layers (docs/architecture.md), and no module uses another module's
``_private`` names. A new module must be given its layer here. Below the floors, rules that
no edit of them can switch off: the stores never import the turn core, the providers never
import a store, lousho_aio reaches the core only through the public API and its bridge, and
the CLI and the demo only through the public API."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The floors, lowest first: a module may import only from floors strictly below its own
# (modules on one floor are independent of each other).
LAYERS: list[set[str]] = [
    {"lousho_sync.errors", "lousho_sync.callers",
     "lousho_sync._schema", "lousho_sync._docstring"},
    {"lousho_sync.ids", "lousho_sync.signal", "lousho_sync.messages", "lousho_sync._hints"},
    {"lousho_sync.records", "lousho_sync.catalog", "lousho_sync.inputs", "lousho_sync.results",
     "lousho_sync._loop", "lousho_sync._message_form",
     "lousho_sync.providers.base", "lousho_sync.providers._sse", "lousho_sync.stores._lease",
     "lousho_sync.providers._secret", "lousho_sync._tool_run", "lousho_sync.providers._conn"},
    {"lousho_sync.events", "lousho_sync.codec", "lousho_sync.limits", "lousho_sync.tools",
     "lousho_sync.stores.base", "lousho_sync.providers._builder",
     "lousho_sync.stores._sqlite_driver", "lousho_sync._idempotency"},
    {"lousho_sync._otel", "lousho_sync.compaction", "lousho_sync.providers._http",
     "lousho_sync.providers.scripted", "lousho_sync.stores._redis_scripts",
     "lousho_sync._lease_hold", "lousho_sync.stores._common", "lousho_sync.stores._sqlite_rows",
     "lousho_sync.stores._events", "lousho_sync.stores._mail",
     "lousho_sync.stores._postgres_listen",
     "lousho_sync.event_json", "lousho_sync._event_rows",
     "lousho_sync.stores.bundle", "lousho_sync.stores._expiry", "lousho_sync.stores._engine",
     "lousho_sync.stores._engine.backend", "lousho_sync.stores._sealing"},
    {"lousho_sync._turnlog", "lousho_sync.control", "lousho_sync._eventlog",
     "lousho_sync.approvals", "lousho_sync.stores._redis_conn",
     "lousho_sync.providers._wire",
     "lousho_sync.stores._sqlite_db", "lousho_sync.stores._postgres_db",
     "lousho_sync.stores._engine.leases", "lousho_sync.stores._sealed_mail"},
    {"lousho_sync.stores._sqlite_events", "lousho_sync.stores._redis_live",
     "lousho_sync.stores._file_events", "lousho_sync.stores._sealed_events",
     "lousho_sync.stores._postgres_live", "lousho_sync.stores._engine.approvals",
     "lousho_sync.stores._engine.checkpoints", "lousho_sync.stores._engine.commits",
     "lousho_sync.stores._sqlite_mail", "lousho_sync.stores._file_mail",
     "lousho_sync.stores._redis_mail", "lousho_sync.stores._postgres_mail",
     "lousho_sync.stores._memory_mail",
     "lousho_sync._mailbox", "lousho_sync.stores._key_expiry"},
    {"lousho_sync.stores._sqlite_ops", "lousho_sync.stores._postgres_ops",
     "lousho_sync.stores._redis_events", "lousho_sync.stores._postgres_events",
     "lousho_sync.stores._postgres_rows",
     "lousho_sync.stores._redis_ops", "lousho_sync.stores._memory_ops",
     "lousho_sync.stores.storage"},
    {"lousho_sync.stores._file_layout", "lousho_sync.stores._file_lease"},
    {"lousho_sync.stores._file_catalog"},
    {"lousho_sync.providers.openai", "lousho_sync.providers.anthropic",
     "lousho_sync.stores.memory", "lousho_sync.stores.files", "lousho_sync.stores.sqlite",
     "lousho_sync.stores.redis", "lousho_sync.stores.postgres", "lousho_sync.stores.encrypted"},
    {"lousho_sync.providers.registry", "lousho_sync.providers", "lousho_sync.stores",
     "lousho_sync.sqlite", "lousho_sync.redis", "lousho_sync.postgres", "lousho_sync.turn_state"},
    {"lousho_sync.executor", "lousho_sync._session_state", "lousho_sync.run"},
    {"lousho_sync._session_parts"},
    {"lousho_sync.turns", "lousho_sync._session_ops", "lousho_sync._detached"},
    {"lousho_sync.session"},
    {"lousho_sync.agent"},
    {"lousho_sync"},
    {"lousho_sync.demo", "lousho_sync.sse", "lousho_sync._cli_store", "lousho_sync._cli_chat",
     "lousho_sync._cli_approvals"},
    {"lousho_sync.inbox"},
    {"lousho_sync.cli"},
    {"lousho_sync.__main__"},
    {"lousho_aio._bridge"},
    {"lousho_aio.run"},
    {"lousho_aio.session"},
    {"lousho_aio.agent"},
    {"lousho_aio", "lousho_aio.sse"},
]
FLOOR = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("lousho_sync", "lousho_aio"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    for _ in range(node.level - 1):
        base.pop()
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, str, int]]:
    """(imported module, name imported or "", line) for every lousho import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:  # "from . import _loop": the submodule itself
                    out.append((sub, "", node.lineno))
                elif target in known:
                    out.append((target, alias.name, node.lineno))
    return out


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(_modules()) - set(FLOOR))
    assert not missing, f"give these modules a floor in LAYERS: {missing}"


def test_imports_go_down_the_layers_only() -> None:
    modules = _modules()
    bad = []
    for module, path in modules.items():
        for target, _, line in _imports(module, path, set(modules)):
            if target == module:
                continue
            if FLOOR[target] >= FLOOR[module]:
                bad.append(f"{path.relative_to(ROOT)}:{line} {module} (floor {FLOOR[module]}) "
                           f"imports {target} (floor {FLOOR[target]})")
    assert not bad, "imports that climb the layers:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {m: {t for t, _, _ in _imports(m, p, set(modules)) if t != m}
             for m, p in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_uses_another_modules_private_names() -> None:
    modules = _modules()
    bad = []
    for module, path in modules.items():
        for target, name, line in _imports(module, path, set(modules)):
            if name.startswith("_") and not name.startswith("__") and target != module:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}.{name}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {a.asname or a.name.rpartition(".")[2]
                   for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for a in n.names}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and f"{module.rpartition('.')[0]}.{node.value.id}" in modules):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses "
                           f"{node.value.id}.{node.attr}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


# --- rules no edit of LAYERS can switch off ----------------------------------------------------
# The floors above say today's order; these say what must never happen, whatever the order.
_CORE_ROOTS = ("lousho_sync.control", "lousho_sync.turn_state")
"""What runs a turn: its live control and its data. The turn core is these and every module
that imports one of them, directly or not (read from the imports, not from ``LAYERS``)."""
_PUBLIC_CORE = frozenset({
    "lousho_sync", "lousho_sync.session", "lousho_sync.agent", "lousho_sync.run"})
"""The turn core's public modules: the package root, ``Session``, ``Agent``, ``AgentRun``."""
_BRIDGE_MAY_IMPORT = frozenset({"lousho_sync._tool_run", "lousho_sync.callers"})
"""The private modules lousho_aio's ``_bridge`` reaches: the tool loop and who is calling."""
_CLI = frozenset({"lousho_sync.cli", "lousho_sync.demo", "lousho_sync.__main__",
                  "lousho_sync._cli_store", "lousho_sync._cli_chat",
                  "lousho_sync._cli_approvals", "lousho_sync.inbox"})


def _public(module: str) -> bool:
    """A module of the public API: no ``_private`` part in its name."""
    return not any(part.startswith("_") for part in module.split("."))


def _turn_core() -> set[str]:
    graph: dict[str, set[str]] = {}
    for m, t, _ in _edges():
        graph.setdefault(m, set()).add(t)
    core = set(_CORE_ROOTS)
    grew = True
    while grew:
        grew = False
        for m, targets in graph.items():
            if m not in core and targets & core:
                core.add(m)
                grew = True
    return core


def test_the_turn_core_is_found() -> None:
    core = _turn_core()
    assert {"lousho_sync.executor", "lousho_sync.turns", "lousho_sync.session",
            "lousho_sync._session_state", "lousho_sync.agent"} <= core


def _edges() -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every import between the packages' modules."""
    modules = _modules()
    out = []
    for module, path in modules.items():
        for target, _, line in _imports(module, path, set(modules)):
            if target != module:
                out.append((module, target, f"{path.relative_to(ROOT)}:{line}"))
    return out


def test_stores_never_import_the_turn_core() -> None:
    core = _turn_core()
    bad = [f"{where} {m} imports {t}" for m, t, where in _edges()
           if m.startswith("lousho_sync.stores") and t in core]
    assert not bad, "a store imports the turn core:\n" + "\n".join(bad)


def test_providers_never_import_stores_or_the_turn_core() -> None:
    core = _turn_core()
    bad = [f"{where} {m} imports {t}" for m, t, where in _edges()
           if m.startswith("lousho_sync.providers")
           and (t.startswith("lousho_sync.stores") or t in core)]
    assert not bad, "a provider imports a store or the turn core:\n" + "\n".join(bad)


def test_lousho_aio_reaches_the_core_only_through_the_public_api_and_its_bridge() -> None:
    core = _turn_core()
    bad = []
    for m, t, where in _edges():
        if not m.startswith("lousho_aio") or not t.startswith("lousho_sync"):
            continue
        if m == "lousho_aio._bridge" and t in _BRIDGE_MAY_IMPORT:
            continue
        if not _public(t) or t in core - _PUBLIC_CORE:
            bad.append(f"{where} {m} imports {t}")
    assert not bad, "lousho_aio reaches past the public API:\n" + "\n".join(bad)


def test_the_cli_and_the_demo_use_the_public_api_only() -> None:
    core = _turn_core()
    bad = [f"{where} {m} imports {t}" for m, t, where in _edges()
           if m in _CLI and t not in _CLI and (not _public(t) or t in core - _PUBLIC_CORE)]
    assert not bad, "the CLI or the demo reaches past the public API:\n" + "\n".join(bad)


STORE_MODULE_MAX_LINES = 600  # issue 27: a store's rules live in the engine, not in its module


def test_no_store_module_is_over_600_lines() -> None:
    """A backend keeps its schema, statements and row decoding; the rules it shares with the
    others live in ``stores/_engine`` (a module past this size has grown rules of its own)."""
    over = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "lousho_sync" / "stores").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > STORE_MODULE_MAX_LINES
    }
    assert not over, f"store modules over {STORE_MODULE_MAX_LINES} lines: {over}"
