"""structlog setup: readable console lines in a terminal, JSON lines otherwise (systemd, Kubernetes)."""

from __future__ import annotations

import logging
import sys
import time

import structlog

from cdcd.config import LogSettings


def configure(settings: LogSettings) -> None:
    json_output = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, settings.level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class _Bridge(logging.Handler):
    """Forwards a library's stdlib log records to structlog, each distinct message at most once per window:
    librdkafka repeats a connection failure many times a second while a broker is down."""

    def __init__(self, name: str, window_s: float) -> None:
        super().__init__()
        self.log = structlog.get_logger(name)
        self.window_s = window_s
        self._last: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        now = time.monotonic()
        if now - self._last.get(message, -self.window_s) < self.window_s:
            return
        if len(self._last) > 1000:
            self._last.clear()
        self._last[message] = now
        self.log.log(record.levelno, message)


def library_logger(name: str, window_s: float = 30.0) -> logging.Logger:
    """A stdlib logger for a library (e.g. librdkafka via confluent-kafka's ``logger`` setting) that ends in
    structlog with repeats suppressed."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        logger.addHandler(_Bridge(name, window_s))
        logger.propagate = False
        logger.setLevel(logging.INFO)
    return logger
