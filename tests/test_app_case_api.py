"""The case over the server's API (gradio_client, real server on the demo model): a failed upload leaves no film
active, clearing the chat starts a new conversation, warnings name the loaded model, and an image that is not a
chest film (a 6000 x 6000 noise PNG) is refused before the model reads it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from tests.test_app_e2e import answer_text

pytestmark = pytest.mark.slow


@pytest.fixture()
def pa_film(tmp_path):
    path = tmp_path / "chest.dcm"
    path.write_bytes(dicom_bytes(quantize(chest_phantom(seed=5), 12), bits_stored=12))
    return path


def test_failed_upload_leaves_no_film_active(demo_server, pa_film, tmp_path):
    client = Client(demo_server.url, verbose=False)
    client.predict(handle_file(str(pa_film)), api_name="/upload_film")
    assert answer_text(client.predict("Is there a pleural effusion?", api_name="/ask")[0])
    renamed = tmp_path / "notes.png"
    renamed.write_text("not an image at all\n" * 10)
    with pytest.raises(Exception, match="not a PNG, JPEG or DICOM"):
        client.predict(handle_file(str(renamed)), api_name="/upload_film")
    with pytest.raises(Exception, match="Upload a chest X-ray first"):
        client.predict("And now?", api_name="/ask")
    with pytest.raises(Exception, match="Upload a chest X-ray first"):
        client.predict(api_name="/report")


def reused_tokens(chat: list[dict]) -> int:
    found = re.search(r"(\d+) reused from this conversation's cache", answer_text(chat))
    assert found, answer_text(chat)
    return int(found.group(1))


def test_clearing_the_chat_starts_a_new_conversation(demo_server, pa_film):
    client = Client(demo_server.url, verbose=False)
    client.predict(handle_file(str(pa_film)), api_name="/upload_film")
    client.predict("Is there a pleural effusion?", api_name="/ask")
    chat = client.predict("Is there a pneumothorax?", api_name="/ask")[0]
    assert reused_tokens(chat) > 256  # the follow-up reuses the film's KV
    client.predict(api_name="/clear_chat")
    chat = client.predict("Is there a pneumothorax?", api_name="/ask")[0]
    assert [m["role"] for m in chat] == ["user", "assistant"]
    assert reused_tokens(chat) == 0


def test_warnings_name_the_loaded_model_once(demo_server, tmp_path):
    client = Client(demo_server.url, verbose=False)
    film = tmp_path / "ap.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=6), 12), bits_stored=12, view_position="AP"))
    notes = client.predict(handle_file(str(film)), api_name="/upload_film")[1]
    assert notes.count("View position is AP") == 1, notes
    assert "MedGemma" not in notes and "demo model (medgemma-xray-demo" in notes, notes


def test_a_large_noise_png_is_refused_before_the_model_reads_it(demo_server, tmp_path):
    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (6000, 6000), dtype=np.uint8)).save(noise)
    client = Client(demo_server.url, verbose=False)
    with pytest.raises(Exception, match="does not look like a frontal chest X-ray") as refused:
        client.predict(handle_file(str(noise)), api_name="/upload_film")
    assert "Upload a PA or AP chest radiograph" in str(refused.value)
    with pytest.raises(Exception, match="Upload a chest X-ray first"):
        client.predict("What are the findings?", api_name="/ask")
    assert "user error: NotAChestFilm" in demo_server.log_text
