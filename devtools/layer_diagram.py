"""The architecture page's layer table, generated from the layer test and the packages' own docstrings.

tests/test_layout.py's LAYERS is the one statement of which package sits on which layer (the test enforces it on
every import, lazy ones too), and each package's docstring says what it is for. This reads both without importing
them (the layer rule forbids devtools to import tests), so the table in docs/developers/architecture.md changes
when they do: devtools/docs_generate.py writes it and tests/test_docs.py fails while it is stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYOUT_TEST = REPO_ROOT / "tests" / "test_layout.py"
NAMESPACE = "medgemma_xray"


def read_layers(layout_test: Path = LAYOUT_TEST) -> dict[str, int]:
    """The LAYERS mapping of tests/test_layout.py, evaluated from its source (the NAMESPACE f-strings included)."""
    tree = ast.parse(layout_test.read_text())
    namespace: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name = node.target.id
        else:
            continue
        if name in ("NAMESPACE", "LAYERS"):
            value = node.value
            namespace[name] = eval(compile(ast.Expression(value), str(layout_test), "eval"), {}, dict(namespace))  # noqa: S307 (our source)
    layers = namespace.get("LAYERS")
    if not isinstance(layers, dict) or not layers:
        raise ValueError(f"{layout_test} has no LAYERS mapping to read the layers from")
    return {str(key): int(value) for key, value in layers.items()}


def _summary(unit: str, repo_root: Path) -> str:
    """The first paragraph of the unit's docstring, on one line ('' when it has none or does not exist yet)."""
    source = _source_of(unit, repo_root)
    if source is None:
        return ""
    docstring = ast.get_docstring(ast.parse(source.read_text())) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def _source_of(unit: str, repo_root: Path) -> Path | None:
    """The file whose docstring describes a LAYERS key: a package's __init__.py or a module's .py file."""
    base = repo_root / "src" / Path(*unit.split(".")) if unit.startswith(f"{NAMESPACE}.") else repo_root / unit
    source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return source if source.is_file() else None


def render(layout_test: Path = LAYOUT_TEST, repo_root: Path = REPO_ROOT) -> str:
    """A Markdown table of the layers, lowest first: layer, units, and what each is for."""
    layers = read_layers(layout_test)
    lines = ["| layer | package or module | what it is for |", "|---|---|---|"]
    for unit, layer in sorted(layers.items(), key=lambda item: (item[1], item[0])):
        source = _source_of(unit, repo_root)
        shown = unit.removeprefix(f"{NAMESPACE}.")
        if source is not None:
            shown += "/" if source.name == "__init__.py" else ".py"
        summary = (_summary(unit, repo_root) or "–") if source is not None else "(not in this tree yet)"
        lines.append(f"| {layer} | `{shown}` | {summary.replace('|', '/')} |")
    return "\n".join(lines)
