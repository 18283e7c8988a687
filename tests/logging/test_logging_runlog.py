"""train.log lines are ``[LEVEL] message``, flushed per line; setup is idempotent."""

from __future__ import annotations

import logging
import re

from danka.logging import close_run_logger, setup_run_logger


def test_train_log_lines(tmp_path):
    log = setup_run_logger(tmp_path, console=False)
    try:
        log.info("Using HF Transformers backend for Actor/Critic inference")
        logging.getLogger("danka.checkpoint").warning("child logger %d", 3)
        # flushed per line: readable before close
        lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
        assert lines == [
            "[INFO] Using HF Transformers backend for Actor/Critic inference",
            "[WARNING] child logger 3",
        ]
        assert setup_run_logger(tmp_path, console=False) is log  # idempotent
        log.info("once")
        text = (tmp_path / "logs" / "train.log").read_text()
        assert text.count("[INFO] once") == 1
    finally:
        close_run_logger()
    assert not [h for h in log.handlers if getattr(h, "_danka_run_handler", False)]


def test_timestamps_after_level_and_console(tmp_path, capsys):
    log = setup_run_logger(tmp_path, console=True, timestamps=True)
    try:
        log.info("hello")
    finally:
        close_run_logger()
    line = (tmp_path / "logs" / "train.log").read_text().strip()
    assert re.fullmatch(r"\[INFO\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d hello", line)
    assert "[INFO] hello" in capsys.readouterr().err  # stderr is not a TTY under pytest


def test_resume_appends_and_switches_dir(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    setup_run_logger(a, console=False).info("first")
    close_run_logger()
    log = setup_run_logger(a, console=False)
    log.info("second")
    log = setup_run_logger(b, console=False)  # a new output dir replaces the handlers
    log.info("third")
    close_run_logger()
    assert (a / "logs" / "train.log").read_text() == "[INFO] first\n[INFO] second\n"
    assert (b / "logs" / "train.log").read_text() == "[INFO] third\n"
