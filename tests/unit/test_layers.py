"""The import contract, read from the source (AST): which layer may import which, and no import circles.

The device package is grouped by job (``edgesdk/runtime``, ``fleet``, ``offload``, ``agent``, ``cli``, and the shared
plumbing beside them); ARCHITECTURE.md's dependency direction is enforced here:

- the device package never imports the converter or server wing, and the CLI only inside its commands;
- ``runtime`` imports nothing from ``fleet``, ``agent``, ``cli`` or ``offload``; its single allowed exception is
  :data:`SEAM`, which may import ``offload`` inside functions (or for type checking) only;
- ``offload`` and ``fleet`` import nothing from ``agent`` or ``cli``, nor from each other;
- the shared plumbing imports none of the jobs;
- no module of the three wings reaches itself through imports, lazy ones included (``TYPE_CHECKING`` blocks are
  left out: they never run).

The planted tests break each rule in a copy of the tree and check that the checker names the break.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WINGS = ("edgesdk.converters", "edgesdk.ota_server")
#: Where each wing's source lives, and the import name it has once installed (pyproject's package-dir).
PACKAGES = {"edgesdk": "edgesdk", "converters": "edgesdk.converters", "ota_server": "edgesdk.ota_server"}
#: The one runtime module allowed to reach ``offload``: ``Runtime(offload=...)`` and ``predict_async`` compose the
#: dispatcher through it, importing it on first use.
SEAM = "edgesdk.runtime.async_predictions"
SHARED = ("edgesdk.errors", "edgesdk.files", "edgesdk.logs", "edgesdk.lazy")
JOBS = ("edgesdk.runtime", "edgesdk.fleet", "edgesdk.offload", "edgesdk.agent", "edgesdk.cli")
#: What each job may not import (on top of the wings rule).
FORBIDDEN = {
    "edgesdk.runtime": ("edgesdk.fleet", "edgesdk.agent", "edgesdk.cli", "edgesdk.offload"),
    "edgesdk.offload": ("edgesdk.fleet", "edgesdk.agent", "edgesdk.cli"),
    "edgesdk.fleet": ("edgesdk.offload", "edgesdk.agent", "edgesdk.cli"),
    **{shared: JOBS for shared in SHARED},
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is, and how it runs."""

    module: str  # the importing module, dotted
    line: int
    target: str  # the imported module (or the package a name came from)
    top_level: bool  # runs when the module is imported (not inside a function)
    type_only: bool  # inside ``if TYPE_CHECKING:``: never runs


def _module_name(path: Path, root: Path) -> str:
    folder, *rest = path.relative_to(root).with_suffix("").parts
    parts = [PACKAGES[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, top_level: bool, type_only: bool):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, top_level, type_only
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _walk(child, False, type_only)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), top_level, True)
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), top_level, type_only)
        else:
            yield from _walk(child, top_level, type_only)


def scan(root: Path) -> tuple[set[str], list[Import]]:
    """Every module of the three wings under ``root`` and every import of a project module they make."""
    files = {_module_name(path, root): path for folder in PACKAGES for path in (root / folder).rglob("*.py")}
    imports = []
    for module, path in sorted(files.items()):
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, top_level, type_only in _walk(ast.parse(path.read_text()), True, False):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from pkg import submodule`` imports the submodule; ``from mod import name`` the module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            imports += [Import(module, node.lineno, t, top_level, type_only)
                        for t in dict.fromkeys(targets) if t == "edgesdk" or t.startswith("edgesdk.")]
    return set(files), imports


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(root: Path) -> list[str]:
    """Each import that breaks a layer rule, as ``module:line: target (rule)``."""
    _, imports = scan(root)
    found = []
    for imp in imports:
        where = f"{imp.module}:{imp.line}: {imp.target}"
        if _within(imp.module, "edgesdk.cli"):
            if imp.top_level and not imp.type_only and imp.target.startswith(WINGS):
                found.append(f"{where} (the CLI imports the wings only inside commands)")
            continue
        if imp.module.startswith("edgesdk.") and not imp.module.startswith(WINGS) and imp.target.startswith(WINGS):
            found.append(f"{where} (the device package never imports the converter or server wing)")
        for layer, banned in FORBIDDEN.items():
            if not _within(imp.module, layer):
                continue
            for other in banned:
                if not _within(imp.target, other):
                    continue
                if imp.module == SEAM and other == "edgesdk.offload" and (imp.type_only or not imp.top_level):
                    continue  # the one lazy seam
                found.append(f"{where} ({layer} imports nothing from {other})")
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """Import circles among the project's modules (lazy imports count; TYPE_CHECKING ones do not)."""
    modules, imports = scan(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if not imp.type_only and imp.target in modules and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    cycles, state, stack = [], dict.fromkeys(graph, 0), []  # 0 new, 1 on the stack, 2 done

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif state[nxt] == 0:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node)
    return cycles


def test_every_layer_rule_holds():
    assert not layer_violations(ROOT), "\n".join(layer_violations(ROOT))


def test_there_are_no_import_circles():
    cycles = import_cycles(ROOT)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_seam_is_the_only_runtime_module_that_reaches_offload_and_it_does_so_lazily():
    _, imports = scan(ROOT)
    reaching = [i for i in imports if _within(i.module, "edgesdk.runtime") and _within(i.target, "edgesdk.offload")]
    assert {i.module for i in reaching} == {SEAM}, reaching
    assert all(i.type_only or not i.top_level for i in reaching), reaching


def test_the_scan_sees_lazy_imports_relative_imports_and_submodules(tmp_path):
    # The checker's own reading, on a tree whose imports are known.
    pkg = tmp_path / "edgesdk"
    (pkg / "runtime").mkdir(parents=True)
    for folder in ("converters", "ota_server"):
        (tmp_path / folder).mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "runtime" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from edgesdk.runtime.c import C\n"
        "def f():\n    import edgesdk.runtime.c\n")
    (pkg / "runtime" / "b.py").write_text("")
    (pkg / "runtime" / "c.py").write_text("from edgesdk.runtime.a import f\n")
    modules, imports = scan(tmp_path)
    assert modules == {"edgesdk", "edgesdk.runtime", "edgesdk.runtime.a", "edgesdk.runtime.b", "edgesdk.runtime.c"}
    got = {(i.module, i.target, i.top_level, i.type_only) for i in imports}
    assert got == {("edgesdk.runtime.a", "edgesdk.runtime.b", True, False),
                   ("edgesdk.runtime.a", "edgesdk.runtime.c", True, True),
                   ("edgesdk.runtime.a", "edgesdk.runtime.c", False, False),
                   ("edgesdk.runtime.c", "edgesdk.runtime.a", True, False)}
    assert import_cycles(tmp_path) == [["edgesdk.runtime.a", "edgesdk.runtime.c", "edgesdk.runtime.a"]]


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"  # planting happens in a copy: a test never edits the checkout
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _plant(path: Path, source: str) -> int:
    """Append ``source`` to ``path``; the line it starts on."""
    text = path.read_text()
    path.write_text(text + "\n" + source)
    return len(text.splitlines()) + 2


def test_planted_imports_that_break_each_rule_are_each_named(tmp_path):
    copy = _copy(tmp_path)
    planted = {
        "edgesdk.runtime.stats": ("from edgesdk.fleet.protocol import parse_command\n",
                                  "edgesdk.runtime imports nothing from edgesdk.fleet"),
        "edgesdk.runtime.runtime": ("def _f():\n    from edgesdk.agent.agent import DeviceAgent\n",
                                    "edgesdk.runtime imports nothing from edgesdk.agent"),
        "edgesdk.runtime.bundle": ("def _g():\n    from edgesdk.offload.policy import OffloadPolicy\n",
                                   "edgesdk.runtime imports nothing from edgesdk.offload"),
        "edgesdk.runtime.async_predictions": ("from edgesdk.offload.dispatcher import Dispatcher as _D\n",
                                              "edgesdk.runtime imports nothing from edgesdk.offload"),
        "edgesdk.fleet.records": ("from edgesdk.agent.store import SlotStore\n",
                                  "edgesdk.fleet imports nothing from edgesdk.agent"),
        "edgesdk.offload.client": ("import edgesdk.fleet.transport\n",
                                   "edgesdk.offload imports nothing from edgesdk.fleet"),
        "edgesdk.errors": ("def _h():\n    from edgesdk.runtime import runtime\n",
                           "edgesdk.errors imports nothing from edgesdk.runtime"),
        "edgesdk.runtime.profiles": ("def _i():\n    import edgesdk.converters.planning.planner\n",
                                     "the device package never imports the converter or server wing"),
        "edgesdk.cli.server": ("from edgesdk.ota_server.app import build_app\n",
                               "the CLI imports the wings only inside commands"),
    }
    expected = []
    for module, (source, rule) in planted.items():
        path = copy.joinpath("edgesdk", *module.split(".")[1:]).with_suffix(".py")
        line = _plant(path, source) + (1 if source.startswith("def") else 0)
        expected.append((f"{module}:{line}:", rule))
    found = layer_violations(copy)
    for prefix, rule in expected:
        assert any(f.startswith(prefix) and f.endswith(f"({rule})") for f in found), (prefix, rule, found)
    assert len(found) == len(expected), found


def test_a_planted_circle_through_a_lazy_import_is_found(tmp_path):
    copy = _copy(tmp_path)
    # The circle issue 22 found: runtime -> bundle -> (lazily) something that imports runtime.
    _plant(copy / "edgesdk" / "runtime" / "bundle.py", "def _sample():\n    from edgesdk.runtime.bench import x\n")
    cycles = import_cycles(copy)
    assert any(c[0] == "edgesdk.runtime.bundle" or "edgesdk.runtime.bundle" in c for c in cycles), cycles
    assert any({"edgesdk.runtime.bundle", "edgesdk.runtime.bench", "edgesdk.runtime.runtime"} <= set(c)
               for c in cycles), cycles
