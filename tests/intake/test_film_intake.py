"""The one film intake (medgemma_xray.intake): its three refusals, the film check at refuse and warn, the one
decoded-film cache (a resent film is not decoded again, the cache keeps within its bytes), single flight for the
same bytes, and the bound on decodes running at once."""

from __future__ import annotations

import threading
import time

import anyio
import numpy as np
import pytest

from devtools.hostile_files import dicom_rle_bomb
from medgemma_xray.film_check.negatives import negative_film
from medgemma_xray.intake import (
    FilmIntake,
    FilmRefused,
    FilmTooLarge,
    IntakeConfig,
    NotAChestFilm,
    NotAnImage,
)
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.serving.settings import Settings
from medgemma_xray.xray_io.errors import ImageInputError

NEGATIVES = ("noise", "text", "natural")


def phantom_png(seed: int = 3, rows: int = 256, cols: int = 224) -> bytes:
    return png_bytes(quantize(chest_phantom(rows, cols, seed=seed), 8))


@pytest.mark.parametrize("kind", NEGATIVES)
def test_an_image_that_is_not_a_chest_film_is_refused_by_name(kind):
    intake = FilmIntake(IntakeConfig())
    with pytest.raises(NotAChestFilm, match="does not look like a frontal chest X-ray") as refused:
        intake.read(png_bytes(quantize(negative_film(kind, seed=1), 8)))
    assert refused.value.code == "not_a_chest_film" and refused.value.http_status == 400
    assert "Upload a PA or AP chest radiograph" in str(refused.value)


def test_with_the_check_at_warn_the_film_is_read_and_flagged():
    intake = FilmIntake(IntakeConfig(film_check="warn"))
    film = intake.read(png_bytes(quantize(negative_film("noise", seed=2), 8)))
    assert not film.plausible and film.verdict is not None and film.verdict.distance > film.verdict.threshold
    assert "answers about it are not meaningful" in film.warnings[-1]
    assert intake.read(phantom_png()).plausible


def test_the_three_refusals_each_say_what_to_do():
    intake = FilmIntake(IntakeConfig(max_bytes=4 << 20))
    cases = {
        NotAnImage: b"this is a page of notes, not an image\n" * 20,
        FilmTooLarge: dicom_rle_bomb(8000, 8000),  # 1 MiB of RLE claiming 64 Mpx: refused from the header
    }
    for kind, data in cases.items():
        with pytest.raises(kind) as refused:
            intake.read(data)
        assert isinstance(refused.value, ImageInputError) and isinstance(refused.value.__cause__, ImageInputError)
        assert str(refused.value) == str(refused.value.__cause__)  # the loader's own message, which names the fix
    with pytest.raises(FilmTooLarge, match="larger than the 4 MiB limit") as too_big:
        intake.read(b"\0" * (5 << 20))
    assert too_big.value.http_status == 400 and too_big.value.code == "image_too_large"
    ct = dicom_bytes(quantize(chest_phantom(128, 112), 12), bits_stored=12, modality="CT")
    with pytest.raises(NotAnImage, match="The modality is CT"):
        intake.read(ct)
    assert intake.decodes == 3 and intake.cache_bytes == 0, "the 5 MiB file was refused unread; refusals are not kept"


def test_a_resent_film_is_decoded_once_and_the_model_input_is_the_processors():
    intake = FilmIntake(IntakeConfig())
    data = phantom_png()
    first, again = intake.read(data), intake.read(data)
    assert again is first and intake.decodes == 1
    assert first.model_image.size == (896, 896) and first.model_image.mode == "RGB"
    assert first.full_shape == (256, 224) and max(first.film.shape) <= 512
    assert intake.read(phantom_png(seed=4)).image_key != first.image_key and intake.decodes == 2
    for _ in range(2):  # a bad film is refused every time (it was never kept)
        with pytest.raises(NotAnImage, match="PNG"):
            intake.read(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)


def test_the_cache_keeps_within_its_bytes_and_lets_the_oldest_go():
    one_film = FilmIntake(IntakeConfig()).read(phantom_png(seed=0)).nbytes
    intake = FilmIntake(IntakeConfig(cache_bytes=2 * one_film))
    films = [phantom_png(seed=seed) for seed in range(3)]
    images = [intake.read(data) for data in films]
    assert intake.cache_bytes <= 2 * one_film
    assert intake.read(films[2]) is images[2] and intake.read(films[1]) is images[1]
    assert intake.read(films[0]) is not images[0], "the oldest film was evicted"
    assert FilmIntake(IntakeConfig(cache_bytes=0)).cache_bytes == 0


def test_concurrent_reads_of_the_same_bytes_decode_once():
    intake = FilmIntake(IntakeConfig())
    data = phantom_png(rows=1024, cols=896)
    barrier = threading.Barrier(8)
    films = []

    def read() -> None:
        barrier.wait()
        films.append(intake.read(data))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(films) == 8 and all(film is films[0] for film in films)
    assert intake.decodes == 1


def test_at_most_max_decodes_run_at_once_and_the_rest_wait(monkeypatch):
    """Each decode is held inside the loader until the test lets go: with a bound of 2, five different films
    leave two decoding and three waiting; without the bound all five would be inside the loader at once. The decodes
    run in this process (no deadline), where the test can hold the loader; the slots are the same either way."""
    import medgemma_xray.xray_io.loader as loader

    intake = FilmIntake(IntakeConfig(max_decodes=2, decode_timeout_s=0))
    release, inside = threading.Event(), []
    real = loader.load_radiograph

    def held(*args, **kwargs):
        inside.append(1)
        release.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "load_radiograph", held)
    threads = [threading.Thread(target=intake.read, args=(phantom_png(seed=seed),)) for seed in range(5)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while intake.decoding + intake.waiting < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (intake.decoding, intake.waiting, len(inside)) == (2, 3, 2)
    release.set()
    for thread in threads:
        thread.join()
    assert intake.peak_decodes == 2 and intake.decodes == 5 and intake.decoding == intake.waiting == 0


def test_read_async_decodes_off_the_event_loop():
    intake = FilmIntake(IntakeConfig())
    data = phantom_png()

    async def main():
        loop_thread = threading.get_ident()
        seen = []
        real = intake._decode

        def recording(*args, **kwargs):
            seen.append(threading.get_ident())
            return real(*args, **kwargs)

        intake._decode = recording
        film = await intake.read_async(data)
        return loop_thread, seen, film

    loop_thread, seen, film = anyio.run(main)
    assert seen and loop_thread not in seen and film.full_shape == (256, 224)


def test_the_values_come_from_the_same_decode_and_are_kept_under_the_films_key():
    intake = FilmIntake(IntakeConfig())
    stored = quantize(chest_phantom(256, 224, seed=5), 12)
    data = dicom_bytes((4095 - stored).astype(np.uint16), bits_stored=12, photometric="MONOCHROME1")
    film, values = intake.read_with_values(data)
    assert intake.decodes == 1 and intake.values(film.key) is values and intake.read(data) is film
    assert values.shape == film.full_shape and values.values.dtype == np.float32
    # MONOCHROME1 stored inverted: flipped within its range, so bright where attenuating as the model's film is.
    offset = values.values - stored.astype(np.float32)
    assert np.ptp(offset) == 0
    assert any("inverted" in warning for warning in film.warnings)


def test_every_door_of_one_server_shares_one_intake():
    settings = Settings()
    assert FilmIntake.for_settings(settings) is FilmIntake.for_settings(Settings())
    assert FilmIntake.for_settings(settings.with_overrides(film_check="warn")) is not FilmIntake.for_settings(settings)
    with pytest.raises(ValueError, match="film_check must be one of refuse, warn, off"):
        IntakeConfig(film_check="maybe")
    assert issubclass(FilmTooLarge, FilmRefused) and issubclass(NotAChestFilm, FilmRefused)
