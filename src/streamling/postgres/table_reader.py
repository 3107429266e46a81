"""Reading back a table a Postgres sink wrote: the latest rows, for the notebook's ``display``.

Shared by the ``postgres`` sink (its table) and ``postgres_aggregate`` (its aggregate table); the
connections come from this package's pool with the sink's own settings, the SQL from ``psycopg.sql``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamling.util import json_safe

if TYPE_CHECKING:
    from streamling.config.sections import PostgresSinkSettings
    from streamling.postgres.pool import PostgresPool


def _arrow(names: list[str], rows: list[tuple[Any, ...]]) -> pa.Table:
    """Rows from a database cursor as Arrow; a column Arrow cannot type (mixed JSON) becomes text."""
    arrays = []
    for i in range(len(names)):
        values = [row[i] for row in rows]
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowException, TypeError, ValueError):
            arrays.append(pa.array([None if v is None else str(json_safe(v)) for v in values], pa.string()))
    return pa.Table.from_arrays(arrays, names=names)


class PostgresTableReader:
    """``schema.table`` of a sink named ``node``, highest key first (``key`` is asked at each read:
    a sink learns its key when it opens)."""

    def __init__(self, node: str, settings: PostgresSinkSettings, target: str, schema: str, table: str,
                 key: Callable[[], list[str]]) -> None:
        self.node = node
        self.settings = settings
        self.target = target
        self.schema, self.table = schema, table
        self.key = key
        self.where = f'"{schema}"."{table}" on {target}'
        self._pool: PostgresPool | None = None

    @property
    def caption(self) -> str:
        keys = self.key()
        order = (f"the highest primary key ({', '.join(keys)}) first" if keys
                 else "as stored (no primary key to order by)")
        return f"rows of table {self.where}, {order}; queried after each committed epoch"

    def read(self, limit: int) -> tuple[pa.Table, list[str]]:
        from psycopg import sql

        keys = self.key()
        order: sql.Composable = sql.SQL("")
        if keys:
            order = sql.SQL(" ORDER BY ") + sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(k))
                                                                for k in keys)
        query = sql.SQL("SELECT * FROM {}{} LIMIT %s").format(sql.Identifier(self.schema, self.table), order)
        with self._connections().connection() as conn, conn.cursor() as cur:
            cur.execute(query, (limit,))
            description = cur.description or []
            rows = cur.fetchall()
            # The declared types (bigint, numeric(12,2)), not the wire names psycopg knows (int8, numeric).
            cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                        "%s::regclass AND attnum > 0 AND NOT attisdropped",
                        (sql.Identifier(self.schema, self.table).as_string(conn),))
            declared = dict(cur.fetchall())
        names = [c.name for c in description]
        return _arrow(names, rows), [declared.get(c.name, c.type_display) for c in description]

    def _connections(self) -> PostgresPool:
        if self._pool is None:
            from streamling.postgres.pool import PoolSettings, PostgresPool

            self._pool = PostgresPool(self.settings.conninfo(), target=self.target,
                                      describe=f"display of '{self.node}'",
                                      application_name=f"streamling:display:{self.node}",
                                      settings=PoolSettings.from_sink(self.settings), autocommit=True)
        return self._pool

    def error_text(self, exc: BaseException) -> str:
        from streamling.errors import first_line
        from streamling.postgres.errors import mask

        return f"querying {self.where} failed: {mask(first_line(exc), [self.settings.pass_])}"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
