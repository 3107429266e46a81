"""The flow's one retry loop (attempt count, give-up context, stop requests) and the shared
Postgres failure classification, without Spark or a server."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

from streamling.config.sections import RetrySettings
from streamling.errors import StreamlingError
from streamling.postgres import StatementBoundExceeded, is_authentication_failure, is_transient, mask
from streamling.runtime.retry import STOPPED, call_with_retry, clear_stop, request_stop

FAST = RetrySettings(max_attempts=4, initial_backoff_ms=1, max_backoff_ms=2)


@pytest.fixture(autouse=True)
def _no_stop() -> None:
    clear_stop()


def test_transient_errors_are_retried_up_to_the_policy_then_raised_with_context() -> None:
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        raise StreamlingError("cannot connect", node="db", node_kind="postgres sink", retriable=True)

    with pytest.raises(StreamlingError) as info:
        call_with_retry(down, FAST, "writing epoch 3")
    assert len(calls) == 4 and "gave up after 4 attempts" in str(info.value)


def test_terminal_errors_fail_on_the_first_attempt_and_success_returns() -> None:
    calls: list[int] = []

    def bad() -> None:
        calls.append(1)
        raise StreamlingError("constraint violated", retriable=False)

    with pytest.raises(StreamlingError, match="constraint violated"):
        call_with_retry(bad, FAST, "writing")
    assert len(calls) == 1
    results = iter([ConnectionRefusedError(), "ok"])

    def flaky() -> str:
        value = next(results)
        if isinstance(value, BaseException):
            raise value
        return value

    assert call_with_retry(flaky, FAST, "writing") == "ok"


def test_a_stop_request_interrupts_the_backoff_and_names_the_node() -> None:
    slow = RetrySettings(max_attempts=10, initial_backoff_ms=30_000, max_backoff_ms=30_000)

    def down() -> None:
        raise StreamlingError("cannot connect", node="db", node_kind="postgres sink", retriable=True)

    threading.Timer(0.2, request_stop).start()
    started = time.monotonic()
    with pytest.raises(StreamlingError) as info:
        call_with_retry(down, slow, "writing epoch 1")
    assert time.monotonic() - started < 5
    assert info.value.code == STOPPED and info.value.node == "db"
    assert isinstance(info.value.__cause__, StreamlingError)


@pytest.mark.parametrize(("exc", "transient"), [
    (pg_errors.AdminShutdown("terminating connection"), True),  # 57P01
    (pg_errors.QueryCanceled("statement timeout"), True),  # 57014
    (pg_errors.SerializationFailure("retry"), True),  # 40001
    (pg_errors.ReadOnlySqlTransaction("read-only after failover"), True),  # 25006
    (pg_errors.TooManyConnections("too many clients"), True),  # 53300
    (pg_errors.UniqueViolation("duplicate key"), False),  # 23505
    (pg_errors.NotNullViolation("null value"), False),  # 23502
    (pg_errors.UndefinedTable("no such table"), False),  # 42P01
    (psycopg.OperationalError("connection refused"), True),
    (psycopg.OperationalError('password authentication failed for user "x"'), False),
    (psycopg.OperationalError('database "nope" does not exist'), False),
    (StatementBoundExceeded("did not complete within 2 s"), True),
    (ConnectionResetError(), True),
    (ValueError("bad"), False),
])
def test_postgres_failures_are_classified_once_for_every_user(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@pytest.mark.parametrize(("exc", "auth"), [
    (psycopg.OperationalError('connection failed: FATAL:  password authentication failed for user "x"'), True),
    (pg_errors.InvalidPassword("wrong"), True),
    (pg_errors.InvalidAuthorizationSpecification("no such role"), True),
    (pg_errors.NotNullViolation("null in name"), False),
    (psycopg.OperationalError("connection refused"), False),
])
def test_refused_logins_are_told_apart_from_data_errors(exc: BaseException, auth: bool) -> None:
    assert is_authentication_failure(exc) is auth


def test_secrets_are_masked() -> None:
    text = "connection to 'host=db password=s3cr3t user=u' failed: s3cr3t rejected"
    assert mask(text, ["s3cr3t"]) == "connection to 'host=db password=*** user=u' failed: *** rejected"
    assert "hunter2" not in mask("password='hunter2' host=x")


def test_first_line_is_what_a_person_reads_of_any_error() -> None:
    from streamling.errors import first_line

    assert first_line(RuntimeError("\n  boom\n\tat x")) == "boom"
    assert first_line(ConnectionResetError()) == "ConnectionResetError"  # no message: never an IndexError
    assert first_line("") == "" and first_line("one\ntwo") == "one"


def test_clickhouse_and_sql_errors_read_their_first_line_through_the_one_helper() -> None:
    from streamling.clickhouse import server_message
    from streamling.spec.sql import _parse_error_text

    wrapped = RuntimeError("HTTPDriver for http://ch:8123 received ClickHouse error code 60\n"
                           " Code: 60. DB::Exception: Table default.t does not exist. (UNKNOWN_TABLE) (version 24.3)\n"
                           "\tat frame")
    assert server_message(wrapped) == "Code: 60. DB::Exception: Table default.t does not exist. (UNKNOWN_TABLE)"
    assert server_message(OSError()) == "OSError"
    assert _parse_error_text(ValueError(""), "SELECT") == "ValueError"  # no message: never an IndexError
    assert _parse_error_text(ValueError("bad\nmore"), "SELECT") == "bad"
