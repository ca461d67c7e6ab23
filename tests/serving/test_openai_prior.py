"""A prior film at the OpenAI door, through the official client against a real server (in this process, over HTTP):
two image parts in the first user message are the prior and the current film (the cxr_longitudinal_comparison
notebook's order), accepted where the serving checkpoint compares films and refused with a 400 that says why where
it does not (the rule every door keeps: web/asking.py). Three images are refused everywhere."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from tests.serving.test_openai_films import data_url


def phantom_url(seed: int) -> str:
    return data_url(png_bytes(quantize(chest_phantom(rows=512, cols=512, seed=seed), 8)))


def comparing_copy(model_dir: Path, folder: Path) -> Path:
    """The checkpoint's files, linked, under a marker that declares the longitudinal capability (as the demo's
    training writes it once the model has learnt the pairs)."""
    folder.mkdir()
    for item in model_dir.iterdir():
        if item.name != "demo_checkpoint.json":
            (folder / item.name).symlink_to(item.resolve())
    marker = json.loads((model_dir / "demo_checkpoint.json").read_text())
    marker["capabilities"] = ["localisation", "longitudinal"]
    (folder / "demo_checkpoint.json").write_text(json.dumps(marker))
    return folder


@contextmanager
def api_server(model_dir: Path, log_dir: Path):
    import uvicorn
    from fastapi import FastAPI

    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.web.openai import add_openai_routes
    from tests.conftest import free_port

    service = InferenceService(Settings(model_path=model_dir, log_dir=log_dir, max_new_tokens=4, device="cpu"))
    service.start()
    api = FastAPI()
    add_openai_routes(api, service)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn")
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it started"
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        yield client, client.models.list().data[0].id, service
    finally:
        server.should_exit = True
        thread.join(30)
        service.close()


def films_message(urls: list[str], question: str) -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def test_two_image_parts_are_a_prior_where_the_checkpoint_compares_films_and_a_400_where_it_does_not(
    random_model_dir, tmp_path
):
    prior, current, third = phantom_url(31), phantom_url(32), phantom_url(33)
    with api_server(random_model_dir, tmp_path / "plain-logs") as (client, model, service):
        assert "longitudinal" not in service.info().capabilities
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=model, messages=films_message([prior, current], "What changed?"), max_tokens=2
            )
        error = refused.value.body
        assert refused.value.status_code == 400 and error["code"] == "prior_film_unsupported"
        assert "does not compare a film with a prior" in error["message"] and "MedGemma 1.5" in error["message"]
        one = client.chat.completions.create(model=model, messages=films_message([current], "Findings?"), max_tokens=2)
        assert one.usage.completion_tokens == 2
    with api_server(comparing_copy(random_model_dir, tmp_path / "comparing"), tmp_path / "logs") as (
        client,
        model,
        service,
    ):
        assert {"localisation", "longitudinal"} <= service.info().capabilities
        alone = client.chat.completions.create(
            model=model, messages=films_message([current], "What changed?"), max_tokens=2
        )
        both = client.chat.completions.create(
            model=model, messages=films_message([prior, current], "What changed?"), max_tokens=2
        )
        assert both.usage.completion_tokens == 2
        assert both.usage.prompt_tokens - alone.usage.prompt_tokens == 256 + 6  # one more film's image tokens
        with pytest.raises(openai.BadRequestError) as three:
            client.chat.completions.create(
                model=model, messages=films_message([prior, current, third], "What changed?"), max_tokens=2
            )
        assert three.value.body["code"] == "one_film_required"
        # The localisation notebook's prompt, sent as written (1,063 bytes), is a question like any other here.
        from medgemma_xray.grounding.prompts import localisation_prompt

        question = localisation_prompt("pleural effusion")
        assert len(question.encode()) > 1024
        where = client.chat.completions.create(model=model, messages=films_message([current], question), max_tokens=2)
        assert where.usage.completion_tokens == 2
