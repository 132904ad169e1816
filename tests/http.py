"""HTTP helpers for the tests of cdcd's metrics endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# (metric sample name, sorted labels) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    """Status and body; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> Samples:
    """Every sample of ``base``/metrics."""
    status, text = get(base + "/metrics")
    assert status == 200
    families = text_string_to_metric_families(text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
