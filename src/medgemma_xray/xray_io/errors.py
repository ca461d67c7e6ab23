"""Domain errors for image input. Each message says what was wrong and what to do; the UI shows it as is.

Messages never name the file: upload names (and DICOM tags) may hold patient names, and messages reach logs and
batch summaries. The user sees their own file name in the browser already.
"""


class ImageInputError(ValueError):
    """The upload cannot be used as a chest radiograph."""


class UnsupportedImageError(ImageInputError):
    """A well-formed file of a kind we do not support (CT, colour, multi-frame, unknown format)."""


class CorruptImageError(ImageInputError):
    """The file is damaged, truncated, or its header contradicts itself."""


class MissingCodecError(ImageInputError):
    """The file is compressed with a codec whose decoder package is not installed."""


class ImageTooLargeError(ImageInputError):
    """More pixels or bytes than the configured limit: refused from the header, before anything is decoded."""


class UnexpectedImageError(CorruptImageError):
    """The loader's last line: a failure no specific check anticipated. Logged by class only; the fuzz test
    treats any occurrence as a loader bug to fix with a specific check."""


def is_native_panic(exc: BaseException) -> bool:
    """Rust decoders (pylibjpeg-rle, through pyo3) report a panic on damaged data as pyo3_runtime.PanicException, a
    BaseException so that `except Exception` misses it. It cannot be imported by name, so it is matched by name."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"
