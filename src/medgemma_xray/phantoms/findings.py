"""What a labelled synthetic phantom shows: findings, devices and technique, drawn from a seed.

The labels are the ground truth for the demo model's training and for task accuracy. They are written to a sidecar
JSON next to each film (never into DICOM patient fields). Sides are the patient's: on a PA film the patient's
right is on the viewer's left.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from medgemma_xray.phantoms.films import SYNTHETIC_LABEL

LABELS_VERSION = 1
SYNTHETIC_NOTICE = SYNTHETIC_LABEL

# The findings whose presence is asked and scored (per-finding F1), in the order reports and tables list them.
FINDINGS = (
    "pleural_effusion",
    "cardiomegaly",
    "pneumothorax",
    "nodule_or_mass",
    "consolidation",
    "endotracheal_tube",
    "central_line",
    "pacemaker",
)
LOBES = {
    "right": ("right upper lobe", "right middle lobe", "right lower lobe"),
    "left": ("left upper lobe", "left lower lobe"),
}
EFFUSION_SIZES = ("small", "moderate", "large")  # blunted angle, meniscus, up to mid-lung
CENTRAL_LINE_ROUTES = ("right internal jugular", "left subclavian")
CENTRAL_LINE_TIPS = ("superior vena cava", "cavoatrial junction", "right atrium")
CARDIOMEGALY_CTR = 0.5  # cardiothoracic ratio above which the heart is enlarged on a PA film
MASS_CM = 3.0  # a lung opacity of 3 cm or more is a mass, smaller a nodule


@dataclass(frozen=True)
class Effusion:
    side: str  # "left", "right" or "both"
    size: str  # one of EFFUSION_SIZES

    @property
    def sides(self) -> tuple[str, ...]:
        return ("right", "left") if self.side == "both" else (self.side,)


@dataclass(frozen=True)
class Heart:
    cardiothoracic_ratio: float

    @property
    def enlarged(self) -> bool:
        return self.cardiothoracic_ratio > CARDIOMEGALY_CTR


@dataclass(frozen=True)
class Pneumothorax:
    side: str
    size: str  # "small" (a rim at the apex and lateral wall) or "large"


@dataclass(frozen=True)
class LungOpacity:
    """A nodule or mass: one round opacity."""

    lobe: str
    size_cm: float

    @property
    def kind(self) -> str:
        return "mass" if self.size_cm >= MASS_CM else "nodule"


@dataclass(frozen=True)
class Consolidation:
    lobe: str


@dataclass(frozen=True)
class EndotrachealTube:
    tip_above_carina_cm: float


@dataclass(frozen=True)
class CentralLine:
    route: str  # one of CENTRAL_LINE_ROUTES
    tip: str  # one of CENTRAL_LINE_TIPS


@dataclass(frozen=True)
class Pacemaker:
    side: str  # the generator's side


@dataclass(frozen=True)
class Technique:
    rotated: bool
    inspiration: str  # "adequate" or "poor"
    exposure: str  # "adequate", "under" or "over"

    @property
    def adequate(self) -> bool:
        return not self.rotated and self.inspiration == "adequate" and self.exposure == "adequate"


@dataclass(frozen=True)
class PhantomLabels:
    seed: int
    heart: Heart
    technique: Technique
    effusion: Effusion | None = None
    pneumothorax: Pneumothorax | None = None
    nodule: LungOpacity | None = None
    consolidation: Consolidation | None = None
    endotracheal_tube: EndotrachealTube | None = None
    central_line: CentralLine | None = None
    pacemaker: Pacemaker | None = None
    synthetic: str = field(default=SYNTHETIC_NOTICE)

    def present(self, finding: str) -> bool:
        """Ground truth for one of FINDINGS."""
        if finding not in FINDINGS:
            raise ValueError(f"unknown finding {finding!r}; choose from {', '.join(FINDINGS)}")
        if finding == "cardiomegaly":
            return self.heart.enlarged
        attribute = {"pleural_effusion": "effusion", "nodule_or_mass": "nodule"}.get(finding, finding)
        return getattr(self, attribute) is not None

    @property
    def pathology_free(self) -> bool:
        return not any(self.present(f) for f in FINDINGS[:5])

    def to_json(self) -> str:
        record = {"labels_version": LABELS_VERSION, **asdict(self)}
        return json.dumps(record, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PhantomLabels:
        record = json.loads(text)
        version = record.pop("labels_version", None)
        if version != LABELS_VERSION:
            raise ValueError(f"phantom labels version {version!r}; this code reads version {LABELS_VERSION}")
        kinds = {
            "heart": Heart,
            "technique": Technique,
            "effusion": Effusion,
            "pneumothorax": Pneumothorax,
            "nodule": LungOpacity,
            "consolidation": Consolidation,
            "endotracheal_tube": EndotrachealTube,
            "central_line": CentralLine,
            "pacemaker": Pacemaker,
        }
        values = {}
        for spec in fields(cls):
            value = record.get(spec.name)
            values[spec.name] = kinds[spec.name](**value) if spec.name in kinds and value is not None else value
        return cls(**values)


def sample_labels(seed: int) -> PhantomLabels:
    """Draw one film's findings. About one film in seven is free of findings and devices; otherwise each finding
    is drawn on its own, with combinations that would hide each other (a nodule under a large effusion) avoided."""
    rng = np.random.default_rng([seed, 0x1ABE1])
    normal = rng.random() < 0.15

    def drawn(probability: float) -> bool:
        return not normal and rng.random() < probability

    technique = Technique(
        rotated=bool(rng.random() < 0.25),
        inspiration="poor" if rng.random() < 0.25 else "adequate",
        exposure=str(rng.choice(["adequate", "under", "over"], p=[0.7, 0.15, 0.15])),
    )
    enlarged = drawn(0.4)
    ratio = rng.uniform(0.55, 0.66) if enlarged else rng.uniform(0.38, 0.47)
    effusion = None
    if drawn(0.4):
        effusion = Effusion(
            str(rng.choice(["right", "left", "both"], p=[0.4, 0.4, 0.2])), str(rng.choice(EFFUSION_SIZES))
        )
    pneumothorax = None
    if drawn(0.3):
        free_sides = [s for s in ("right", "left") if effusion is None or s not in effusion.sides]
        if free_sides:
            pneumothorax = Pneumothorax(str(rng.choice(free_sides)), str(rng.choice(["small", "large"])))

    def free_lobe(taken: set[str]) -> str | None:
        """A lobe not already used, not under a moderate or large effusion, not in a collapsed lung."""
        candidates = []
        for side, lobes in LOBES.items():
            for lobe in lobes:
                hidden = (
                    lobe.endswith("lower lobe") and effusion and side in effusion.sides and effusion.size != "small"
                )
                collapsed = pneumothorax is not None and pneumothorax.side == side and pneumothorax.size == "large"
                if lobe not in taken and not hidden and not collapsed:
                    candidates.append(lobe)
        return str(rng.choice(candidates)) if candidates else None

    nodule = None
    if drawn(0.35) and (lobe := free_lobe(set())):
        size = rng.uniform(1.5, 2.9) if rng.random() < 0.6 else rng.uniform(3.0, 6.0)
        nodule = LungOpacity(lobe, round(float(size), 1))
    consolidation = None
    if drawn(0.35) and (lobe := free_lobe({nodule.lobe} if nodule else set())):
        consolidation = Consolidation(lobe)
    tube = EndotrachealTube(round(float(rng.uniform(2.0, 7.0)), 1)) if drawn(0.3) else None
    line = None
    if drawn(0.3):
        line = CentralLine(str(rng.choice(CENTRAL_LINE_ROUTES)), str(rng.choice(CENTRAL_LINE_TIPS)))
    pacemaker = Pacemaker(str(rng.choice(["left", "right"], p=[0.8, 0.2]))) if drawn(0.25) else None
    return PhantomLabels(
        seed=int(seed),
        heart=Heart(round(float(ratio), 2)),
        technique=technique,
        effusion=effusion,
        pneumothorax=pneumothorax,
        nodule=nodule,
        consolidation=consolidation,
        endotracheal_tube=tube,
        central_line=line,
        pacemaker=pacemaker,
    )
