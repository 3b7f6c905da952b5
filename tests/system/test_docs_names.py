"""Every dotted ``dfmp2.…`` name the documentation mentions resolves: the docstrings under dfmp2/,
docs/*.md, README.md and ARCHITECTURE.md. A renamed module or function leaves no name behind that
a reader (or jedi) cannot follow. The test imports the longest importable module prefix of each name
and takes the rest as attributes; it reports every unresolved name at once."""

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w./-])dfmp2(?:\.[A-Za-z_]\w*)+")

# Names written on purpose that are not importable, each with its reason.
NOT_IMPORTABLE: dict[str, str] = {}


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc


def mentioned() -> dict[str, str]:
    """{name: where it was first seen} over the docstrings and the manual."""
    seen: dict[str, str] = {}
    sources = [(p, "\n".join(_docstrings(p))) for p in sorted((ROOT / "dfmp2").rglob("*.py"))]
    for p in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "ARCHITECTURE.md"]:
        sources.append((p, p.read_text(encoding="utf-8")))
    for path, text in sources:
        for m in NAME.finditer(text):
            seen.setdefault(m.group(0), str(path.relative_to(ROOT)))
    return seen


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_dfmp2_name_resolves():
    names = mentioned()
    assert len(names) > 20  # the scan found the documentation
    bad = [
        f"{name} ({where})"
        for name, where in sorted(names.items())
        if name not in NOT_IMPORTABLE and not resolves(name)
    ]
    assert not bad, "unresolved dfmp2 names:\n" + "\n".join(bad)
