"""docs/configuration.md is generated from the settings model (python -m cdcd.docs): it must match; it and
config/cdcd.example.yaml hold every key of the model."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from cdcd import docs
from cdcd.config import Settings, load_settings
from cdcd.confighints import nested_models


def test_committed_configuration_reference_is_up_to_date() -> None:
    assert docs.DEFAULT_PATH.read_text() == docs.render(), "docs/configuration.md is stale: run python -m cdcd.docs"


def _fields(model: type[BaseModel], prefix: str) -> list[tuple[str, str | None]]:
    found = []
    for name, field in model.model_fields.items():
        found.append((prefix + name, field.description))
        for sub in nested_models(field.annotation):
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


# -- every key of the settings model in the example file and in the reference ------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "cdcd.example.yaml"
ANY = "*"  # a mapping's own key: a table's name, a column's


@dataclass(frozen=True)
class Key:
    path: tuple[str, ...]  # as written in YAML, ANY where the mapping's keys are the user's
    section: str  # its section's title in docs/configuration.md, e.g. source.publications[]


def _keys(model: type[BaseModel], path: tuple[str, ...], section: str) -> Iterator[Key]:
    for name, field in model.model_fields.items():
        yield Key((*path, name), section)
        origin = typing.get_origin(field.annotation)
        for sub in nested_models(field.annotation):
            sub_path = (*path, name, ANY) if origin is dict else (*path, name)
            yield from _keys(sub, sub_path, f"{section}.{name}{'[]' * (origin is list)}".lstrip("."))


MODEL_KEYS = list(_keys(Settings, (), ""))
# a key, after an optional list dash, where the line starts (a commented-out key: after the "# " that hides it);
# or a list item that is a flow mapping, `- {name: public.orders}`
_KEY = re.compile(r"(?P<indent>\s*)(?P<dash>-\s+)?(?:(?P<key>[A-Za-z_][\w.]*):(?:\s|$)|(?={))(?P<rest>.*)")
_FLOW_KEY = re.compile(r"[{,]\s*([A-Za-z_][\w.]*):")


def _uncommented(line: str) -> str:
    """The line with the "# " that comments it out removed ("  # key: v" is the key at indent 2)."""
    stripped = line.lstrip()
    if not stripped.startswith("#"):
        return line
    indent = len(line) - len(stripped)
    return line[:indent] + stripped[1:].removeprefix(" ")


def _example_paths(text: str) -> set[tuple[str, ...]]:
    """The key paths the example holds, present or commented out; the keys of a flow mapping ({k: v}) too."""
    paths: set[tuple[str, ...]] = set()
    open_keys: list[tuple[int, str]] = []  # (indent, key) of the keys the next lines may nest in
    for line in text.splitlines():
        match = _KEY.fullmatch(_uncommented(line))
        if match is None:
            continue
        indent = len(match["indent"]) + len(match["dash"] or "")
        while open_keys and open_keys[-1][0] >= indent:
            open_keys.pop()
        path = tuple(key for _, key in open_keys)
        if match["key"] is not None:
            path = (*path, match["key"])
            paths.add(path)
            open_keys.append((indent, match["key"]))
        paths.update((*path, key) for key in _FLOW_KEY.findall(match["rest"]))
    return paths


def _holds(paths: set[tuple[str, ...]], key: Key) -> bool:
    return any(
        len(path) == len(key.path) and all(want in (ANY, got) for want, got in zip(key.path, path, strict=True))
        for path in paths
    )


def test_the_example_file_holds_every_key_present_or_commented_out() -> None:
    paths = _example_paths(EXAMPLE.read_text())
    missing = [".".join(key.path) for key in MODEL_KEYS if not _holds(paths, key)]
    assert not missing, f"config/cdcd.example.yaml lacks {missing} (as `key: value` or `# key: value`)"


def test_the_example_parses_and_runs_under_a_role_that_is_no_superuser() -> None:
    """The image's default configuration (Dockerfile): `cdcd run` takes it, and a publication of listed tables
    needs only their ownership when managed (all_tables and schemas need a superuser)."""
    settings = load_settings(EXAMPLE)
    assert settings.sink.run_kind() == "kafka"
    assert all(p.tables and not (p.all_tables or p.schemas) for p in settings.source.publications)


def test_the_reference_holds_every_key() -> None:
    rows: set[tuple[str, str]] = set()  # (section, key); a top-level section is a heading: ("", its name)
    section = ""
    for line in docs.DEFAULT_PATH.read_text().splitlines():
        if heading := re.fullmatch(r"#+ `(.+)`", line):
            section = heading[1]
            rows.add(("", section))
        elif row := re.match(r"\| `(\w+)` \|", line):
            rows.add((section, row[1]))
    missing = [".".join(key.path) for key in MODEL_KEYS if (key.section, key.path[-1]) not in rows]
    assert not missing, f"docs/configuration.md lacks {missing}: run python -m cdcd.docs"


def test_the_example_paths_follow_indentation_comments_and_flow_mappings() -> None:
    text = """\
source:
  dsn: x              # a comment: not a key
  publications:
    - name: cdcd
      tables:
        - {name: public.orders}
    # - name: other
    #   include_tables: ['a\\..*']
  # manage_publications: true
columns:
  tables: {}
  # tables:
  #   public.customers:
  #     mask:
  #       tax_id: {keep_last: 4}
"""
    assert _example_paths(text) == {
        ("source",),
        ("source", "dsn"),
        ("source", "publications"),
        ("source", "publications", "name"),
        ("source", "publications", "tables"),
        ("source", "publications", "tables", "name"),
        ("source", "publications", "include_tables"),
        ("source", "manage_publications"),
        ("columns",),
        ("columns", "tables"),
        ("columns", "tables", "public.customers"),
        ("columns", "tables", "public.customers", "mask"),
        ("columns", "tables", "public.customers", "mask", "tax_id"),
        ("columns", "tables", "public.customers", "mask", "tax_id", "keep_last"),
    }
    assert _holds(_example_paths(text), Key(("columns", "tables", ANY, "mask", ANY, "keep_last"), ""))
