"""The ``postgres`` sink's partition writer: what runs in a Spark task (or, without
``parallelism``, on the driver) to write one partition of an epoch.

Plain data built once on the driver (``Statements``, ``Marks``) is shipped with it, so a writer
needs no sink and no Spark session: it dedups and orders its rows in Arrow, copies them into a
staging table in one ``COPY`` and applies them in one transaction, and reports how it went as one
result row (``RESULT_DDL``) instead of raising, so Spark never retries it behind the flow's back.
See ``streamling.sinks.postgres`` for the semantics.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamling.runtime.nodes import GS_OP

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

    from streamling.postgres import PoolSettings, PostgresPool

NODE_KIND = "postgres sink"  # how the sink and its writers name themselves (errors, pool descriptions)
DELETE_COL = "_stl_del"
ROUND_COL = "_stl_round"
SEQ_COL = "_stl_seq"  # the epoch's row order, carried through the shuffle to the writers
STAGES_ATTR = "_stl_stages"  # temp tables created on a connection (they live as long as it does)


@dataclass
class Statements:
    """SQL for one column set, built once on the driver and shipped to every writer."""

    stage: str
    create_stage: str
    copy_stage: str
    copy_target: str
    insert: str
    delete: str
    # The common epoch (inserts and updates only, one row per key) skips the op and round columns.
    plain: str = ""
    create_plain: str = ""
    copy_plain: str = ""
    insert_plain: str = ""


@dataclass(frozen=True)
class Marks:
    """Where a keyless writer records the partitions of an epoch it wrote (replay protection)."""

    check: str
    check_legacy: str  # "" unless the table of the one-row-per-sink marks of earlier versions exists
    mark: str
    args: tuple[str, str, str]  # sink token, sink, target table
    epoch_id: int


#: One row per partition writer: what it wrote and, instead of an exception, how it failed.
RESULT_DDL = ("partition int, received long, upserts long, deletes long, skipped_deletes long, replayed boolean, "
              "attempts long, error_kind string, sqlstate string, detail string")


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one Spark partition of an epoch in one transaction and yields one result row.

    Called by ``mapInArrow`` on the executors. It never raises into Spark (Spark would retry the
    task behind the flow's back, multiplying an outage's attempts): a failure is classified here
    with ``streamling.postgres`` and reported, and the driver raises it once, naming the node."""

    node: str
    key: tuple[str, ...]
    names: tuple[str, ...]
    deduplicate: bool
    first_wins: bool
    statements: Statements
    conninfo: str
    target: str
    pool_settings: PoolSettings
    secret: str | None
    marks: Marks | None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get()
        part = task.partitionId() if task is not None else 0
        chunks = [b for b in batches if b.num_rows]
        result = self.write(pa.Table.from_batches(chunks) if chunks else None, part)
        yield pa.RecordBatch.from_pylist([result], schema=_result_schema())

    def write(self, table: pa.Table | None, part: int, pool: PostgresPool | None = None) -> dict[str, Any]:
        """Write one partition's rows; the result row (an empty partition connects to nothing).
        ``pool``: the driver's own when it is the writer; executors take their process's pool."""
        from streamling.postgres import connect_attempts, shared_pool

        result: dict[str, Any] = {"partition": part, "received": 0, "upserts": 0, "deletes": 0,
                                  "skipped_deletes": 0, "replayed": False, "attempts": 0, "error_kind": None,
                                  "sqlstate": None, "detail": None}
        if table is None or table.num_rows == 0:
            return result
        result["received"] = table.num_rows
        before = connect_attempts(self.target)
        try:
            payload, stats = self._shape(table)
            result.update(upserts=stats["upserts"], deletes=stats["deletes"], skipped_deletes=stats["skipped"])
            pool = pool or shared_pool(self.conninfo, target=self.target, describe=f"{NODE_KIND} '{self.node}'",
                                       application_name=f"streamling:{self.node}", settings=self.pool_settings)
            with pool.connection() as conn:
                result["replayed"] = not self._write(conn, payload, stats, part)
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises it once
            result.update(zip(("error_kind", "sqlstate", "detail"), classify(exc, self.secret), strict=True))
        finally:
            result["attempts"] = connect_attempts(self.target) - before
        return result

    def _shape(self, table: pa.Table) -> tuple[bytes, dict[str, int]]:
        """Restore the epoch's order, dedup (last row per key wins; the first with ``on_conflict:
        nothing``), assign rounds, and render the COPY payload.

        With ``deduplicate: false`` a key can appear several times; its rows are then applied in
        order, one *round* per occurrence, so the result matches row-by-row application.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv

        if SEQ_COL in table.column_names:  # the shuffle may interleave the epoch's upstream partitions
            table = table.take(pc.sort_indices(table.column(SEQ_COL))).drop_columns([SEQ_COL])
        deletes, table = _split_ops(table)
        key = list(self.key)
        n = table.num_rows
        skipped = 0
        rounds = np.zeros(n, dtype=np.int32)
        # One key column whose values are already distinct (the common epoch) needs no grouping.
        unique = len(key) == 1 and pc.count_distinct(table.column(key[0]), mode="all").as_py() == n
        if key and not unique:
            idx = pa.array(np.arange(n, dtype=np.int64))
            keyed = pa.table([table.column(k) for k in key] + [idx], names=[*key, "__i"])
            last = keyed.group_by(key, use_threads=False).aggregate([("__i", "max")])
            if last.num_rows != n:
                if self.first_wins:
                    take, rounds = _first_wins(table, deletes, key)
                    table, deletes = table.take(pa.array(take)), pc.take(deletes, pa.array(take))
                    n = table.num_rows
                elif self.deduplicate:
                    keep = pc.sort_indices(last.column("__i_max"))
                    take = pc.take(last.column("__i_max"), keep)
                    table, deletes = table.take(take), pc.take(deletes, take)
                    n = table.num_rows
                    rounds = np.zeros(n, dtype=np.int32)
                else:
                    seen: dict[tuple[Any, ...], int] = {}
                    keys = zip(*(table.column(k).to_pylist() for k in key), strict=True)
                    for i, k in enumerate(keys):
                        rounds[i] = seen.get(k, 0)
                        seen[k] = rounds[i] + 1
        elif not key and pc.any(deletes).as_py():
            skipped = int(pc.sum(deletes).as_py() or 0)
            keep_mask = pc.invert(deletes)
            table, deletes = table.filter(keep_mask), pc.filter(deletes, keep_mask)
        n_del = int(pc.sum(deletes).as_py() or 0)
        n_rounds = int(rounds.max()) + 1 if n else 0
        plain = bool(key) and n_del == 0 and n_rounds == 1
        shaped = table.select(list(self.names))
        if key and not plain:
            shaped = shaped.append_column(DELETE_COL, deletes).append_column(ROUND_COL, pa.array(rounds))
        buf = io.BytesIO()
        pacsv.write_csv(shaped, buf, pacsv.WriteOptions(include_header=False))
        stats = {"upserts": table.num_rows - n_del, "deletes": n_del, "rounds": n_rounds, "plain": int(plain),
                 "skipped": skipped}
        return buf.getvalue(), stats

    def _write(self, conn: psycopg.Connection[Any], payload: bytes, stats: dict[str, int], part: int) -> bool:
        """One transaction; False when a keyless partition of this epoch was already written."""
        st = self.statements
        stages: set[str] = getattr(conn, STAGES_ATTR, set())
        stage = ""
        with conn.cursor() as cur:
            if not self.key:
                if self.marks is not None and self._already_written(cur, self.marks, part):
                    conn.rollback()
                    return False
                if stats["upserts"]:
                    with cur.copy(st.copy_target) as copy:
                        copy.write(payload)
                if self.marks is not None:
                    cur.execute(self.marks.mark, (*self.marks.args, part, self.marks.epoch_id))
            elif stats.get("plain"):
                stage = st.plain
                if stage not in stages:
                    cur.execute(st.create_plain)
                with cur.copy(st.copy_plain) as copy:
                    copy.write(payload)
                cur.execute(st.insert_plain)
            else:
                stage = st.stage
                if stage not in stages:
                    cur.execute(st.create_stage)
                with cur.copy(st.copy_stage) as copy:
                    copy.write(payload)
                for r in range(stats["rounds"]):
                    if stats["deletes"]:
                        cur.execute(st.delete, (r,))
                    if stats["upserts"]:
                        cur.execute(st.insert, (r,))
        conn.commit()
        if stage:
            stages.add(stage)
            setattr(conn, STAGES_ATTR, stages)
        return True

    @staticmethod
    def _already_written(cur: psycopg.Cursor[Any], marks: Marks, part: int) -> bool:
        """Keyless inserts are not idempotent: each partition remembers the last epoch it wrote
        (a whole epoch recorded by an earlier version counts for every partition)."""
        cur.execute(marks.check, (*marks.args, part))
        row = cur.fetchone()
        if row is not None and row[0] >= marks.epoch_id:
            return True
        if marks.check_legacy:
            cur.execute(marks.check_legacy, marks.args)
            row = cur.fetchone()
            return row is not None and row[0] >= marks.epoch_id
        return False


def _result_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("partition", pa.int32()), ("received", pa.int64()), ("upserts", pa.int64()),
                      ("deletes", pa.int64()), ("skipped_deletes", pa.int64()), ("replayed", pa.bool_()),
                      ("attempts", pa.int64()), ("error_kind", pa.string()), ("sqlstate", pa.string()),
                      ("detail", pa.string())])


def classify(exc: BaseException, secret: str | None) -> tuple[str, str | None, str]:
    """How a writer failed, as plain values the driver turns into the sink's error: ``auth``,
    ``transient``, ``rejected`` (Postgres refused the data or the statement) or ``internal``
    (``internal_transient`` when worth another attempt); the SQLSTATE; the masked first line."""
    import psycopg

    from streamling.errors import is_retriable
    from streamling.postgres import first_line, is_authentication_failure, is_transient, mask

    detail = mask(first_line(exc), [secret])
    state = getattr(exc, "sqlstate", None)
    if is_authentication_failure(exc):
        kind = "auth"
    elif isinstance(exc, psycopg.Error):
        kind = "transient" if is_transient(exc) else "rejected"
    else:
        kind = "internal_transient" if is_retriable(exc) else "internal"
        detail = f"{type(exc).__name__}: {detail}"
    return kind, state, detail


def _split_ops(table: pa.Table) -> tuple[pa.Array, pa.Table]:
    """A boolean delete mask from ``_gs_op`` (``d``, any case) and the table without it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if GS_OP not in table.column_names:
        return pa.array(np.zeros(table.num_rows, dtype=bool)), table
    ops = table.column(GS_OP)
    if not pa.types.is_string(ops.type) and not pa.types.is_large_string(ops.type):
        ops = ops.cast(pa.string())
    mask = pc.fill_null(pc.equal(pc.utf8_lower(pc.utf8_trim_whitespace(ops)), "d"), False)
    return mask.combine_chunks(), table.drop_columns([GS_OP])


def _first_wins(table: pa.Table, deletes: pa.Array, key: list[str]) -> tuple[Any, Any]:
    """Rows to keep and their rounds under ``on_conflict: nothing``: the first row of a key in the
    epoch wins (later versions would hit ``DO NOTHING`` row by row). A delete resets the key, so
    per key at most its last delete (round 0) and the first upsert after it (round 1) remain."""
    import numpy as np

    flags = deletes.to_pylist()
    chosen: dict[tuple[Any, ...], list[int]] = {}
    keys = zip(*(table.column(k).to_pylist() for k in key), strict=True)
    for i, k in enumerate(keys):
        kept = chosen.get(k)
        if flags[i] or kept is None:
            chosen[k] = [i]
        elif len(kept) == 1 and flags[kept[0]]:
            kept.append(i)
    pairs = sorted((i, r) for kept in chosen.values() for r, i in enumerate(kept))
    take = np.fromiter((i for i, _ in pairs), dtype=np.int64, count=len(pairs))
    rounds = np.fromiter((r for _, r in pairs), dtype=np.int32, count=len(pairs))
    return take, rounds
