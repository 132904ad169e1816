"""Secrets never reach an output: what masks them, wherever text leaves the process.

``redact`` masks ``password=...`` (libpq conninfo, librdkafka settings), the password of a URL's user info and
every value registered with ``register_secret`` (the source password, SASL and registry passwords, found when
the configuration is loaded). ``RedactingStream`` applies it to everything written to stdout and stderr as
text: ``cdcd check``'s report, log lines, tracebacks, a library's own prints. Data written to the binary
``buffer`` underneath (``cdcd tail``'s JSON lines) is left as it is.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from typing import TextIO

MASK = "***"
# ``password=...`` (libpq, librdkafka) anywhere; ``password: ...`` where the key is a word of its own (``password:``,
# ``sasl.password:``), so that a file name ending in "password" leaves the message after it alone
# ("…/pg.password: No such file or directory")
_PASSWORD = re.compile(
    r"""(password\s*=\s*|(?:^|(?<=[\s,;{(\[]))[\w.-]*password\s*:\s*)"""
    r"""('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s,;&'"]+)""",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)", re.IGNORECASE)
_secrets: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Mask this exact value wherever it appears (values under 4 characters are not worth it: they would mask
    unrelated text, and ``password=`` masking still applies)."""
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def register_url_password(url: str) -> None:
    """Register the password of ``url``'s user info, as written and percent-decoded (a client may show either)."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:  # e.g. a bad port: the raw user info is still masked by redact's URL rule
        return
    if password:
        register_secret(password)
        register_secret(urllib.parse.unquote(password))


def redact(text: str) -> str:
    """``text`` with passwords masked: ``password=...``, URL user info and every registered secret."""
    text = _PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class RedactingStream(io.TextIOBase):
    """A text stream that redacts what is written to it before passing it on to ``inner``."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.inner.encoding

    @property
    def buffer(self) -> io.BufferedIOBase:
        """The binary stream underneath, for data (not redacted)."""
        return self.inner.buffer  # type: ignore[return-value]


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """Within: everything written to ``sys.stdout`` and ``sys.stderr`` as text is redacted."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(saved[0]), RedactingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
