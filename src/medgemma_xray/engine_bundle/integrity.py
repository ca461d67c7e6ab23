"""What ties a manifest to its bundle: a hash of every file, recorded at build time and checked before serving.

A bundle serves only if (1) its accuracy gate passed, and its recorded figures pass its recorded thresholds, (2) the manifest is the one the build sealed (a digest over
its whole content: editing the weight hash, the precision or the accuracy figures breaks it), and (3) every
recorded file (plans, ONNX graphs and their external data, tokenizer and processor files) is there with the
recorded size and SHA-256, and (4) the bundle is one folder of plain files: no symbolic link anywhere in it (a
linked file, folder or manifest would let what serves change behind the hashes, or read files outside the
bundle), and no recorded name that points outside it. Every refusal names the file and the command that rebuilds
the bundle.

What the seal is: a plain SHA-256, not a signature. It catches accidents (a truncated copy, a file replaced by
another build's, a hand-edited manifest); it cannot stop someone with write access to the bundle, who can edit a
file and seal it again. Protect bundles with file permissions, as the checkpoint itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medgemma_xray.engine_bundle.gate import recorded_failures
from medgemma_xray.engine_bundle.manifest import FORMAT_VERSION, MANIFEST_NAME, ManifestError, rebuild_command

logger = logging.getLogger(__name__)

# Files the runtime opens; a manifest that records no hash for one of them is refused.
REQUIRED_FILES = ("tokenizer.json", "tokenizer_config.json", "processor_config.json")
_BLOCK = 1 << 20


class BundleRefusedError(ManifestError):
    """The bundle must not serve: its accuracy gate did not pass, or its files are not the ones that were verified."""


@dataclass(frozen=True)
class IntegrityReport:
    files: int
    bytes: int
    seconds: float


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)  # hashlib releases the GIL on large blocks: threads hash files in parallel
    return digest.hexdigest()


def _hash_all(bundle_dir: Path, relative_paths: list[str]) -> dict[str, str]:
    workers = max(1, min(4, os.cpu_count() or 1, len(relative_paths)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bundle-hash") as pool:
        hashes = pool.map(lambda name: file_sha256(bundle_dir / name), relative_paths)
        return dict(zip(relative_paths, hashes, strict=True))


def bundle_files(bundle_dir: Path) -> list[str]:
    """Every file of the bundle but the manifest, as sorted POSIX paths relative to the bundle."""
    bundle_dir = Path(bundle_dir)
    names = [
        path.relative_to(bundle_dir).as_posix()
        for path in bundle_dir.rglob("*")
        if path.is_file() and path.name != MANIFEST_NAME
    ]
    return sorted(names)


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON without its seal."""
    payload = {key: value for key, value in manifest.items() if key != "integrity"}
    payload["files"] = manifest.get("integrity", {}).get("files")
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(bundle_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with the hash of every file now in bundle_dir and the digest over both (call last, then write)."""
    bundle_dir = Path(bundle_dir)
    names = bundle_files(bundle_dir)
    hashes = _hash_all(bundle_dir, names)
    files = {name: {"sha256": hashes[name], "bytes": (bundle_dir / name).stat().st_size} for name in names}
    sealed = {**{key: value for key, value in manifest.items() if key != "integrity"}, "format": FORMAT_VERSION}
    sealed["integrity"] = {"files": files, "algorithm": "sha256"}
    sealed["integrity"]["manifest_sha256"] = manifest_digest(sealed)
    return sealed


def served_files(manifest: dict[str, Any]) -> list[str]:
    """The files the runtime reads: each graph's ONNX and plan, and the tokenizer/processor files."""
    names = list(REQUIRED_FILES)
    for entry in manifest["graphs"].values():
        names += [entry[key] for key in ("onnx", "engine") if entry.get(key)]
    return names


def check_accuracy_gate(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    accuracy = manifest.get("accuracy")
    rebuild = rebuild_command(manifest)
    if not isinstance(accuracy, dict):
        raise BundleRefusedError(
            f"{bundle_dir} has no accuracy record: its build never finished verification against PyTorch, so it "
            f"must not answer questions. Rebuild it: {rebuild}"
        )
    if accuracy.get("passed") is not True:
        failed = "; ".join(accuracy.get("failures") or []) or f"passed is {accuracy.get('passed')!r}"
        raise BundleRefusedError(
            f"{bundle_dir} failed its accuracy check against PyTorch ({failed}, measured on "
            f"{accuracy.get('executor', 'an unknown executor')}), so it must not answer questions. "
            f"Try another precision or more calibration films. Rebuild it: {rebuild}"
        )
    failures = recorded_failures(accuracy)
    if failures:
        raise BundleRefusedError(
            f"{bundle_dir}: its recorded accuracy figures do not pass its own recorded thresholds "
            f"({'; '.join(failures)}), although the record says passed: true (a build from an older version, or an "
            f"edited record), so it must not answer questions. Rebuild it: {rebuild}"
        )


def refuse_links(bundle_dir: str | Path) -> None:
    """Refuse a bundle with a symbolic link anywhere inside it (a file, a folder, the manifest). The bundle's own
    path may be a link (engines/current -> engines/v3): what is inside it must be plain files and folders."""
    bundle_dir = Path(bundle_dir)
    for folder, folders, files in os.walk(bundle_dir):
        for name in sorted([*folders, *files]):
            path = Path(folder) / name
            if path.is_symlink():
                raise BundleRefusedError(
                    f"{bundle_dir}: {path.relative_to(bundle_dir).as_posix()} is a symbolic link (to "
                    f"{os.readlink(path)}). A bundle holds its own files only, so that the hashes it records are "
                    "the files that serve: copy the bundle with its files (cp -rL, or rebuild it) instead of linking "
                    "into it."
                )


def _inside(name: str) -> bool:
    """A relative path without '..': inside the bundle, since nothing in it is a link (refuse_links)."""
    relative = Path(name)
    return not relative.is_absolute() and ".." not in relative.parts and bool(relative.parts)


def unreadable(bundle_dir: Path, names: list[str]) -> list[str]:
    """The names among `names` that this process may not read."""
    return [name for name in names if not os.access(bundle_dir / name, os.R_OK)]


def verify_bundle(bundle_dir: str | Path, manifest: dict[str, Any]) -> IntegrityReport:
    """Refuse (BundleRefusedError) unless the accuracy gate passed, every recorded file is unchanged, readable and
    inside the bundle, and nothing in it is a symbolic link."""
    bundle_dir = Path(bundle_dir)
    started = time.perf_counter()
    refuse_links(bundle_dir)
    check_accuracy_gate(bundle_dir, manifest)
    rebuild = rebuild_command(manifest)
    integrity = manifest.get("integrity")
    if not isinstance(integrity, dict) or not isinstance(integrity.get("files"), dict):
        raise BundleRefusedError(
            f"{bundle_dir}/{MANIFEST_NAME} records no file hashes (a bundle from an older build), so nothing proves "
            f"its files are the ones that were verified. Rebuild it: {rebuild}"
        )
    if integrity.get("manifest_sha256") != manifest_digest(manifest):
        raise BundleRefusedError(
            f"{bundle_dir}/{MANIFEST_NAME} was changed after the build sealed it (its digest does not match its "
            f"content: an edited weight hash, precision, shape or accuracy figure). Rebuild it: {rebuild}"
        )
    files = integrity["files"]
    outside = [name for name in [*files, *served_files(manifest)] if not _inside(name)]
    if outside:
        raise BundleRefusedError(
            f"{bundle_dir}/{MANIFEST_NAME} names files outside the bundle ({', '.join(sorted(set(outside)))}): a "
            f"bundle serves only files inside its own folder. Rebuild it: {rebuild}"
        )
    for name in served_files(manifest):
        if name not in files:
            raise BundleRefusedError(f"{bundle_dir}: the manifest records no hash for {name}. Rebuild it: {rebuild}")
    present = []
    for name, record in files.items():
        path = bundle_dir / name
        if not path.is_file():
            raise BundleRefusedError(
                f"{bundle_dir}: {name} is missing (the manifest records it). Rebuild it: {rebuild}"
            )
        size = path.stat().st_size
        if size != record["bytes"]:
            raise BundleRefusedError(
                f"{bundle_dir}: {name} has {size} bytes, the build recorded {record['bytes']} (truncated or "
                f"replaced). Rebuild it: {rebuild}"
            )
        present.append(name)
    denied = unreadable(bundle_dir, present)
    if denied:
        raise BundleRefusedError(
            f"{bundle_dir}: this server's user (uid {os.getuid()}) may not read {', '.join(denied)}. Every file of a "
            f"bundle must be readable by the service's user: chmod -R a+rX {bundle_dir} (the build publishes every "
            "file 0644 and every folder 0755), or rebuild it."
        )
    hashes = _hash_all(bundle_dir, present)
    for name in present:
        if hashes[name] != files[name]["sha256"]:
            raise BundleRefusedError(
                f"{bundle_dir}: {name} changed since the build (SHA-256 {hashes[name][:16]}..., recorded "
                f"{files[name]['sha256'][:16]}...). Rebuild it: {rebuild}"
            )
    report = IntegrityReport(len(files), sum(r["bytes"] for r in files.values()), time.perf_counter() - started)
    logger.info(
        "bundle %s: accuracy gate passed (measured on %s); %d files (%.1f MB) match their recorded SHA-256 in %.1f s",
        bundle_dir,
        manifest["accuracy"].get("executor"),
        report.files,
        report.bytes / 1e6,
        report.seconds,
    )
    return report
