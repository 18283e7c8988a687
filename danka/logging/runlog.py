"""The run's text log: ``OUTPUT/logs/train.log`` plus the console.

Every line of the file reads ``2025-01-01 12:00:00 [LEVEL] message`` (local time; the
console shows ``[LEVEL] message``), so ``grep "\\[INFO\\] Using HF"`` and ``grep reward:``
work on the file and each line says when it happened. :data:`LINE_PREFIX` matches the
start of a line with or without the time (files of older runs have none). The file
handler flushes after every record (``logging.StreamHandler.emit`` does), so a killed run
keeps every line it logged.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOGGER_NAME = "danka"
LOG_FORMAT = "[%(levelname)s] %(message)s"
LOG_FORMAT_TIME = "%(asctime)s [%(levelname)s] %(message)s"
# the start of a train.log line up to the level: ``re.match(LINE_PREFIX + r"\[INFO\] ", line)``
LINE_PREFIX = r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d )?"
_MARK = "_danka_run_handler"  # attribute set on the handlers this module owns


def _own_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if getattr(h, _MARK, False)]


def file_only(record: logging.LogRecord) -> bool:
    """False for a record logged with ``extra={"console": False}``: train.log keeps it, the
    console does not (a step line the progress line already shows)."""
    return getattr(record, "console", True)


def _console_handler() -> logging.Handler:
    """Rich on an interactive terminal, plain ``[INFO] msg`` lines on stderr otherwise;
    records logged with ``extra={"console": False}`` stay in the file."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(
            console=Console(stderr=True), show_path=False, markup=False, show_time=False
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(file_only)
    return handler


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (it may have been
    replaced since the logger was set up, e.g. by a test harness or a notebook)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; always follow sys.stderr
        pass


def setup_run_logger(
    output_dir: Path,
    *,
    console: bool = True,
    timestamps: bool = True,
    level: int = logging.INFO,
) -> logging.Logger:
    """The ``danka`` logger, writing ``output_dir/logs/train.log`` (appended, so a resumed
    run continues the same file; each line with its time unless ``timestamps=False``) and,
    if ``console``, stderr.

    Idempotent: a second call with the same arguments returns the logger unchanged; with a
    different ``output_dir`` the old handlers are closed and replaced. Child loggers
    (``danka.checkpoint``, ``danka.trainer``...) write through it.
    """
    logger = logging.getLogger(LOGGER_NAME)
    log_path = (Path(output_dir) / "logs" / "train.log").resolve()
    key = (str(log_path), console, timestamps)
    if getattr(logger, "_danka_run_key", None) == key and _own_handlers(logger):
        logger.setLevel(level)
        return logger
    close_run_logger(logger)

    log_path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_path, mode="a", encoding="utf-8")
    file_handler.setFormatter(
        logging.Formatter(LOG_FORMAT_TIME if timestamps else LOG_FORMAT, "%Y-%m-%d %H:%M:%S")
    )
    handlers: list[logging.Handler] = [file_handler]
    if console:
        handlers.append(_console_handler())
    for handler in handlers:
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # why: a root handler set by a library would print lines twice
    logger._danka_run_key = key  # type: ignore[attr-defined]
    return logger


def run_logger_open() -> bool:
    """Whether :func:`setup_run_logger` handlers are attached (a caller that opens the
    logger closes it; one that finds it open leaves it to its opener)."""
    return bool(_own_handlers(logging.getLogger(LOGGER_NAME)))


def close_run_logger(logger: logging.Logger | None = None) -> None:
    """Flush, close and remove the handlers :func:`setup_run_logger` added."""
    logger = logger or logging.getLogger(LOGGER_NAME)
    for handler in _own_handlers(logger):
        logger.removeHandler(handler)
        try:
            handler.flush()
        finally:
            handler.close()
    logger.propagate = True
    if hasattr(logger, "_danka_run_key"):
        del logger._danka_run_key  # type: ignore[attr-defined]
