"""train.log lines are ``TIME [LEVEL] message``, flushed per line; setup is idempotent."""

from __future__ import annotations

import logging
import re

from danka.logging import close_run_logger, setup_run_logger
from danka.logging.runlog import LINE_PREFIX


def test_train_log_lines(tmp_path):
    log = setup_run_logger(tmp_path, console=False, timestamps=False)
    try:
        log.info("Using HF Transformers backend for Actor/Critic inference")
        logging.getLogger("danka.checkpoint").warning("child logger %d", 3)
        # flushed per line: readable before close
        lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
        assert lines == [
            "[INFO] Using HF Transformers backend for Actor/Critic inference",
            "[WARNING] child logger 3",
        ]
        assert setup_run_logger(tmp_path, console=False, timestamps=False) is log  # idempotent
        log.info("once")
        text = (tmp_path / "logs" / "train.log").read_text()
        assert text.count("[INFO] once") == 1
    finally:
        close_run_logger()
    assert not [h for h in log.handlers if getattr(h, "_danka_run_handler", False)]


def test_file_lines_start_with_the_time_by_default_console_without(tmp_path, capsys):
    log = setup_run_logger(tmp_path, console=True)
    try:
        log.info("Using HF Transformers backend")
    finally:
        close_run_logger()
    line = (tmp_path / "logs" / "train.log").read_text().strip()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[INFO\] Using HF Transformers backend", line
    )
    assert re.match(LINE_PREFIX + r"\[INFO\] Using HF", line)
    assert re.match(LINE_PREFIX + r"\[INFO\] Using HF", "[INFO] Using HF")  # older files
    # stderr is not a TTY under pytest: plain lines, without the time
    assert "[INFO] Using HF Transformers backend\n" in capsys.readouterr().err


def test_resume_appends_and_switches_dir(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    setup_run_logger(a, console=False, timestamps=False).info("first")
    close_run_logger()
    log = setup_run_logger(a, console=False, timestamps=False)
    log.info("second")
    log = setup_run_logger(
        b, console=False, timestamps=False
    )  # a new output dir replaces the handlers
    log.info("third")
    close_run_logger()
    assert (a / "logs" / "train.log").read_text() == "[INFO] first\n[INFO] second\n"
    assert (b / "logs" / "train.log").read_text() == "[INFO] third\n"
