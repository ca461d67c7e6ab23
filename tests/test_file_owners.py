"""Previews and exports are served only to the client they were made for: a second client, or a request with no
cookie, that holds another client's URL gets 404 (a real server, two gradio_client clients, raw HTTP)."""

from __future__ import annotations

import httpx
import pytest
from gradio_client import Client, handle_file

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

pytestmark = pytest.mark.slow


def url_of(output) -> str | None:
    """The URL of a file output (a FileData, or an update carrying one)."""
    if isinstance(output, dict) and isinstance(output.get("value"), dict):
        output = output["value"]
    return output.get("url") if isinstance(output, dict) else None


def fetch(url: str, cookies: dict | None) -> int:
    return httpx.get(url, cookies=cookies, timeout=60).status_code


def test_another_clients_preview_and_report_are_not_served(demo_server, tmp_path):
    film = tmp_path / "film.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=11), 12), bits_stored=12, window=(2048, 4096)))
    owner = Client(demo_server.url, verbose=False, download_files=False)
    other = Client(demo_server.url, verbose=False, download_files=False)
    assert owner.cookies and other.cookies and owner.cookies != other.cookies, "each client gets its own cookie"
    preview = owner.predict(handle_file(str(film)), api_name="/upload_film")[0]
    _, report_json, report_md = owner.predict(api_name="/report")
    urls = [url_of(item) for item in (preview, report_json, report_md) if url_of(item)]
    assert len(urls) == 3, (preview, report_json, report_md)
    for url in urls:
        assert fetch(url, owner.cookies) == 200, url
        assert fetch(url, other.cookies) == 404, "another client's file was served"
        assert fetch(url, None) == 404, "a request with no cookie got another client's file"
        # Gradio's deprecated form of the same route serves the same file: closed for everyone
        old_form = url.replace("/gradio_api/file=", "/gradio_api/file/", 1)
        assert old_form != url and fetch(old_form, other.cookies) == 404, "the /file/ route served another's file"
        assert fetch(old_form, owner.cookies) == 404
