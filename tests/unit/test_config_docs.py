"""docs/configuration.md is generated from the settings model (python -m cdcd.docs): it must match."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from cdcd import docs
from cdcd.config import Settings


def test_committed_configuration_reference_is_up_to_date() -> None:
    assert docs.DEFAULT_PATH.read_text() == docs.render(), "docs/configuration.md is stale: run python -m cdcd.docs"


def _fields(model: type[BaseModel], prefix: str) -> list[tuple[str, str | None]]:
    found = []
    for name, field in model.model_fields.items():
        found.append((prefix + name, field.description))
        for sub in docs._models(field.annotation):
            found += _fields(sub, f"{prefix}{name}.")
    return found


def test_every_key_is_documented_with_a_description() -> None:
    text = docs.render()
    missing = [key for key, description in _fields(Settings, "") if "." in key and not description]
    assert not missing, f"settings without a description: {missing}"
    for section in Settings.model_fields:
        assert f"## `{section}`" in text
    assert "`CDCD_SOURCE__RECONNECT__MAX_ATTEMPTS`" in text
    assert "`CDCD_SOURCE__PASSWORD_FILE`" in text


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    assert docs.main(["--check", str(stale)]) == 1
    assert docs.main([str(stale)]) == 0
    assert docs.main(["--check", str(stale)]) == 0
