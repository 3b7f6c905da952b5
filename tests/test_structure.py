"""The application layer's shape (issue 23): imports point one way, functions stay readable.

Walks dfmp2/ with ``ast`` (function-level imports included, since those are how a cycle hides)."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "dfmp2"
MAX_FUNCTION_LINES = 100


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(name: str, path: Path) -> set:
    """The dfmp2 modules that ``name`` imports anywhere in its file (top level or in a function)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dfmp2")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base[:len(base) - node.level + 1]
                mod = ".".join(pkg + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("dfmp2"):
                continue
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}    # 'from . import scf' names a module
    return out


def _graph():
    mods = dict(_modules())
    graph = {}
    for name, path in mods.items():
        # the package's own __init__ (dfmp2: the light API entry) is not an edge of its children
        graph[name] = {m for m in _imports(name, path) if m in mods and m != name and m != "dfmp2"}
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(n, stack):
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m, stack + [m])
                if found:
                    return found
        state[n] = 2
        return None
    for n in sorted(graph):
        if n not in state:
            found = visit(n, [n])
            if found:
                return found
    return None


def test_the_walker_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "dfmp2.fitting" in _graph()["dfmp2.dfhf"]       # function-level and relative imports count


def test_no_import_cycle_in_dfmp2():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_stages_do_not_import_the_orchestrator():
    """The SCF and the MP2 stage are peers below the pipeline: neither imports it."""
    g = _graph()
    for stage in ("dfmp2.dfhf", "dfmp2.mp2", "dfmp2.scf", "dfmp2.reference", "dfmp2.fitting",
                  "dfmp2.timing", "dfmp2.outofcore", "dfmp2.integrals"):
        assert "dfmp2.pipeline" not in g[stage], stage


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda x: str(x))
def test_no_function_over_100_lines(name, path):
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)}"
