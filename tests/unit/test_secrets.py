"""Secrets are masked in every text cdcd writes: redaction rules, the redacting streams, config errors."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cdcd.cli import main
from cdcd.config import load_settings
from cdcd.secrets import MASK, RedactingStream, redact, redacted_output, register_secret


def test_url_user_info_and_registered_secrets_are_masked() -> None:
    register_secret("reg-Secret-1")
    assert redact("at http://user:pw%2F1@h:1/x failed") == f"at http://user:{MASK}@h:1/x failed"
    assert redact("auth reg-Secret-1 refused") == f"auth {MASK} refused"


def test_registry_and_kafka_passwords_are_registered_when_the_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "source: {dsn: 'host=db password=pg-Secret-2'}\n"
        "kafka: {producer: {sasl.password: kafka-Secret-2, ssl.key.password: key-Secret-2}}\n"
        "schema_registry: {url: 'http://u:url%40Secret-2@r/apis', client: {basic.auth.user.info: 'u:cli-Secret-2'}}\n"
    )
    load_settings(path)
    text = "pg-Secret-2 kafka-Secret-2 key-Secret-2 url%40Secret-2 url@Secret-2 cli-Secret-2"
    assert redact(text) == " ".join([MASK] * 6)


def test_redacting_stream_masks_text_and_passes_data_through() -> None:
    register_secret("stream-Secret-3")
    raw = io.BytesIO()
    inner = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    stream = RedactingStream(inner)
    print("registry refused stream-Secret-3", file=stream)
    stream.buffer.write(b'{"after": "stream-Secret-3"}\n')  # data: a row's value is never altered
    assert raw.getvalue().decode() == f'registry refused {MASK}\n{{"after": "stream-Secret-3"}}\n'


def test_redacted_output_wraps_and_restores_the_standard_streams() -> None:
    before = sys.stdout, sys.stderr
    with redacted_output():
        assert isinstance(sys.stdout, RedactingStream)
        assert isinstance(sys.stderr, RedactingStream)
    assert (sys.stdout, sys.stderr) == before


@pytest.mark.parametrize("command", [["check"], ["run"], ["tail"], ["snapshot", "--table", "public.t"]])
@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 passwordDsn-Secret-4",  # libpq quotes the fragment: here, the password
        "host=127.0.0.1 password='Dsn-Secret-4",
        "postgresql://u:Dsn-Secret-4@127.0.0.1:5432/db extra",
        "host=127.0.0.1 password=Dsn-Secret-4 sslmod=require",
    ],
)
def test_malformed_dsn_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], dsn: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("source:\n  dsn: |-\n    " + dsn + "\n")
    assert main([command[0], "--config", str(path), *command[1:]]) == 2
    printed = capsys.readouterr()
    assert "source.dsn: Value error, not a valid connection string" in printed.err
    assert "Dsn-Secret-4" not in printed.out + printed.err


def test_a_file_name_ending_in_password_leaves_the_message_after_it_alone() -> None:
    message = "cannot read source.password_file /run/cdcd/pg.password: No such file or directory"
    assert redact(message) == message
    assert redact("login failed, password: hunter22 refused") == f"login failed, password: {MASK} refused"
    assert redact("sasl.password=hunter22") == f"sasl.password={MASK}"
    assert redact("{sasl.password: hunter22, x: 1}") == f"{{sasl.password: {MASK}, x: 1}}"
    assert redact("password: hunter22") == f"password: {MASK}"
