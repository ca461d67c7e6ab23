"""The intake's one error family: every door refuses a film with one of three classes, each with a message that
says what was wrong and what to do, a stable code, and the HTTP status an API gives it.

They derive from xray_io's ImageInputError, so code that catches the loader's errors catches these too; the
original error is chained (`__cause__`) for tests, never shown. Messages never name the file.
"""

from __future__ import annotations

from typing import ClassVar

from medgemma_xray.xray_io.errors import ImageInputError, ImageTooLargeError


class FilmRefused(ImageInputError):
    """A film the intake will not hand to the model. `code` and `http_status` are stable for API clients."""

    code: ClassVar[str] = "invalid_image"
    http_status: ClassVar[int] = 400


class NotAnImage(FilmRefused):
    """The bytes are not a film this server reads: not PNG, JPEG or DICOM, damaged, an unsupported kind (colour
    DICOM, CT, multi-frame), or compressed with a codec that is not installed."""

    code = "not_an_image"


class NotAChestFilm(FilmRefused):
    """A readable image that does not look like a frontal chest radiograph (noise, a document, a photograph, a
    lateral film, a CT slice), with FILM_CHECK=refuse."""

    code = "not_a_chest_film"


class FilmTooLarge(FilmRefused):
    """More bytes or pixels than the server's limits (MAX_FILE_SIZE_MB, MAX_PIXELS), refused before decoding, or
    a film that ran the decoder out of memory. A 400 like every input error of the API (its code tells it apart);
    413 is the HTTP edge's, for a request body over the transport limit."""

    code = "image_too_large"


def refusal_for(exc: ImageInputError) -> FilmRefused:
    """The intake's class for a loader error, with the loader's own message (it already says what to do)."""
    if isinstance(exc, FilmRefused):
        return exc
    kind: type[FilmRefused] = FilmTooLarge if isinstance(exc, ImageTooLargeError) else NotAnImage
    refused = kind(str(exc))
    refused.__cause__ = exc
    return refused
