"""The prompts that ask a MedGemma checkpoint to point and to compare, in the form Google's notebooks publish.

LOCALISATION_PROMPT is the user text of Google-Health/medgemma's `cxr_anatomy_localization_with_hugging_face.ipynb`
(MedGemma 1.5), with the object's name in place; the film is the only image in that turn. The comparison follows
`cxr_longitudinal_comparison_with_hugging_face.ipynb`: one user turn whose content is the prior image, then the
current image, then the text. MedGemma 1.5 may think before answering, between <unused94> and <unused95>;
`strip_thinking` drops that part before an answer is parsed or shown.
"""

from __future__ import annotations

LOCALISATION_PROMPT = (
    "Instructions:\n"
    "The following user query will require outputting bounding boxes. The format of bounding boxes coordinates is "
    "[y0, x0, y1, x1] where (y0, x0) must be top-left corner and (y1, x1) the bottom-right corner. This implies "
    "that x0 < x1 and y0 < y1. Always normalize the x and y coordinates the range [0, 1000], meaning that a "
    "bounding box starting at 15% of the image width would be associated with an x coordinate of 150. You MUST "
    "output a single parseable json list of objects enclosed into ```json...``` brackets, for instance "
    '```json[{{"box_2d": [800, 3, 840, 471], "label": "car"}}, {{"box_2d": [400, 22, 600, 73], "label": "dog"}}]``` '
    "is a valid output. Now answer to the user query.\n\n"
    'Remember "left" refers to the patient\'s left side where the heart is and sometimes underneath an L in the '
    "upper right corner of the image.\n\n"
    "Query:\n"
    "Where is the {object_name}? Don't give a final answer without reasoning. Output the final answer in the format "
    '"Final Answer: X" where X is a JSON list of objects. The object needs a "box_2d" and "label" key. Answer:'
)

THINKING_START, THINKING_END = "<unused94>", "<unused95>"


def localisation_prompt(object_name: str) -> str:
    """The notebook's localisation query for one object ('pleural effusion', 'endotracheal tube')."""
    return LOCALISATION_PROMPT.format(object_name=object_name.strip())


def strip_thinking(text: str) -> str:
    """The answer without MedGemma 1.5's thinking trace (everything up to <unused95>), if there is one."""
    if THINKING_END in text:
        return text.split(THINKING_END, 1)[1].lstrip()
    return text


# The user text of Google-Health/medgemma's `cxr_longitudinal_comparison_with_hugging_face.ipynb` (MedGemma 1.5):
# it follows the prior image and the current image in the same user turn.
COMPARISON_PROMPT = (
    "Provide a comparison of these two images and include details from the image which students should take note "
    "of when reading longitudinal CXR"
)
