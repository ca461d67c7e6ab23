"""The app log on a disk that fills up: a real tmpfs, filled to the last byte, then freed (serving/log_disk.py)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from benchmarks.soak_faults import fill_disk, free_disk
from medgemma_xray.web.http_server import configure_logging

CLIENT_TEXT = "patient-name-Jane-Roe"
RECORDS = 40


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of its own (mounting needs root, as the soak's log-disk fault does)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "logs"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(folder)], check=False)
    if mounted.returncode != 0:
        pytest.skip("this host does not let root mount a tmpfs")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=False)


@pytest.fixture
def app_logging(small_disk):
    configure_logging(small_disk / "gradio_app.log")
    yield small_disk / "gradio_app.log"
    for handler in logging.getLogger().handlers:
        handler.close()
    logging.basicConfig(force=True, handlers=[logging.NullHandler()])


def test_a_full_log_disk_is_said_once_and_the_lost_records_are_counted_in_the_log(app_logging, capsys):
    log_file = app_logging
    logger = logging.getLogger("medgemma_xray.web.some_page")
    logger.info("before the disk filled")
    fill_disk(log_file.parent)
    for index in range(RECORDS):  # more than the page the log file already has can hold; fewer than the limiter's burst
        logger.warning("refused a question from %s (%d) %s", CLIENT_TEXT, index, "." * 100)  # never on stderr
    said = capsys.readouterr().err  # the process's stderr: the journal under systemd
    assert said.count("cannot write the log file") == 1, said[:2000]
    assert "Logging error" not in said and "Traceback" not in said and CLIENT_TEXT not in said

    free_disk(log_file.parent)
    logger.info("after the disk was freed")
    text = log_file.read_text(errors="replace")
    assert "before the disk filled" in text and "after the disk was freed" in text
    warning = next(line for line in text.splitlines() if "log disk was full" in line)
    lost = int(re.search(r"(\d+) log records lost", warning).group(1))
    assert warning.split(" ")[2] == "WARNING" and "No space left on device" in warning  # a line of its own
    written = sum(1 for line in text.splitlines() if line.endswith("." * 100))  # whole lines; a cut one is lost
    assert lost > 0 and written + lost == RECORDS  # every record is either in the file or counted as lost
    assert text.index("log disk was full") < text.index("after the disk was freed")


def test_under_the_console_capture_the_notice_reaches_the_real_stderr_and_nothing_is_miscounted(app_logging, capfd):
    """Under start_gradio.sh and systemd, sys.stderr is serving.console_log's stream, which logs what is written to
    it: the handler's notice must go to the real stderr (the journal), not back into the failing handler as new
    records (which it then counted as lost, about fifty deep)."""
    from medgemma_xray.serving.console_log import capture_console

    log_file = app_logging
    logger = logging.getLogger("medgemma_xray.web.some_page")
    saved = sys.stdout, sys.stderr
    capture_console()
    try:
        logger.info("before the disk filled")
        fill_disk(log_file.parent)
        for index in range(RECORDS):
            logger.warning("refused a question from %s (%d) %s", CLIENT_TEXT, index, "." * 100)
        free_disk(log_file.parent)
        logger.info("after the disk was freed")
    finally:
        sys.stdout, sys.stderr = saved
        logging.captureWarnings(False)
    said = capfd.readouterr().err
    assert said.count("cannot write the log file") == 1, said[:2000]
    text = log_file.read_text(errors="replace")
    warning = next(line for line in text.splitlines() if "log disk was full" in line)
    lost = int(re.search(r"(\d+) log records lost", warning).group(1))
    written = sum(1 for line in text.splitlines() if line.endswith("." * 100))
    assert written + lost == RECORDS, (written, lost)  # no record that was never logged is counted
    assert "a library printed" not in text
