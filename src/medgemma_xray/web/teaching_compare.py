"""/teaching's prior film: a library case's prior read through the one intake, a teacher's prior for an uploaded
film, the controls a case with a prior shows, and "What changed?", which asks the model with both films in one
prompt (GenerationRequest.prior_image: the prior first, then the current film, then the text).

"What changed?" takes the page's question path (web.asking's rules on the conversation and on the client, one
answer at a time per case, Stop by the server-side token, bound to the case it started on; guess first in quiz
mode). Its answer is kept with the case as the model's statement (shown beside the student's change read after
the reveal, and exported). A checkpoint without the "longitudinal" capability (BackendInfo.capabilities) is not
asked: the control is disabled and says that MedGemma 1.5 compares with a prior.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from medgemma_xray.teaching.prior_round import PriorView
from medgemma_xray.teaching.rounds import LibraryRound, Round, upload_names
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_answers import _claim, _release, _throttled
from medgemma_xray.web.teaching_context import (
    QUESTIONS_LOCKED,
    TeachingPage,
    current_round,
    logger,
    questions_locked,
)
from medgemma_xray.web.teaching_practice import change_markdown
from medgemma_xray.web.teaching_view import VIEW_OUT, view_outputs

EVENTS = PageEvents()
STILL_SHOWN = "The two films are still shown side by side."
LOADING = "The model is not ready yet; What changed? opens once it has loaded (reopen the case)."
PRIOR_CONTROLS = ["change_group", "compare_button", "compare_note"]


def compares_with_prior(page: TeachingPage) -> tuple[bool, str]:
    """Whether the serving checkpoint compares with a prior (its "longitudinal" capability), and if not, why."""
    from medgemma_xray.engine_bundle.checkpoint_profile import LONGITUDINAL
    from medgemma_xray.inference_api.capabilities import has_capability, missing_capability_message

    info = page.service.info()
    if info is None:
        return False, LOADING
    if not has_capability(info, LONGITUDINAL):
        return False, f"{missing_capability_message(info, LONGITUDINAL)} {STILL_SHOWN}"
    return True, ""


def prior_controls(page: TeachingPage, round_: Round | None) -> dict[str, Any]:
    """The change read (a case whose prior has a change key), What changed? and its note, for the case shown."""
    import gradio as gr

    prior = round_.prior if round_ is not None else None
    able, why = compares_with_prior(page) if prior is not None else (False, "")
    return {
        "change_group": gr.update(visible=prior is not None and prior.change_key is not None),
        "compare_button": gr.update(visible=prior is not None, interactive=able),
        "compare_note": why,
    }


def read_prior(page: TeachingPage, data: bytes, interval: str, key=None, change_key=None) -> PriorView:
    """A prior film through the one intake (its decode, film check, limits and cache), as a round keeps it."""
    from medgemma_xray.teaching.viewer import display_film

    film, values = page.intake.read_with_values(data)
    display = display_film(values, film.film.source, film.key)
    return PriorView(display, film.model_image, film.image_key, interval, key, change_key, warnings=film.warnings)


def library_prior(page: TeachingPage, case) -> PriorView | None:
    """A library case's prior (its sidecar's `prior`), or None for a case without one."""
    from medgemma_xray.teaching.change_scoring import change_key_of

    prior = case.prior
    if prior is None:
        return None
    change_key = change_key_of(prior.changes) if prior.changes is not None else None
    return read_prior(page, prior.film_path.read_bytes(), prior.interval, prior.key, change_key)


@EVENTS.on(["prior_upload.upload"], inputs=["prior_upload", "session"],
           outputs=[*VIEW_OUT, *PRIOR_CONTROLS, "session"], api_name="teaching_upload_prior")  # fmt: skip
def upload_prior(page: TeachingPage, values: dict) -> dict:
    """A teacher's prior film for the uploaded film on screen: through the same intake and limits as any film."""
    session, _, round_ = current_round(values)
    if not values["prior_upload"]:
        raise refused("No prior film received. Drop the earlier film onto the prior's upload box.", logger, "teaching")
    if isinstance(round_, LibraryRound):
        raise refused("A library case's prior comes from its sidecar (docs/teaching_cases.md); upload a film first, "
                      "then its prior.", logger, "teaching")  # fmt: skip
    try:
        prior = read_prior(page, page.uploads.take(values["prior_upload"]), "")
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    forbidden = upload_names(values["prior_upload"]) | set(prior.display.dicom_identity.values())
    paired = replace(round_, prior=prior)
    held = session.update(
        lambda s: replace(s.updated(paired), forbidden=s.forbidden | frozenset(forbidden)) if s.current is round_ else s
    )
    if held.current is not paired:
        return {}
    return {**view_outputs(page, paired), **prior_controls(page, paired), "session": session}


def _compare_request(page: TeachingPage, round_: Round):
    from medgemma_xray.grounding.prompts import COMPARISON_PROMPT
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.web.asking import AskRefused

    prior = round_.prior
    if prior is None:
        raise refused("This case has no prior film to compare with.", logger, "teaching")
    request = GenerationRequest(
        image=round_.model_image,
        turns=(ChatTurn("user", COMPARISON_PROMPT),),
        max_new_tokens=page.settings.max_new_tokens,
        image_key=round_.image_key,
        prior_image=prior.model_image,
        prior_image_key=prior.image_key,
    )
    try:
        page.asking.check(request)
    except AskRefused as exc:
        raise shown(exc, logger, "teaching") from exc
    return request


@EVENTS.on(["compare_button.click"], inputs=["quiz", "session"], outputs=["change_box", "session"], request=True,
           api_name="teaching_compare", concurrency_id="generation")  # fmt: skip
def compare(page: TeachingPage, values: dict, request) -> Any:
    """The model's answer to "what changed since the prior?", streamed below the reveal; kept with the case."""
    from medgemma_xray.inference_api.types import GenerationStats

    session, _, round_ = current_round(values)
    if questions_locked(page, bool(values["quiz"]), round_):
        raise refused(QUESTIONS_LOCKED, logger, "teaching")
    able, why = compares_with_prior(page)
    if not able and round_.prior is not None:
        raise refused(why, logger, "teaching")
    generation = _compare_request(page, round_)
    ticket = _claim(page, session, round_, request)
    title = "**The model on what changed**"
    text = ""
    try:
        yield {"change_box": f"{title} (streaming)"}
        for text in _throttled(page.asking.stream(generation, ticket, GenerationStats())):
            if ticket.superseded:
                return
            yield {"change_box": f"{title} (streaming)\n\n{text}"}
        if ticket.superseded or round_.prior is None:
            return
        stated = replace(round_, prior=replace(round_.prior, statement=text))
        held = session.update(lambda s: s.updated(stated) if s.current is round_ else s)
        if held.current is not stated:
            return
        stopped = "\n\n*Stopped. Press What changed? to ask again.*" if ticket.stopped.is_set() else ""
        box = change_markdown(stated) if stated.revealed else f"{title}\n\n{text}"
        yield {"change_box": box + stopped, "session": session}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)
