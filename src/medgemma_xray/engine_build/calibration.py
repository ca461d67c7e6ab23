"""Calibration inputs: films through exactly the serving preprocessing, plus teaching-round questions.

No numpy at import: optimize_trt_engine.py imports this module's errors before refusing a build, in a second.

ModelOpt suggests 128-512 samples; 50 films is the floor below which INT8 scales are poorly estimated.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from medgemma_xray.engine_bundle.gate import MIN_HELD_OUT_FILMS, held_out_count

if TYPE_CHECKING:
    from medgemma_xray.intake import FilmIntake

logger = logging.getLogger(__name__)

MIN_RECOMMENDED_FILMS = 50
SYNTHETIC_MARK = "SYNTHETIC"  # medgemma_xray.phantoms.films writes it into every phantom's metadata
CALIBRATION_QUESTIONS = (
    "What are the main findings on this chest X-ray?",
    "Is there a pneumothorax or pleural effusion?",
    "Describe the heart size and the mediastinum.",
    "Are there any lines, tubes or devices?",
    "Is there consolidation, and in which lobe?",
    "Write a structured report with findings and impression.",
)


class CalibrationInputError(ValueError):
    """--calib_images is not a folder, or holds no readable film: a configuration error (exit 2)."""


@dataclass
class CalibrationSet:
    images: list  # PIL images exactly as the server hands them to the processor (padded square RGB)
    names: list[str]
    sha256: str
    skipped: list[str]  # "name: why", one per file that is not a readable frontal chest film
    synthetic: list[str]  # names of films whose metadata says SYNTHETIC (the project's phantoms)

    @property
    def real_films(self) -> int:
        return len(self.images) - len(self.synthetic)


def is_synthetic(data: bytes) -> bool:
    """True when the film's own metadata calls it synthetic (PNG/JPEG text chunks; DICOM comments and series)."""
    if len(data) >= 132 and data[128:132] == b"DICM":
        import io

        import pydicom

        dataset = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True, force=True)
        fields = (dataset.get(name, "") for name in ("ImageComments", "SeriesDescription", "StudyDescription"))
        return any(SYNTHETIC_MARK in str(value).upper() for value in fields)
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return any(SYNTHETIC_MARK in str(value).upper() for value in image.info.values() if isinstance(value, str))


SIDECAR_SUFFIXES = (".json", ".md", ".txt")  # a case's labels, notes and the folder's README: not films


def load_calibration_films(folder: Path, intake: FilmIntake | None = None) -> CalibrationSet:
    """Every plausible frontal chest film under folder (DICOM or PNG/JPEG, recognised by content), in name order,
    through the one film intake the servers use (medgemma_xray.intake): the model sees exactly what it would
    serve, and an image the film check refuses (noise, a document, a photograph, a lateral film) is skipped and
    named, never counted as a film. Sidecar files (.json labels, .md, .txt) are passed over without a word."""
    from medgemma_xray.intake import FilmIntake, FilmRefused, IntakeConfig

    folder = Path(folder)
    if not folder.is_dir():
        raise CalibrationInputError(f"--calib_images {folder} is not a folder of films")
    intake = intake or FilmIntake(IntakeConfig(film_check="refuse", cache_bytes=0))
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() not in SIDECAR_SUFFIXES
    )
    digest = hashlib.sha256()
    images, names, skipped, synthetic = [], [], [], []
    for path in files:
        name = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        try:
            film = intake.read(data)
        except FilmRefused as exc:
            skipped.append(f"{name}: {exc}")
            logger.warning("calibration: skipped %s", skipped[-1])
            continue
        digest.update(hashlib.sha256(data).digest())
        images.append(film.model_image)
        names.append(name)
        if is_synthetic(data):
            synthetic.append(name)
    if not images:
        raise CalibrationInputError(
            f"no usable films in --calib_images {folder} ({len(files)} files, {len(skipped)} skipped"
            + (f": {'; '.join(skipped[:5])}" if skipped else "")
            + "). Put de-identified PA chest films (DICOM, PNG or JPEG) there; see calib_dataset/README.md."
        )
    if synthetic:
        logger.warning(
            "calibration: %d of %d films are SYNTHETIC phantoms (their metadata says so): fine for a pipeline test, "
            "never for a bundle that serves patients",
            len(synthetic),
            len(images),
        )
    return CalibrationSet(images, names, digest.hexdigest(), skipped, synthetic)


class TooFewFilmsError(ValueError):
    """Fewer real films than the minimum, and the caller did not allow it."""


def require_enough_films(films: CalibrationSet, allow_few: bool, minimum: int = MIN_RECOMMENDED_FILMS) -> None:
    """At least `minimum` real (non-synthetic) films, unless allowed; then a warning and the manifest records it."""
    if films.real_films >= minimum:
        return
    detail = f"{films.real_films} real films" + (f" (+{len(films.synthetic)} synthetic)" if films.synthetic else "")
    if not allow_few:
        raise TooFewFilmsError(
            f"{detail} for calibration; the minimum is {minimum} de-identified PA films (ModelOpt suggests "
            "128-512; see calib_dataset/README.md). For a pipeline test or a demo, pass --allow_few_films: the "
            "manifest then records below_recommended: true."
        )
    logger.warning(
        "calibration: %s, below the minimum of %d (allowed by --allow_few_films; recorded in the manifest)",
        detail,
        minimum,
    )


class TooFewHeldOutError(TooFewFilmsError):
    """Too few films to hold out enough for the accuracy gate and still calibrate on the rest."""


def require_held_out(films: CalibrationSet) -> None:
    """The gate's held-out set must be large enough to judge (medgemma_xray.engine_bundle.gate.MIN_HELD_OUT_FILMS), for every
    precision and with or without --allow_few_films; and at least as many films must remain to calibrate on."""
    held = held_out_count(len(films.images))
    if len(films.images) < 2 * held:
        raise TooFewHeldOutError(
            f"{len(films.images)} films: the accuracy gate holds out {held} (10%, at least {MIN_HELD_OUT_FILMS}: "
            f"fewer is too few to judge a precision) and calibrates on the rest, which needs at least {2 * held} "
            "films. Add films to --calib_images."
        )


def split_held_out(films: CalibrationSet) -> tuple[list, list]:
    """The last held_out_count(n) films are held out for verification and never used to calibrate."""
    require_held_out(films)
    held = held_out_count(len(films.images))
    return films.images[:-held], films.images[-held:]


class RecordingSequence:
    """Wraps an ONNX Runtime executor sequence and keeps every decoder feed it runs (the decoder's calibration data)."""

    def __init__(self, inner, sink: list) -> None:
        self.inner, self.sink = inner, sink

    @property
    def past_length(self) -> int:
        return self.inner.past_length

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask):
        feed = self.inner.decoder_feeds(inputs_embeds, position_ids, full_mask, sliding_mask)
        self.sink.append({name: value.copy() for name, value in feed.items()})  # the past is a view of the live cache
        return self.inner.run(inputs_embeds, position_ids, full_mask, sliding_mask)

    def truncate(self, past_length: int) -> None:
        self.inner.truncate(past_length)

    def close(self) -> None:
        self.inner.close()


def record_decoder_feeds(fp32_backend, images: list, decode_steps: int, progress=None) -> tuple[list[dict], list]:
    """Run the fp32 bundle over films x questions; return decoder feeds and vision inputs for calibration."""
    from medgemma_xray.engine_build.comparison import generate_steps
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

    feeds: list[dict] = []
    executor = fp32_backend.executor
    original = executor.new_sequence
    executor.new_sequence = lambda *args, **kwargs: RecordingSequence(original(*args, **kwargs), feeds)
    try:
        for index, image in enumerate(images):
            question = CALIBRATION_QUESTIONS[index % len(CALIBRATION_QUESTIONS)]
            request = GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens=decode_steps)
            generate_steps(fp32_backend, request)
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
