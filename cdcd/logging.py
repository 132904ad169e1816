"""structlog setup: readable console lines in a terminal, JSON lines otherwise (systemd, Kubernetes).

Every field of every line passes through :func:`cdcd.secrets.redact` before it is rendered (JSON escaping
would otherwise hide a secret from the redacting stream the line is written to), whatever logged it: an error
message quoting a connection string, a library's log line, a traceback.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog

from cdcd.secrets import redact

if TYPE_CHECKING:
    from cdcd.config import LogSettings


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v) for v in value]
    if isinstance(value, BaseException):
        return redact(str(value))
    return value


def redact_processor(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: every string value (the event, fields, a formatted exception) redacted."""
    for key, value in event_dict.items():
        event_dict[key] = _redact_value(value)
    return event_dict


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


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
            redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, settings.level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    sys.excepthook = _excepthook  # an unexpected crash's traceback is redacted too


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
