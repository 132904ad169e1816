"""cdcd.spark.wire without Spark: the Confluent wire-format header, topic selection, the registry client."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cdcd.spark.wire import Registry, WireFormatError, schema_id, table_of, topic_pattern


def test_schema_id_reads_the_big_endian_id_after_the_magic_byte() -> None:
    assert schema_id(b"\x00\x00\x00\x01\x02rest") == 258
    assert schema_id(bytearray(b"\x00\xff\xff\xff\xff")) == 2**32 - 1
    assert schema_id(None) is None


@pytest.mark.parametrize(
    ("header", "message"), [(b"\x01\x00\x00\x00\x01", "magic byte is 1"), (b"\x00\x00", "shorter")]
)
def test_schema_id_refuses_what_is_not_the_wire_format(header: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        schema_id(header)


def test_topic_pattern_matches_table_topics_only() -> None:
    pattern = re.compile(topic_pattern("my.prefix"))
    assert pattern.fullmatch("my.prefix.public.items")
    assert pattern.fullmatch("my.prefix.shop.order_lines")
    assert not pattern.fullmatch("my.prefix.transaction")
    assert not pattern.fullmatch("my.prefix.message")
    assert not pattern.fullmatch("myXprefix.public.items")
    assert not pattern.fullmatch("other.public.items")


def test_table_of() -> None:
    assert table_of("p.shop.items", "p") == ("shop", "items")
    assert table_of("p.transaction", "p") is None
    assert table_of("p.transaction.log", "p") == ("transaction", "log")  # a schema named like cdcd's topics
    assert table_of("p.a.b.c", "p") is None
    assert table_of("q.shop.items", "p") is None


@pytest.fixture
def registry_server() -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path + " " + str(self.headers.get("Authorization")))
            if self.path == "/ccompat/schemas/ids/7":
                body = json.dumps({"schema": json.dumps({"type": "record", "name": "X", "fields": []})}).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/ccompat/", requests
    server.shutdown()


def test_registry_fetches_each_id_once(registry_server: tuple[str, list[str]]) -> None:
    url, requests = registry_server
    registry = Registry(url, auth=("user", "secret"))
    assert registry.parsed(7) == {"type": "record", "name": "X", "fields": []}
    assert registry.schema(7) == registry.schema(7)
    assert requests == ["/ccompat/schemas/ids/7 Basic dXNlcjpzZWNyZXQ="]
    with pytest.raises(LookupError, match="HTTP 404"):
        registry.schema(8)
