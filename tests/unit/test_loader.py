"""YAML loading: every key and list item remembers its line, so problems can cite it."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamling.errors import StreamlingError, ValidationError
from streamling.spec import parse_pipeline
from streamling.spec.loader import load_yaml_file, parse_yaml

PIPELINE = """\
# A comment and a blank line do not shift the numbering.

sources:
  orders: {type: generate, rows: 10}
transforms:
  clean:
    type: sql
    sql: |
      SELECT id
      FROM orders
sinks:
  out:
    type: print
    from:
      - clean
      - orders
"""


def test_values_are_plain_data() -> None:
    doc = parse_yaml(PIPELINE)
    assert doc.data == {
        "sources": {"orders": {"type": "generate", "rows": 10}},
        "transforms": {"clean": {"type": "sql", "sql": "SELECT id\nFROM orders\n"}},
        "sinks": {"out": {"type": "print", "from": ["clean", "orders"]}},
    }


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("sources", 3),
        ("sources.orders", 4),
        ("sources.orders.rows", 4),  # flow mappings: every key is on the same line
        ("transforms.clean", 6),
        ("transforms.clean.sql", 8),  # a block scalar is cited at its key
        ("sinks.out.from", 14),
        ("sinks.out.from.0", 15),
        ("sinks.out.from.1", 16),
    ],
)
def test_every_key_and_item_has_its_line(path: str, line: int) -> None:
    assert parse_yaml(PIPELINE).line(path) == line


def test_missing_path_falls_back_to_the_nearest_ancestor() -> None:
    doc = parse_yaml(PIPELINE)
    assert doc.line("sinks.out.table") == 12
    assert doc.line("sinks.out.from.1.extra") == 16
    assert doc.line("nowhere.at.all") is None


def test_location_renders_path_and_line() -> None:
    doc = parse_yaml(PIPELINE)
    assert str(doc.location("sinks.out.type")) == "sinks.out.type (line 13)"
    assert str(doc.location("")) == "<root>"
    assert str(doc.location("nowhere")) == "nowhere"


def test_scalars_keep_their_yaml_types() -> None:
    doc = parse_yaml("a: 1\nb: 1.5\nc: true\nd: null\ne: '1'\nf: 2024-01-02T03:04:05\n7: seven\n")
    assert doc.data["a"] == 1 and doc.data["b"] == 1.5 and doc.data["c"] is True and doc.data["d"] is None
    assert doc.data["e"] == "1"
    assert str(doc.data["f"]) == "2024-01-02 03:04:05"
    assert doc.data[7] == "seven" and doc.line("7") == 7


def test_anchors_and_aliases_are_expanded() -> None:
    doc = parse_yaml("base: &b {type: print}\nout: *b\n")
    assert doc.data["out"] == {"type": "print"}


def test_empty_document_is_none() -> None:
    assert parse_yaml("# nothing here\n").data is None


# --- the definition: wrapper ----------------------------------------------------------------------

WRAPPED = """\
definition:
  sources:
    orders:
      type: generate
      rows: 10
  sinks:
    out:
      type: print
      from: orders
"""


def test_definition_wrapper_lines_and_paths() -> None:
    doc = parse_yaml(WRAPPED)
    assert doc.line("definition.sinks.out.from") == 9
    spec = parse_pipeline(WRAPPED)
    assert [(n.name, n.path, n.line) for n in spec.topological()] == [
        ("orders", "definition.sources.orders", 3),
        ("out", "definition.sinks.out", 7),
    ]


def test_definition_wrapper_prefixes_problem_paths() -> None:
    text = WRAPPED.replace("rows: 10", "rows: 10\n      colour: red").replace("from: orders", "from: order")
    with pytest.raises(ValidationError) as info:
        parse_pipeline(text)
    assert [str(p.location) for p in info.value.problems] == [
        "definition.sources.orders.colour (line 6)",
        "definition.sinks.out.from (line 10)",
    ]


def test_definition_wrapper_without_sections_is_reported_under_definition() -> None:
    with pytest.raises(ValidationError) as info:
        parse_pipeline("definition:\n  - sources\n")
    (problem,) = info.value.problems
    assert problem.headline() == (
        "a pipeline must be a mapping with 'sources', 'transforms' and 'sinks'; found a list "
        "[definition (line 1)]"
    )


# --- syntax errors --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("sources:\n  orders:\n    type: generate\n      rows: 10\n",
         "p.yaml is not valid YAML: mapping values are not allowed here at column 11", 4),
        ("sources: [a, b\n",
         "p.yaml is not valid YAML: expected ',' or ']', but got '<stream end>' at column 1 "
         "(while parsing a flow sequence started on line 1)", 2),
        ('sql: "SELECT 1\n\nsinks: {}\n',
         "p.yaml is not valid YAML: found unexpected end of stream at column 1 "
         "(while scanning a quoted scalar started on line 1)", 4),
        ("sources: {}\n---\nsinks: {}\n",
         "p.yaml is not valid YAML: expected a single document in the stream, but found another document "
         "at column 1", 2),
        ("sources:\n\t- a\n",
         "p.yaml is not valid YAML: found character '\\t' that cannot start any token at column 1", 2),
        ("sources:\n  orders: !Ref other\n",
         "p.yaml is not valid YAML: could not determine a constructor for the tag '!Ref' at column 11", 2),
    ],
)
def test_syntax_error_names_line_and_column(text: str, message: str, line: int) -> None:
    with pytest.raises(StreamlingError) as info:
        parse_yaml(text, source="p.yaml")
    err = info.value
    assert not isinstance(err, ValidationError)
    assert err.message == message
    assert err.location is not None and (err.location.path, err.location.line) == ("<root>", line)
    assert err.code == "yaml_syntax" and err.user
    assert err.hint == "fix the indentation or quoting at that line"
    assert err.__cause__ is not None  # the parser's own report is kept for --debug


# --- files ----------------------------------------------------------------------------------------

def test_load_file_uses_the_path_as_source(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE, encoding="utf-8")
    doc = load_yaml_file(path)
    assert doc.source == str(path)
    assert doc.line("sinks.out") == 12


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(StreamlingError) as info:
        load_yaml_file(path)
    assert info.value.headline() == (
        f"pipeline file {path} does not exist — pass a pipeline file or set pipeline_definition_location"
    )
    assert info.value.code == "pipeline_missing"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(StreamlingError) as info:
        load_yaml_file(tmp_path)
    assert info.value.headline().startswith(f"cannot read pipeline file {tmp_path}: ")
    assert info.value.code == "pipeline_unreadable"


def test_duplicate_key_is_an_error() -> None:
    text = "sources:\n  orders: {type: generate, rows: 10}\n  orders: {type: generate, rows: 20}\n"
    try:
        parse_yaml(text, source="p.yaml")
    except StreamlingError as exc:
        assert exc.location is not None and exc.location.line == 3
        return
    raise AssertionError("the duplicate 'orders' was accepted")


def test_a_transform_with_only_sql_is_a_sql_transform_as_in_streamling() -> None:
    spec = parse_pipeline("sources: {orders: {type: generate, rows: 10}}\n"
                          "transforms: {stringify: {sql: 'SELECT CAST(id AS STRING) AS id FROM orders'}}\n"
                          "sinks: {out: {type: print, from: stringify}}\n")
    node = spec.nodes["stringify"]
    assert node.node_type.name == "sql" and node.options.sql.startswith("SELECT CAST")
    with pytest.raises(ValidationError, match="transform 'odd' has no 'type'"):
        parse_pipeline("sources: {orders: {type: generate, rows: 10}}\ntransforms: {odd: {from: orders}}\n"
                       "sinks: {out: {type: print, from: odd}}\n")


def test_merge_keys_take_mappings_and_keep_the_keys_set_beside_them() -> None:
    doc = parse_yaml("base: &b {a: 1, b: {x: 2}}\nmore: &m {a: 9, c: 3}\njob:\n  <<: [*b, *m]\n  b: {y: 5}\n")
    assert doc.data["job"] == {"a": 1, "c": 3, "b": {"y": 5}}  # set beside wins; the first merged wins
    assert doc.lines["job.a"] == 4 and doc.lines["job.b"] == 5
    with pytest.raises(StreamlingError) as info:
        parse_yaml("n: &n 3\njob:\n  <<: *n\n")
    assert info.value.code == "yaml_merge" and info.value.location is not None
    assert info.value.location.line == 3
    assert info.value.headline().startswith("a merge key (<<) takes a mapping or a list of mappings")
