"""DataFusion SQL → Spark SQL, one test per row of docs/sql-compatibility.md (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from streamling.errors import ValidationError
from streamling.functions import catalog
from streamling.spec import load_pipeline, sql_functions
from streamling.spec.sql import analyze_sql, expression_problems, rewrite_sql, spark_expression
from streamling.spec.sql_translate import accepted_function_names, spark_function_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql-compatibility.md"
TYPES = {"i": "bigint", "j": "bigint", "x": "double", "ts": "timestamp", "s": "string", "ms": "bigint"}


def spark(expression: str, columns: dict[str, str] | None = TYPES) -> str:
    return spark_expression(expression, columns)


def problems(expression: str) -> list[str]:
    return analyze_sql(f"SELECT {expression} AS v FROM t").problems


# --- syntax and operators -------------------------------------------------------------------------

@pytest.mark.parametrize(("datafusion", "spark_sql"), [
    ("\"status\" = 'x'", "`status` = 'x'"),
    ("'text'", "'text'"),
    ("`x.y`", "`x.y`"),
    ("x::int", "CAST(x AS INT)"),
    ("x::bigint", "CAST(x AS BIGINT)"),
    ("x::varchar", "CAST(x AS STRING)"),
    ("x::text", "CAST(x AS STRING)"),
    ("x::double", "CAST(x AS DOUBLE)"),
    ("x::float", "CAST(x AS FLOAT)"),
    ("x::decimal(10,2)", "CAST(x AS DECIMAL(10, 2))"),
    ("s::timestamp", "CAST(s AS TIMESTAMP)"),
    ("s::timestamptz", "CAST(s AS TIMESTAMP)"),
    ("s::bytea", "CAST(s AS BINARY)"),
    ("i / j", "i DIV j"),
    ("5 / 2", "5 DIV 2"),
    ("x / j", "x / j"),
    ("(i + 1) / j", "(i + 1) DIV j"),
    ("0.1 + 0.2", "CAST(0.1 AS DOUBLE) + CAST(0.2 AS DOUBLE)"),
    ("i % j", "i % j"),
    ("5 ^ 3", "5 ^ 3"),
    ("'a' || s", "'a' || s"),
    ("i IS DISTINCT FROM j", "i IS DISTINCT FROM j"),
    ("i IS NOT DISTINCT FROM j", "i IS NOT DISTINCT FROM j"),
    ("s ILIKE 'a%'", "s ILIKE 'a%'"),
    ("s LIKE 'a!_c' ESCAPE '!'", "s LIKE 'a!_c' ESCAPE '!'"),
    ("s ~ 'p'", "s RLIKE 'p'"),
    ("s ~* 'p'", "REGEXP_LIKE(s, CONCAT('(?i)', 'p'))"),
    ("s !~ 'p'", "NOT s RLIKE 'p'"),
    ("i > '100'", "i > '100'"),
    ("arr[1]", "TRY_ELEMENT_AT(arr, 1)"),
    ("m['k']", "m['k']"),
    ("CAST(ts AS BIGINT)", "CAST(UNIX_MICROS(ts) * 1000 AS BIGINT)"),
    ("CAST(i AS TIMESTAMP)", "TIMESTAMP_MICROS(i DIV 1000)"),
])
def test_syntax_and_operators(datafusion: str, spark_sql: str) -> None:
    assert spark(datafusion) == spark_sql


def test_without_types_integer_columns_keep_spark_division() -> None:
    # validation has no schema: only literals are known to be integers
    assert spark("i / j", None) == "i / j"


def test_unquoted_names_fold_and_quoted_keep_case() -> None:
    sql = rewrite_sql('SELECT Amount AS Total, "Mixed" FROM Orders', {"orders": "v"}, carry_gs_op=False)
    assert sql == "SELECT amount AS total, `Mixed` FROM v AS Orders"


def test_similar_to_is_rejected() -> None:
    assert problems("s SIMILAR TO 'a%'") == ["SIMILAR TO is not supported; use regexp_like(text, pattern)"]


def test_unnest_runs_as_explode_only_as_a_whole_column() -> None:
    assert rewrite_sql("SELECT id, unnest(arr) AS v FROM t", {"t": "v"}, carry_gs_op=False) == (
        "SELECT id, EXPLODE(arr) AS v FROM v AS t")
    assert problems("unnest(arr) + 1") == ["unnest() is supported only as a whole column of a SELECT list"]
    assert analyze_sql("SELECT unnest(a), unnest(b) FROM t").problems == [
        "only one unnest() per SELECT is supported on Spark"]


# --- functions ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("datafusion", "spark_sql"), [
    ("log(x)", "CASE WHEN x > 0 THEN LOG10(x) WHEN x = 0 THEN CAST('-Infinity' AS DOUBLE) "
               "WHEN x < 0 THEN CAST('NaN' AS DOUBLE) END"),
    ("ln(x)", "CASE WHEN x > 0 THEN LN(x) WHEN x = 0 THEN CAST('-Infinity' AS DOUBLE) "
              "WHEN x < 0 THEN CAST('NaN' AS DOUBLE) END"),
    ("log(2, x)", "LOG(2, x)"),
    ("trunc(x)", "CAST(IF(x < 0, CEIL(x, 0), FLOOR(x, 0)) AS DOUBLE)"),
    ("trunc(x, 2)", "CAST(IF(x < 0, CEIL(x, 2), FLOOR(x, 2)) AS DOUBLE)"),
    ("power(i, 2)", "CAST(POWER(i, 2) AS BIGINT)"),
    ("power(x, 2)", "POWER(x, 2)"),
    ("substr(s, 0, 3)", "SUBSTRING(s, GREATEST(0, 1), GREATEST((0) + 3 - GREATEST(0, 1), 0))"),
    ("substr(s, 2)", "SUBSTRING(s, GREATEST(2, 1))"),
    ("substring(s FROM 2 FOR 3)", "SUBSTRING(s, GREATEST(2, 1), GREATEST((2) + 3 - GREATEST(2, 1), 0))"),
    ("concat(s, NULL, 'b')", "CONCAT_WS('', s, NULL, 'b')"),
    ("strpos(s, 'b')", "INSTR(s, 'b')"),
    ("left(s, 2)", "LEFT(s, 2)"),
    ("left(s, i)", "IF(i < 0, SUBSTRING(s, 1, GREATEST(CHAR_LENGTH(s) + i, 0)), LEFT(s, i))"),
    ("right(s, -2)", "IF(-2 < 0, SUBSTRING(s, 1 - -2), RIGHT(s, -2))"),
    ("to_hex(i)", "LOWER(HEX(i))"),
    ("hex(i)", "LOWER(HEX(i))"),
    ("sha256(s)", "UNHEX(SHA2(s, 256))"),
    ("sha512(s)", "UNHEX(SHA2(s, 512))"),
    ("digest(s, 'md5')", "UNHEX(MD5(s))"),
    ("digest(s, 'sha384')", "UNHEX(SHA2(s, 384))"),
    ("ltrim(s, 'x')", "TRIM(LEADING 'x' FROM s)"),
    ("rtrim(s)", "RTRIM(s)"),
    ("date_part('dow', ts)", "DAYOFWEEK(ts) - 1"),
    ("extract(dow FROM ts)", "DAYOFWEEK(ts) - 1"),
    ("date_part('millisecond', ts)", "CAST(DATE_PART('SECOND', ts) * 1000 AS INT)"),
    ("date_part('epoch', ts)", "UNIX_MICROS(CAST(ts AS TIMESTAMP)) / CAST(1000000 AS DOUBLE)"),
    ("date_part('year', ts)", "YEAR(ts)"),
    ("EXTRACT(doy FROM ts)", "DAYOFYEAR(ts)"),
    ("to_timestamp(s)", "CAST(s AS TIMESTAMP)"),
    ("to_timestamp(s, '%d/%m/%Y %H:%M')", "TO_TIMESTAMP(s, 'dd/MM/yyyy HH:mm')"),
    ("to_timestamp(s, '%Y', '%d/%m/%Y')",
     "COALESCE(TRY_TO_TIMESTAMP(s, 'yyyy'), TRY_TO_TIMESTAMP(s, 'dd/MM/yyyy'))"),
    ("to_timestamp_millis(ms)", "TIMESTAMP_MILLIS(ms)"),
    ("to_timestamp_millis(s)", "DATE_TRUNC('MILLISECOND', CAST(s AS TIMESTAMP))"),
    ("to_timestamp_seconds(i)", "TIMESTAMP_SECONDS(i)"),
    ("to_timestamp_micros(i)", "TIMESTAMP_MICROS(i)"),
    ("to_timestamp_nanos(i)", "TIMESTAMP_MICROS(i DIV 1000)"),
    ("from_unixtime(i)", "TIMESTAMP_SECONDS(i)"),
    ("to_unixtime(ts)", "UNIX_SECONDS(CAST(ts AS TIMESTAMP))"),
    ("to_char(ts, '%Y-%m-%dT%H:%M:%S%.3f')", "DATE_FORMAT(ts, 'yyyy-MM-dd\\'T\\'HH:mm:ss.SSS')"),
    ("date_format(ts, '%F')", "DATE_FORMAT(ts, 'yyyy-MM-dd')"),
    ("to_date(i)", "DATE_FROM_UNIX_DATE(i)"),
    ("to_date(s)", "CAST(s AS DATE)"),
    ("regexp_like(s, 'a', 'i')", "REGEXP_LIKE(s, '(?i)a')"),
    ("regexp_match(s, '(a)(b)')",
     "IF(REGEXP_LIKE(s, '(a)(b)'), ARRAY(REGEXP_EXTRACT(s, '(a)(b)', 1), REGEXP_EXTRACT(s, '(a)(b)', 2)), NULL)"),
    ("array_length(arr)", "ARRAY_SIZE(arr)"),
    ("array_has(arr, 1)", "ARRAY_CONTAINS(arr, 1)"),
    ("make_array(1, 2)", "ARRAY(1, 2)"),
    ("array_position(arr, 1)", "NULLIF(ARRAY_POSITION(arr, 1), 0)"),
    ("array_slice(arr, 2, 3)", "SLICE(arr, 2, GREATEST(3 - 2 + 1, 0))"),
    ("array_prepend(1, arr)", "ARRAY_PREPEND(arr, 1)"),
    ("array_sort(arr)", "SORT_ARRAY(arr, TRUE)"),
    ("array_sort(arr, 'DESC')", "SORT_ARRAY(arr, FALSE)"),
    ("array_to_string(arr, ',')", "ARRAY_JOIN(arr, ',')"),
    ("string_to_array(s, '.')", "SPLIT(s, '\\\\.', -1)"),
    ("struct(i, s)", "NAMED_STRUCT('c0', i, 'c1', s)"),
    ("arrow_cast(i, 'Int32')", "CAST(i AS INT)"),
    ("arrow_cast(i, 'Decimal128(10, 2)')", "CAST(i AS DECIMAL(10, 2))"),
    ("now()", "CURRENT_TIMESTAMP()"),
    ("current_timestamp", "CURRENT_TIMESTAMP()"),
    ("random()", "RAND()"),
    ("today()", "CURRENT_DATE()"),
    ("datetrunc('day', ts)", "DATE_TRUNC('day', ts)"),
    ("datepart('hour', ts)", "HOUR(ts)"),
    ("starts_with(s, 'a')", "STARTSWITH(s, 'a')"),
    ("startswith(s, 'a')", "STARTSWITH(s, 'a')"),
    ("ends_with(s, 'a')", "ENDSWITH(s, 'a')"),
    ("endswith(s, 'a')", "ENDSWITH(s, 'a')"),
    ("lowercase(s)", "LOWER(s)"),
    ("uppercase(s)", "UPPER(s)"),
    ("charlength(s)", "CHAR_LENGTH(s)"),
    ("character_length(s)", "CHARACTER_LENGTH(s)"),
    ("octet_length(s)", "OCTET_LENGTH(s)"),
    ("substr_index(s, '.', 2)", "SUBSTRING_INDEX(s, '.', 2)"),
])
def test_function_translations(datafusion: str, spark_sql: str) -> None:
    assert spark(datafusion) == spark_sql


def test_arrow_typeof_names_arrow_types() -> None:
    out = spark("arrow_typeof(i)")
    assert "WHEN TYPEOF(i) = 'bigint' THEN 'Int64'" in out and "WHEN TYPEOF(i) = 'string' THEN 'Utf8'" in out


def test_regexp_aliases_mean_regexp_like() -> None:
    for alias in ("regexp", "similar"):
        assert spark(f"{alias}(s, '^a')") == "REGEXP_LIKE(s, '^a')"


def test_datafusion_regexp_replace_replaces_the_first_match_unless_g() -> None:
    # Streamling registers Flink's regexp_replace over this one; the catalogue's rewrite runs.
    build = sql_functions.BUILDERS["regexp_replace"].build
    lit = exp.Literal.string
    first = build([exp.column("s"), lit("b(.)"), lit("<\\1>")], lambda _e: None)
    assert first.sql(dialect="spark") == "REGEXP_REPLACE(s, '^(?s:(.*?))(?:b(.))', '$1<${2}>')"
    every = build([exp.column("s"), lit("b"), lit("$$"), lit("gi")], lambda _e: None)
    assert every.sql(dialect="spark") == "REGEXP_REPLACE(s, '(?i)b', '\\\\$\\\\$')"


def test_catalog_functions_come_first() -> None:
    if catalog.lookup("regexp_replace") is not None:
        assert problems("regexp_replace(s, 'a', 'b', 'g')") == ["regexp_replace takes 3 arguments, found 4"]
    own = catalog.lookup("_gs_byte_to_hex")
    assert own is not None and own.to_spark is not None
    assert spark("_gs_byte_to_hex(s)") == own.to_spark([exp.column("s")]).sql(dialect="spark")


def test_same_in_spark_functions_pass_through() -> None:
    for name, (low, _high) in sql_functions.SAME_IN_SPARK.items():
        if catalog.lookup(name) is not None:
            continue  # Streamling's own definition wins
        args = ", ".join(["i"] * low)
        assert spark(f"{name}({args})").lower() == f"{name}({args})"


def test_every_spark_name_we_emit_or_pass_exists_in_spark() -> None:
    names = spark_function_names()
    assert len(names) > 400  # the snapshot ships with the package
    assert set(sql_functions.SAME_IN_SPARK) <= names
    emitted = {"instr", "startswith", "endswith", "lower", "upper", "char_length", "hex", "unhex", "sha2",
               "rand", "log10", "log", "ceil", "floor", "substring", "greatest", "concat_ws", "date_format",
               "to_timestamp", "try_to_timestamp", "timestamp_seconds", "timestamp_millis", "timestamp_micros",
               "unix_seconds", "unix_micros", "date_from_unix_date", "dayofweek", "dayofyear", "weekofyear",
               "regexp_like", "regexp_extract", "regexp_replace", "array", "array_size", "array_contains",
               "arrays_overlap", "array_except", "try_element_at", "array_position", "slice", "array_prepend",
               "sort_array", "array_join", "split", "named_struct", "typeof", "explode", "array_remove",
               "date_trunc", "date_part", "current_date", "current_timestamp"}
    assert emitted <= names, emitted - names


# --- rejected -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("datafusion", "message"), [
    ("array_remove(arr, 1)", "array_remove() cannot run on Spark with DataFusion's meaning: DataFusion's "
                             "array_remove drops only the first match and Spark has no equivalent; "
                             "array_remove_all(array, value) drops every match"),
    ("array_distinct(arr)", "array_distinct() cannot run on Spark"),
    ("chr(65)", "chr() cannot run on Spark"),
    ("initcap(s)", "initcap() cannot run on Spark"),
    ("encode(s, 'hex')", "encode() cannot run on Spark"),
    ("decode(s, 'hex')", "decode() cannot run on Spark"),
    ("date_bin(INTERVAL '1 hour', ts)", "date_bin() cannot run on Spark"),
    ("blake3(s)", "blake3() cannot run on Spark"),
    ("make_map('a', 1)", "make_map() cannot run on Spark"),
    ("digest(s, 'blake3')", "digest(): digest algorithm 'blake3' has no Spark equivalent"),
    ("regexp_like(s, 'a', 'U')", "regexp_like(): regular expression flag(s) 'U' have no Spark equivalent"),
    ("regexp_match(s, p)", "regexp_match(): regexp_match's pattern must be a string literal"),
    ("to_char(ts, '%Q')", "to_char(): format specifier '%Q' has no Spark equivalent"),
    ("arrow_cast(i, 'Float16')", "arrow_cast(): arrow_cast to 'Float16' has no Spark equivalent"),
    ("date_part('isodow', ts)", "date_part(): date part 'isodow' is not supported"),
    ("from_unixtime(i, 'UTC')", "from_unixtime(): from_unixtime with a time zone has no Spark equivalent"),
    ("foo(s)", "unknown function foo() (did you mean 'floor'?)"),
    ("sha2(s, 256)", "unknown function sha2() (Spark's sha2 is not part of Streamling SQL) "
                     "(did you mean 'sha512', 'sha256', 'sha224'?)"),
    ("upper(s, s)", "upper takes 1 argument, found 2"),
    ("substr(s)", "substr takes 2 to 3 arguments, found 1"),
])
def test_unfaithful_constructs_fail_validation(datafusion: str, message: str) -> None:
    found = problems(datafusion)
    assert len(found) == 1 and found[0].startswith(message), found


def test_problems_come_in_sql_order() -> None:
    assert analyze_sql("SELECT foo(a), bar(b) FROM t").problems[0].startswith("unknown function foo()")


def test_did_you_mean_lists_accepted_names() -> None:
    names = accepted_function_names()
    assert "dynamic_table_check" in names and "to_timestamp_millis" in names and "_gs_byte_to_hex" in names


def test_window_and_aggregate_calls_are_reported_as_such_only() -> None:
    assert analyze_sql("SELECT row_number() OVER (ORDER BY id) AS rn FROM t").problems == [
        "window functions (OVER …) are not supported in a stateless transform"]


def test_kafka_filter_is_read_as_datafusion() -> None:
    assert spark_expression("\"status\" = 'x' AND i / 2 = 1", {"i": "bigint"}) == "`status` = 'x' AND i DIV 2 = 1"
    assert expression_problems("foo(x) > 1") == ["unknown function foo() (did you mean 'floor'?)"]
    assert expression_problems("a >")[0].startswith("does not parse")
    assert expression_problems("SELECT 1") == ["must be an expression over the row's columns, not a query"]


def test_dynamic_table_sql_and_transform_sql_are_both_checked(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "sources:\n  orders: {type: generate, rows: 5, primary_key: id}\n"
        "transforms:\n"
        "  t: {type: sql, primary_key: id, sql: \"SELECT id, sha2(name, 256) AS h FROM orders\"}\n"
        "sinks:\n  out: {type: blackhole, from: t}\n", encoding="utf-8")
    with pytest.raises(ValidationError) as info:
        load_pipeline(path)
    assert "sql transform 't': unknown function sha2()" in str(info.value)


def test_the_doc_lists_every_function_we_translate() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [n for n in ("log", "trunc", "substr", "regexp_match", "array_position", "arrow_cast", "to_char",
                           "from_unixtime", "to_unixtime", "array_remove", "date_bin") if f"`{n}" not in text]
    assert missing == []


def test_translated_sql_parses_as_spark() -> None:
    sql = rewrite_sql("SELECT \"Status\", log(x), arr[1], to_char(ts, '%Y') FROM t", {"t": "v"})
    assert sqlglot.parse_one(sql, read="spark") is not None


@pytest.mark.parametrize(("datafusion", "spark_sql"), [
    ("to_unixtime(ts) / 60", "UNIX_SECONDS(CAST(ts AS TIMESTAMP)) DIV 60"),
    ("extract(year FROM ts) / 10", "YEAR(ts) DIV 10"),
    ("character_length(s) / 2", "CHARACTER_LENGTH(s) DIV 2"),
    ("date_part('epoch', ts) / 10", "UNIX_MICROS(CAST(ts AS TIMESTAMP)) / CAST(1000000 AS DOUBLE) / 10"),
])
def test_integer_results_of_functions_divide_as_integers(datafusion: str, spark_sql: str) -> None:
    assert spark(datafusion) == spark_sql


def test_kafka_source_filter_is_validated_as_datafusion(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text(
        "sources:\n  orders: {type: kafka, topic: orders, data_format: json, schema: {id: int64, status: string},"
        " filter: \"starts_with(\\\"status\\\", 'x') AND sha2(status, 256) IS NOT NULL\"}\n"
        "sinks:\n  out: {type: blackhole, from: orders}\n", encoding="utf-8")
    with pytest.raises(ValidationError) as info:
        load_pipeline(path)
    assert [p.headline() for p in info.value.problems] == [
        "kafka source 'orders': filter: unknown function sha2() (Spark's sha2 is not part of Streamling SQL) "
        "(did you mean 'sha512', 'sha256', 'sha224'?) [sources.orders.filter (line 2)]"]


def test_current_time_says_why_it_cannot_run() -> None:
    from streamling.spec.sql import analyze_sql

    assert analyze_sql("SELECT current_time() AS t FROM s").problems == [
        "current_time() cannot run on Spark with DataFusion's meaning: a time-of-day type is not enabled on Spark "
        "here; use date_format(now(), 'HH:mm:ss.SSSSSS') for text, or now() for a timestamp"]
