"""The server's stdout and stderr, once logging is set up: into the rotating, rate-limited log, without their text.

Libraries print to the console rather than log: Gradio prints a whole traceback for every input its preprocessing
refuses, and its message quotes the client's value (about 2.5 KB a request, 200 characters of them the client's,
at 20 requests/s: 180 MB an hour in a file nobody rotates). The server's own records already go to the log file
through the repeat limiter; what a library prints is replaced by one fixed line per traceback (naming only the
exception's class) or per other line (its length), which the same limiter bounds. Python's warnings go through
logging too (logging.captureWarnings). What bypasses Python (a crash of native code) still reaches the real
console, which start_gradio.sh rotates at each start.
"""

from __future__ import annotations

import io
import logging
import re

EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")

logger = logging.getLogger("console")


class ConsoleToLog(io.TextIOBase):
    """A text stream for sys.stdout / sys.stderr. Whole lines are read; a traceback (from "Traceback (most recent
    call last):" to its exception line) becomes one record, any other line one record without its text."""

    into_logging = True  # a log handler that reports its own failure on stderr must not write here

    def __init__(self, stream_name: str) -> None:
        super().__init__()
        self.stream_name = stream_name
        self._pending = ""
        self._in_traceback = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._line(line)
        if len(self._pending) > 1 << 16:  # a line without end: judge what came so far
            self._line(self._pending)
            self._pending = ""
        return len(text)

    def flush(self) -> None:
        pass

    def _line(self, line: str) -> None:
        if line.startswith("Traceback (most recent call last):"):
            self._in_traceback = True
            return
        if self._in_traceback:
            if not line or line.startswith((" ", "\t")):
                return  # a frame or its source line
            self._in_traceback = False
            match = EXCEPTION_LINE.match(line)
            logger.warning(
                "a library printed a traceback on %s ending in %s; its text is withheld (it may quote a client's input)",
                self.stream_name,
                match.group(1) if match else "an exception",
            )
            return
        if line.strip():
            logger.warning(
                "a library printed a line of %d characters on %s; its text is withheld (it may quote a client's input)",
                len(line),
                self.stream_name,
            )


def capture_console() -> None:
    """Route Python's stdout, stderr and warnings into logging. Call once the log handlers are in place (they
    keep the real streams they were given)."""
    import sys

    logging.captureWarnings(True)
    sys.stdout = ConsoleToLog("stdout")
    sys.stderr = ConsoleToLog("stderr")


def operator_stderr():
    """Where the server's own words for the operator go (a start that cannot listen): the real stderr, which is
    the journal under systemd and the terminal under --foreground, even while the console is captured."""
    import sys

    stream = sys.stderr
    return sys.__stderr__ if getattr(stream, "into_logging", False) else stream
