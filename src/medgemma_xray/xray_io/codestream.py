"""What a compressed image declares about itself, read from its markers without decoding it.

Decoders size their output from the codestream, not from the DICOM header or a file's first bytes, so the size
must be found wherever the codestream puts it: JPEG frame headers after any number of APPn/COM segments (skipped by
their lengths), JPEG 2000's SIZ after any JP2 boxes (walked by their lengths), and in DICOM after the codestream is
split over fragments (PS3.5 A.4), read across fragment boundaries without joining them. A progressive JPEG's scans
are counted over the whole codestream, fragments included (each scan that carries data costs the decoder a pass
over the whole image). Nothing here decodes pixels.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

# Frame headers: SOF0-3, 5-7, 9-11, 13-15 (not DHT C4, JPG C8, DAC CC), DHP (hierarchical), SOF55 (JPEG-LS).
FRAME_MARKERS = frozenset([*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), *range(0xCD, 0xD0), 0xDE, 0xF7])
STANDALONE_MARKERS = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0-7: no length
SOS, EOI = 0xDA, 0xD9
MAX_SEGMENTS = 20_000  # marker segments walked before giving up: real files have tens
MAX_BOXES = 1_000  # JP2 boxes walked before the codestream box: real files have a handful
MAX_FRAGMENTS = 1 << 20
ITEM, SEQUENCE_DELIMITER = b"\xfe\xff\x00\xe0", b"\xfe\xff\xdd\xe0"  # (FFFE,E000), (FFFE,E0DD), little endian
_COUNT_CHUNK = 1 << 20  # count_jpeg_scans reads this much at a time


@dataclass(frozen=True)
class DeclaredImage:
    width: int
    height: int
    components: int


# What the readers accept: anything memoryview() takes that the decoders hand us.
ByteSource = bytes | bytearray | memoryview


class Bytes:
    """Random access to one byte string (the plain case of Fragments)."""

    def __init__(self, data: ByteSource) -> None:
        self._view = memoryview(data)

    def __len__(self) -> int:
        return len(self._view)

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self._view[offset : offset + size])


class Fragments:
    """The fragments of one encapsulated frame, read as one byte string without copying them together."""

    def __init__(self, buffer: ByteSource, spans: list[tuple[int, int]]) -> None:
        self._view = memoryview(buffer)
        self._spans = spans  # (start in buffer, length), in order
        self._starts: list[int] = []
        total = 0
        for _, length in spans:
            self._starts.append(total)
            total += length
        self._length = total

    @classmethod
    def of_pixel_data(cls, pixel_data: ByteSource) -> Fragments | None:
        """The fragments after the Basic Offset Table of encapsulated Pixel Data (PS3.5 A.4: items up to the
        sequence delimiter, or the end); None if it is not encapsulated so (the decoder then reports the damage)."""
        view = memoryview(pixel_data)
        if len(view) < 8 or view[0:4] != ITEM:
            return None
        position = 8 + int.from_bytes(view[4:8], "little")  # past the offset table
        spans: list[tuple[int, int]] = []
        while position + 8 <= len(view) and len(spans) < MAX_FRAGMENTS:
            tag = view[position : position + 4]
            if tag == SEQUENCE_DELIMITER:
                break
            if tag != ITEM:
                return None
            length = int.from_bytes(view[position + 4 : position + 8], "little")
            start = position + 8
            spans.append((start, min(length, len(view) - start)))
            position = start + length
        return cls(pixel_data, spans) if spans else None

    def __len__(self) -> int:
        return self._length

    def read(self, offset: int, size: int) -> bytes:
        out = bytearray()
        index = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while len(out) < size and index < len(self._spans):
            start, length = self._spans[index]
            begin = max(0, offset + len(out) - self._starts[index])
            if begin < length:
                out += self._view[start + begin : start + min(length, begin + size - len(out))]
            index += 1
        return bytes(out)


# A codestream to read from: one byte string, or the fragments of an encapsulated frame.
Stream = Bytes | Fragments


def declared_image(stream: Stream) -> DeclaredImage | None:
    """The size a JPEG, JPEG-LS or JPEG 2000 codestream (raw or in a JP2 file) declares; None if none is found."""
    head = stream.read(0, 12)
    if head[:2] == b"\xff\xd8":
        return _jpeg_frame(stream)
    if head[:4] == b"\xff\x4f\xff\x51":
        return _j2k_size(stream, 0)
    if head[4:8] == b"jP  ":
        return _jp2_size(stream)
    return None


def _jpeg_frame(stream: Stream) -> DeclaredImage | None:
    position = 2
    for _ in range(MAX_SEGMENTS):
        marker = stream.read(position, 4)
        if len(marker) < 2 or marker[0] != 0xFF:
            return None
        kind = marker[1]
        if kind == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if kind in STANDALONE_MARKERS:
            position += 2
            continue
        if kind in (SOS, EOI) or len(marker) < 4:  # a scan or the end before any frame header
            return None
        length = int.from_bytes(marker[2:4], "big")
        if length < 2:
            return None
        if kind in FRAME_MARKERS:
            frame = stream.read(position + 4, 6)  # precision, height, width, components
            if len(frame) < 6:
                return None
            height, width = int.from_bytes(frame[1:3], "big"), int.from_bytes(frame[3:5], "big")
            return DeclaredImage(width, height, frame[5])
        position += 2 + length
    return None


def _j2k_size(stream: Stream, start: int) -> DeclaredImage | None:
    siz = stream.read(start, 42)  # SOC, SIZ marker, Lsiz, Rsiz, Xsiz, Ysiz, XOsiz, YOsiz, 4 tile fields, Csiz
    if len(siz) < 42 or siz[:4] != b"\xff\x4f\xff\x51":
        return None
    x, y, x0, y0 = (int.from_bytes(siz[at : at + 4], "big") for at in (8, 12, 16, 20))
    if x <= x0 or y <= y0:
        return DeclaredImage(0, 0, 0)
    return DeclaredImage(x - x0, y - y0, int.from_bytes(siz[40:42], "big"))


def _jp2_size(stream: Stream) -> DeclaredImage | None:
    """Walk the JP2 file's top-level boxes (ISO 15444-1 I.4) by their lengths to the contiguous codestream box."""
    position, total = 0, len(stream)
    for _ in range(MAX_BOXES):
        header = stream.read(position, 16)
        if len(header) < 8:
            return None
        length, kind = int.from_bytes(header[:4], "big"), header[4:8]
        content = position + 8
        if length == 1:  # the length follows as 64 bits
            if len(header) < 16:
                return None
            length, content = int.from_bytes(header[8:16], "big"), position + 16
        elif length == 0:  # the box runs to the end
            length = total - position
        if kind == b"jp2c":
            return _j2k_size(stream, content)
        if length < content - position:
            return None
        position += length
    return None


def count_jpeg_scans(stream: Stream) -> int:
    """An upper bound on the scans (SOS markers) a JPEG decoder can read from this codestream: every 0xFF 0xDA
    pair in it, across fragment boundaries, with no early return.

    A decoder finds a marker as 0xFF, any number of 0xFF fill bytes, then the marker's code, and resynchronises
    past damaged bytes to the next 0xFF, so every scan it reads stands on these two bytes. Entropy-coded data
    never holds them (a 0xFF there is followed by a stuffed 0x00 or an RST), so only segment payloads (an EXIF
    thumbnail's own scans, by chance an ICC profile) add to the count. A walk of the segments by their lengths
    stops at fill bytes, COM segments or a damaged byte, and a stop read as "no scans" lets a bomb through; this
    count has nothing to stop at. Baseline JPEGs have one scan per component layout; progressive encoders write
    about ten."""
    scans = 0
    for offset in range(0, len(stream), _COUNT_CHUNK):  # chunks overlap by one byte: a pair on a seam counts once
        scans += stream.read(offset, _COUNT_CHUNK + 1).count(b"\xff\xda")
    return scans
