"""The README's first screen as a reader sees it: the Markdown rendered to HTML (Python-Markdown, as MkDocs does)
and photographed in headless Chromium at 1280 x 800.

    .venv/bin/python -m devtools.readme_first_screen [--output test-artifacts/readme-first-screen.png]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 980px; margin: 24px auto;
       padding: 0 32px; line-height: 1.5; color: #1f2328; font-size: 16px; }
pre { background: #f6f8fa; padding: 16px; border-radius: 6px; overflow: auto; font-size: 13.6px; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; }
table { border-collapse: collapse; } td, th { border: 1px solid #d0d7de; padding: 6px 13px; vertical-align: top; }
img { max-width: 100%; } h1, h2 { border-bottom: 1px solid #d8dee4; padding-bottom: .3em; }
"""


def main(argv: list[str] | None = None) -> int:
    import markdown
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "test-artifacts" / "readme-first-screen.png")
    args = parser.parse_args(argv)
    body = markdown.markdown(
        (REPO_ROOT / "README.md").read_text(encoding="utf-8"), extensions=["fenced_code", "tables"]
    )
    page_file = REPO_ROOT / "test-artifacts" / "readme.html"
    page_file.parent.mkdir(exist_ok=True)
    page_file.write_text(
        f'<!doctype html><meta charset=utf-8><base href="{REPO_ROOT.as_uri()}/"><style>{STYLE}</style>{body}',
        encoding="utf-8",
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(page_file.as_uri(), wait_until="load")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.output))
        browser.close()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
