"""PostgreSQL 18's generated columns: the publication setting (its SQL, refused before 18)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cdcd.config import ConfigError, Publication, load_settings
from cdcd.source.catalog import publication_options, sync_publications, version_refusals


def publication(**fields: Any) -> Publication:
    return Publication.model_validate({"name": "p", "tables": [{"name": "public.t"}], **fields})


# -- the publication setting ------------------------------------------------------------------------------------


def test_the_setting_defaults_to_postgresqls_none_and_takes_only_none_or_stored(tmp_path: Path) -> None:
    assert publication().publish_generated_columns == "none"
    assert publication(publish_generated_columns="stored").publish_generated_columns == "stored"
    path = tmp_path / "cdcd.yaml"
    path.write_text(
        "source: {dsn: 'host=x', publications: [{name: p, all_tables: true, publish_generated_columns: virtual}]}\n"
    )
    with pytest.raises(ConfigError, match=r"source\.publications\.0\.publish_generated_columns"):
        load_settings(path)


@pytest.mark.parametrize(
    ("setting", "version", "options"),
    [
        ("none", 170000, "publish = 'insert, update, delete, truncate', publish_via_partition_root = false"),
        (
            "none",
            180000,
            "publish = 'insert, update, delete, truncate', publish_via_partition_root = false,"
            " publish_generated_columns = 'none'",
        ),
        (
            "stored",
            180001,
            "publish = 'insert, update, delete, truncate', publish_via_partition_root = false,"
            " publish_generated_columns = 'stored'",
        ),
    ],
)
def test_the_publications_options_name_generated_columns_from_18_on(setting: str, version: int, options: str) -> None:
    """On 18 the option is always written, so that a server-side ``stored`` is reset to the config's default."""
    sql = publication_options(publication(publish_generated_columns=setting), version).as_string(None)
    assert sql == options


def test_stored_generated_columns_before_18_are_a_config_error_naming_the_key_and_the_version() -> None:
    stored = publication(publish_generated_columns="stored")
    (refusal,) = version_refusals([publication(name="q"), stored], 170004)
    assert "publication 'p' sets publish_generated_columns: stored" in refusal
    assert "the server is PostgreSQL 17" in refusal
    assert version_refusals([stored], 180000) == []
    assert version_refusals([publication()], 140000) == []
    bare = Publication(name="p", publish_generated_columns="stored")  # read from the server, not made by cdcd
    assert version_refusals([bare], 140000) == []


class NoWrites:
    """A catalog connection to a PostgreSQL 16 server that records every statement."""

    info = SimpleNamespace(server_version=160003)

    def __init__(self) -> None:
        self.statements: list[Any] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        self.statements.append(query)
        raise AssertionError("nothing may be run")


def test_managing_a_publication_the_server_cannot_make_writes_nothing() -> None:
    conn = NoWrites()
    with pytest.raises(ConfigError, match=r"publish_generated_columns: stored, but the server is PostgreSQL 16"):
        sync_publications(conn, [publication(publish_generated_columns="stored")], push_down=False)  # type: ignore[arg-type]
    assert conn.statements == []
