"""The check itself: a film's distance from the frontal-film reference, and the refusal the UI shows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from medgemma_xray.film_check.features import FEATURE_NAMES, film_features
from medgemma_xray.xray_io import ImageInputError

REFERENCE_PATH = Path(__file__).with_name("reference.json")


class NotAChestFilmError(ImageInputError):
    """The image is too unlike a frontal chest film for the model's answer to mean anything."""


@dataclass(frozen=True)
class Reference:
    """Mean and inverse covariance of frontal films' features, and the distance beyond which an image is refused."""

    mean: np.ndarray
    precision: np.ndarray
    threshold: float
    fitted_on: str  # what the reference was fitted on, in words

    def distance(self, features: np.ndarray) -> float:
        offset = features - self.mean
        return float(np.sqrt(max(offset @ self.precision @ offset, 0.0)))

    def to_json(self) -> str:
        return json.dumps(
            {
                "feature_names": list(FEATURE_NAMES),
                "mean": self.mean.tolist(),
                "precision": self.precision.tolist(),
                "threshold": self.threshold,
                "fitted_on": self.fitted_on,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, origin: str = "reference") -> Reference:
        document = json.loads(text)
        if document.get("feature_names") != list(FEATURE_NAMES):
            raise ValueError(
                f"{origin} was fitted on other features than medgemma_xray.film_check.features computes; "
                "refit it with: python -m medgemma_xray.film_check --calibrate"
            )
        return cls(
            np.asarray(document["mean"], dtype=np.float64),
            np.asarray(document["precision"], dtype=np.float64),
            float(document["threshold"]),
            str(document["fitted_on"]),
        )


@lru_cache(maxsize=4)
def load_reference(path: str | Path = REFERENCE_PATH) -> Reference:
    path = Path(path)
    try:
        return Reference.from_json(path.read_text(), origin=str(path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no film-check reference at {path}; create it with: python -m medgemma_xray.film_check --calibrate --output {path}"
        ) from None


@dataclass(frozen=True)
class FilmVerdict:
    distance: float
    threshold: float

    @property
    def plausible(self) -> bool:
        return self.distance <= self.threshold

    def refusal(self) -> str:
        return (
            f"This image does not look like a frontal chest X-ray (film check score {self.distance:.0f}; frontal "
            f"films score under {self.threshold:.0f}), so the model will not read it. Upload a PA or AP chest "
            "radiograph. The check compares noise, symmetry and layout with frontal chest films; photographs, "
            "documents, CT slices and lateral films are refused."
        )

    def warning(self) -> str:
        return (
            f"This image does not look like a frontal chest X-ray (film check score {self.distance:.0f}, frontal "
            f"films score under {self.threshold:.0f}); the model's answers about it are not meaningful."
        )


def check_film(image, reference: Reference | None = None) -> FilmVerdict:
    """The verdict on one image (2-D uint8 pixels, an RGB array or a PIL image; zero padding is ignored)."""
    reference = reference or load_reference()
    return FilmVerdict(reference.distance(film_features(image)), reference.threshold)
