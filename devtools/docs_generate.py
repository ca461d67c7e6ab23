"""Write, or check, every documentation file that is generated from the code:

- docs/operators/configuration.md, from serving.settings.Settings (devtools/settings_reference.py);
- the layer table in docs/developers/architecture.md, from tests/test_layout.py (devtools/layer_diagram.py);
- THIRD_PARTY_NOTICES.md, from the installed packages (devtools/third_party_notices.py).

    .venv/bin/python -m devtools.docs_generate            # rewrite what is stale
    .venv/bin/python -m devtools.docs_generate --check    # exit 1 and name what is stale (the docs build does this)

They are committed, so the Markdown reads the same on disk as on the site, and the suite (tests/test_docs.py) and
`mkdocs build` fail while any of them differs from what the code says.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Generated:
    """A generated file, or a marked block inside a hand-written one."""

    path: Path
    render: Callable[[], str]
    block: str | None = None  # the name in <!-- BEGIN GENERATED: name ... --> ... <!-- END GENERATED: name -->

    def expected(self, current: str) -> str:
        text = self.render().rstrip("\n") + "\n"
        if self.block is None:
            return text
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED: {re.escape(self.block)}\b[^>]*-->\n)(.*?)(<!-- END GENERATED: {re.escape(self.block)} -->)",
            re.DOTALL,
        )
        if not pattern.search(current):
            raise ValueError(f"{self.path}: no '<!-- BEGIN GENERATED: {self.block} -->' ... END block to fill")
        return pattern.sub(lambda match: match.group(1) + text + match.group(3), current, count=1)

    def is_current(self) -> bool:
        current = self.path.read_text() if self.path.is_file() else ""
        return current == self.expected(current)

    def write(self) -> bool:
        """Rewrite the file if it is stale; True if it changed."""
        current = self.path.read_text() if self.path.is_file() else ""
        expected = self.expected(current)
        if current == expected:
            return False
        self.path.write_text(expected)
        return True


def _configuration() -> str:
    from devtools.settings_reference import render

    return render()


def _layers() -> str:
    from devtools.layer_diagram import render

    return render()


def _notices() -> str:
    from devtools.third_party_notices import render

    return render()


GENERATED = (
    Generated(REPO_ROOT / "docs" / "operators" / "configuration.md", _configuration),
    Generated(REPO_ROOT / "docs" / "developers" / "architecture.md", _layers, block="layers"),
    Generated(REPO_ROOT / "THIRD_PARTY_NOTICES.md", _notices),
)


def stale(generated: tuple[Generated, ...] = GENERATED) -> list[Path]:
    """The generated files that differ from what the code says now."""
    return [item.path for item in generated if not item.is_current()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check the documentation generated from the code.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stale file")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for path in out_of_date:
            print(f"stale: {path.relative_to(REPO_ROOT)} (run: .venv/bin/python -m devtools.docs_generate)")
        return 1 if out_of_date else 0
    for item in GENERATED:
        if item.write():
            print(f"wrote {item.path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
