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
    from phantoms.films import chest_phantom, dicom_bytes, quantize

    data = bytearray(dicom_bytes(quantize(chest_phantom(128, 112), 8), bits_stored=8, transfer_syntax="jpeg-baseline"))
    sof = data.index(b"\xff\xc0")  # marker, length (2), precision (1), height (2), width (2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)
