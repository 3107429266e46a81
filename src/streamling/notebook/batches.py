"""What ``%streamling preview``, ``capture`` and ``debug`` hand back: the rows a node's upstream
nodes gave it, and a transform's output on a captured batch before and after its cell changed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class Capture:
    """The batch a transform saw: its upstream nodes' rows in one epoch, and its definition then."""

    node: str
    epoch: int | None
    inputs: dict[str, pa.Table]
    definition: dict[str, Any]
    origin: str  # "run" or "preview"


@dataclass
class DebugResult:
    """A transform re-run on a captured batch: the previous and the new definition's output."""

    node: str
    capture: Capture
    before: pa.Table | None
    after: pa.Table
    key: list[str] = field(default_factory=list)

    def changes(self) -> dict[str, Any]:
        """Columns added/removed and rows added/removed/changed (by primary key when there is one)."""
        after_cols = self.after.column_names
        before_cols = self.before.column_names if self.before is not None else []
        before_rows = self.before.to_pylist() if self.before is not None else []
        after_rows = self.after.to_pylist()
        out: dict[str, Any] = {
            "columns_added": [c for c in after_cols if c not in before_cols],
            "columns_removed": [c for c in before_cols if c not in after_cols],
            "rows_before": len(before_rows), "rows_after": len(after_rows),
        }
        key = [k for k in self.key if k in after_cols and k in before_cols]
        if key:
            old = {tuple(r[k] for k in key): r for r in before_rows}
            new = {tuple(r[k] for k in key): r for r in after_rows}
            out["rows_added"] = len(new.keys() - old.keys())
            out["rows_removed"] = len(old.keys() - new.keys())
            out["rows_changed"] = sum(1 for k in new.keys() & old.keys() if new[k] != old[k])
        else:
            def rows(items: list[dict[str, Any]]) -> Counter[str]:
                return Counter(repr(sorted(r.items())) for r in items)

            old_rows, new_rows = rows(before_rows), rows(after_rows)  # multisets: duplicates count
            out["rows_added"] = (new_rows - old_rows).total()
            out["rows_removed"] = (old_rows - new_rows).total()
            out["rows_changed"] = 0
        return out


@dataclass
class Preview:
    node: str
    inputs: dict[str, pa.Table]
    output: pa.Table | None
