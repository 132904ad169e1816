"""Ask a running daemon for its /status document (`cdcd status`); the rendering is in ``cdcd.status``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from cdcd.secrets import redact


class StatusUnavailable(RuntimeError):
    """The daemon did not answer, or not with a status document."""


def fetch_status(url: str, timeout: float) -> dict[str, Any]:
    """GET ``url``/status; raises StatusUnavailable with the (redacted) address and the reason."""
    base = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
    shown = redact(base)
    try:
        with urllib.request.urlopen(base + "/status", timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise StatusUnavailable(f"{shown}/status answered HTTP {exc.code}: is it a cdcd daemon?") from None
    except urllib.error.URLError as exc:
        raise StatusUnavailable(f"no answer from {shown}: {exc.reason}; is `cdcd run` serving metrics there?") from None
    except (TimeoutError, OSError) as exc:
        raise StatusUnavailable(f"no answer from {shown} within {timeout:g} s: {exc}") from None
    except ValueError as exc:
        raise StatusUnavailable(f"cannot ask {shown}: {exc}") from None
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        raise StatusUnavailable(f"{shown}/status did not answer with a status document")
    return status
