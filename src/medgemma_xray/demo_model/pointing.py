"""The demo model's texts for pointing and comparing: answers to the localisation prompt and to the comparison prompt.

Localisation (MedGemma 1.5's format, Google-Health/medgemma's cxr_anatomy_localization notebook): the user turn is
grounding.prompts.localisation_prompt(<the finding's name>); the answer is one short reasoning sentence (what the
film shows and where), then grounding.boxes.final_answer with the finding's ground-truth boxes
(phantoms.regions) in the model's frame: 0..1000 of the centred, zero-padded square the model sees. For a finding
the film does not show, the reasoning says so and the answer is `Final Answer: []`: the prompt asks for a JSON
list, and an empty list is the parseable "nothing to point at" (grounding.boxes.parse_boxes reads it as no boxes,
never as a refusal).

Comparison (cxr_longitudinal_comparison notebook): one user turn holding the prior film, the current film and
grounding.prompts.COMPARISON_PROMPT; the answer is phantoms.progression.change_statement, one fixed-format
sentence that phantoms.progression.parse_change_statement reads back.
"""

from __future__ import annotations

import numpy as np

from medgemma_xray.demo_model import teaching
from medgemma_xray.grounding.boxes import final_answer, to_model
from medgemma_xray.grounding.prompts import COMPARISON_PROMPT, localisation_prompt
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels
from medgemma_xray.phantoms.progression import Change, change_statement
from medgemma_xray.phantoms.regions import Region, object_name

_WHERE = {
    "pleural_effusion": "It fills the {side} costophrenic angle, in the {side} lower zone.",
    "pneumothorax": "The {side} lung edge is visible with no lung markings beyond it, widest at the {side} apex.",
    "nodule_or_mass": "It lies in the {side} {zone} zone.",
    "consolidation": "It lies in the {side} {zone} zone.",
    "cardiomegaly": "The heart's outline spans more than half of the chest's width.",
    "endotracheal_tube": "It runs down the trachea in the midline.",
    "central_line": "It runs from the {side} side of the neck or chest to the superior vena cava.",
    "pacemaker": "The generator lies over the {side} upper chest, its lead in the heart.",
}


def localisation_answer(finding: str, labels: PhantomLabels, regions: tuple[Region, ...], rows: int, cols: int) -> str:
    """The answer to localisation_prompt(object_name(finding)) for a rows x cols film with these regions."""
    own = [region for region in regions if region.finding == finding]
    presence = teaching.finding_answer(finding, labels)
    if not own:
        # "No pleural effusion." / "No, the heart size is normal: ..." then nothing to point at.
        return f"{presence} There is nothing to locate.\nFinal Answer: []"
    statement = presence.removeprefix("Yes, ")
    statement = statement[0].upper() + statement[1:]
    where = " ".join(
        _WHERE[finding].format(side=region.side or "", zone=region.zone or "") for region in own[:1]
    ).replace("  ", " ")
    if finding == "pleural_effusion" and len(own) > 1:
        where = "They fill both costophrenic angles, in both lower zones."
    boxes = [(region.box.label, to_model(region.box, rows, cols)) for region in own]
    return f"{statement} {where}\n{final_answer(boxes)}"


def localisation_turns(
    labels: PhantomLabels, regions: tuple[Region, ...], rows: int, cols: int, rng: np.random.Generator, turns: int = 2
) -> list[tuple[str, str]]:
    """`turns` localisation questions about one film: mostly findings it shows, sometimes one it does not."""
    present = [f for f in FINDINGS if labels.present(f)]
    absent = [f for f in FINDINGS if not labels.present(f)]
    chosen: list[str] = []
    for _ in range(turns):
        pick_present = present and (not absent or rng.random() < 0.75)
        pool = [f for f in (present if pick_present else absent) if f not in chosen] or present or absent
        chosen.append(str(rng.choice(pool)))
    return [(localisation_prompt(object_name(f)), localisation_answer(f, labels, regions, rows, cols)) for f in chosen]


def comparison_turn(changes: tuple[Change, ...]) -> tuple[str, str]:
    """The comparison question (after the prior and the current film) and its answer."""
    return COMPARISON_PROMPT, change_statement(changes)


def corpus_lines(seed: int, rng: np.random.Generator) -> list[str]:
    """Texts of the pointing tasks for the tokenizer's training corpus, from one label set (no film drawn): one
    localisation prompt and the answers for every finding with random boxes, one comparison prompt and statement."""
    from medgemma_xray.grounding.boxes import FilmBox
    from medgemma_xray.phantoms.progression import pair_labels
    from medgemma_xray.phantoms.regions import box_label

    _, labels, _, changes = pair_labels(seed)
    regions = []
    for finding in FINDINGS:
        if labels.present(finding):
            side = str(rng.choice(["right", "left"])) if finding not in ("cardiomegaly", "endotracheal_tube") else None
            y0, x0 = rng.uniform(0.0, 0.5, size=2)
            box = FilmBox(box_label(finding, side), y0, x0, y0 + rng.uniform(0.05, 0.5), x0 + rng.uniform(0.05, 0.5))
            regions.append(Region(finding, side, str(rng.choice(["upper", "middle", "lower"])), box))
    lines = [localisation_prompt(object_name(str(rng.choice(FINDINGS))))]
    for finding in FINDINGS:
        lines.extend(localisation_answer(finding, labels, tuple(regions), 512, 448).splitlines())
    return [*lines, *comparison_turn(changes)]
