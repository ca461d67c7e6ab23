"""The configuration reference page, generated from serving.settings.Settings so that it cannot drift.

Each variable's name, type, default and valid values are read from the code: the dataclass's fields and their
defaults, the choices and ranges that `Settings.validated` checks, and the flags of the server's command line. Only
the explanation is written by hand, in docs/operators/settings.yml, which also orders the fields into sections. A
field with no explanation, or an explanation for a field that no longer exists, is an error here, so the docs build
(mkdocs_hooks.py, `mkdocs build --strict`) and tests/test_docs.py fail until the page is complete.

    .venv/bin/python -m devtools.settings_reference            # print the page's Markdown
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DESCRIPTIONS = REPO_ROOT / "docs" / "operators" / "settings.yml"
SERVER_CLI = REPO_ROOT / "src" / "medgemma_xray" / "web" / "http_server.py"
PAGE_PATH = "operators/configuration.md"  # where the page appears in the site


class ReferenceIncomplete(ValueError):
    """A Settings field has no explanation in settings.yml, or settings.yml explains a field that is gone."""


@dataclass(frozen=True)
class Constraint:
    """What Settings.validated accepts for one field, read from its source."""

    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None


def validation_constraints(settings_cls: type) -> dict[str, Constraint]:
    """Field name -> the choices or range its `validated` method checks, read from the method's own calls:
    `_one_of("NAME", self.field, CHOICES)` and `_in_range("NAME", self.field, low, high)`, including those made in a
    loop over a tuple of field names. Names and constants are evaluated in the settings module."""
    validated = getattr(settings_cls, "validated", None)
    if validated is None:
        return {}
    module = inspect.getmodule(settings_cls)
    namespace = vars(module) if module is not None else {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(validated)))
    found: dict[str, Constraint] = {}

    def evaluate(node: ast.expr, loop: dict[str, str]) -> object:
        if isinstance(node, ast.Name) and node.id in loop:
            return loop[node.id]
        return eval(compile(ast.Expression(node), "<settings>", "eval"), dict(namespace))  # noqa: S307 (our source)

    def field_of(node: ast.expr, loop: dict[str, str]) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            value = evaluate(node.args[1], loop)
            return value if isinstance(value, str) else None
        return None

    def visit(statements: list[ast.stmt], loop: dict[str, str]) -> None:
        for statement in statements:
            if isinstance(statement, ast.For) and isinstance(statement.target, ast.Name):
                try:
                    values = evaluate(statement.iter, loop)
                except Exception:
                    continue
                for value in values if isinstance(values, tuple) else ():
                    visit(statement.body, {**loop, statement.target.id: value})
                continue
            for node in ast.walk(statement):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or len(node.args) < 3:
                    continue
                name = field_of(node.args[1], loop)
                if name is None:
                    continue
                try:
                    if node.func.id == "_one_of":
                        found[name] = Constraint(choices=tuple(evaluate(node.args[2], loop)))
                    elif node.func.id == "_in_range" and len(node.args) >= 4:
                        low, high = evaluate(node.args[2], loop), evaluate(node.args[3], loop)
                        found[name] = Constraint(low=float(low), high=float(high))
                except Exception:
                    continue

    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    visit(function.body, {})
    return found


def server_flags(cli_source: Path = SERVER_CLI) -> dict[str, str]:
    """Field name -> the server's command-line flag that overrides it (app.py and start_gradio.sh take the same),
    read from web/http_server.py's `Settings.from_env(field=args.flag, ...)` call."""
    if not cli_source.is_file():
        return {}
    flags: dict[str, str] = {}
    for node in ast.walk(ast.parse(cli_source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_env":
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg and isinstance(value, ast.Attribute) and getattr(value.value, "id", None) == "args":
                    flags[keyword.arg] = f"--{value.attr}"
    return flags


def _plain_type(hint: object) -> object:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _format_number(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}".replace(",", " ") if abs(value) >= 100_000 else str(int(value))
    return f"{value:g}"


def _format_default(value: object, repo_root: Path) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, Path):
        try:
            return f"`<checkout>/{value.relative_to(repo_root)}`"
        except ValueError:
            return f"`{value}`"
    if isinstance(value, (int, float)):
        return f"`{_format_number(value)}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _format_values(hint: object, constraint: Constraint | None) -> str:
    kind = _plain_type(hint)
    if constraint and constraint.choices:
        return "one of " + ", ".join(f"`{choice}`" for choice in constraint.choices)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in kind)
    if kind is bool:
        return "`1` or `0` (also true/false, yes/no, on/off)"
    if kind is Path:
        return "a path"
    name = {int: "an integer", float: "a number", str: "text"}.get(kind, str(kind))  # type: ignore[call-overload]
    if constraint and constraint.low is not None and constraint.high is not None:
        return f"{name}, {_format_number(constraint.low)} to {_format_number(constraint.high)}"
    return name


def load_descriptions(path: Path = DESCRIPTIONS) -> list[dict]:
    """The hand-written part: a list of sections, each {"title", "intro"?, "fields": {name: {"text", "default"?}}}."""
    data = yaml.safe_load(path.read_text())
    return list(data["sections"])


def check_complete(settings_cls: type, sections: list[dict]) -> None:
    """Raise ReferenceIncomplete naming every field without an explanation and every explanation without a field."""
    names = [spec.name for spec in fields(settings_cls)]
    explained = [name for section in sections for name in section["fields"]]
    missing = [name for name in names if name not in explained]
    stale = [name for name in explained if name not in names]
    repeated = sorted({name for name in explained if explained.count(name) > 1})
    problems = []
    if missing:
        problems.append(f"Settings fields with no entry in {DESCRIPTIONS.name}: {', '.join(missing)}")
    if stale:
        problems.append(f"entries in {DESCRIPTIONS.name} for fields Settings no longer has: {', '.join(stale)}")
    if repeated:
        problems.append(f"fields explained twice in {DESCRIPTIONS.name}: {', '.join(repeated)}")
    for section in sections:
        for name, entry in section["fields"].items():
            if not (entry or {}).get("text", "").strip():
                problems.append(f"{DESCRIPTIONS.name}: {name} has no text")
    if problems:
        raise ReferenceIncomplete(
            "the configuration reference is incomplete: "
            + "; ".join(problems)
            + f". Explain each field in docs/operators/{DESCRIPTIONS.name} (docs/operators/configuration.md is "
            "generated from it and from serving/settings.py)."
        )


def render(settings_cls: type | None = None, sections: list[dict] | None = None, repo_root: Path = REPO_ROOT) -> str:
    """The page's Markdown. Raises ReferenceIncomplete when a field is not explained."""
    if settings_cls is None:
        from medgemma_xray.serving.settings import Settings

        settings_cls = Settings
    sections = load_descriptions() if sections is None else sections
    check_complete(settings_cls, sections)
    hints = typing.get_type_hints(settings_cls)
    defaults = {
        spec.name: spec.default if spec.default is not dataclasses.MISSING else None for spec in fields(settings_cls)
    }
    constraints = validation_constraints(settings_cls)
    flags = server_flags()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by devtools/settings_reference.py from serving/settings.py and docs/operators/settings.yml."
        " Edit those, not this page. -->",
        "",
        "Every setting of the server is one field of `Settings` (`src/medgemma_xray/serving/settings.py`), read once at"
        " start from the environment variable of the same name in capitals. A command-line flag, where there is one,"
        " wins over the variable. `start_gradio.sh`, `stop_gradio.sh`, `install_service.sh` and the systemd unit read"
        " their values through the same object:",
        "",
        "```bash",
        ".venv/bin/python -m medgemma_xray.serving.settings show          # every value, as the environment makes it",
        ".venv/bin/python -m medgemma_xray.serving.settings get port      # one value",
        ".venv/bin/python -m medgemma_xray.serving.settings show --env-file /etc/default/medgemma-xray   # as the unit sees it",
        "```",
        "",
        "A value outside its valid range stops the start with exit status 2 and a message naming the variable and"
        " what it accepts ([exit codes](monitoring.md#exit-codes)). Names, defaults and valid values on this page are"
        " read from the code when the documentation is built.",
        "",
    ]
    for section in sections:
        lines += [f"## {section['title']}", ""]
        if section.get("intro"):
            lines += [section["intro"].strip(), ""]
        lines += ["| variable | default | valid values | meaning |", "|---|---|---|---|"]
        for name, entry in section["fields"].items():
            variable = f'<a id="{name.upper()}"></a>`{name.upper()}`'
            if name in flags:
                variable += f" (`{flags[name]}`)"
            default = entry.get("default") or _format_default(defaults[name], repo_root)
            values = _format_values(hints[name], constraints.get(name))
            text = " ".join(entry["text"].split())
            lines.append(f"| {variable} | {default} | {values} | {text} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
