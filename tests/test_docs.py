"""The documentation: the site builds with every link and anchor checked, the pages generated from the code are
current, every setting is documented, the README keeps its shape, and the docs state each fact once and carry no
project history (that is CHANGELOG.md's job)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools import docs_generate, layer_diagram, settings_reference
from medgemma_xray.serving.settings import Settings

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CONFIGURATION = REPO / "docs" / "operators" / "configuration.md"
DOC_FILES = sorted([README, *(REPO / "docs").rglob("*.md"), *(REPO / "docs").rglob("*.yml")])
HISTORY = re.compile(r"\bissues? ?#?\d+|\bround[- ](one|two|three|four|[0-9])\b|\br[1-9]\b", re.IGNORECASE)


def test_the_site_builds_with_every_link_and_anchor_checked(tmp_path):
    """mkdocs.yml sets strict: a link to a missing page or anchor, or a page left out of the nav, fails the build."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    built = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("index.html")}
    for page in ("operators/configuration/index.html", "changelog/index.html", "licences/index.html"):
        assert page in built, sorted(built)
    licences = (tmp_path / "site" / "licences" / "index.html").read_text()
    assert "Apache License" in licences and "Health AI Developer Foundations" in licences


def test_the_generated_docs_are_what_the_code_says_now():
    """configuration.md, the architecture page's layer table and THIRD_PARTY_NOTICES.md are committed; each must
    equal what devtools/docs_generate.py renders from Settings, the layer test and the installed packages."""
    stale = [str(path.relative_to(REPO)) for path in docs_generate.stale()]
    assert not stale, f"run .venv/bin/python -m devtools.docs_generate; stale: {stale}"


def test_every_settings_field_has_a_row_in_the_configuration_reference():
    page = CONFIGURATION.read_text()
    for spec in dataclasses.fields(Settings):
        name = spec.name.upper()
        assert f'<a id="{name}"></a>`{name}`' in page, f"{name} has no row in {CONFIGURATION.relative_to(REPO)}"


def test_a_settings_field_without_an_entry_stops_the_reference():
    """A field added to Settings without an explanation in settings.yml makes the generator (and so the docs build
    and the test above) fail, naming the field; an entry whose field is gone fails too."""

    @dataclasses.dataclass(frozen=True)
    class SettingsWithANewField(Settings):
        brand_new_limit: int = 7

    sections = settings_reference.load_descriptions()
    with pytest.raises(settings_reference.ReferenceIncomplete, match="brand_new_limit"):
        settings_reference.render(SettingsWithANewField, sections)

    without_port = [
        {**section, "fields": {k: v for k, v in section["fields"].items() if k != "port"}} for section in sections
    ]
    with pytest.raises(settings_reference.ReferenceIncomplete, match=r"no entry .*: port"):
        settings_reference.render(Settings, without_port)

    stale_entry = [*sections, {"title": "Gone", "fields": {"removed_setting": {"text": "It was here."}}}]
    with pytest.raises(settings_reference.ReferenceIncomplete, match="removed_setting"):
        settings_reference.render(Settings, stale_entry)


def test_the_reference_reads_defaults_ranges_and_flags_from_the_code():
    page = settings_reference.render()
    assert re.search(r"`PORT` \(`--port`\) \| `7860` \| an integer, 1 to 65535 \|", page), "PORT's row"
    assert "`INFERENCE_MODE` (`--mode`) | `pytorch` | one of `pytorch`, `trt` |" in page
    assert "`FILM_CHECK` | `refuse` | one of `refuse`, `warn`, `off` |" in page
    for name in ("REQUEST_TIMEOUT_S", "BREAKER_TIMEOUT_S", "DRAIN_TIMEOUT_S"):  # ranges checked in a loop
        assert re.search(rf"`{name}` \| `[0-9.]+` \| a number, 0.1 to 86400 \|", page), name


def test_the_layer_table_is_the_layer_tests_own():
    layers = layer_diagram.read_layers()
    assert layers["medgemma_xray.engine_bundle"] == 0 and layers["tests"] == max(layers.values())
    table = layer_diagram.render()
    assert "| 0 | `engine_bundle/` |" in table and "`web/`" in table


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert commands == ["scripts/setup_env.sh && scripts/start_gradio.sh", "scripts/run_tests.sh"], commands
    ci = (REPO / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd "))] == [
        "scripts/run_tests.sh"
    ], "the README says CI runs exactly scripts/run_tests.sh"
    assert "Not a medical device" in text
    for image in re.findall(r"\]\((docs/images/[^)]+\.png)\)", text):
        assert (REPO / image).is_file(), image
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", text):
        assert (REPO / target).is_file(), f"README links to {target}, which does not exist"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_project_history_in_the_readme_or_the_docs(path):
    """Reasons are said in the present tense; what happened when is in CHANGELOG.md and git log."""
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, f"history in {path.relative_to(REPO)}:\n" + "\n".join(found)


# Facts that are stated once, on the page that owns them; every other page links there.
ONE_TRUTH = {
    "the queue-full status codes": (re.compile(r"\b429\b"), "docs/security.md"),
    "the switch pause": (re.compile(r"\b200 ms\b"), "docs/operators/switching.md"),
    "the film intake path": (re.compile(r"load_radiograph"), "docs/developers/architecture.md"),
    "the stop timeouts": (re.compile(r"15 s more|30 s more"), "docs/operators/systemd.md"),
}


@pytest.mark.parametrize("fact", sorted(ONE_TRUTH))
def test_each_fact_is_stated_on_one_page(fact):
    pattern, owner = ONE_TRUTH[fact]
    pages = sorted({str(path.relative_to(REPO)) for path in DOC_FILES if pattern.search(path.read_text())})
    assert pages == [owner], f"{fact} is stated on {pages}; state it on {owner} only and link there"


def test_settings_yml_is_the_only_hand_written_source_of_the_reference():
    """The page says where it comes from, and the descriptions file parses into sections of fields."""
    assert "Generated by devtools/settings_reference.py" in CONFIGURATION.read_text()
    data = yaml.safe_load((REPO / "docs" / "operators" / "settings.yml").read_text())
    assert all(section["title"] and section["fields"] for section in data["sections"])
