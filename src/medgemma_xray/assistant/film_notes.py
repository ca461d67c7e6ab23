"""The film's notes under the preview: what was loaded and every warning about it, each once, naming the model that
is actually loaded (the loaders speak of "MedGemma"; under the demo checkpoint that would be untrue)."""

from __future__ import annotations

from medgemma_xray.inference_api.types import BackendInfo
from medgemma_xray.xray_io import Radiograph

_LOADER_MODEL_CLAIM = "MedGemma was trained on PA chest films"


def loaded_model_claim(info: BackendInfo | None) -> str:
    if info is None:
        return "the model was trained on PA chest films"
    if info.is_demo:
        return f"the loaded demo model ({info.model_id}) was trained only on synthetic PA phantoms"
    return f"the loaded model ({info.model_id}) was trained on PA chest films"


def film_warnings(film: Radiograph, info: BackendInfo | None, extra: tuple[str, ...] = ()) -> list[str]:
    """The film's warnings and any extra ones (the film check's), in order, duplicates dropped."""
    claim = loaded_model_claim(info)
    seen: list[str] = []
    for warning in (*film.warnings, *extra):
        text = warning.replace(_LOADER_MODEL_CLAIM, claim)
        if text not in seen:
            seen.append(text)
    return seen


def film_notes_markdown(
    film: Radiograph, info: BackendInfo | None, extra: tuple[str, ...] = (), shape: tuple[int, int] | None = None
) -> str:
    """shape: the film's own (rows, columns) where `film` is a smaller copy of it."""
    rows, cols = shape or film.shape
    notes = "\n".join(f"- ⚠️ {warning}" for warning in film_warnings(film, info, extra))
    return f"**Loaded:** {film.source}, {cols}×{rows} px\n\n{notes}".strip()
