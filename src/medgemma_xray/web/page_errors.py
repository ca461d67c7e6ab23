"""How both pages turn a failure into what the user sees, in one place.

A user's error (a refused film, a refused question, a busy server) becomes a gr.Error with its own message; the
log gets its class only, never the message (it can quote the user's text) nor a file name. Anything else is an
internal error: the user gets an incident number, the log gets the class and where it failed, without the message.
"""

from __future__ import annotations

import logging
import traceback
import uuid

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.xray_io.errors import ImageInputError

USER_ERRORS: tuple[type[BaseException], ...] = (RequestError, ImageInputError)


def is_user_error(exc: BaseException) -> bool:
    from medgemma_xray.serving.service import ServiceUnavailable
    from medgemma_xray.teaching.keys import AnswerKeyError
    from medgemma_xray.web.upload_cache import NotAnUploadError, UploadGoneError

    return isinstance(exc, (*USER_ERRORS, ServiceUnavailable, NotAnUploadError, UploadGoneError, AnswerKeyError))


def shown(exc: BaseException, logger: logging.Logger, where: str = ""):
    """The gr.Error a page raises for `exc` (raise shown(exc, logger) from exc)."""
    import gradio as gr

    prefix = f"{where}: " if where else ""
    if isinstance(exc, gr.Error):
        return exc
    if is_user_error(exc):
        cause = exc.__cause__ if isinstance(exc.__cause__, ImageInputError) else exc
        logger.warning("%suser error: %s", prefix, type(cause).__name__)
        return gr.Error(str(exc), duration=None, print_exception=False)
    incident = uuid.uuid4().hex[:8]
    frames = "".join(traceback.format_tb(exc.__traceback__))  # where it failed, without the message
    logger.error("%sinternal error %s: %s\n%s", prefix, incident, type(exc).__name__, frames.rstrip())
    return gr.Error(
        f"Internal error (incident {incident}); the server is still running. Try again; if it happens again, give "
        "the incident number to the operator.",
        print_exception=False,
    )


def refused(message: str, logger: logging.Logger, where: str = ""):
    """A fixed text of the page's own (no film, no question): the kind is logged, not the message."""
    import gradio as gr

    logger.warning("%suser error: incomplete request", f"{where}: " if where else "")
    return gr.Error(message, print_exception=False)
