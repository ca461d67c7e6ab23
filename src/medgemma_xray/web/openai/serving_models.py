"""The served model under a plain id, as OpenAI and vLLM name models, with what serves it described beside the id.

The id is what a client sends as `model`: "medgemma-xray-demo" for the project's demo checkpoints, the checkpoint's
own name for a real one ("google/medgemma-4b-it", or a local folder's name, never a server path). What the id does
not say (demo or not, executor, precision, the demo's notice) is in the card's `medgemma` object.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from medgemma_xray.web.openai.errors import ApiError
from medgemma_xray.web.openai.protocol import ModelCard, ModelDescription, ModelList

if TYPE_CHECKING:
    from medgemma_xray.inference_api.types import BackendInfo
    from medgemma_xray.serving.surface import InferenceSurface

DEMO_MODEL_NAME = "medgemma-xray-demo"  # both demo checkpoints (random weights, trained on phantoms) serve as this
OWNED_BY = "medgemma-xray-assistant"


def served_model_name(info: BackendInfo | None) -> str:
    if info is None:
        return "medgemma"
    if info.is_demo:
        return DEMO_MODEL_NAME
    model_id = str(info.model_id).rstrip("/")
    return model_id.rsplit("/", 1)[-1] if model_id.startswith(("/", ".")) else model_id


class OpenAIServingModels:
    def __init__(self, service: InferenceSurface) -> None:
        self.service = service
        self.created = int(time.time())

    @property
    def name(self) -> str:
        return served_model_name(self.service.info())

    def card(self) -> ModelCard:
        info = self.service.info()
        description = None
        if info is not None:
            description = ModelDescription(
                description=str(info.model_id),
                demo=info.is_demo,
                mode=info.mode_label,
                executor=info.executor,
                precision=info.precision,
                notice=info.demo_notice,
            )
        return ModelCard(id=served_model_name(info), created=self.created, owned_by=OWNED_BY, medgemma=description)

    def list(self) -> ModelList:
        return ModelList(data=[self.card()])

    def retrieve(self, model_id: str) -> ModelCard:
        card = self.card()
        if model_id != card.id:
            raise not_found(model_id, card.id)
        return card

    def check(self, requested: str) -> str:
        """The served id, if that is what the request asked for; else OpenAI's 404 model_not_found."""
        name = self.name
        if requested != name:
            raise not_found(requested, name)
        return name


def not_found(requested: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{requested}' does not exist or you do not have access to it. This server serves '{served}' "
        "(GET /v1/models).",
        kind="invalid_request_error",
        param="model",
        code="model_not_found",
    )
