"""The shape docs/architecture.md describes, checked on the source: no import cycles inside cdcd/, the pure
stages never reach psycopg or confluent-kafka (not even through another module), no module imports both, and
the Kafka sink holds no Debezium rules."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "cdcd"
EDGES = ("psycopg", "confluent_kafka")
# Sans-I/O: bytes and values in, events out. Each may use the others, never the network libraries.
PURE = (
    "cdcd.pgoutput",
    "cdcd.pgtypes",
    "cdcd.assembly",
    "cdcd.batches",
    "cdcd.filters",
    "cdcd.plan",
    "cdcd.shaping",
    "cdcd.avro",
    "cdcd.ledger",
    "cdcd.replication.core",
    "cdcd.snapshot.runner",
    "cdcd.snapshot.window",
    "cdcd.snapshot.control",
    "cdcd.snapshot.signals",
    "cdcd.snapshot.notifications",
    "cdcd.snapshot.copy",
    "cdcd.snapshot.xids",
    "cdcd.snapshot.ranges",
    "cdcd.snapshot.parallel",
    "cdcd.source.protocol",
    "cdcd.rowstage",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The statements under ``if TYPE_CHECKING:``: imports for annotations, which never run."""
    return {
        node
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }


def _imported(path: Path, name: str, typing: bool = False) -> Iterator[str]:
    """The modules ``name`` imports; type-only ones (``TYPE_CHECKING``) too only with ``typing``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if typing else _type_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield base
            yield from (f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)


@cache
def imports(name: str) -> frozenset[str]:
    """What ``name`` imports when it runs (anywhere in it, also inside functions; not the type-only imports):
    cdcd modules, and the top-level name of others. Importing ``a.b.c`` also runs ``a`` and ``a.b``."""
    out: set[str] = set()
    for target in _imported(MODULES[name], name):
        if target.startswith("cdcd"):
            parts = target.split(".")
            out.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in MODULES)
        else:
            out.add(target.split(".")[0])
    out.discard(name)
    return frozenset(out)


def reachable(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for target in imports(todo.pop()):
            if target not in seen:
                seen.add(target)
                if target in MODULES:
                    todo.append(target)
    return seen


def stage(name: str) -> str:
    """The stage a module belongs to: ``cdcd.<package or module>``."""
    return ".".join(name.split(".")[:2])


def cycles(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for start in edges:
        stack, seen = [(start, [start])], set()
        while stack:
            current, path = stack.pop()
            for target in edges.get(current, set()):
                if target == start:
                    found.append(" -> ".join([*path, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    return found


def test_no_import_cycles_between_modules() -> None:
    # A package importing its own submodules (its __init__ re-exporting them) is not a cycle.
    edges = {
        name: {t for t in imports(name) if t in MODULES and not name.startswith(t + ".") and t != "cdcd"}
        for name in MODULES
        if name != "cdcd"
    }
    assert cycles(edges) == []


def test_no_import_cycles_between_stages() -> None:
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        if name != "cdcd":
            targets = {stage(t) for t in imports(name) if t in MODULES and t != "cdcd"}
            edges.setdefault(stage(name), set()).update(targets - {stage(name)})
    assert cycles(edges) == []


@pytest.mark.parametrize("stage", PURE)
def test_pure_stages_never_reach_the_network_libraries(stage: str) -> None:
    modules = [m for m in MODULES if m == stage or m.startswith(stage + ".")]
    assert modules
    for module in modules:
        assert not reachable(module) & set(EDGES), f"{module} reaches {sorted(reachable(module) & set(EDGES))}"


def test_no_module_imports_both_psycopg_and_confluent_kafka() -> None:
    both = [name for name in MODULES if set(EDGES) <= imports(name)]
    assert both == []
    assert "psycopg" in imports("cdcd.source.walsender")  # the check sees real imports
    assert "confluent_kafka" in imports("cdcd.sink.transport")


KAFKA_SINK = ("cdcd.sink.kafka", "cdcd.sink.transport", "cdcd.sink.delivery", "cdcd.sink.transactional")


@pytest.mark.parametrize("module", KAFKA_SINK)
def test_the_kafka_sink_is_transport_only(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):  # the code only: docstrings may say where the rules went
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            body.pop(0)
    source = ast.unparse(tree)
    rules = ("__debezium", "BEGIN", "'d'", "'c'", "'t'", "'r'", "key_changed", "encode_value", "TxInfo", "OP_CODES")
    for rule in rules:
        assert rule not in source, f"{module} mentions {rule}: Debezium rules belong in cdcd/shaping.py"


def _classes(module: str) -> list[ast.ClassDef]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def test_exactly_once_is_a_strategy_the_kafka_sink_holds_not_a_subclass() -> None:
    """Delivery strategies stand on their own (``sink/delivery.py``'s interface); nothing in the sink package
    extends the Kafka sink or asks an object what it happens to have (``hasattr``)."""
    sink_modules = [m for m in MODULES if m.startswith("cdcd.sink.")]
    for module in sink_modules:
        bases = {ast.unparse(base) for cls in _classes(module) for base in cls.bases}
        assert not bases & {"KafkaSink", "KafkaTransport"}, f"{module} subclasses {bases}"
        assert "hasattr(" not in MODULES[module].read_text(encoding="utf-8"), module
    names = {cls.name for cls in _classes("cdcd.sink.transactional")}
    assert "ExactlyOnceDelivery" in names
    assert "cdcd.sink.kafka" not in imports("cdcd.sink.transactional")


def test_the_transport_knows_neither_the_registry_nor_how_delivery_is_counted() -> None:
    """Producing and acknowledging (``sink/transport.py``) is apart from schema ids and topics
    (``sink/registry.py``) and from the delivery strategies; the registry waits through an interface."""
    transport = imports("cdcd.sink.transport")
    assert not transport & {"cdcd.sink.registry", "cdcd.sink.delivery", "cdcd.sink.transactional", "cdcd.sink.kafka"}
    assert "cdcd.sink.transport" not in imports("cdcd.sink.registry")
    assert "confluent_kafka" in transport  # the check sees real imports


def test_the_kafka_checks_are_with_the_checks_not_in_the_sink() -> None:
    checks = {node.name for node in ast.walk(ast.parse(MODULES["cdcd.sink.checks"].read_text(encoding="utf-8")))
              if isinstance(node, ast.FunctionDef)}  # fmt: skip
    assert {"check_kafka", "check_compatibility"} <= checks
    for module in KAFKA_SINK:
        assert "cdcd.sink.checks" not in imports(module)
        assert "def check_" not in MODULES[module].read_text(encoding="utf-8"), module


# The row stage (cdcd/rowstage/) chooses between the compiled module and the Python specification; the stages
# it is built on take what it hands them and never ask which one runs.
SPECIFICATION = ("cdcd.pgoutput", "cdcd.assembly", "cdcd.batches", "cdcd.avro", "cdcd.snapshot.copy")


def _every_name(path: Path) -> set[str]:
    """Every module or name ``path`` imports, type-only imports too (``from a import b``: ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_only_the_row_stage_imports_the_compiled_module() -> None:
    compiled = {"cdcd._native", "cdcd.native"}
    outside = {
        name: sorted(targets)
        for name, path in MODULES.items()
        if stage(name) != "cdcd.rowstage" and (targets := _every_name(path) & compiled)
    }
    assert outside == {}
    assert "cdcd._native" in _every_name(MODULES["cdcd.rowstage.compiled"])  # the check sees real imports
    assert "cdcd.native" not in MODULES  # the choice is cdcd.rowstage's


@pytest.mark.parametrize("spec", SPECIFICATION)
def test_the_specification_does_not_run_the_row_stage(spec: str) -> None:
    modules = [m for m in MODULES if m == spec or m.startswith(spec + ".")]
    assert modules
    for module in modules:
        assert not {t for t in reachable(module) if stage(t) == "cdcd.rowstage"}, module
