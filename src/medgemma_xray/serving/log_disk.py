"""The app log's file handler, for a log disk that fills up.

The standard library's handler meets a write error (ENOSPC, EDQUOT, EIO) by printing "--- Logging error ---", a
traceback, and the record's message and arguments to stderr, once per record: under systemd that is the journal,
so a full LOG_DIR turns every log line into twenty lines of traceback there, with whatever a client sent in the
arguments; and once the disk has room again the app log shows a gap with no word of why. This handler instead
says once on stderr that records are being dropped, counts them, and, as soon as a write succeeds again, writes a
warning with the count and the time span into the log itself, before the record that succeeded. The server keeps
answering throughout: logging never raises into a request.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import sys
import time

LOST_MESSAGE = "log disk was full or failing: %d log records lost between %s and %s (last error: %s)"


class LogDiskHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler that survives a full or failing disk and reports what it lost."""

    def __init__(self, filename, *args, stderr=None, **kwargs) -> None:
        super().__init__(filename, *args, **kwargs)
        self._stderr = stderr  # None: sys.stderr at the time (it may be replaced after start-up)
        self.lost = 0
        self._lost_from = 0.0
        self._last_error = ""
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.lost:
            self._failed = False
            self._end_cut_line()
            super().emit(self._lost_record(record))
            if self._failed:  # still cannot write: this record is lost as well
                self.lost += 1
                return
            self.lost = 0
        self._failed = False
        super().emit(record)
        if self._failed:
            self.lost += 1

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return super().handleError(record)
        self._failed = True
        self._last_error = error.strerror or type(error).__name__
        # Buffered bytes of the failed write would be retried with the next record, so the file is closed (what
        # is in its buffer is lost with the record) and opened afresh by the next emit.
        with contextlib.suppress(OSError, ValueError):
            if self.stream is not None:
                self.stream.close()
        self.stream = None
        if not self.lost:
            self._lost_from = time.time()
            self._say(
                f"WARNING: cannot write the log file {self.baseFilename} ({self._last_error}); log records are "
                "dropped and counted until it can be written again, then the count is logged there\n"
            )

    def _end_cut_line(self) -> None:
        """The write that failed may have left half a line: end it, so the warning starts a line of its own."""
        with contextlib.suppress(OSError), open(self.baseFilename, "rb+") as log:
            if log.seek(0, 2) and (log.seek(-1, 2), log.read(1))[1] != b"\n":
                log.write(b"\n")

    def _lost_record(self, cause: logging.LogRecord) -> logging.LogRecord:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._lost_from))
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        return logging.LogRecord(
            __name__, logging.WARNING, __file__, 0, LOST_MESSAGE, (self.lost, start, end, self._last_error), None
        )

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            from medgemma_xray.serving.console_log import operator_stderr

            stream = self._stderr or operator_stderr()  # never the captured console: it would log it back into here
            stream.write(line)
            stream.flush()
