"""MkDocs hooks (mkdocs.yml `hooks:`; run `.venv/bin/python -m mkdocs` from the repository's root): the site's pages that come from files outside docs/, and a check that the
pages generated from the code are current.

- changelog.md is CHANGELOG.md, and licences.md is LICENSE, NOTICE and THIRD_PARTY_NOTICES.md, so the files at the
  repository's root stay the one copy.
- Before the build, the configuration reference and the architecture page's layer table must equal what
  devtools/docs_generate.py renders from the code now; otherwise the build fails and says which command fixes it.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def on_pre_build(config) -> None:
    from mkdocs.exceptions import PluginError

    try:  # mkdocs loads this file by path; the devtools package is found from the working directory
        from devtools.docs_generate import GENERATED, stale
    except ModuleNotFoundError as exc:
        raise PluginError(
            f"cannot import {exc.name}: run MkDocs from the repository's root as `.venv/bin/python -m mkdocs build` "
            "(or `serve`), so that devtools/ can be imported"
        ) from None

    docs_dir = Path(config["docs_dir"]).resolve()
    pages = tuple(item for item in GENERATED if item.path.resolve().is_relative_to(docs_dir))
    try:
        out_of_date = stale(pages)
    except ValueError as exc:  # a Settings field without an entry in settings.yml, or a missing generated block
        raise PluginError(str(exc)) from None
    if out_of_date:
        names = ", ".join(str(path.relative_to(REPO_ROOT)) for path in out_of_date)
        raise PluginError(
            f"generated pages differ from the code: {names}; run .venv/bin/python -m devtools.docs_generate"
        )


def _licences_page() -> str:
    notice = (REPO_ROOT / "NOTICE").read_text()
    notices = (REPO_ROOT / "THIRD_PARTY_NOTICES.md").read_text()
    notices = notices.replace("# Third-party notices", "## Third-party notices", 1).replace("\n## ", "\n### ")
    licence = (REPO_ROOT / "LICENSE").read_text()
    return "\n".join(
        [
            "# Licences",
            "",
            "The project's own code is under the Apache License 2.0 (`LICENSE`, [below](#the-projects-licence)).",
            "MedGemma's weights are not part of the project: they come under Google's terms, as `NOTICE` says.",
            "These are the repository's `NOTICE`, `THIRD_PARTY_NOTICES.md` and `LICENSE` files, as they are.",
            "",
            "## Notice",
            "",
            "```text",
            notice.rstrip(),
            "```",
            "",
            notices.split("\n", 1)[1].strip(),
            "",
            "## The project's licence",
            "",
            "```text",
            licence.rstrip(),
            "```",
            "",
        ]
    )


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "changelog.md", content=(REPO_ROOT / "CHANGELOG.md").read_text()))
    files.append(File.generated(config, "licences.md", content=_licences_page()))
    return files
