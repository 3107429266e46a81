"""ClickHouse plumbing shared by the source, the hybrid source and the sink.

Everything talks to ClickHouse's HTTP interface through clickhouse-connect, as against ClickHouse
Cloud: ``connect`` builds a client from a ``clickhouse_source``/``clickhouse_sink`` section,
``is_transient`` tells an outage or an overloaded server (worth another attempt) from an error in
the query, the schema or the credentials, and ``error`` words a failure for a node. Nothing here
retries: callers raise ``StreamlingError(retriable=…)`` and the flow retries with one policy.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from streamling.errors import StreamlingError, first_line

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from streamling.config.sections import ClickHouseConnection

# Server error codes worth another attempt: timeouts, overload, network trouble, too many parts
# (merges catch up), a replica or keeper away.
_TRANSIENT_CODES = frozenset({159, 160, 164, 202, 203, 209, 210, 241, 242, 252, 285, 319, 425, 999, 1000})
_AUTH_CODES = frozenset({192, 193, 194, 195, 516})
_CODE = re.compile(r"Code:\s*(\d+)")


def connect(conn: ClickHouseConnection, *, compression: str | None = None, settings: dict[str, Any] | None = None,
            send_receive_timeout: int = 300) -> Client:
    """A clickhouse-connect client for ``conn`` (its URL names scheme, host and port).

    ``compression`` is the transport compression (``none``, ``gzip``, ``zstd``, ``lz4``): inserts are
    sent compressed and responses are asked for compressed. The client itself retries nothing."""
    import clickhouse_connect

    url = urlsplit(conn.url)
    secure = url.scheme == "https"
    compress: bool | str = False if compression in (None, "none") else str(compression)
    return clickhouse_connect.get_client(
        host=url.hostname or "localhost", port=url.port or (8443 if secure else 8123), interface=url.scheme,
        username=conn.user, password=conn.password or "", database=conn.database, secure=secure,
        compress=compress, query_retries=0, connect_timeout=10, send_receive_timeout=send_receive_timeout,
        settings=settings or {}, autogenerate_session_id=False)


def error_code(exc: BaseException) -> int | None:
    """ClickHouse's numeric error code of a server error, if the failure came from the server."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    match = _CODE.search(str(exc))
    return int(match.group(1)) if match else None


def is_transient(exc: BaseException) -> bool:
    """True when the same request may succeed later (connection refused or reset, timeout, server
    overloaded); False for bad SQL, unknown tables or columns, type errors and refused credentials."""
    from clickhouse_connect.driver import exceptions as ch

    code = error_code(exc)
    if code is not None:
        return code in _TRANSIENT_CODES
    if isinstance(exc, ch.OperationalError | ch.StreamFailureError | ConnectionError | TimeoutError | OSError):
        return True
    return False


def is_authentication_failure(exc: BaseException) -> bool:
    return error_code(exc) in _AUTH_CODES


def server_message(exc: BaseException) -> str:
    """The server's message without clickhouse-connect's wrapper lines and the stack trace: its
    ``Code: N. …`` part cut before ``(version …``, then read as any error's first line is."""
    text = str(exc)
    match = re.search(r"Code:\s*\d+\..*", text)
    if match:
        text = match.group(0)
    return first_line(re.split(r"\s*\(version [\d.]+", text)[0]) or type(exc).__name__


def error(node_kind: str, node: str, doing: str, exc: BaseException, conn: ClickHouseConnection) -> StreamlingError:
    """``<kind> '<node>': <doing> at <url> failed: <message>``, retriable when the failure is transient."""
    message = server_message(exc)
    if conn.password:
        message = message.replace(conn.password, "***")
    transient = is_transient(exc)
    if is_authentication_failure(exc):
        hint = "check the user and password (STREAMLING__CLICKHOUSE_…__USER / __PASSWORD)"
    elif transient:
        hint = f"check that ClickHouse answers at {conn.url}; while a pipeline runs, such failures are retried"
    else:
        hint = None
    return StreamlingError(f"{doing} at {conn.url} failed: {message}", node=node, node_kind=node_kind,
                           retriable=transient, code="clickhouse_transient" if transient else "clickhouse_failed",
                           hint=hint)


def quote_identifier(name: str) -> str:
    """A ClickHouse identifier in back quotes (``db.table`` is split and quoted part by part)."""
    return ".".join("`" + part.replace("\\", "\\\\").replace("`", "\\`") + "`" for part in name.split("."))


def quote_literal(value: Any) -> str:
    """A SQL literal for a sort-key value read back from ClickHouse (number or text)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def split_table(name: str, default_database: str) -> tuple[str, str]:
    """``db.table`` or ``table`` → (database, table)."""
    if "." in name:
        db, _, table = name.partition(".")
        return db, table
    return default_database, name


def sorting_key(client: Client, database: str, table: str) -> list[str]:
    """The table's sorting key columns (``ORDER BY``), as ``system.tables`` reports them."""
    result = client.query("SELECT sorting_key FROM system.tables WHERE database = {db:String} AND name = {t:String}",
                          parameters={"db": database, "t": table})
    if not result.result_rows:
        raise LookupError(f"table {database}.{table} does not exist")
    text = str(result.result_rows[0][0] or "")
    return [part.strip().strip("`") for part in text.split(",") if part.strip()]


__all__ = ["connect", "error", "error_code", "first_line", "is_authentication_failure", "is_transient",
           "quote_identifier", "quote_literal", "sorting_key", "split_table"]
