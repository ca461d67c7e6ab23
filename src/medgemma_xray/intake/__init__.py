"""One film intake for every door: bytes in; the model's image, the film's warnings and a content hash out; one
error family (not an image, not a chest film, too large); one decoded-film cache; a bounded number of decodes.

    from medgemma_xray.intake import FilmIntake
    intake = FilmIntake.for_settings(settings)     # the process's one intake for these settings
    film = intake.read(data)                        # IntakeFilm, or NotAnImage / NotAChestFilm / FilmTooLarge
"""

from medgemma_xray.intake.errors import FilmRefused, FilmTooLarge, NotAChestFilm, NotAnImage
from medgemma_xray.intake.film_intake import FilmIntake, IntakeConfig, IntakeFilm

__all__ = [
    "FilmIntake",
    "FilmRefused",
    "FilmTooLarge",
    "IntakeConfig",
    "IntakeFilm",
    "NotAChestFilm",
    "NotAnImage",
]
