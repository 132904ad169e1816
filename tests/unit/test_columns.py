"""Column selection and masking: the rules (cdcd.columns), their configuration (errors exit 2), the schemas and
records they shape through the Python specification, and cdcd tail's lines. The compiled row stage is compared
with this specification in test_native.py and test_lane.py."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import fastavro
import pytest

from cdcd.avro import EnvelopeEncoder, build_schemas
from cdcd.avro.encoder import SourceInfo
from cdcd.cli import main
from cdcd.columns import ColumnRuleError, ColumnRules, Mask, TableColumns
from cdcd.config import ConfigError, load_settings
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Column, Relation, Row
from cdcd.secrets import redact
from cdcd.sink.jsonl import JsonLinesSink
from tests.unit.test_jsonl import transaction

SALT = b"pepper-\xc3\xa9"  # UTF-8 text, as a salt file or variable holds it
PEOPLE = Relation(
    16500,
    "crm",
    "people",
    "d",
    (
        Column("id", 23, -1, True),
        Column("email", 25, -1, False, not_null=True),
        Column("tax_id", 1043, 20, False),
        Column("age", 23, -1, False),
        Column("photo", 17, -1, False),
        Column("notes", 25, -1, False, not_null=True),
    ),
)


def rules(**table: Any) -> TableColumns:
    return TableColumns("crm.people", **table)


MASKED = rules(
    exclude=frozenset({"photo"}),
    masks={
        "id": Mask("hash", salt=SALT),
        "email": Mask("hash", salt=SALT),
        "tax_id": Mask("keep_last", 3),
        "age": Mask("null"),
        "notes": Mask("truncate", 4),
    },
)


def sha(text: str) -> str:
    return hashlib.sha256(SALT + text.encode()).hexdigest()


# -- the rules --------------------------------------------------------------------------------------------------


def test_each_rule_on_a_text_form() -> None:
    assert Mask("hash", salt=b"s").apply("a@b.c") == hashlib.sha256(b"sa@b.c").hexdigest()
    assert Mask("hash", salt=b"s").apply("é") == hashlib.sha256("sé".encode()).hexdigest()  # UTF-8 bytes
    assert Mask("keep_first", 2).apply("héllo") == "hé***"
    assert Mask("keep_first", 9).apply("ab") == "ab"
    assert Mask("keep_last", 4).apply("123456789") == "*****6789"
    assert Mask("keep_last", 0).apply("abc") == "***"
    assert Mask("keep_last", 5).apply("") == ""
    assert Mask("stars", 3).apply("whatever it was") == "***"
    assert Mask("constant", constant="redacted").apply("x") == "redacted"
    assert Mask("truncate", 2).apply("éèà") == "éè"
    assert Mask("truncate", 0).apply("abc") == ""
    assert Mask("null").apply("x") is None


def test_the_compiled_form_of_each_rule() -> None:
    assert Mask("hash", salt=b"s").native() == (1, 0, b"s")
    assert Mask("keep_first", 2).native() == (2, 2, b"")
    assert Mask("keep_last", 3).native() == (3, 3, b"")
    assert Mask("stars", 3).native() == (4, 0, b"***")  # a constant of n stars
    assert Mask("constant", constant="é").native() == (4, 0, "é".encode())
    assert Mask("null").native() == (5, 0, b"")
    assert Mask("truncate", 7).native() == (6, 7, b"")


def test_a_salt_is_not_in_a_rules_repr() -> None:
    assert "pepper" not in repr(Mask("hash", salt=SALT))
    assert "pepper" not in repr(MASKED)


def test_key_columns_may_only_be_hashed_and_never_left_out() -> None:
    with pytest.raises(ColumnRuleError, match=r"crm\.people: key column 'id' cannot be left out"):
        rules(exclude=frozenset({"id"})).check(PEOPLE)
    with pytest.raises(ColumnRuleError, match=r"crm\.people: key column 'id' cannot be left out"):
        rules(include=frozenset({"email"})).check(PEOPLE)
    with pytest.raises(ColumnRuleError, match=r"key column 'id' can only be masked by hash.*not by keep_first"):
        rules(masks={"id": Mask("keep_first", 1)}).check(PEOPLE)
    rules(masks={"id": Mask("hash", salt=SALT)}).check(PEOPLE)


def test_a_rule_naming_a_column_the_table_lacks_is_refused() -> None:
    with pytest.raises(ColumnRuleError, match=r"crm\.people: the table has no column 'emial'"):
        rules(masks={"emial": Mask("hash", salt=SALT)}).check(PEOPLE)
    with pytest.raises(ColumnRuleError, match="no column 'gone'"):
        rules(exclude=frozenset({"gone"})).check(PEOPLE)


def test_rules_go_by_table() -> None:
    every = ColumnRules({"crm.people": MASKED})
    assert every.of(PEOPLE) is MASKED
    assert every.of(Relation(1, "crm", "other", "d", PEOPLE.columns)) is None
    assert every.masked
    assert not ColumnRules().masked


# -- the configuration ------------------------------------------------------------------------------------------

BASE = "source: {dsn: 'host=x'}\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdcd.yaml"
    path.write_text(BASE + text)
    return path


def test_the_yaml_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SALT", "pepper-é")
    text = """
columns:
  hash_salt_env: MY_SALT
  tables:
    crm.people:
      exclude: [photo]
      mask:
        id: hash
        email: {hash: true}
        tax_id: {keep_last: 3}
        age: null
        notes: {truncate: 4}
        other: {stars: 8}
        more: {constant: redacted}
        first: {keep_first: 1}
    crm.slim:
      include: [id, name]
"""
    got = load_settings(write(tmp_path, text)).columns.rules()
    people = got.tables["crm.people"]
    assert people.exclude == {"photo"}
    assert people.include is None
    assert people.masks == {
        "id": Mask("hash", salt=SALT),
        "email": Mask("hash", salt=SALT),
        "tax_id": Mask("keep_last", 3),
        "age": Mask("null"),
        "notes": Mask("truncate", 4),
        "other": Mask("stars", 8),
        "more": Mask("constant", constant="redacted"),
        "first": Mask("keep_first", 1),
    }
    assert people.masks["id"].salt == SALT
    assert got.tables["crm.slim"].include == frozenset({"id", "name"})
    assert redact("the salt is pepper-é") == "the salt is ***"  # registered as a secret


def test_the_salt_from_a_file_without_its_newline(tmp_path: Path) -> None:
    salt = tmp_path / "salt"
    salt.write_text("pepper-é\n")
    text = f"columns: {{hash_salt_file: {salt}, tables: {{crm.people: {{mask: {{email: hash}}}}}}}}\n"
    got = load_settings(write(tmp_path, text)).columns.rules()
    assert got.tables["crm.people"].masks["email"].salt == SALT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("columns: {tables: {crm.people: {include: [id], exclude: [photo]}}}", "include and exclude are exclusive"),
        ("columns: {tables: {crm.people: {mask: {a: {keep_first: 1, stars: 2}}}}}", "exactly one of"),
        ("columns: {tables: {crm.people: {mask: {a: {}}}}}", "exactly one of"),
        ("columns: {tables: {crm.people: {mask: {a: sha1}}}}", "a mask is hash, null or a mapping"),
        ("columns: {tables: {crm.people: {mask: {a: {keep_last: -1}}}}}", "greater than or equal to 0"),
        ("columns: {tables: {crm.people: {mask: {a: {stars: 0}}}}}", "greater than or equal to 1"),
        ("columns: {tables: {crm.people: {mask: {a: {md5: true}}}}}", "Extra inputs"),
        ("columns: {tables: {crm.people: {mask: {a: hash}}}}", "need their salt"),
        (
            "columns: {hash_salt_env: NO_SUCH_SALT, tables: {crm.people: {mask: {a: hash}}}}",
            "hash_salt_env names NO_SUCH_SALT, which is not set",
        ),
        (
            "columns: {hash_salt_env: EMPTY_SALT, tables: {crm.people: {mask: {a: hash}}}}",
            "hash_salt_env names EMPTY_SALT, which is empty",
        ),
        (
            "columns: {hash_salt_file: /no/salt, tables: {crm.people: {mask: {a: hash}}}}",
            "cannot read columns.hash_salt_file /no/salt: No such file or directory (file key columns.hash_salt_file"
            " or env CDCD_COLUMNS__HASH_SALT_FILE)",
        ),
        ("columns: {tables: {crm.people: {exclude: [a], mask: {a: null}}}}", "not sent at all"),
        ("columns: {tables: {crm.people: {include: [b], mask: {a: null}}}}", "not sent at all"),
        ("columns: {tables: {people: {exclude: [a]}}}", "schema.table"),
        ("source: {binary: true}\ncolumns: {tables: {crm.people: {mask: {a: null}}}}", "source.binary: false"),
    ],
)
def test_configuration_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    monkeypatch.delenv("NO_SUCH_SALT", raising=False)
    monkeypatch.setenv("EMPTY_SALT", "")
    if text.startswith("source:"):
        (tmp_path / "cdcd.yaml").write_text(text.replace("source: {", "source: {dsn: 'host=x', ") + "\n")
        path = tmp_path / "cdcd.yaml"
    else:
        path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_settings(path)
    assert main(["tail", "--config", str(path)]) == 2
    assert expected in capsys.readouterr().err


# -- schemas and records (the Python specification) -------------------------------------------------------------


@pytest.mark.parametrize("debezium", [False, True], ids=["cdcd", "debezium"])
def test_schemas_describe_what_is_sent(debezium: bool) -> None:
    schemas = build_schemas(PEOPLE, "srv", debezium=debezium, rules=MASKED)
    fields = {f["name"]: f for f in schemas.value["fields"]}
    assert list(fields) == ["id", "email", "tax_id", "age", "notes"]  # photo left out
    assert all(f["cdcd.mask"] for f in fields.values())
    assert fields["age"]["type"] == ["null", "string"]  # null: nullable whatever the column was
    assert fields["tax_id"]["type"] == ["null", "string"]
    # Debezium's NOT NULL columns stay required, as strings; cdcd's layout makes every Value field nullable
    assert fields["email"]["type"] == ("string" if debezium else ["null", "string"])
    assert schemas.key is not None
    assert schemas.key["fields"] == [{"name": "id", "type": "string", "cdcd.mask": "hash"}]
    assert schemas.width == 6
    plain = build_schemas(PEOPLE, "srv", debezium=debezium)
    assert [f["name"] for f in plain.value["fields"]] == ["id", "email", "tax_id", "age", "photo", "notes"]


def read(schema: dict[str, Any], data: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data), fastavro.parse_schema(schema), None)


ROW: Row = ("7", "a@b.c", "123-45-6789", "41", "\\x00ff", "long notes")
ROW_SENT = {"id": sha("7"), "email": sha("a@b.c"), "tax_id": "********789", "age": None, "notes": "long"}
SOURCE = SourceInfo("1.0", "db", 1_700_000_000_000_000, tx_id=5, commit_lsn=99)


@pytest.mark.parametrize("debezium", [False, True], ids=["cdcd", "debezium"])
def test_records_hold_the_masked_values(debezium: bool) -> None:
    encoder = EnvelopeEncoder(build_schemas(PEOPLE, "srv", debezium=debezium, rules=MASKED))
    after: Row = ("8", "x@y.z", None, "40", None, UNCHANGED_TOAST)
    value = read(encoder.schemas.envelope, encoder.encode_value("u", ROW, after, SOURCE, 100, None))
    assert value["before"] == {
        "id": sha("7"),
        "email": sha("a@b.c"),
        "tax_id": "********789",
        "age": None,
        "notes": "long",
    }
    assert value["after"]["id"] == sha("8")
    assert value["after"]["tax_id"] is None  # NULL stays NULL
    assert value["after"]["notes"] == ("" if debezium else None)  # unchanged: Debezium's NOT NULL zero, or null
    assert value["unchanged_toast"] == ["notes"]
    assert encoder.schemas.key is not None
    assert read(encoder.schemas.key, encoder.encode_key(ROW)) == {"id": sha("7")}
    assert json.loads(encoder.key_json(ROW)) == {"id": sha("7")}  # Debezium's key-change headers


def test_a_masked_value_in_binary_form_is_refused() -> None:
    encoder = EnvelopeEncoder(build_schemas(PEOPLE, "srv", rules=MASKED))
    with pytest.raises(ValueError, match="text form"):
        encoder.encode_value("c", None, (*ROW[:1], b"a@b.c", *ROW[2:]), SOURCE, 1, None)


# -- cdcd tail ----------------------------------------------------------------------------------------------------


def test_json_lines_hold_what_kafka_gets(tmp_path: Path) -> None:
    from cdcd.pgoutput.messages import RowChange  # noqa: PLC0415

    out = io.BytesIO()
    sink = JsonLinesSink(out, columns=ColumnRules({"crm.people": MASKED}))
    after: Row = ("8", "x@y.z", None, "40", UNCHANGED_TOAST, UNCHANGED_TOAST)
    changes = [
        RowChange("insert", PEOPLE, None, ROW, False, None, 0x10, 0),
        RowChange("update", PEOPLE, ("7", None, None, None, None, None), after, True, None, 0x20, 0),
    ]
    txn = transaction(tmp_path, *changes)
    sink.write_transaction(txn, txn.changes(), Ledger())
    sink.poll()
    first, second = (json.loads(line) for line in out.getvalue().decode().splitlines())
    assert first["after"] == {
        "id": sha("7"),
        "email": sha("a@b.c"),
        "tax_id": "********789",
        "age": None,
        "notes": "long",
    }
    assert second["before"] == {"id": sha("7")}  # the old key, hashed
    assert second["after"] == {"id": sha("8"), "email": sha("x@y.z"), "tax_id": None, "age": None}
    assert second["unchanged_toast"] == ["notes"]  # photo is not sent at all
