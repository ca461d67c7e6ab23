"""Calibration inputs: films through exactly the serving preprocessing, plus teaching-round questions.

ModelOpt suggests 128-512 samples; 50 films is the floor below which INT8 scales are poorly estimated.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

MIN_RECOMMENDED_FILMS = 50
CALIBRATION_QUESTIONS = (
    "What are the main findings on this chest X-ray?",
    "Is there a pneumothorax or pleural effusion?",
    "Describe the heart size and the mediastinum.",
    "Are there any lines, tubes or devices?",
    "Is there consolidation, and in which lobe?",
    "Write a structured report with findings and impression.",
)


@dataclass
class CalibrationSet:
    images: list  # PIL images exactly as the server hands them to the processor (padded square RGB)
    names: list[str]
    sha256: str
    skipped: list[str]


def load_calibration_films(folder: Path) -> CalibrationSet:
    """Every readable film under folder (DICOM or PNG/JPEG, recognised by content), in name order."""
    from xray_io import ImageInputError, load_radiograph
    from xray_io.preprocess import model_input_image

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--calib_images {folder} is not a folder of films")
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".") and p.suffix not in (".md", ".txt")
    )
    digest = hashlib.sha256()
    images, names, skipped = [], [], []
    for path in files:
        data = path.read_bytes()
        try:
            film = load_radiograph(data, path.name)
        except ImageInputError as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        digest.update(hashlib.sha256(data).digest())
        images.append(model_input_image(film))
        names.append(path.name)
    if not images:
        raise ValueError(f"no usable films in {folder} ({len(skipped)} files skipped)")
    if len(images) < MIN_RECOMMENDED_FILMS:
        logger.warning(
            "only %d calibration films (recommended: at least %d, ModelOpt suggests 128-512); INT8 scales may be poor",
            len(images), MIN_RECOMMENDED_FILMS,
        )  # fmt: skip
    return CalibrationSet(images, names, digest.hexdigest(), skipped)


def split_held_out(films: CalibrationSet, fraction: float = 0.1, minimum: int = 2) -> tuple[list, list]:
    """Last films are held out for verification and never used to calibrate."""
    held = max(minimum, int(round(len(films.images) * fraction)))
    if len(films.images) <= held:
        raise ValueError(f"need more than {held} films to hold {held} out for verification; got {len(films.images)}")
    return films.images[:-held], films.images[-held:]


class RecordingSequence:
    """Wraps an executor sequence and keeps every decoder feed it runs (the decoder's calibration data)."""

    def __init__(self, inner, sink: list) -> None:
        self.inner, self.sink, self.kv = inner, sink, None

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask):
        executor = self.inner.executor
        past = self.inner.kv
        if past is None:
            empty = np.zeros((inputs_embeds.shape[0], executor.kv_heads, 1, executor.head_dim), dtype=np.float32)
            past = [empty] * (2 * executor.layers)
        feed = {"inputs_embeds": inputs_embeds.astype(np.float32), "position_ids": position_ids.astype(np.int64),
                "full_mask": full_mask, "sliding_mask": sliding_mask, **dict(zip(executor.kv_input_names, past, strict=True))}  # fmt: skip
        self.sink.append(feed)
        return self.inner.run(inputs_embeds, position_ids, full_mask, sliding_mask)

    def close(self) -> None:
        self.inner.close()


def record_decoder_feeds(
    fp32_backend, images: list, decode_steps: int, progress=None
) -> tuple[list[dict], list[np.ndarray]]:
    """Run the fp32 bundle over films x questions; return decoder feeds and vision inputs for calibration."""
    from inference_api.types import ChatTurn, GenerationRequest

    feeds: list[dict] = []
    executor = fp32_backend.executor
    original = executor.new_sequence
    executor.new_sequence = lambda: RecordingSequence(original(), feeds)
    try:
        for index, image in enumerate(images):
            question = CALIBRATION_QUESTIONS[index % len(CALIBRATION_QUESTIONS)]
            request = GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens=decode_steps)
            fp32_backend.generate_steps(request)
            if progress:
                progress()
    finally:
        executor.new_sequence = original
    pixels = [fp32_backend.preprocess([image]) for image in images]
    return feeds, pixels


class FeedReader:
    """ONNX Runtime CalibrationDataReader over a list of feeds (shapes may differ from feed to feed)."""

    def __init__(self, feeds: list[dict]) -> None:
        self.feeds, self.index = feeds, 0

    def get_next(self):
        if self.index >= len(self.feeds):
            return None
        self.index += 1
        return self.feeds[self.index - 1]

    def get_first(self):  # ModelOpt's probe run reads one feed without advancing
        return self.feeds[0]

    def rewind(self) -> None:
        self.index = 0
