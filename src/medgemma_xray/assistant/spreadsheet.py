"""Text cells that a spreadsheet shows as text: CSV formula injection neutralised as OWASP advises.

Excel, LibreOffice and Google Sheets run a cell that starts with =, +, - or @ as a formula (and a tab or carriage
return before one is skipped), so a student's note `=HYPERLINK("http://...")` becomes a live link in the teacher's
spreadsheet. Such a cell gets a leading apostrophe, which every spreadsheet shows as text and hides. Full-width forms
of the four characters count too (some spreadsheets fold them). Lone surrogates (which no UTF-8 file can hold) become
U+FFFD, so writing the file never fails on a typed field.
"""

from __future__ import annotations

import re

FORMULA_STARTS = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, only a lone one: json.loads joins pairs


def text_cell(value: str) -> str:
    """The cell's text, shown as text by a spreadsheet, and encodable as UTF-8."""
    value = valid_text(value)
    return "'" + value if value[:1] in FORMULA_STARTS else value


def valid_text(value: str) -> str:
    """value with lone surrogates (from a JSON "\\ud800" escape) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", value)


def row_cells(row: dict) -> dict:
    """A CSV row with every text cell made safe; numbers and empty cells unchanged."""
    return {key: text_cell(value) if isinstance(value, str) else value for key, value in row.items()}
