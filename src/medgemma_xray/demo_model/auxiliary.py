"""An auxiliary training signal: a linear read-out of the image features that predicts the film's labels.

A tiny, randomly initialised model learns to look at the film slowly from the answer tokens alone (a yes/no word
is one token among dozens of template tokens, and "No" is right most of the time). The read-out sends the label
signal straight into the projector and vision tower, so the 256 image tokens encode the findings early and the
language model only has to learn to read them. It is used during training only and is not part of the saved
checkpoint, which stays a plain Gemma3ForConditionalGeneration.
"""

from __future__ import annotations

import math

from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels


def _side(attribute: str, side: str):
    def present(labels: PhantomLabels) -> bool:
        value = getattr(labels, attribute)
        if value is None:
            return False
        if hasattr(value, "sides"):
            return side in value.sides
        if hasattr(value, "lobe"):
            return value.lobe.startswith(side)
        return value.side == side

    return present


AUX_TARGETS = {
    **{finding: (lambda f: lambda labels: labels.present(f))(finding) for finding in FINDINGS},
    "effusion_right": _side("effusion", "right"),
    "effusion_left": _side("effusion", "left"),
    "effusion_beyond_small": lambda labels: labels.effusion is not None and labels.effusion.size != "small",
    "pneumothorax_right": _side("pneumothorax", "right"),
    "pneumothorax_left": _side("pneumothorax", "left"),
    "opacity_right": _side("nodule", "right"),
    "mass": lambda labels: labels.nodule is not None and labels.nodule.kind == "mass",
    "consolidation_right": _side("consolidation", "right"),
    "pacemaker_left": _side("pacemaker", "left"),
    "line_jugular": lambda labels: labels.central_line is not None and labels.central_line.route.endswith("jugular"),
    "rotated": lambda labels: labels.technique.rotated,
    "poor_inspiration": lambda labels: labels.technique.inspiration == "poor",
    "underexposed": lambda labels: labels.technique.exposure == "under",
    "overexposed": lambda labels: labels.technique.exposure == "over",
}


def aux_targets(film_labels: list[PhantomLabels]):
    import torch

    return torch.tensor([[float(f(labels)) for f in AUX_TARGETS.values()] for labels in film_labels])


def make_readout(hidden_size: int, generator_seed: int):
    """One attention-pooling head per target: a learned query picks the image tokens that matter (a region, or a
    kind of content) and a linear read-out of their average scores the target. That is the same job the language
    model's attention does when it answers, so features that serve one serve the other."""
    import torch
    from torch import nn

    class FindingReadout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(generator_seed)
            targets = len(AUX_TARGETS)
            self.query = nn.Parameter(torch.randn(targets, hidden_size, generator=generator) / math.sqrt(hidden_size))
            self.weight = nn.Parameter(torch.randn(targets, hidden_size, generator=generator) / math.sqrt(hidden_size))
            self.bias = nn.Parameter(torch.zeros(targets))
            self.mean_weight = nn.Parameter(
                torch.randn(targets, hidden_size, generator=generator) / math.sqrt(hidden_size)
            )
            self.mean_bias = nn.Parameter(torch.zeros(targets))

        def forward(self, features):
            features = features.float()
            features = features * torch.rsqrt(features.pow(2).mean(-1, keepdim=True) + 1e-6)  # unit RMS per token
            attention = torch.softmax(torch.einsum("bth,kh->bkt", features, self.query), dim=-1)
            pooled = torch.einsum("bkt,bth->bkh", attention, features)
            attended = (pooled * self.weight).sum(-1) + self.bias
            # The same targets from the plain average of all 256 tokens: pushes the vision tower to spread what it
            # found over every token, which a language model that has not yet learned where to look can read.
            averaged = features.mean(dim=1) @ self.mean_weight.T + self.mean_bias
            return torch.stack([attended, averaged])

    return FindingReadout()


def aux_loss(readout, features, film_labels: list[PhantomLabels]):
    import torch.nn.functional as F

    targets = aux_targets(film_labels).to(features.device)
    return F.binary_cross_entropy_with_logits(readout(features), targets.expand(2, -1, -1))


# The boxes the box read-out predicts: one per finding and side it can be on (dataset.model_boxes' keys).
BOX_TARGETS = (
    "pleural_effusion:right",
    "pleural_effusion:left",
    "cardiomegaly:None",
    "pneumothorax:right",
    "pneumothorax:left",
    "nodule_or_mass:right",
    "nodule_or_mass:left",
    "consolidation:right",
    "consolidation:left",
    "endotracheal_tube:None",
    "central_line:right",
    "central_line:left",
    "pacemaker:right",
    "pacemaker:left",
)


def make_box_readout(hidden_size: int, generator_seed: int):
    """Where each finding is, read from the image features: per BOX_TARGETS entry, a learned query pools the image
    tokens and a linear map gives the box's four corners (fractions of the model's square). Like the label
    read-out, a training aid only: it makes the image tokens say where a finding lies, not only whether, which is
    what the language model must read to write a box."""
    import torch
    from torch import nn

    class BoxReadout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(generator_seed)
            targets = len(BOX_TARGETS)
            self.query = nn.Parameter(torch.randn(targets, hidden_size, generator=generator) / math.sqrt(hidden_size))
            self.weight = nn.Parameter(
                torch.randn(targets, 4, hidden_size, generator=generator) / math.sqrt(hidden_size)
            )
            self.bias = nn.Parameter(torch.tensor([0.3, 0.3, 0.7, 0.7]).repeat(targets, 1))

        def forward(self, features):
            features = features.float()
            features = features * torch.rsqrt(features.pow(2).mean(-1, keepdim=True) + 1e-6)
            attention = torch.softmax(torch.einsum("bth,kh->bkt", features, self.query), dim=-1)
            pooled = torch.einsum("bkt,bth->bkh", attention, features)
            return torch.einsum("bkh,kch->bkc", pooled, self.weight) + self.bias  # (films, targets, 4)

    return BoxReadout()


def box_targets(film_boxes: list[dict]):
    """(targets (films, BOX_TARGETS, 4), mask (films, BOX_TARGETS)) from each film's model-frame boxes."""
    import torch

    targets = torch.zeros(len(film_boxes), len(BOX_TARGETS), 4)
    mask = torch.zeros(len(film_boxes), len(BOX_TARGETS))
    for row, boxes in enumerate(film_boxes):
        for column, key in enumerate(BOX_TARGETS):
            if key in boxes:
                targets[row, column] = torch.tensor(boxes[key])
                mask[row, column] = 1.0
    return targets, mask


def box_loss(readout, features, film_boxes: list[dict]):
    """Mean L1 error of the present findings' corners (0 when the batch shows none)."""
    targets, mask = box_targets(film_boxes)
    targets, mask = targets.to(features.device), mask.to(features.device)
    error = (readout(features) - targets).abs().mean(-1)
    return (error * mask).sum() / mask.sum().clamp(min=1.0)
