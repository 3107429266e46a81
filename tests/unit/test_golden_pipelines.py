"""Golden pipelines: what a user sees for each invalid file, and that the valid ones load.

Each ``fixtures/pipelines/invalid/<name>.yaml`` has a ``<name>.expected`` holding one problem
headline per line, in the order they are reported. The expected files are written by hand: a
changed message must be read by a person before the golden file follows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamling.errors import StreamlingError, ValidationError
from streamling.spec import PipelineSpec, load_pipeline
from streamling.spec.sources import FileSourceOptions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pipelines"
INVALID = sorted((FIXTURES / "invalid").glob("*.yaml"))
VALID = sorted((FIXTURES / "valid").glob("*.yaml"))


def _headlines(name: str) -> list[str]:
    """Load ``name`` from the current directory and return every reported problem headline."""
    try:
        load_pipeline(name)
    except ValidationError as exc:
        return [p.headline() for p in exc.problems]
    except StreamlingError as exc:  # YAML syntax errors stop before validation
        return [exc.headline()]
    pytest.fail(f"{name} loaded without errors")


def test_every_invalid_pipeline_has_expected_messages() -> None:
    expected = {p.stem for p in (FIXTURES / "invalid").glob("*.expected")}
    pipelines = {p.stem for p in INVALID}
    assert pipelines == expected
    assert len(pipelines) >= 30


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_pipeline_messages(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Load by bare file name so messages that cite the file do not depend on the checkout path.
    monkeypatch.chdir(path.parent)
    expected = path.with_suffix(".expected").read_text(encoding="utf-8").splitlines()
    assert _headlines(path.name) == expected


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_pipeline_is_a_user_error(path: Path) -> None:
    with pytest.raises(StreamlingError) as info:
        load_pipeline(path)
    assert info.value.user
    problems = info.value.problems if isinstance(info.value, ValidationError) else [info.value]
    assert all(p.user and p.location is not None for p in problems)


def test_validation_error_summarises_all_problems() -> None:
    with pytest.raises(ValidationError) as info:
        load_pipeline(FIXTURES / "invalid" / "several_problems.yaml")
    text = str(info.value)
    assert text.startswith("pipeline is invalid (6 problems):\n")
    assert "  - print sink 'audit': 'from' names 'nowhere', which does not exist" in text


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_pipeline_loads(path: Path) -> None:
    spec = load_pipeline(path)
    assert spec.sources and spec.sinks
    assert {n.name for n in spec.topological()} == set(spec.nodes)


def _valid(name: str) -> PipelineSpec:
    return load_pipeline(FIXTURES / "valid" / f"{name}.yaml")


def test_dotted_node_names_resolve_in_sql() -> None:
    spec = _valid("dotted_names")
    assert spec.nodes["clean.transactions"].upstream == ["raw.transactions"]
    assert spec.nodes["flagged.transactions"].upstream == ["clean.transactions"]
    assert [n.name for n in spec.topological()] == [
        "raw.transactions", "clean.transactions", "flagged.transactions", "out",
    ]


def test_union_all_reads_both_sources() -> None:
    spec = _valid("union_all")
    assert spec.nodes["all_orders"].upstream == ["eu_orders", "us_orders"]
    assert [c.name for c in spec.consumers("all_orders")] == ["out"]


def test_definition_wrapper_paths_are_prefixed() -> None:
    spec = _valid("definition_wrapper")
    assert set(spec.nodes) == {"orders", "out"}
    assert spec.nodes["out"].path == "definition.sinks.out"
    assert spec.nodes["out"].line == 9


def test_composite_primary_key() -> None:
    spec = _valid("composite_primary_key")
    assert spec.nodes["transfers"].options.key_columns() == ["block_number", "log_index"]
    assert spec.nodes["table_out"].options.key_columns() == ["block_number", "log_index"]


def test_key_declared_only_on_the_source() -> None:
    spec = _valid("inherited_key")
    assert spec.nodes["orders"].options.key_columns() == ["id"]
    assert spec.nodes["big_orders"].options.primary_key is None
    assert spec.nodes["out"].upstream == ["big_orders"]


def test_bounded_file_source() -> None:
    options = _valid("file_bounded").nodes["history"].options
    assert isinstance(options, FileSourceOptions)
    assert options.mode.type == "bounded"
    assert options.telemetry is not None and options.telemetry.event_time is not None
    assert options.telemetry.labels == {"team": "analytics", "note": "tabs\tare allowed"}
    assert options.telemetry.event_time.unit == "seconds"


def test_cte_name_is_not_an_upstream_node() -> None:
    assert _valid("cte_and_from").nodes["priced"].upstream == ["orders"]
