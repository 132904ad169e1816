"""Configuration: a YAML file, every key overridable by environment variables ``CDCD_<SECTION>__<KEY>``.

Environment beats the file, so a Kubernetes Secret or a systemd drop-in can override one key. Unknown keys
are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from cdcd.columns import ColumnRules, Mask, TableColumns
from cdcd.confighints import unknown_key
from cdcd.patterns import PatternError, Selection, whole
from cdcd.secrets import redact, register_secret, register_url_password

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem."""


def parse_size(value: object) -> int:
    """Accept 1048576, "64MiB", "64MB", "512k" (binary units)."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"not a size: {value!r} (use a byte count or e.g. 64MiB)")
    number, unit = match.groups()
    return int(number) * _UNITS[(unit or "")[:1].lower()]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


PublishOp = Literal["insert", "update", "delete", "truncate"]
ALL_OPS: tuple[PublishOp, ...] = ("insert", "update", "delete", "truncate")
GeneratedColumns = Literal["none", "stored"]


def _qualified_name(value: str) -> str:
    if value.count(".") != 1 or not all(value.split(".")):
        raise ValueError(f"table name must be schema.table, got {value!r}")
    return value


class TableRef(_Section):
    name: str = Field(description="schema-qualified table name, e.g. public.orders")
    where: str | None = Field(None, description="row filter: a PostgreSQL boolean expression over the columns")

    _name = field_validator("name")(_qualified_name)

    @field_validator("where")
    @classmethod
    def _filter(cls, value: str | None) -> str | None:
        if value is not None:
            from cdcd.filters.expr import parse_filter  # noqa: PLC0415 - pglast loads only when filters are used

            parse_filter(value)  # FilterError is a ValueError: reported with the key that holds it
        return value

    @property
    def schema_table(self) -> tuple[str, str]:
        schema, table = self.name.split(".")
        return schema, table


def _full_match(pattern: str, table: str) -> bool:
    return re.fullmatch(pattern, table, re.IGNORECASE) is not None


def _regexes(value: list[str], info: ValidationInfo) -> list[str]:
    for pattern in value:
        try:
            re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"{info.field_name}: {pattern!r} is not a valid regular expression: {exc}") from None
    return value


class Publication(_Section):
    name: str = Field(description="publication name; alone (no tables/schemas/all_tables) it must exist on the server")
    tables: list[TableRef] = Field(default_factory=list, description="FOR TABLE ..., each with an optional row filter")
    schemas: list[str] = Field(default_factory=list, description="FOR TABLES IN SCHEMA ... (no row filters)")
    all_tables: bool = Field(False, description="FOR ALL TABLES (no row filters)")
    include_tables: list[str] = Field(
        default_factory=list,
        description="regular expressions matched against the whole schema.table, case-insensitively (Debezium's"
        " table.include.list): matching tables are published, also those created later while cdcd runs (needs"
        " manage_publications)",
    )
    exclude_tables: list[str] = Field(
        default_factory=list,
        description="regular expressions (as include_tables; Debezium's table.exclude.list): tables they match are"
        " not published by pattern; alone, every other table of the database is",
    )
    publish: list[PublishOp] = Field(
        default_factory=lambda: list(ALL_OPS), description="operations published (the publication's publish option)"
    )
    publish_via_partition_root: bool = Field(
        False, description="publish changes of partitions as changes of their partitioned root table"
    )
    publish_generated_columns: GeneratedColumns = Field(
        "none",
        description="stored: STORED generated columns are published like the others, in snapshots too"
        " (PostgreSQL 18 or later); virtual generated columns are never published",
    )

    _patterns = field_validator("include_tables", "exclude_tables")(_regexes)

    @property
    def defined(self) -> bool:
        """False for a bare name: the publication exists on the server and cdcd reads its definition there."""
        return self.all_tables or bool(self.tables or self.schemas) or self.has_patterns

    @property
    def has_patterns(self) -> bool:
        return bool(self.include_tables or self.exclude_tables)

    def matches(self, table: str) -> bool:
        """Whether ``schema.table`` is published by pattern: matched whole, ignoring case (Debezium's rules), by
        an include pattern (any table when there are only exclude patterns) and by no exclude pattern."""
        if not self.has_patterns:
            return False
        included = not self.include_tables or any(_full_match(p, table) for p in self.include_tables)
        return included and not any(_full_match(p, table) for p in self.exclude_tables)

    @model_validator(mode="after")
    def _consistent(self) -> Publication:
        where = [t.name for t in self.tables if t.where is not None]
        if self.all_tables and where:
            raise ValueError(
                f"publication {self.name!r}: row filters are not allowed on a FOR ALL TABLES publication"
                f" (filtered: {', '.join(where)}); list the tables instead"
            )
        if self.all_tables and (self.tables or self.schemas or self.has_patterns):
            raise ValueError(
                f"publication {self.name!r}: all_tables and tables/schemas/include_tables/exclude_tables are"
                " mutually exclusive"
            )
        excluded = [t.name for t in self.tables if any(_full_match(p, t.name) for p in self.exclude_tables)]
        if excluded:
            raise ValueError(
                f"publication {self.name!r}: {', '.join(excluded)} listed in tables but matched by exclude_tables"
            )
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"publication {self.name!r}: a table is listed twice in {names}")
        in_schema = [t.name for t in self.tables if t.schema_table[0] in self.schemas]
        if in_schema:
            raise ValueError(
                f"publication {self.name!r}: {', '.join(in_schema)} already belong to its schemas {self.schemas}"
            )
        if not self.publish or len(set(self.publish)) != len(self.publish):
            raise ValueError(f"publication {self.name!r}: publish must list distinct operations, got {self.publish}")
        return self


def _case_insensitive_patterns(value: list[str]) -> list[str]:
    for pattern in value:
        try:
            whole(pattern, ignore_case=True)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
    return value


class MessagePrefixes(_Section):
    """Which logical decoding messages are published, by prefix: an include list or an exclude list (not both)."""

    include: list[str] = Field(
        default_factory=list,
        description="regular expressions (RE2) matched against the whole prefix, ignoring case (Debezium's"
        " message.prefix.include.list): only messages whose prefix one matches are published",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="regular expressions (as include; Debezium's message.prefix.exclude.list): messages whose"
        " prefix one matches are not published",
    )

    _patterns = field_validator("include", "exclude")(_case_insensitive_patterns)

    @model_validator(mode="after")
    def _one_list(self) -> MessagePrefixes:
        if self.include and self.exclude:
            raise ValueError(
                "message_prefixes.include and message_prefixes.exclude are exclusive, as Debezium's"
                " message.prefix.include.list and message.prefix.exclude.list: give one list"
            )
        return self

    def selection(self) -> Selection:
        return Selection.of(self.include, self.exclude, ignore_case=True)


class ReconnectSettings(_Section):
    initial_backoff_s: float = Field(0.5, gt=0, description="first wait before reconnecting; doubles each failure")
    max_backoff_s: float = Field(30.0, gt=0, description="longest wait between reconnect attempts")
    max_attempts: int = Field(0, ge=0, description="0 retries forever")
    slot_active_wait_s: float = Field(
        120.0,
        ge=0,
        description="how long to keep retrying while the slot is held by another connection (after a lost"
        " connection the server keeps the old walsender until its wal_sender_timeout, 60 s by default); then stop",
    )


class SourceSettings(_Section):
    dsn: SecretStr = Field(description="libpq connection string of the source database")
    password_file: Path | None = Field(
        None,
        description="file holding the source password (e.g. a mounted Secret), read at each connect; overrides"
        " a password in the DSN (trailing newline ignored)",
    )
    primary_dsn: SecretStr | None = Field(
        None,
        description="when dsn is a hot standby (PostgreSQL 16+): libpq connection string of its primary, where cdcd"
        " writes what a standby cannot (incremental snapshots' watermarks, `cdcd snapshot` requests, the heartbeat"
        " action query, managed publications) and asks for the running-xacts record a slot created on the standby"
        " waits for; password_file applies to it too (a standby has its primary's roles). Unused while dsn is not"
        " a standby (e.g. once it was promoted); without it, what would write is refused",
    )
    slot: str = Field("cdcd", description="logical replication slot (pgoutput) that keeps cdcd's position")
    create_slot: bool = Field(True, description="create the slot when it does not exist (else it is an error)")
    failover: bool | None = Field(
        None,
        description="a failover slot (PostgreSQL 17+), synchronized to standbys running with"
        " sync_replication_slots so cdcd goes on after a promotion; default: on where the server supports it",
    )
    temporary_slot: bool = Field(
        False, description="a temporary slot, dropped when the session ends (tests and one-off tails only)"
    )
    publications: list[Publication] = Field(
        default_factory=lambda: [Publication(name="cdcd", all_tables=True)],
        description="publications to stream (pgoutput publication_names)",
    )
    manage_publications: bool = Field(
        False, description="create the publications, or alter them to match this config (before streaming starts)"
    )
    table_check_interval_s: float = Field(
        10.0,
        ge=0,
        description="how often, while streaming, to look up what the publications capture: tables that"
        " include_tables (or, on PostgreSQL 14, schemas) of a managed publication match are added to it, and"
        " tables newly captured (added by hand, a partition attached) are snapshotted with snapshot.new_tables;"
        " 0: only at start",
    )
    protocol_version: int | Literal["auto"] = Field(
        "auto", description="pgoutput protocol version 1-4; auto: the highest the server supports"
    )
    streaming: Literal["off", "on", "parallel"] = Field(
        "on", description="receive large in-progress transactions as they happen (protocol 2+) instead of at commit"
    )
    messages: bool = Field(True, description="receive logical decoding messages (pg_logical_emit_message)")
    message_prefixes: MessagePrefixes = Field(
        default_factory=MessagePrefixes,
        description="with messages: the prefixes whose messages are published (by default all); the others are"
        ' dropped, counted in cdcd_filtered_events_total{table=""}, transactional or not. cdcd\'s own messages'
        " (cdcd.watermark, cdcd.snapshot) are read whatever it says",
    )
    binary: bool = Field(False, description="ask pgoutput for values in binary format")
    status_interval_s: float = Field(
        10.0, gt=0, description="how often to confirm the flushed position to the server (also once caught up)"
    )
    reconnect: ReconnectSettings = Field(
        default_factory=ReconnectSettings, description="retries after the source connection is lost"
    )
    receive_timeout_s: float = Field(
        60.0,
        ge=0,
        description="drop the replication connection (and reconnect) when the server sent nothing for this long;"
        " at half of it the server is asked for a keepalive (PostgreSQL's wal_receiver_timeout). Also the TCP user"
        " timeout and keepalive of every connection, unless the DSN sets them; 0 disables",
    )
    connect_timeout_s: int = Field(
        10,
        ge=2,
        description="give up a connection attempt after this long (libpq connect_timeout, unless the DSN sets it)",
    )
    statement_timeout_s: float = Field(
        60.0,
        ge=0,
        description="statement_timeout of the catalog queries (not of replication or snapshot reads); 0: none",
    )
    slot_create_timeout_s: float = Field(
        300.0,
        ge=0,
        description="give up creating the slot after this long (CREATE_REPLICATION_SLOT waits for the transactions"
        " running on the server to end; on a standby, for a running-xacts record) and retry with backoff; 0: none",
    )

    @field_validator("dsn", "primary_dsn")
    @classmethod
    def _parse_dsn(cls, value: SecretStr | None) -> SecretStr | None:
        """A DSN libpq cannot parse is a configuration error; the password of one it can is masked in every
        output."""
        from psycopg import ProgrammingError  # noqa: PLC0415 - psycopg loads only when a DSN is given
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

        if value is None:
            return None
        try:
            params = conninfo_to_dict(value.get_secret_value())
        except ProgrammingError as exc:
            raise ValueError(f"not a valid connection string: {safe_conninfo_error(exc)}") from None
        register_secret(str(params.get("password") or ""))
        return value

    def read_password(self) -> str | None:
        """The contents of password_file (None without one), read afresh at each call (a rotated Secret); raises
        ConfigError naming an unreadable or empty file."""
        if self.password_file is None:
            return None
        return read_secret_file(self.password_file, ("source", "password_file"))

    def read_secrets(self) -> None:
        """Whether password_file can be read: `cdcd run` finds out at start, not at its first connection."""
        self.read_password()

    @property
    def publication_names(self) -> list[str]:
        return [p.name for p in self.publications]

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, value: str) -> str:
        if not _IDENT.match(value) or len(value) > 63:
            raise ValueError(f"slot name must be lower-case letters, digits and _ (max 63), got {value!r}")
        return value

    @field_validator("protocol_version")
    @classmethod
    def _proto(cls, value: int | str) -> int | str:
        if value != "auto" and value not in (1, 2, 3, 4):
            raise ValueError("protocol_version must be auto or 1-4")
        return value

    @field_validator("publications")
    @classmethod
    def _publications(cls, value: list[Publication]) -> list[Publication]:
        if not value:
            raise ValueError("at least one publication is required")
        names = [p.name for p in value]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate publication names in {names}")
        return value

    @model_validator(mode="after")
    def _patterns_managed(self) -> SourceSettings:
        patterned = [p.name for p in self.publications if p.has_patterns]
        if patterned and not self.manage_publications:
            raise ValueError(
                f"publication(s) {', '.join(patterned)} select tables by pattern (include_tables/exclude_tables):"
                " cdcd keeps their table lists, so set manage_publications: true"
            )
        return self


def safe_conninfo_error(exc: BaseException) -> str:
    """libpq's message about a malformed connection string without the fragments it quotes: they can be a
    piece of the password (``missing "=" after "passw0rd"``, a whole URI with its user info)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if re.fullmatch(r'invalid connection option "\w+"', message):
        return message  # an option name, no value
    return redact(re.sub(r'"[^"]*"', '"..."', message))


class BufferSettings(_Section):
    memory_limit: int = Field(64 * 1024**2, description="bytes of buffered changes before spilling (e.g. 64MiB)")
    spill_dir: Path = Field(
        Path("/var/lib/cdcd/spill"),
        description="where buffered changes spill beyond memory_limit: each process in a locked cdcd-spill-*"
        " directory of its own; at start, the spill files of processes that are gone are removed",
    )

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        return parse_size(value)


# Producer settings the admin client needs too: how to reach and authenticate to the brokers.
_SHARED_CLIENT_SETTINGS = ("security.", "ssl.", "sasl.", "client.")


class ExactlyOnceSettings(_Section):
    transactional_id: str | None = Field(
        None,
        description="the producer's transactional.id; default cdcd-<database system id>-<slot>. One writer per id:"
        " a second instance with the same id fences the first",
    )
    progress_topic: str | None = Field(
        None,
        description="compacted topic of committed WAL positions, keyed by slot (JSON, not Avro); default"
        " __cdcd-progress-<topic_prefix>, outside the <topic_prefix>.* topics consumers subscribe to",
    )
    commit_interval_ms: int = Field(
        20, ge=1, description="longest a Kafka transaction stays open for more PostgreSQL transactions (latency)"
    )
    max_messages: int = Field(
        50_000, ge=1, description="messages after which a Kafka transaction is committed at the next transaction end"
    )
    transaction_timeout_s: int = Field(
        900,
        ge=10,
        description="transaction.timeout.ms: one PostgreSQL transaction must reach Kafka within this (at most the"
        " broker's transaction.max.timeout.ms)",
    )


class HeartbeatSettings(_Section):
    interval_s: float = Field(
        0.0,
        ge=0,
        description="a heartbeat record every this many seconds, with the source position (Debezium's"
        " heartbeat.interval.ms); 0: none",
    )
    topic: str | None = Field(
        None,
        description="the heartbeat topic's whole name; default __debezium-heartbeat.<topic_prefix>, Debezium's"
        " (its topic.heartbeat.prefix, a dot, its topic.prefix)",
    )
    action_query: str | None = Field(
        None,
        description="SQL run on the source database before each heartbeat (Debezium's heartbeat.action.query),"
        " e.g. an UPDATE of a heartbeat table; a query the server refuses stops cdcd. cdcd moves the slot by"
        " keepalive positions without it (docs/kafka.md: Heartbeats)",
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", value):
            raise ValueError(f"the heartbeat topic may hold letters, digits, '.', '_' and '-' only, got {value!r}")
        return value

    @model_validator(mode="after")
    def _action_needs_interval(self) -> HeartbeatSettings:
        if self.action_query is not None and not self.interval_s:
            raise ValueError("action_query runs at each heartbeat: set interval_s too")
        return self


class KafkaSettings(_Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka brokers, host:port[,host:port...]")
    topic_prefix: str = Field("cdcd", description="topics are <prefix>.<schema>.<table>; also Debezium's source.name")
    create_topics: bool = Field(True, description="create missing topics (else they must exist)")
    partitions: int = Field(1, ge=1, description="partitions of topics cdcd creates")
    replication_factor: int = Field(-1, description="-1: the broker's default.replication.factor")
    topic_config: dict[str, str] = Field(default_factory=dict, description="configs for topics cdcd creates")
    tombstones_on_delete: bool = Field(
        True, description="after a delete event, a tombstone (null value) for compaction"
    )
    transaction_topic: bool = Field(True, description="BEGIN/END events with counts on <prefix>.transaction")
    envelope: Literal["native", "debezium"] = Field(
        "native",
        description="debezium: column values in the types of Debezium's PostgreSQL connector (ZonedTimestamp"
        " strings, MicroTimestamp, VariableScaleDecimal, MicroDuration...) for consumers written against it;"
        " native: Avro logical types (timestamp-micros, decimal, uuid), which Avro readers and Spark map directly",
    )
    producer: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="extra librdkafka producer settings (idempotence and acks=all are fixed)"
    )
    whole_transaction_changes: int = Field(
        100_000,
        ge=0,
        description="a transaction of at least this many changes is acknowledged whole, not message by message:"
        " produced (once Kafka has every earlier message) by a second producer that reports failures only, and"
        " in Kafka whole before anything after it is produced. 0: every message acknowledged on its own",
    )
    delivery: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="exactly_once: whole PostgreSQL transactions in Kafka transactions, with the WAL position in"
        " the same transaction (for consumers reading with isolation.level=read_committed)",
    )
    exactly_once: ExactlyOnceSettings = Field(
        default_factory=ExactlyOnceSettings, description="Kafka transactions (delivery: exactly_once)"
    )
    heartbeat: HeartbeatSettings = Field(
        default_factory=HeartbeatSettings, description="heartbeat records (Debezium's heartbeat.*)"
    )

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", value):
            raise ValueError(f"topic_prefix may hold letters, digits, '.', '_' and '-' only, got {value!r}")
        return value

    @model_validator(mode="after")
    def _register_passwords(self) -> KafkaSettings:
        """Client passwords and secrets (SASL, TLS key) are masked in every output."""
        for key, value in self.producer.items():
            if isinstance(value, str) and ("password" in key or "secret" in key):
                register_secret(value)
        return self

    @property
    def heartbeat_topic(self) -> str:
        return self.heartbeat.topic or f"__debezium-heartbeat.{self.topic_prefix}"

    @property
    def progress_topic(self) -> str:
        return self.exactly_once.progress_topic or f"__cdcd-progress-{self.topic_prefix}"

    def client_config(self) -> dict[str, Any]:
        """Bootstrap servers and the connection settings of ``producer`` (TLS, SASL): for admin clients too."""
        shared = {k: v for k, v in self.producer.items() if k.startswith(_SHARED_CLIENT_SETTINGS)}
        return {**shared, "bootstrap.servers": self.bootstrap_servers}


class SchemaRegistrySettings(_Section):
    url: str = Field("http://127.0.0.1:8081", description="Confluent-compatible schema registry for the Avro schemas")
    client: dict[str, str | int | float] = Field(
        default_factory=dict,
        description="more schema registry client settings, e.g. basic.auth.user.info (user:password),"
        " ssl.ca.location, ssl.certificate.location, ssl.key.location, max.retries (a number)",
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="give up a request the registry does not answer after this long: it is then waited for as a"
        " registry that is away (logged, asked again each second, a stop request honoured between requests)",
    )

    def client_config(self) -> dict[str, Any]:
        """The client's settings. cdcd asks again itself: the client's own retries (``max.retries``, with waits of
        up to 20 s) would hold the main loop for several timeouts, so none unless ``client`` sets them."""
        return {"max.retries": 0, **self.client, "url": self.url, "timeout": self.timeout_s}

    @model_validator(mode="after")
    def _register_passwords(self) -> SchemaRegistrySettings:
        """Basic-auth passwords, in the URL or in ``client``, are masked in every output."""
        register_url_password(self.url)
        register_secret(str(self.client.get("basic.auth.user.info", "")).partition(":")[2] or None)
        return self


class FilterSettings(_Section):
    unevaluable: Literal["publish", "drop", "fail"] = Field(
        "publish",
        description="when a row filter cannot be evaluated for a change (a referenced value is an unchanged TOAST"
        " value, or evaluation fails): publish the change, drop it (logged and counted) or stop the daemon",
    )
    push_down: bool = Field(
        True, description="with manage_publications on PostgreSQL 15+, also write the filters into the publications"
    )


_MASK_RULES = ("hash", "null", "keep_first", "keep_last", "stars", "constant", "truncate")


class MaskRule(_Section):
    """One column's mask, of its text form: exactly one key (hash and null also alone: `email: hash`)."""

    hash: bool = Field(
        False,
        description="SHA-256 of the salt then the value, as lower-case hex: PostgreSQL's"
        " encode(sha256(convert_to(salt || value::text, 'UTF8')), 'hex') (Debezium's"
        " column.mask.hash.v2.SHA-256.with.salt.<salt>); the only rule allowed on a key column",
    )
    null: bool = Field(False, description="always null; the field becomes nullable")
    keep_first: int | None = Field(None, ge=0, description="keep the first n characters, every other one becomes *")
    keep_last: int | None = Field(None, ge=0, description="keep the last n characters, every other one becomes *")
    stars: int | None = Field(None, ge=1, description="n * whatever the value (Debezium's column.mask.with.<n>.chars)")
    constant: str | None = Field(None, description="this text whatever the value")
    truncate: int | None = Field(
        None, ge=0, description="the first n characters (Debezium's column.truncate.to.<n>.chars)"
    )

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: object) -> object:
        if value is None or value == "null":  # YAML's `column: null`
            return {"null": True}
        if value == "hash":
            return {"hash": True}
        if isinstance(value, str):
            raise ValueError(f"a mask is hash, null or a mapping of one of {', '.join(_MASK_RULES)}; got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> MaskRule:
        given = [name for name in _MASK_RULES if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"a mask takes exactly one of {', '.join(_MASK_RULES)}; got {given or 'none'}")
        return self

    def rule(self, salt: bytes) -> Mask:
        if self.hash:
            return Mask("hash", salt=salt)
        if self.null:
            return Mask("null")
        if self.constant is not None:
            return Mask("constant", constant=self.constant)
        if self.keep_first is not None:
            return Mask("keep_first", self.keep_first)
        if self.keep_last is not None:
            return Mask("keep_last", self.keep_last)
        if self.stars is not None:
            return Mask("stars", self.stars)
        assert self.truncate is not None  # validated: one rule
        return Mask("truncate", self.truncate)


class TableColumnSettings(_Section):
    """One table's columns: an include list or an exclude list (not both), and masks by column."""

    include: list[str] | None = Field(
        None, description="send only these columns (Debezium's column.include.list); key columns must be in it"
    )
    exclude: list[str] = Field(
        default_factory=list, description="leave these columns out (Debezium's column.exclude.list); not key columns"
    )
    mask: dict[str, MaskRule] = Field(default_factory=dict, description="mask rules by column name")

    @model_validator(mode="after")
    def _consistent(self) -> TableColumnSettings:
        if self.include is not None and self.exclude:
            raise ValueError("include and exclude are exclusive: give one list")
        left_out = [c for c in self.mask if c in self.exclude or (self.include is not None and c not in self.include)]
        if left_out:
            raise ValueError(f"masked column(s) {', '.join(left_out)} are not sent at all: drop the mask or the column")
        return self


class ColumnSettings(_Section):
    """Column selection and masking per captured table (Debezium's column.* settings). See docs/columns.md."""

    tables: dict[str, TableColumnSettings] = Field(
        default_factory=dict, description="rules by schema.table (the exact names, as in the catalog)"
    )
    hash_salt_file: Path | None = Field(
        None, description="file holding the salt of hash masks (UTF-8, trailing newline ignored); never logged"
    )
    hash_salt_env: str | None = Field(
        None, description="name of the environment variable holding the salt of hash masks, instead of a file"
    )
    _salt: bytes | None = PrivateAttr(None)  # read once, when first needed

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: dict[str, TableColumnSettings]) -> dict[str, TableColumnSettings]:
        for name in value:
            _qualified_name(name)
        return value

    @property
    def hashed(self) -> bool:
        return any(rule.hash for table in self.tables.values() for rule in table.mask.values())

    @model_validator(mode="after")
    def _salt_named(self) -> ColumnSettings:
        if self.hashed and (self.hash_salt_file is None) == (self.hash_salt_env is None):
            raise ValueError("hash masks need their salt: set exactly one of hash_salt_file and hash_salt_env")
        return self

    def read_secrets(self) -> None:
        """Read the salt of hash masks, once; raises ConfigError naming the file or variable that lacks it."""
        if self._salt is not None or not self.hashed:
            return
        if self.hash_salt_env is not None:
            salt = read_secret_variable(self.hash_salt_env, ("columns", "hash_salt_env"))
        else:
            assert self.hash_salt_file is not None  # validated: one of them
            salt = read_secret_file(self.hash_salt_file, ("columns", "hash_salt_file"))
        self._salt = salt.encode()

    def rules(self) -> ColumnRules:
        """The rules as the encoders apply them (``cdcd.columns``); reads the salt when not read yet."""
        self.read_secrets()
        salt = self._salt or b""
        return ColumnRules(
            {
                name: TableColumns(
                    name,
                    None if table.include is None else frozenset(table.include),
                    frozenset(table.exclude),
                    {column: rule.rule(salt) for column, rule in table.mask.items()},
                )
                for name, table in self.tables.items()
            }
        )


class SnapshotSettings(_Section):
    mode: Literal["initial", "never", "initial_only", "when_needed"] = Field(
        "initial",
        description="initial: snapshot the captured tables when cdcd creates its slot, then stream; never: only"
        " stream; initial_only: snapshot (with a temporary slot) and exit; when_needed: as initial, and when the"
        " slot was lost or invalidated, create a new one and snapshot again",
    )
    chunk_size: int = Field(
        10_000, ge=1, description="rows per chunk of an incremental snapshot, and per saved step of the initial one"
    )
    state_dir: Path = Field(
        Path("/var/lib/cdcd/state"), description="where snapshot progress is kept, so a restart resumes it"
    )
    new_tables: bool = Field(
        True,
        description="an incremental snapshot of each table that becomes captured: found at start (captured since"
        " the last one) or added by a pattern while streaming. Its rows written before it was added to the"
        " publication are not streamed; false: only what changes after that (modes initial and when_needed)",
    )
    read_only: bool = Field(
        False,
        description="incremental snapshots that write nothing to the source (Debezium's read.only): no watermark"
        " messages; each chunk's window is bounded by its snapshot's transaction ids and the WAL position read with"
        " it. Snapshots are then asked for on the signal topic (signals.kafka.topic): `cdcd snapshot` refuses",
    )
    progress_interval_s: float = Field(
        30.0, gt=0, description="while a table is snapshotted, log its rows, estimate, rate and time left this often"
    )
    parallelism: int = Field(
        1,
        ge=1,
        le=64,
        description="connections the initial snapshot reads on (Debezium's snapshot.max.threads), each in the"
        " slot's exported snapshot: tables side by side, a large one cut into key ranges on its first key column,"
        " each range's progress saved on its own (a restart reads only the ranges not finished)",
    )
    requests: Literal["signed", "off"] = Field(
        "signed",
        description="snapshot requests `cdcd snapshot` writes into the WAL, where any database role can write a"
        " message: signed: acted on only when signed with the request key (HMAC-SHA256), others are logged, counted"
        " (cdcd_control_rejected_total) and passed by; off: none is acted on (ask on the signal topic instead)",
    )
    request_key_file: Path | None = Field(
        None,
        description="file holding the key requests are signed with (at least 16 characters, trailing newline"
        " ignored); none: <state_dir>/request.key, made (mode 0600) by `cdcd run` when missing and read by `cdcd"
        " snapshot`, which must then run where it can read the state directory. Never logged",
    )
    request_key_env: str | None = Field(
        None, description="name of the environment variable holding the request key, instead of a file"
    )

    @model_validator(mode="after")
    def _one_key(self) -> SnapshotSettings:
        if self.request_key_file is not None and self.request_key_env is not None:
            raise ValueError("set at most one of request_key_file and request_key_env")
        return self

    def request_key(self, create: bool) -> bytes | None:
        """The request key (None: snapshot.requests is off); ``create``: make the default file when missing.
        Raises ConfigError naming what is missing."""
        if self.requests == "off":
            return None
        if self.request_key_env is not None:
            key = os.environ.get(self.request_key_env, "")
            where = f"environment variable {self.request_key_env} (snapshot.request_key_env)"
        else:
            path = self.request_key_file or self.state_dir / "request.key"
            key, where = _key_file(path, create=create and self.request_key_file is None), f"file {path}"
        if not key:
            raise ConfigError(
                f"no snapshot request key in {where}: `cdcd run` makes the default file at its first start (run"
                " `cdcd snapshot` where it can read snapshot.state_dir), or set snapshot.request_key_file or"
                " request_key_env; snapshot.requests: off refuses requests instead"
            )
        if len(key) < _MIN_KEY:
            raise ConfigError(f"the snapshot request key in {where} has under {_MIN_KEY} characters")
        register_secret(key)
        return key.encode()


_MIN_KEY = 16


def _key_file(path: Path, create: bool) -> str:
    """The text of ``path`` ("" when it does not exist); ``create``: a new random key written there (0600) first."""
    if create and not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        except FileExistsError:
            pass  # another process made it first: it is read below
        except OSError as exc:
            raise ConfigError(f"cannot write the snapshot request key {path}: {exc.strerror}") from None
    try:
        return path.read_text().rstrip("\r\n")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read the snapshot request key {path}: {reason}") from None


_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _topic_name(value: str | None) -> str | None:
    if value is not None and not _TOPIC.fullmatch(value):
        raise ValueError(f"a topic name may hold letters, digits, '.', '_' and '-' only, got {value!r}")
    return value


class SignalKafkaSettings(_Section):
    topic: str | None = Field(
        None,
        description="Kafka topic `cdcd run` reads snapshot signals from (Debezium's signal.kafka.topic): records"
        ' keyed by kafka.topic_prefix (Debezium\'s connector name), valued {"type": "execute-snapshot" |'
        ' "stop-snapshot" | "pause-snapshot" | "resume-snapshot" | "log", "data": {...}}; each acted on'
        " once (its offset is kept with the snapshot state); none: no Kafka signals",
    )
    poll_interval_s: float = Field(0.5, gt=0, description="how often the signal topic is read while streaming")

    check_topic = field_validator("topic")(_topic_name)


class SignalSettings(_Section):
    kafka: SignalKafkaSettings = Field(
        default_factory=SignalKafkaSettings,
        description="Debezium's Kafka signal channel (docs/snapshots.md: Signals over Kafka)",
    )


class NotificationKafkaSettings(_Section):
    topic: str | None = Field(
        None,
        description="Kafka topic of Debezium's snapshot notifications (its notification.sink.topic.name):"
        " Incremental Snapshot / Initial Snapshot STARTED, IN_PROGRESS, TABLE_SCAN_COMPLETED, COMPLETED, ABORTED,"
        " PAUSED, RESUMED (Avro, key {id}); needs sink.kind kafka; none: no notifications",
    )

    check_topic = field_validator("topic")(_topic_name)


class NotificationSettings(_Section):
    kafka: NotificationKafkaSettings = Field(
        default_factory=NotificationKafkaSettings, description="Debezium's sink notification channel, on Kafka"
    )


SinkKind = Literal["jsonl", "kafka"]


class SinkSettings(_Section):
    kind: SinkKind | None = Field(
        None,
        description="where `cdcd run` sends changes: kafka, or jsonl (JSON lines appended to path). No default:"
        " `cdcd run` refuses to start without it, so that a forgotten sink does not confirm positions into a"
        " terminal; `cdcd tail`, `check` and `snapshot` do not need it",
    )
    path: str = Field("-", description="jsonl: the file to append to, - for stdout")
    fsync: bool = Field(
        True,
        description="jsonl (`cdcd run` and `cdcd tail --output`): fsync the file before its lines are confirmed to"
        " PostgreSQL, once per round of writes; false trusts the page cache (a crash of the machine can then lose"
        " lines already confirmed)",
    )
    flush_timeout_s: float = Field(30.0, gt=0, description="on stop, how long to wait for the sink to finish")

    def run_kind(self) -> SinkKind:
        """The sink `cdcd run` sends to; raises ConfigError when the configuration names none."""
        if self.kind is None:
            raise ConfigError(
                f"sink.kind is not set (file key sink.kind or {_env_name(('sink', 'kind'))}): `cdcd run` needs to"
                " know where changes go: kafka, or jsonl (JSON lines appended to sink.path, - for stdout); `cdcd"
                " tail` prints them without it"
            )
        return self.kind


class MetricsSettings(_Section):
    listen: str = Field(
        "0.0.0.0:9187",
        description="host:port serving /metrics, /status, /healthz and /readyz; empty disables; port 0 picks one."
        " Every interface by default: Kubernetes probes and Prometheus reach a pod on its IP, not on loopback."
        " No authentication (read-only; no credentials in it): outside a pod network, 127.0.0.1:9187 or a firewall",
    )
    health_timeout_s: float = Field(60.0, gt=0, description="/healthz fails when the main loop stalls this long")
    slot_check_interval_s: float = Field(30.0, gt=0, description="how often to query the WAL the slot retains")

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[^:\s]*):\d{1,5}", value):
            raise ValueError(f"listen must be host:port (or empty to disable), got {value!r}")
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        if not self.listen:
            return None
        host, port = self.listen.rsplit(":", 1)
        return host.strip("[]") or "0.0.0.0", int(port)


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console lines in a terminal, JSON lines otherwise (to stderr)"
    )


@runtime_checkable
class _HoldsSecrets(Protocol):
    """A section naming secret files or variables, which it reads when asked (never while parsing)."""

    def read_secrets(self) -> None: ...


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CDCD_", env_nested_delimiter="__", extra="forbid")

    source: SourceSettings
    buffer: BufferSettings = Field(default_factory=BufferSettings)
    filters: FilterSettings = Field(default_factory=FilterSettings)
    columns: ColumnSettings = Field(default_factory=ColumnSettings)
    snapshot: SnapshotSettings = Field(default_factory=SnapshotSettings)
    sink: SinkSettings = Field(default_factory=SinkSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    signals: SignalSettings = Field(default_factory=SignalSettings)
    notifications: NotificationSettings = Field(default_factory=NotificationSettings)

    @model_validator(mode="after")
    def _masks_read_text(self) -> Settings:
        if self.source.binary and any(t.mask for t in self.columns.tables.values()):
            raise ValueError("column masks read values in their text form: they need source.binary: false")
        return self

    @model_validator(mode="after")
    def _notifications_need_kafka(self) -> Settings:
        if self.notifications.kafka.topic is not None and self.sink.kind != "kafka":
            raise ValueError("notifications.kafka.topic is written by the Kafka sink: set sink.kind to kafka")
        return self

    def read_secrets(self) -> None:
        """Read every secret file and variable the configuration names (each section's ``read_secrets``: the
        source password, the salt of hash masks), so that a missing one stops a command before it does anything,
        reported with the others. Parsing reads none; each is also read where it is used."""
        problems = []
        for name in type(self).model_fields:
            section = getattr(self, name)
            if isinstance(section, _HoldsSecrets):
                try:
                    section.read_secrets()
                except ConfigError as exc:
                    problems.append(str(exc))
        if problems:
            count = f"{len(problems)} problem{'s' * (len(problems) > 1)}"
            raise ConfigError(f"the configuration's secrets cannot be read ({count}):\n  - " + "\n  - ".join(problems))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings  # environment overrides the file


def read_secret_file(path: Path, key: tuple[str, ...]) -> str:
    """The text of the secret file that the setting ``key`` names (trailing newline ignored), registered as a
    secret; raises ConfigError naming the key, the file and the key's variable when it is unreadable or empty."""
    where, set_by = f"{'.'.join(key)} {path}", f"file key {'.'.join(key)} or {_env_name(key)}"
    try:
        text = path.read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {where}: {reason} ({set_by})") from None
    if not text:
        raise ConfigError(f"{where} is empty ({set_by})")
    register_secret(text)
    return text


def read_secret_variable(name: str, key: tuple[str, ...]) -> str:
    """The value of the environment variable ``name`` that the setting ``key`` names, registered as a secret;
    raises ConfigError naming both when it is unset or empty."""
    text = os.environ.get(name, "")
    if not text:
        state = "is empty" if name in os.environ else "is not set"
        raise ConfigError(f"{'.'.join(key)} names {name}, which {state}")
    register_secret(text)
    return text


def load_settings(path: Path | None, *, read_secrets: bool = True) -> Settings:
    """Read the YAML file (if any) and the environment; raise ConfigError naming every problem. ``read_secrets``:
    then read the secrets the configuration names (``Settings.read_secrets``); without it nothing is read but the
    file and the environment's CDCD_* variables (`cdcd check --offline`, `cdcd status`)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except SettingsError as exc:  # an environment variable holding malformed JSON for a section or mapping
        raise ConfigError(redact(f"invalid configuration in the environment: {exc}")) from None
    if read_secrets:
        settings.read_secrets()
    return settings


def _env_name(loc: tuple[int | str, ...]) -> str:
    """How to set the key at ``loc`` from the environment. A key holding a dot (a table's name) has no variable a
    shell can export: the variable of the section above it takes that section as JSON."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    dotted = next((i for i, p in enumerate(parts) if "." in p), None)
    if dotted is None:
        return "env CDCD_" + "__".join(p.upper() for p in parts)
    if dotted == 0:
        return "no environment variable: the key holds a dot"
    section = "CDCD_" + "__".join(p.upper() for p in parts[:dotted])
    return f"env {section}, as JSON: {'.'.join(parts[dotted:])} holds a dot"


def _describe(exc: ValidationError, path: Path | None) -> str:
    origin = f" in {path}" if path else ""
    lines = [f"invalid configuration{origin} ({exc.error_count()} problem{'s' * (exc.error_count() > 1)}):"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        env = _env_name(error["loc"])
        message = error["msg"]
        value = error.get("input")
        if isinstance(value, str) and len(value) >= 4 and value in message:
            message = message.replace(value, "...")  # never echo an input: it may be a secret in the wrong key
        if error["type"] == "extra_forbidden" and (hint := unknown_key(Settings, error["loc"])):
            message = f"{message}: {hint}"
        lines.append(f"  - {where}: {redact(message)} (file key {where} or {env})")
    return "\n".join(lines)
