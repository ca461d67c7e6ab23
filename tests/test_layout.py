"""The package rule, read from the code's own imports (lazy ones inside functions too).

A package imports only packages on a lower layer; nothing imports upward and there is no cycle between modules.
tests/ is a leaf; benchmarks/ is imported only by its own command line, benchmark.py. devtools/ is test support: product code never imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Lower number = lower layer. A module may import from its own package and from any lower layer.
LAYERS: dict[str, float] = {
    "engine_bundle": 0,
    "inference_api": 1,
    "xray_io": 1,
    "phantoms": 2,
    "pytorch_backend": 2,
    "trt_inference": 2,
    "assistant": 2,
    "film_check": 2.5,  # calibrates on phantoms (2); the UI and the OpenAI API (serving, 3) both run it
    "serving": 3,
    "engine_build": 3,
    "demo_model": 3,
    "teaching": 3,
    "teaching_ui": 3.5,  # the teaching-rounds page: uses serving and teaching (3); app (4) adds it with one call
    "app": 4,
    "batch_films": 4,
    "optimize_trt_engine": 4,
    "devtools": 5,
    "deploy": 5,  # the container entry point: imports app and serving
    "scaleout": 5,  # Ray Serve application: imports app (the UI) and serving
    "benchmarks": 6,
    "benchmark": 7,  # the benchmarks package's command line: the one module that may import it
    "tests": 8,
}
LEAVES = {"tests"}


def _package_of(path: Path) -> str:
    relative = path.relative_to(REPO)
    return relative.parts[0].removesuffix(".py")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _python_files() -> list[Path]:
    files = []
    for name in LAYERS:
        target = REPO / name
        if target.is_dir():
            files.extend(p for p in target.rglob("*.py") if "trained" not in p.parts)
        elif (REPO / f"{name}.py").is_file():
            files.append(REPO / f"{name}.py")
    return sorted(files)


def project_imports(path: Path) -> set[str]:
    """Every project module this file names in an import statement, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in LAYERS)
    return found


def import_graph() -> dict[str, set[str]]:
    files = _python_files()
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in project_imports(path):
            # "from a.b import c" names a.b.c, which is a module only if such a file exists.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_every_top_level_package_has_a_layer():
    tops = {p.name.removesuffix(".py") for p in REPO.iterdir() if (p.is_dir() and (p / "__init__.py").exists())}
    tops |= {p.stem for p in REPO.glob("*.py")}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS: {sorted(tops - set(LAYERS))}"


def test_no_package_imports_upward_or_a_leaf():
    wrong = []
    for module, targets in import_graph().items():
        own = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other == own:
                continue
            if other in LEAVES or LAYERS[other] >= LAYERS[own]:
                wrong.append(f"{module} -> {target} (layer {LAYERS[own]} -> {LAYERS[other]})")
    assert not wrong, "imports against the layer rule:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_modules():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in graph.get(node, ()):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["phantoms", "demo_model", "engine_bundle"])
def test_moved_packages_exist(package):
    assert (REPO / package / "__init__.py").is_file()
