"""The package rule, read from the code's own imports (lazy ones inside functions too).

The product is one namespace, medgemma_xray (src/medgemma_xray). Each of its packages sits on a layer, and a module
imports only from its own package and from packages on lower layers: nothing imports upward and there is no cycle
between modules. Outside the namespace: the three launcher files at the root, devtools/ (test support: product
code never imports it), benchmarks/ (imported only by its own command line, benchmark.py) and tests/ (a leaf).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
NAMESPACE = "medgemma_xray"

# Lower number = lower layer. Keys are a namespace package ("medgemma_xray.serving") or a top-level module or
# package outside it ("devtools", "app").
LAYERS: dict[str, int] = {
    f"{NAMESPACE}.engine_bundle": 0,  # each name shared by build and runtime, once
    f"{NAMESPACE}.inference_api": 1,  # the backend contract
    f"{NAMESPACE}.xray_io": 1,  # bytes to a radiograph
    f"{NAMESPACE}.grounding": 1,  # boxes in MedGemma 1.5's format, and the prompts that ask for them
    f"{NAMESPACE}.phantoms": 2,
    f"{NAMESPACE}.pytorch_backend": 2,
    f"{NAMESPACE}.trt_inference": 2,
    f"{NAMESPACE}.assistant": 2,
    f"{NAMESPACE}.film_check": 3,  # calibrates on phantoms (2)
    f"{NAMESPACE}.intake": 4,  # one film intake for every door: decode, film check, model image
    f"{NAMESPACE}.serving": 5,  # the runtime: service, scheduler, breaker, metrics, settings, operator channel
    f"{NAMESPACE}.engine_build": 5,
    f"{NAMESPACE}.demo_model": 5,
    f"{NAMESPACE}.teaching": 5,
    f"{NAMESPACE}.web": 6,  # the HTTP edge and the pages
    f"{NAMESPACE}.cli": 7,  # batch, engine build, container entry point
    f"{NAMESPACE}.scaleout": 7,  # Ray Serve: the ingress serves web's pages over replicas of serving
    "app": 8,  # the launcher files the operator scripts and the docs name
    "batch_films": 8,
    "optimize_trt_engine": 8,
    "devtools": 8,
    "benchmarks": 9,
    "benchmark": 10,  # the benchmarks package's command line: the one module that may import it
    "tests": 11,
}
LEAVES = {"tests"}
ROOT_MODULE = NAMESPACE  # medgemma_xray/__init__.py: a docstring, imports nothing


def _unit_of(module: str) -> str:
    """The LAYERS key a dotted module name belongs to."""
    parts = module.split(".")
    if parts[0] == NAMESPACE:
        return ".".join(parts[:2]) if len(parts) > 1 else ROOT_MODULE
    return parts[0]


def _module_name(path: Path) -> str:
    base = SRC if path.is_relative_to(SRC) else REPO
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _python_files() -> list[Path]:
    files = [p for p in (SRC / NAMESPACE).rglob("*.py") if "trained" not in p.parts]
    for name in LAYERS:
        if name.startswith(NAMESPACE):
            continue
        target = REPO / name
        if target.is_dir():
            files.extend(target.rglob("*.py"))
        elif (REPO / f"{name}.py").is_file():
            files.append(REPO / f"{name}.py")
    return sorted(files)


def _is_project(name: str) -> bool:
    return _unit_of(name) in LAYERS


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
        found.update(name for name in names if _is_project(name))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _python_files()}
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


def test_every_package_has_a_layer():
    inside = {f"{NAMESPACE}.{p.name}" for p in (SRC / NAMESPACE).iterdir() if (p / "__init__.py").is_file()}
    outside = {p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    outside |= {p.stem for p in REPO.glob("*.py")}
    missing = (inside | outside) - set(LAYERS)
    assert not missing, f"give these a layer in LAYERS: {sorted(missing)}"


def test_no_package_imports_upward_or_a_leaf():
    wrong = []
    for module, targets in import_graph().items():
        own = _unit_of(module)
        for target in targets:
            other = _unit_of(target)
            if other == own:
                continue
            if other == ROOT_MODULE or other in LEAVES or LAYERS[other] >= LAYERS[own]:
                wrong.append(f"{module} -> {target} (layer {LAYERS.get(own)} -> {LAYERS.get(other)})")
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


def test_the_namespace_is_the_only_product_package_at_the_top():
    """One installable distribution: no product package beside src/medgemma_xray, and nothing puts a folder on
    sys.path by hand (the package is installed; scripts run with -m from the root)."""
    beside = sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != NAMESPACE and p.name != "__pycache__")
    assert beside in ([], [f"{NAMESPACE.replace('_', '-')}-assistant.egg-info"]) or all(
        name.endswith(".egg-info") for name in beside
    ), beside
    inserts = [
        str(path.relative_to(REPO))
        for path in _python_files() + sorted((REPO / "tests").rglob("*.py"))
        if "sys.path.insert" in path.read_text() and path != Path(__file__).resolve()
    ]
    assert not inserts, f"sys.path.insert in {inserts}: run the module with python -m from the root instead"


@pytest.mark.parametrize("layer", [value for value in LAYERS.values()])
def test_layers_are_whole_numbers(layer):
    assert isinstance(layer, int)
