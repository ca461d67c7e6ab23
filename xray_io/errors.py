"""Domain errors for image input. Each message says what was wrong and what to do; the UI shows it as is."""


class ImageInputError(ValueError):
    """The upload cannot be used as a chest radiograph."""


class UnsupportedImageError(ImageInputError):
    """A well-formed file of a kind we do not support (CT, colour, multi-frame, unknown format)."""


class CorruptImageError(ImageInputError):
    """The file is damaged or truncated."""


class MissingCodecError(ImageInputError):
    """The file is compressed with a codec whose decoder package is not installed."""
