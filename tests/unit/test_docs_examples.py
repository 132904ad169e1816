"""The configurations the docs show are ones cdcd loads, and the Debezium mapping in docs/from-debezium.md says what
cdcd/confighints.py says: the worked example (docs/examples/from-debezium.yaml, quoted whole by the page) loaded
with cdcd's own loader, and the README's first configuration likewise (its run against the stack:
tests/integration/test_readme.py)."""

from __future__ import annotations

import hashlib
import re
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from cdcd.config import Settings, load_settings
from cdcd.confighints import DEBEZIUM, nested_models

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "from-debezium.md"
EXAMPLE = ROOT / "docs" / "examples" / "from-debezium.yaml"
README = ROOT / "README.md"
SALT = "CzQMA0cB5K"  # the salt the worked example's Debezium connector names in its property


def test_the_guide_quotes_its_example_whole() -> None:
    text = EXAMPLE.read_text()
    assert f"```yaml\n{text}```" in GUIDE.read_text(), f"docs/from-debezium.md must quote {EXAMPLE.name} as it is"


def test_the_worked_example_loads_with_what_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVENTORY_MASK_SALT", SALT)
    settings = load_settings(EXAMPLE, read_secrets=False)  # its password file is the production host's
    source = settings.source
    assert "sslmode=verify-full" in source.dsn.get_secret_value()
    assert source.password_file == Path("/run/secrets/pg-password")
    assert source.slot == "cdcd"
    assert source.manage_publications
    [publication] = source.publications
    assert publication.name == "cdcd"
    assert publication.include_tables == [r"inventory\..*", r"public\.audit_log"]
    assert publication.exclude_tables == [r"inventory\.debezium_signal"]
    assert publication.publish == ["insert", "update", "delete", "truncate"]
    # the patterns mean what table.include.list meant: whole names, the signal table left out
    assert publication.matches("inventory.customers")
    assert publication.matches("public.audit_log")
    assert not publication.matches("public.audit_log_old")
    assert not publication.matches("inventory.debezium_signal")
    # message.prefix.include.list=audit: the whole prefix, ignoring case
    prefixes = source.message_prefixes.selection()
    assert prefixes("audit")
    assert prefixes("AUDIT")
    assert not prefixes("audit.login")

    rules = settings.columns.rules().tables
    customers, orders = rules["inventory.customers"], rules["inventory.orders"]
    assert not customers.sent("photo")
    assert customers.sent("email")
    # the hash Debezium's column.mask.hash.v2.SHA-256.with.salt.<salt> names: SHA-256 of salt || value, hex
    expected = hashlib.sha256(f"{SALT}ann@example.com".encode()).hexdigest()
    assert customers.masks["email"].apply("ann@example.com") == expected
    assert customers.masks["card_number"].apply("4111111111111111") == "********"
    assert orders.masks["notes"].apply("x" * 150) == "x" * 100

    assert settings.snapshot.mode == "initial"
    assert settings.snapshot.chunk_size == 5000
    assert settings.snapshot.parallelism == 2
    assert settings.sink.kind == "kafka"
    kafka = settings.kafka
    assert kafka.topic_prefix == "inventory"
    assert kafka.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert kafka.envelope == "debezium"
    assert kafka.delivery == "exactly_once"
    assert kafka.progress_topic == "__cdcd-progress-inventory"
    assert kafka.transaction_topic
    assert kafka.tombstones_on_delete
    assert (kafka.partitions, kafka.replication_factor) == (3, 3)
    assert kafka.heartbeat.interval_s == 10
    assert kafka.heartbeat.action_query == "UPDATE inventory.heartbeat SET at = now() WHERE id = 1"
    assert kafka.heartbeat_topic == "__debezium-heartbeat.inventory"
    assert settings.schema_registry.url == "http://registry:8081"
    assert settings.signals.kafka.topic == "inventory-signals"
    assert settings.notifications.kafka.topic == "inventory-notifications"


def _rows(markdown: str) -> dict[str, str]:
    """Each Debezium property of the guide's tables (first cell, backticked, several per row allowed) and the cdcd
    cell beside it."""
    rows: dict[str, str] = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        for prop in re.findall(r"`([^`]+)`", cells[0]):
            rows[prop] = cells[1]
    return rows


def test_the_guide_maps_debezium_properties_as_the_config_hints_do() -> None:
    """Every property cdcd/confighints.py knows is in the guide's tables with the same cdcd key, or "no equivalent"
    where the hint says cdcd has none."""
    rows = _rows(GUIDE.read_text())
    for prop, hint in DEBEZIUM.items():
        assert prop in rows, f"docs/from-debezium.md has no row for {prop} (cdcd/confighints.py maps it)"
        cell = rows[prop]
        if hint.startswith("none"):
            assert cell == "no equivalent", f"{prop}: the hint says none ({hint}), the guide {cell}"
        else:
            key = hint.split()[0].rstrip(":,")
            assert f"`{key}" in cell, f"{prop}: the hint says {key}, the guide {cell}"


_SECTIONS = tuple(Settings.model_fields)


def _exists(path: str) -> bool:
    """Whether a key as the guide writes it (`source.publications[].name`, `columns.tables.<schema.table>.include`)
    is one of the settings model's."""
    parts = re.sub(r"<[^>]+>", "<key>", path).split(".")
    model: type[BaseModel] | None = Settings
    keyed = False
    for part in parts:
        if part == "<key>" and keyed:
            keyed = False
            continue
        if model is None:
            return False
        field = model.model_fields.get(part.removesuffix("[]"))
        if field is None:
            return False
        keyed = typing.get_origin(field.annotation) is dict or any(
            typing.get_origin(arg) is dict for arg in typing.get_args(field.annotation)
        )
        model = next(iter(nested_models(field.annotation)), None)
    return True


def test_every_cdcd_key_the_guide_names_exists() -> None:
    keys = {
        match.split(":")[0]
        for cell in _rows(GUIDE.read_text()).values()
        for match in re.findall(r"`([^`]+)`", cell)
        if match.split(".")[0] in _SECTIONS
    }
    assert len(keys) > 40
    missing = sorted(key for key in keys if not _exists(key))
    assert not missing, f"docs/from-debezium.md names keys the settings model does not have: {missing}"


def _first_yaml_block(markdown: str) -> str:
    match = re.search(r"```yaml\n(.*?)```", markdown, re.DOTALL)
    assert match is not None, "no ```yaml block"
    return match.group(1)


def test_the_readme_first_configuration_loads(tmp_path: Path) -> None:
    """The README's first configuration is valid as written, names its sink, and lists its tables (no superuser-only
    FOR ALL TABLES). tests/integration/test_readme.py runs it against the stack."""
    path = tmp_path / "first.yaml"
    path.write_text(_first_yaml_block(README.read_text()))
    settings = load_settings(path)
    assert yaml.safe_load(path.read_text())["sink"]["kind"] == "kafka"  # written, not a default
    assert settings.sink.kind == "kafka"
    assert settings.source.manage_publications
    assert [t.name for p in settings.source.publications for t in p.tables] == ["shop.customers", "shop.orders"]
    assert not any(p.all_tables or p.schemas for p in settings.source.publications)
    assert len(path.read_text().splitlines()) <= 20
