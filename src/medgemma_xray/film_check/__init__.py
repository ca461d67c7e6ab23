"""Before the model reads an image: is it plausibly a frontal chest radiograph?

MedGemma answers about anything it is shown; pure noise came back as "bilateral effusions and a 6 cm mass" at 96%.
This package refuses such images up front. It measures cheap, model-free image statistics (medgemma_xray.film_check.features) and
their Mahalanobis distance from those of known frontal chest films (film_check/reference.json, fitted by
`python -m medgemma_xray.film_check --calibrate`); an image further than the recorded threshold is not read. Being model-free it
works the same for the demo checkpoint and the real MedGemma, on CPU or GPU, and costs a few milliseconds.
`python -m medgemma_xray.film_check --evaluate` prints its AUROC and false-refusal rate on held-out phantoms against generated
negatives (noise, gradients, text, photographs' stand-ins, lateral and CT-like phantoms).
"""

from medgemma_xray.film_check.check import FilmVerdict, NotAChestFilmError, check_film, load_reference

__all__ = ["FilmVerdict", "NotAChestFilmError", "check_film", "load_reference"]
