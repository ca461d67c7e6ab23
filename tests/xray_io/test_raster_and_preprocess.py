"""PNG/JPEG input, padding to square, and DICOM-vs-PNG parity at the processor's output."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.xray_io import CorruptImageError, UnsupportedImageError, load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image, pad_to_square

FILM = chest_phantom(400, 320, seed=3)


def test_8bit_png_is_kept_as_is():
    pixels = quantize(FILM, 8)
    film = load_radiograph(png_bytes(pixels))
    assert np.array_equal(film.pixels, pixels)
    assert film.source == "PNG 8-bit"


def test_16bit_png_is_stretched_to_8bit():
    pixels = (quantize(FILM, 12).astype(np.uint16) + 100).astype(np.uint16)  # 12-bit data in a 16-bit PNG
    film = load_radiograph(png_bytes(pixels))
    assert film.source == "PNG 16-bit"
    assert film.pixels.min() == 0 and film.pixels.max() == 255
    expected = np.round((pixels - pixels.min()) / (pixels.max() - pixels.min()) * 255)
    assert np.abs(film.pixels.astype(int) - expected).max() <= 1


def test_jpeg_and_colour_input():
    rgb = np.repeat(quantize(FILM, 8)[:, :, None], 3, axis=2)
    rgb[..., 0] = np.clip(rgb[..., 0].astype(int) + 40, 0, 255)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=95)
    film = load_radiograph(buffer.getvalue())
    assert film.source == "JPEG 8-bit colour"
    assert any("colour" in warning for warning in film.warnings)
    assert film.pixels.shape == (400, 320)


def test_not_an_image_is_refused_with_advice():
    with pytest.raises(UnsupportedImageError, match="not a PNG, JPEG or DICOM"):
        load_radiograph(b"%PDF-1.7 this is a report")


def test_truncated_png_is_corrupt():
    data = png_bytes(quantize(FILM, 8))
    with pytest.raises(CorruptImageError, match="truncated"):
        load_radiograph(data[: len(data) // 2])


def test_blank_and_tiny_images_are_refused():
    with pytest.raises(UnsupportedImageError, match="blank"):
        load_radiograph(png_bytes(np.full((100, 100), 7, dtype=np.uint16)))
    with pytest.raises(UnsupportedImageError, match="too small"):
        load_radiograph(png_bytes(quantize(chest_phantom(32, 32), 8)))


def test_pad_to_square_centres_the_film_on_black():
    pixels = np.full((4, 2), 9, dtype=np.uint8)
    square = pad_to_square(pixels)
    assert square.shape == (4, 4)
    assert np.array_equal(square[:, 1:3], pixels)
    assert square[:, 0].max() == 0 and square[:, 3].max() == 0


def test_model_input_is_three_equal_channels_padded():
    film = load_radiograph(png_bytes(quantize(FILM, 8)))
    image = np.asarray(model_input_image(film))
    assert image.shape == (400, 400, 3)
    assert np.array_equal(image[..., 0], image[..., 2])
    assert image[:, :40].max() == 0 and image[:, -40:].max() == 0  # 40-px zero bands left and right


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_processor_gets_the_same_tensor_from_dicom_and_png(demo_model_dir, photometric):
    """The equivalent PNG (an 8-bit export of the film) and the 12-bit windowed DICOM reach the model identically."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(demo_model_dir)
    eight_bit = load_radiograph(png_bytes(quantize(FILM, 12))).pixels  # full 0-255 range, as exported
    stored = eight_bit.astype(np.uint16) * 16  # the same film on a 12-bit detector scale
    if photometric == "MONOCHROME1":
        stored = (4080 - stored).astype(np.uint16)
    dicom = load_radiograph(dicom_bytes(stored, bits_stored=12, photometric=photometric, window=(2040, 4081)))
    png = load_radiograph(png_bytes(eight_bit))

    def pixel_values(film):
        return processor.image_processor(images=[model_input_image(film)], return_tensors="np")["pixel_values"]

    from_dicom, from_png = pixel_values(dicom), pixel_values(png)
    assert from_dicom.shape == (1, 3, 896, 896)
    assert np.abs(from_dicom - from_png).max() == 0.0
    assert from_png.min() == pytest.approx(-1.0) and from_png.max() <= 1.0
