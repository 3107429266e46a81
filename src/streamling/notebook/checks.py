"""What a definition cell checks on its own, when it runs, without a JVM.

The whole notebook pipeline goes through the same validation as ``--validate`` (so the messages
are the same), and the cell keeps the problems of *its* node: an unknown type, an unknown or
missing key, SQL that does not parse, ``from`` naming a sink. A reference to a node no cell has
defined yet is not an error here: cells may be written in any order and run top to bottom, so it
is only noted, and ``validate``/``show``/``run`` fail if it is still missing then. Problems of
other nodes were reported by their own cells; whole-pipeline ones (no sink yet, nodes without
consumers) are what an unfinished notebook looks like.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamling.errors import StreamlingError, ValidationError
from streamling.spec import parse_pipeline
from streamling.spec.pipeline import SECTIONS, Kind

#: How validation words a reference to a name no node has (``from``, SQL ``FROM``,
#: ``dynamic_table_check``): in a notebook, possibly a node of a later cell.
NOT_DEFINED_YET = ("which does not exist", "which is not a source or transform",
                   "but not defined in pipeline topology")

#: Whole-pipeline problems reported at a node's path without its name: a node nothing reads yet
#: is the latest cell of a notebook being written, not a mistake in it.
UNFINISHED = ("orphan_nodes",)


@dataclass
class CellCheck:
    """The cell's node: its problems, and its references to nodes not defined (yet)."""

    errors: list[StreamlingError] = field(default_factory=list)
    undefined: list[StreamlingError] = field(default_factory=list)


def check_node(yaml_text: str, kind: Kind, name: str) -> CellCheck:
    """Validate the notebook's pipeline (``yaml_text``) and keep what concerns node ``name``."""
    try:
        parse_pipeline(yaml_text, source="<notebook>")
    except ValidationError as exc:
        problems = exc.problems
    except StreamlingError as exc:
        problems = [exc]
    else:
        return CellCheck()
    section = next(s for s, k in SECTIONS.items() if k == kind)
    check = CellCheck()
    for problem in problems:
        if problem.code in UNFINISHED:
            continue
        path = problem.location.path if problem.location else ""
        # A node without a valid 'type' is reported at its own path, without a node name.
        if problem.node != name and not (problem.node is None and path == f"{section}.{name}"):
            continue
        if any(marker in problem.message for marker in NOT_DEFINED_YET):
            check.undefined.append(problem)
        else:
            check.errors.append(problem)
    return check
