"""The structured report: a tolerant parser of the model's text into the fixed schema, with confidence per field.

The parser never raises on any string and never loses text: it keeps the raw answer, fills each schema field it
can find, and lists the ones it could not. It accepts what models write instead of the trained format: Markdown
bold and headings, bullets and numbering, any case, a dash or nothing instead of the colon, a qualifier before the
colon ("Bones and soft tissues:"), fields in any order, several fields on one line, and a field written twice (the
parts are joined). Text outside every field is kept in `unparsed`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from medgemma_xray.assistant.confidence import Confidence, answer_confidence, span_confidence
from medgemma_xray.assistant.report_schema import REPORT_FIELDS, REPORT_PROMPT
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

REPORT_MAX_NEW_TOKENS = 300

# Other names models give the schema's fields; the schema's own label comes first. Longest match wins.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "view": ("view", "view position", "projection"),
    "technique": ("technique", "technique and quality", "technique/quality", "image quality", "quality"),
    "lungs": ("lungs", "lung", "lung fields", "lung parenchyma", "parenchyma"),
    "pleura": ("pleura", "pleural space", "pleural spaces", "pleural"),
    "heart_mediastinum": (
        "heart and mediastinum",
        "heart & mediastinum",
        "heart/mediastinum",
        "heart, mediastinum",
        "cardiomediastinal silhouette",
        "cardiomediastinal",
        "cardiac silhouette",
        "mediastinum",
        "heart",
    ),
    "bones": ("bones", "bone", "bony structures", "osseous structures", "skeleton"),
    "lines_devices": (
        "lines and devices",
        "lines, tubes and devices",
        "lines, tubes, and devices",
        "lines/tubes/devices",
        "tubes and lines",
        "lines and tubes",
        "support devices",
        "devices",
        "lines",
    ),
    "impression": ("impression", "conclusion", "summary"),
}
assert set(FIELD_ALIASES) == {f.key for f in REPORT_FIELDS}, "every schema field needs its aliases"

_LABELS = sorted(
    ((alias, key) for key, aliases in FIELD_ALIASES.items() for alias in aliases), key=lambda item: -len(item[0])
)
_LABEL_KEY = {alias: key for alias, key in _LABELS}
_LABEL_PATTERN = "|".join(re.escape(alias).replace(r"\ ", r"\s+") for alias, _ in _LABELS)
_DECORATION = r"(?:\*\*|__|\*|_)?"
# A field at the start of a line: optional heading/bullet/number and emphasis, the label, an optional short
# qualifier before a colon, emphasis, then a colon or dash, or nothing (heading style or a missing colon).
_LINE_HEADER = re.compile(
    rf"^[ \t]*(?:#{{1,6}}[ \t]*|[-*+•][ \t]+|\d{{1,2}}[.)][ \t]+)?{_DECORATION}[ \t]*"
    rf"(?P<label>{_LABEL_PATTERN})(?![^\W_])"
    rf"(?P<qualifier>(?:[ \t]+[\w&/()'-]+){{1,4}}?(?=[ \t]*{_DECORATION}[ \t]*:))?"
    rf"[ \t]*{_DECORATION}[ \t]*(?P<sep>:|-(?=\s)|–|—)?[ \t]*{_DECORATION}[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
# A field inside a line ("View: PA. Lungs: clear."): only after a sentence or list break, and only with a colon.
_INLINE_HEADER = re.compile(
    rf"(?<=[.;,|!?])[ \t]+{_DECORATION}(?P<label>{_LABEL_PATTERN}){_DECORATION}[ \t]*:[ \t]*{_DECORATION}[ \t]*",
    re.IGNORECASE,
)
_EDGE_JUNK = " \t\r\n*_:#|-–—"
_TAIL_JUNK = _EDGE_JUNK + ",;"  # the break before an inline field ("good, lungs: clear") is not part of the value


@dataclass(frozen=True)
class StructuredReport:
    """A report in the fixed schema. fields has every schema key in schema order; '' where nothing was found.

    spans: for each filled field, the character ranges of raw_text its text came from (two or more when the model
    wrote the field twice). confidence: per filled field whose tokens could be matched to raw_text; overall: the
    whole answer's confidence (None without tokens).
    """

    fields: dict[str, str]
    raw_text: str
    unfilled: tuple[str, ...]
    unparsed: str = ""
    spans: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    confidence: dict[str, Confidence] = field(default_factory=dict)
    overall: Confidence | None = None

    @property
    def filled(self) -> tuple[str, ...]:
        return tuple(key for key, text in self.fields.items() if text)

    def to_dict(self) -> dict:
        return {
            "fields": dict(self.fields),
            "unfilled": list(self.unfilled),
            "unparsed": self.unparsed,
            "confidence": {key: value.to_dict() for key, value in self.confidence.items()},
            "overall_confidence": self.overall.to_dict() if self.overall else None,
            "raw_text": self.raw_text,
        }


def report_request(image, max_new_tokens: int = REPORT_MAX_NEW_TOKENS) -> GenerationRequest:
    """The one request that asks for a structured report on a film (the UI and batch both use it)."""
    return GenerationRequest(image=image, turns=(ChatTurn("user", REPORT_PROMPT),), max_new_tokens=max_new_tokens)


def _header_kind(text: str, match: re.Match, inline: bool) -> str | None:
    """The kind of header a match is: "same_line" (a separator, or an emphasised label: the value follows on its
    line), "heading" (an emphasised label or heading alone on its line: the value is below), "bare" (an undecorated
    label, a space, then words: a missing colon), or None (not a header: a label glued to punctuation, or an
    undecorated word alone on a line, which is more likely text than a heading)."""
    if inline or match.group("sep"):
        return "same_line"
    header = match.group(0)
    rest = text[match.end() : _line_end(text, match.end())].strip(_EDGE_JUNK)
    before_label = header[: match.start("label") - match.start()]
    decorated = any(mark in before_label for mark in "#*_") or header.rstrip(" \t").endswith(("*", "_"))
    if decorated:
        return "same_line" if rest else "heading"
    if rest and match.group(0).endswith((" ", "\t")):
        return "bare"
    return None


def _headers(text: str) -> list[tuple[int, int, str]]:
    """(header start, value start, field key) for every field header found, in text order, never overlapping.

    A bare header ("Lungs clear") counts only where fields are written one per line; under a heading ("## Impression"
    then its text) a line that starts with a label word is the heading's text, not a new field."""
    found = []
    for pattern in (_LINE_HEADER, _INLINE_HEADER):
        for match in pattern.finditer(text):
            key = _LABEL_KEY.get(" ".join(match.group("label").lower().split()))
            kind = _header_kind(text, match, inline=pattern is _INLINE_HEADER) if key else None
            if key is not None and kind is not None:  # (kind is None wherever key is)
                found.append((match.start(), match.end(), key, kind))
    found.sort()
    kept: list[tuple[int, int, str]] = []
    previous_kind = None
    for start, value_start, key, kind in found:
        if kept and start < kept[-1][1]:
            continue  # inside the previous header (an inline match of the same label)
        if kind == "bare" and previous_kind == "heading":
            continue
        kept.append((start, value_start, key))
        previous_kind = kind
    return kept


def _line_end(text: str, position: int) -> int:
    end = text.find("\n", position)
    return len(text) if end < 0 else end


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start] in _EDGE_JUNK:
        start += 1
    while end > start and text[end - 1] in _TAIL_JUNK:
        end -= 1
    return start, end


def parse_report(text: str, stats=None) -> StructuredReport:
    """Parse the model's answer. stats (a GenerationStats, or anything with token_ids, token_logprobs and
    token_texts) adds confidence per field where its token texts line up with `text`. Never raises on any str."""
    text = "" if text is None else text if isinstance(text, str) else str(text)
    headers = _headers(text)
    spans: dict[str, list[tuple[int, int]]] = {}
    for index, (_, value_start, key) in enumerate(headers):
        value_end = headers[index + 1][0] if index + 1 < len(headers) else len(text)
        start, end = _trimmed(text, value_start, value_end)
        if start < end:
            spans.setdefault(key, []).append((start, end))
    fields = {f.key: "\n".join(text[s:e] for s, e in spans.get(f.key, ())) for f in REPORT_FIELDS}
    first_header = headers[0][0] if headers else len(text)
    unparsed = text[:first_header].strip()
    report = StructuredReport(
        fields=fields,
        raw_text=text,
        unfilled=tuple(key for key, value in fields.items() if not value),
        unparsed=unparsed,
        spans={key: tuple(ranges) for key, ranges in spans.items()},
    )
    return _with_confidence(report, stats) if stats is not None else report


def _with_confidence(report: StructuredReport, stats) -> StructuredReport:
    ids: Sequence[int] = list(getattr(stats, "token_ids", ()) or ())
    logprobs: Sequence[float] = list(getattr(stats, "token_logprobs", ()) or ())
    texts: Sequence[str] = list(getattr(stats, "token_texts", ()) or ())
    if not ids or not len(ids) == len(logprobs) == len(texts):
        return report
    overall = answer_confidence(ids, logprobs, texts)
    offset = _offset_in_tokens(report.raw_text, "".join(texts))
    per_field: dict[str, Confidence] = {}
    if offset is not None:
        for key, ranges in report.spans.items():
            shifted = [(start + offset, end + offset) for start, end in ranges]
            value = span_confidence(ids, logprobs, texts, shifted)
            if value is not None:
                per_field[key] = value
    return StructuredReport(
        fields=report.fields,
        raw_text=report.raw_text,
        unfilled=report.unfilled,
        unparsed=report.unparsed,
        spans=report.spans,
        confidence=per_field,
        overall=overall,
    )


def _offset_in_tokens(text: str, generated: str) -> int | None:
    """Where text starts in the tokens' concatenated text, or None if it is not theirs. The answer is the tokens'
    texts plus at most a tail the decoder flushed at the end (an incomplete character), or a slice of them."""
    if text.startswith(generated):
        return 0
    offset = generated.find(text) if text else -1
    return offset if offset >= 0 else None
