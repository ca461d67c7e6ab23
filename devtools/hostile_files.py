"""Hostile inputs for tests: real image bombs (small files that decode to gigabytes) and files whose names and
tags carry fake patient identifiers. Each bomb is a valid file its format's decoder would expand in full; they are
built by streaming, so making one never holds the expanded pixels in memory.
"""

from __future__ import annotations

import io
import struct
import zlib

FAKE_IDENTIFIERS = {
    "PatientName": "ZZTESTPATIENT^SECRETNAME",
    "PatientID": "PID-7731-SECRET",
    "PatientBirthDate": "19010203",
    "AccessionNumber": "ACC-SECRET-5521",
    "InstitutionName": "SECRET GENERAL HOSPITAL",
    "ReferringPhysicianName": "DR^SECRETREFERRER",
    "StudyInstanceUID": "1.2.826.0.1.3680043.8.498.77310000000000000001",
    "SeriesInstanceUID": "1.2.826.0.1.3680043.8.498.77310000000000000002",
}
FAKE_IDENTIFYING_FILE_NAME = "ZZTESTPATIENT_SECRETNAME_PID-7731-SECRET"
_ZEROS = bytes(1 << 20)


def _deflate_zeros(count: int, compressor) -> bytes:
    parts = []
    while count > 0:
        step = min(count, len(_ZEROS))
        parts.append(compressor.compress(_ZEROS[:step]))
        count -= step
    return b"".join(parts)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bomb(width: int, height: int, bits: int = 16) -> bytes:
    """A black grayscale PNG of width x height (8- or 16-bit): a few hundred KB that decode to width*height*bits/8."""
    compressor = zlib.compressobj(9)
    row = 1 + width * bits // 8  # each row: filter byte 0, then the samples
    body = _deflate_zeros(row * height, compressor) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, bits, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", body) + _png_chunk(b"IEND", b"")


def _radiograph_header(rows: int, columns: int, syntax: str):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID("1.2.840.10008.5.1.4.1.1.1.1")
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = UID(syntax)
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.ViewPosition = "DX", "PA"
    ds.Rows, ds.Columns, ds.SamplesPerPixel = rows, columns, 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    return ds


def dicom_rle_bomb(rows: int, columns: int) -> bytes:
    """A 16-bit DX film in RLE Lossless: two PackBits segments of 128-byte zero runs (2 bytes each), so about
    rows*columns/64 bytes of file for rows*columns*2 bytes of pixels."""
    from pydicom.encaps import encapsulate

    ds = _radiograph_header(rows, columns, "1.2.840.10008.1.2.5")
    runs, tail = divmod(rows * columns, 128)
    segment = b"\x81\x00" * runs + (bytes([257 - tail, 0]) if tail > 1 else b"\x00\x00" if tail else b"")
    offsets = [64, 64 + len(segment)] + [0] * 13
    frame = struct.pack("<16I", 2, *offsets) + segment + segment
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def dicom_deflated_bomb(rows: int, columns: int) -> bytes:
    """A 16-bit DX film in Deflated Explicit VR Little Endian whose native pixels are all zero: deflate's ~1000:1
    on zeros makes rows*columns*2 bytes of data set from a file a thousandth that size."""
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info

    ds = _radiograph_header(rows, columns, "1.2.840.10008.1.2.1.99")
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, False
    write_dataset(body, ds)
    pixel_bytes = rows * columns * 2
    pixel_element = struct.pack("<HH2sHI", 0x7FE0, 0x0010, b"OW", 0, pixel_bytes)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    deflated = compressor.compress(body.getvalue() + pixel_element)
    deflated += _deflate_zeros(pixel_bytes, compressor) + compressor.flush()
    out = DicomBytesIO()
    out.write(b"\x00" * 128 + b"DICM")
    write_file_meta_info(out, ds.file_meta, enforce_standard=True)
    return out.getvalue() + deflated


def dicom_jpeg_with_lying_size(width: int = 60000, height: int = 60000) -> bytes:
    """A small DX film in JPEG Baseline whose codestream (SOF0) claims width x height while the DICOM header says
    128 x 112: decoders size their output from the codestream, so this asks for gigabytes."""
    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

    data = bytearray(dicom_bytes(quantize(chest_phantom(128, 112), 8), bits_stored=8, transfer_syntax="jpeg-baseline"))
    sof = data.index(b"\xff\xc0")  # marker, length (2), precision (1), height (2), width (2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# --- compressed DICOM whose codestream hides its size from a reader of the first bytes ---


def _small_compressed_film(syntax: str):
    """A valid 128x112 DX film in `syntax` (jpeg-baseline or jpeg-2000-lossless), read back as a pydicom data set,
    with its one frame's codestream."""
    import pydicom
    from pydicom.encaps import generate_frames

    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

    bits = 8 if syntax == "jpeg-baseline" else 12
    data = dicom_bytes(quantize(chest_phantom(128, 112, seed=3), bits), bits_stored=bits, transfer_syntax=syntax)
    dataset = pydicom.dcmread(io.BytesIO(data))
    frame = next(generate_frames(dataset.PixelData, number_of_frames=1))
    return dataset, bytes(frame)


def _save_with_fragments(dataset, fragments: list[bytes]) -> bytes:
    """The data set with its Pixel Data encapsulated as exactly these fragments (after an empty offset table)."""
    from pydicom.encaps import itemize_fragment

    items = [itemize_fragment(b"")]
    items += [itemize_fragment(part + b"\x00" * (len(part) % 2)) for part in fragments]
    dataset.PixelData = b"".join(items)
    dataset["PixelData"].VR = "OB"
    buffer = io.BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def _jpeg_claiming(codestream: bytes, width: int, height: int) -> bytes:
    sof = codestream.index(b"\xff\xc0")  # marker, length (2), precision (1), height (2), width (2)
    return codestream[: sof + 5] + struct.pack(">HH", height, width) + codestream[sof + 9 :]


def _j2k_claiming(codestream: bytes, width: int, height: int) -> bytes:
    siz = codestream.index(b"\xff\x51")  # after SOC: marker, Lsiz, Rsiz, Xsiz, Ysiz, XOsiz, YOsiz
    return codestream[: siz + 6] + struct.pack(">IIII", width, height, 0, 0) + codestream[siz + 22 :]


def dicom_jpeg_split_fragments(width: int, height: int) -> bytes:
    """JPEG Baseline whose first fragment holds only the SOI marker; the frame header (claiming width x height
    against a 128x112 DICOM header) is in the second fragment."""
    dataset, codestream = _small_compressed_film("jpeg-baseline")
    codestream = _jpeg_claiming(codestream, width, height)
    return _save_with_fragments(dataset, [codestream[:2], codestream[2:]])


def dicom_jpeg_after_app_segments(width: int, height: int, padding: int = 128 << 10) -> bytes:
    """JPEG Baseline with `padding` bytes of APP15 segments between SOI and the frame header (which claims
    width x height against a 128x112 DICOM header): a reader of the first 64 KiB never reaches it."""
    dataset, codestream = _small_compressed_film("jpeg-baseline")
    codestream = _jpeg_claiming(codestream, width, height)
    segments, left = [], padding
    while left > 0:
        size = min(left, 65533)
        segments.append(b"\xff\xef" + struct.pack(">H", size + 2) + bytes(size))
        left -= size
    return _save_with_fragments(dataset, [codestream[:2] + b"".join(segments) + codestream[2:]])


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def dicom_jp2_after_big_box(width: int, height: int, padding: int = 6 << 10) -> bytes:
    """JPEG 2000 Lossless as a JP2 file (signature, file type, a `padding`-byte XML box, header, codestream box);
    its SIZ claims width x height against a 128x112 DICOM header, beyond a reader of the first 4 KiB."""
    dataset, codestream = _small_compressed_film("jpeg-2000-lossless")
    codestream = _j2k_claiming(codestream, width, height)
    ihdr = _box(b"ihdr", struct.pack(">IIHBBBB", height, width, 1, 11, 7, 0, 0))
    colour = _box(b"colr", struct.pack(">BBBI", 1, 0, 0, 17))  # enumerated: greyscale
    jp2 = (
        _box(b"jP  ", b"\r\n\x87\n")
        + _box(b"ftyp", b"jp2 " + struct.pack(">I", 0) + b"jp2 ")
        + _box(b"xml ", b"<x>" + b" " * (padding - 7) + b"</x>")
        + _box(b"jp2h", ihdr + colour)
        + _box(b"jp2c", codestream)
    )
    return _save_with_fragments(dataset, [jp2])


def dicom_j2k_split_fragments(width: int, height: int) -> bytes:
    """JPEG 2000 Lossless whose first fragment holds only the SOC marker; SIZ (claiming width x height) follows in
    the second."""
    dataset, codestream = _small_compressed_film("jpeg-2000-lossless")
    codestream = _j2k_claiming(codestream, width, height)
    return _save_with_fragments(dataset, [codestream[:2], codestream[2:]])


COMPRESSED_SIZE_TRICKS = {
    "jpeg-split-fragments": dicom_jpeg_split_fragments,
    "jpeg-after-128KiB-of-APPn": dicom_jpeg_after_app_segments,
    "jp2-after-6KiB-box": dicom_jp2_after_big_box,
    "j2k-split-fragments": dicom_j2k_split_fragments,
}


# --- raster files ---


def progressive_jpeg_scan_bomb(side: int = 1024, scans: int = 10_000, *, width: int | None = None) -> bytes:
    """A progressive JPEG of side (rows) x width (default side) with `scans` empty scans (each a repeated SOS
    header with no data) before EOI: the decoder's cost grows with the number of scans, not the file's size (Pillow
    12.3 spent about 65 us per empty scan of a 1024 x 1024 film here, 2 s for 30,000 scans in a 455 kB file; scans
    that carry data cost a pass over the image each)."""
    import re

    from PIL import Image

    from medgemma_xray.phantoms.films import chest_phantom, quantize

    buffer = io.BytesIO()
    Image.fromarray(quantize(chest_phantom(side, width or side, seed=1), 8)).save(
        buffer, format="JPEG", progressive=True, quality=90
    )
    data = buffer.getvalue()
    last = [found.start() for found in re.finditer(rb"\xff\xda", data)][-1]
    header = data[last : last + 2 + int.from_bytes(data[last + 2 : last + 4], "big")]
    return data[:-2] + header * scans + b"\xff\xd9"


def before_first_scan(jpeg: bytes, padding: bytes) -> bytes:
    """The JPEG with `padding` put just before its first SOS marker: 0xFF fill bytes, or empty COM segments
    (0xFF 0xFE 0x00 0x02), both of which every decoder skips. A scan counter that walks segments with a step budget
    spends it here and sees no scans."""
    first = jpeg.index(b"\xff\xda")
    return jpeg[:first] + padding + jpeg[first:]


def dicom_progressive_jpeg_scan_bomb(scans: int = 10_000) -> bytes:
    """A 128 x 112 DX film whose one frame is a progressive JPEG of `scans` scans, split over two fragments (the
    seam inside the scans): the DICOM wrapper must not hide the scans from the counter."""
    dataset, _ = _small_compressed_film("jpeg-baseline")
    codestream = progressive_jpeg_scan_bomb(128, scans, width=112)
    seam = len(codestream) // 2
    return _save_with_fragments(dataset, [codestream[:seam], codestream[seam:]])


def png_ztxt_bomb(expanded: int = 64 << 20) -> bytes:
    """A valid small PNG carrying a zTXt chunk that inflates to `expanded` bytes of text."""
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize

    png = png_bytes(quantize(chest_phantom(256, 256, seed=1), 8))
    compressor = zlib.compressobj(9)
    text = _deflate_zeros(expanded, compressor) + compressor.flush()
    chunk = _png_chunk(b"zTXt", b"Comment\x00\x00" + text)
    return png[:33] + chunk + png[33:]  # after the signature (8) and IHDR (25)


def phone_mpo(side: int = 256) -> bytes:
    """A two-image MPO (what phones save: the photo, then a second view): the first image is the film."""
    from PIL import Image

    from medgemma_xray.phantoms.films import chest_phantom, quantize

    first = Image.fromarray(quantize(chest_phantom(side, side, seed=1), 8)).convert("RGB")
    buffer = io.BytesIO()
    first.save(buffer, format="MPO", save_all=True, append_images=[first.rotate(90)], quality=95)
    return buffer.getvalue()
