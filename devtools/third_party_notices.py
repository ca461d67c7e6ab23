"""THIRD_PARTY_NOTICES.md: the licence of every Python package the product installs, read from the installed packages.

What the product installs is worked out from its own metadata, not listed by hand: the requirements of the
`medgemma-xray-assistant` distribution, followed through every installed package's own requirements (markers
evaluated), once for the base install and once for each extra that ships with the product (engine, ray, bench).
The test and documentation tools (the dev and docs extras) are not distributed and are left out. Each package's
licence comes from pip-licenses (its metadata's License-Expression or License field, else its classifiers).

Package versions are not in the file: constraints.txt pins the direct dependencies, but the packages they pull in
float between installs, and a version change does not change a licence. A new package, a package gone or a licence
that changed does change the file, and tests/test_docs.py fails until it is regenerated:

    .venv/bin/python -m devtools.docs_generate          # rewrites this file and the other generated docs
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement

DISTRIBUTION = "medgemma-xray-assistant"
SHIPPED_EXTRAS = ("engine", "ray", "bench")  # dev and docs are the developers' tools, not part of the product


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(distribution: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The distribution's requirements that apply with these extras on this interpreter."""
    found = []
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
        if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
            found.append(requirement)
    return found


def closure(extras: tuple[str, ...] = ()) -> set[str]:
    """Canonical names of every installed package that `pip install DISTRIBUTION[extras]` brings in, the
    distribution itself excluded. A requirement whose package is not installed (a marker for another platform)
    is skipped."""
    seen: set[str] = set()
    pending = [(DISTRIBUTION, extras)]
    while pending:
        name, wanted = pending.pop()
        for requirement in _requirements(name, wanted):
            key = _canonical(requirement.name)
            if key == _canonical(DISTRIBUTION):
                pending.append((DISTRIBUTION, tuple(requirement.extras)))
                continue
            try:
                metadata.distribution(requirement.name)
            except metadata.PackageNotFoundError:
                continue
            if key not in seen:
                seen.add(key)
                pending.append((requirement.name, tuple(requirement.extras)))
            elif requirement.extras:
                pending.append((requirement.name, tuple(requirement.extras)))
    return seen


def licences(names: set[str]) -> dict[str, tuple[str, str, str]]:
    """canonical name -> (name as published, licence, home page), from pip-licenses run on this interpreter."""
    if not names:
        return {}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "piplicenses",
            "--from=mixed",
            "--format=json",
            "--with-urls",
            "--with-system",
            "--packages",
            *sorted(names),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = {}
    for entry in json.loads(result.stdout):
        url = entry.get("URL") or ""
        found[_canonical(entry["Name"])] = (entry["Name"], " ".join(entry["License"].split()), url)
    missing = names - set(found)
    if missing:
        raise RuntimeError(f"pip-licenses gave no licence for: {', '.join(sorted(missing))}")
    return found


def _table(names: set[str], known: dict[str, tuple[str, str, str]]) -> list[str]:
    lines = ["| package | licence | home page |", "|---|---|---|"]
    for key in sorted(names):
        name, licence, url = known[key]
        licence = licence.replace("|", "/") or "not stated in its metadata"
        link = f"<{url}>" if url.startswith(("http://", "https://")) else "–"
        lines.append(f"| {name} | {licence} | {link} |")
    return lines


def render() -> str:
    """The Markdown of THIRD_PARTY_NOTICES.md, from the packages installed in this environment."""
    base = closure()
    sections = [("Installed by `pip install .`", base)]
    listed = set(base)
    for extra in SHIPPED_EXTRAS:
        added = closure((extra,)) - listed
        listed |= added
        sections.append((f"Added by the `{extra}` extra", added))
    known = licences(listed)
    lines = [
        "# Third-party notices",
        "",
        "<!-- Generated by devtools/third_party_notices.py from the installed packages' metadata. Run",
        "     `.venv/bin/python -m devtools.docs_generate` after changing dependencies; do not edit by hand. -->",
        "",
        "The MedGemma X-Ray assistant's own code is under the Apache License 2.0 (LICENSE). It installs the Python",
        "packages below, each under its own licence, which its distribution carries in full. The model weights it",
        "serves are not among them: see NOTICE.",
        "",
        "The list follows the product's requirements and every requirement of theirs, for the base install and for",
        "each extra that ships with the product. The development and documentation tools are not listed. Versions",
        "are left out: constraints.txt pins the direct dependencies.",
        "",
    ]
    for title, names in sections:
        lines += [f"## {title}", ""]
        lines += _table(names, known) if names else ["Nothing beyond the packages above."]
        lines.append("")
    return "\n".join(lines)
