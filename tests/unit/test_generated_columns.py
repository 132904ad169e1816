"""PostgreSQL 18's generated columns: the publication setting (its SQL, refused before 18), the columns a snapshot
reads (what pgoutput sends: a stored generated column only where the publication publishes it, a virtual one
never), and the schemas' mark on a stored generated column. The server's side is tests/integration's
test_generated_columns."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest

from cdcd.avro import EnvelopeEncoder, SourceInfo, build_schemas
from cdcd.columns import ColumnRuleError, TableColumns
from cdcd.config import ConfigError, Publication, load_settings
from cdcd.filters.checks import ColumnInfo, TableInfo
from cdcd.pgoutput.decoder import Decoder
from cdcd.pgoutput.messages import Column, Relation, TableFacts
from cdcd.rowstage import STAGE
from cdcd.snapshot import reader as reader_module
from cdcd.source.catalog import publication_options, published_columns, sync_publications, version_refusals
from tests import pgoutput_encoder as enc

INT4, TEXT = 23, 25


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


# -- the columns a snapshot reads -------------------------------------------------------------------------------

COLUMNS = (
    ColumnInfo("id", INT4, -1, None),
    ColumnInfo("a", INT4, -1, None),
    ColumnInfo("doubled", INT4, -1, None, "s"),
    ColumnInfo("tripled", INT4, -1, None, "v"),
    ColumnInfo("b", TEXT, -1, "C"),
)


@pytest.mark.parametrize(
    ("stored", "names"), [(True, ["id", "a", "doubled", "b"]), (False, ["id", "a", "b"])], ids=["stored", "none"]
)
def test_a_snapshot_reads_the_columns_pgoutput_sends(stored: bool, names: list[str]) -> None:
    assert [c.name for c in published_columns(COLUMNS, stored)] == names


def relation_of(
    monkeypatch: pytest.MonkeyPatch, stored: bool, key: tuple[str, ...], identity: str = "d"
) -> tuple[Relation, tuple[str, ...]]:
    """``reader._relation`` for a table of COLUMNS whose publications publish stored generated columns or not."""
    asked: list[tuple[str, ...]] = []

    def publishes(conn: Any, publications: tuple[str, ...], name: str) -> bool:
        asked.append(publications)
        return stored

    monkeypatch.setattr(reader_module, "_readable", lambda conn, name, info: info.columns)
    monkeypatch.setattr(reader_module, "publishes_generated_columns", publishes)
    monkeypatch.setattr(reader_module, "table_facts", lambda conn, oid: TableFacts(not_null=frozenset({"id"})))
    identity_columns = tuple(c.name for c in COLUMNS) if identity == "f" else key
    info = TableInfo("public.t", False, identity, identity_columns, COLUMNS, 16400)
    described = reader_module._relation(None, info, key, ("cdcd",))  # type: ignore[arg-type]
    assert asked == [("cdcd",)]
    return described


def test_the_snapshots_relation_marks_a_published_stored_generated_column(monkeypatch: pytest.MonkeyPatch) -> None:
    relation, key = relation_of(monkeypatch, True, ("id",))
    assert relation.columns == (
        Column("id", INT4, -1, True, True),
        Column("a", INT4, -1, False),
        Column("doubled", INT4, -1, False, generated=True),
        Column("b", TEXT, -1, False),
    )
    assert key == ("id",)
    relation, key = relation_of(monkeypatch, False, ("id",))
    assert [c.name for c in relation.columns] == ["id", "a", "b"]


@pytest.mark.parametrize("identity", ["d", "f"])
def test_a_key_holding_an_unpublished_generated_column_is_no_chunk_key(
    monkeypatch: pytest.MonkeyPatch, identity: str
) -> None:
    """As the stream: pgoutput flags no column it leaves out, and under FULL a primary key not wholly sent is no key."""
    relation, key = relation_of(monkeypatch, False, ("id", "doubled"), identity)
    assert key == ()
    assert [c.name for c in relation.columns if c.is_key] == (["id"] if identity == "d" else [])
    relation, key = relation_of(monkeypatch, True, ("id", "doubled"), identity)
    assert key == ("id", "doubled")
    assert [c.name for c in relation.columns if c.is_key] == ["id", "doubled"]


# -- the stream's relation and the schemas ----------------------------------------------------------------------

STREAMED = Relation(
    16400,
    "public",
    "t",
    "d",
    (Column("id", INT4, -1, True), Column("a", INT4, -1, False), Column("doubled", INT4, -1, False)),
)


def test_the_streams_relation_marks_the_catalogs_stored_generated_columns() -> None:
    facts = TableFacts(frozenset({"id"}), frozenset({"id"}), frozenset({"doubled"}))
    decoder = Decoder(describe=lambda relation: facts, stage=STAGE)
    decoded = decoder.decode(enc.encode(STREAMED))
    assert isinstance(decoded, Relation)
    assert [c.generated for c in decoded.columns] == [False, False, True]


def marked(relation: Relation) -> Relation:
    """``relation`` with its column doubled marked as a stored generated column, as ``Decoder.describe`` does."""
    columns = tuple(dataclasses.replace(c, generated=c.name == "doubled") for c in relation.columns)
    return dataclasses.replace(relation, columns=columns)


def read(schema: dict[str, Any], data: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data), fastavro.parse_schema(schema), None)


@pytest.mark.parametrize("debezium", [False, True], ids=["cdcd", "debezium"])
def test_a_stored_generated_field_is_marked_and_the_others_are_unchanged(debezium: bool) -> None:
    plain = build_schemas(STREAMED, "srv", debezium=debezium)
    schemas = build_schemas(marked(STREAMED), "srv", debezium=debezium)
    ident, a, doubled = schemas.value["fields"]
    assert doubled["pg.generated"] == "stored"
    assert [ident, a] == plain.value["fields"][:2]
    assert {k: v for k, v in doubled.items() if k != "pg.generated"} == plain.value["fields"][2]
    assert schemas.key == plain.key
    encoder = EnvelopeEncoder(schemas)
    source = SourceInfo("1.0", "db", 1_700_000_000_000_000, tx_id=5, commit_lsn=99)
    value = read(schemas.envelope, encoder.encode_value("c", None, ("1", "2", "4"), source, 100, None))
    assert value["after"] == {"id": 1, "a": 2, "doubled": 4}


def test_column_rules_treat_a_generated_column_as_any_other() -> None:
    relation = marked(STREAMED)
    TableColumns("public.t", exclude=frozenset({"doubled"})).check(relation)
    schemas = build_schemas(relation, "srv", rules=TableColumns("public.t", exclude=frozenset({"doubled"})))
    assert [f["name"] for f in schemas.value["fields"]] == ["id", "a"]
    with pytest.raises(ColumnRuleError, match="a virtual generated column is never sent"):
        TableColumns("public.t", exclude=frozenset({"tripled"})).check(relation)
