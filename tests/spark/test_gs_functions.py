"""Streamling's SQL functions on Spark: each call rewritten by the catalogue (expression kind) or
renamed to its registered Arrow UDF (udf kind), run through ``spark.sql`` on a small view.

Few queries with many columns each: one Spark job checks dozens of functions.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from streamling.functions import catalog

pytestmark = pytest.mark.spark


Arg = str | tuple  # Spark SQL text, or a nested (function, arg…) call


def rewrite(name: str, *args: Arg) -> exp.Expression:
    """``name(args…)`` as the translator will emit it (nested calls first)."""
    function = catalog.lookup(name)
    assert function is not None, name
    assert function.arity_problem(len(args)) is None
    trees = [rewrite(*a) if isinstance(a, tuple) else sqlglot.parse_one(a, read="spark") for a in args]
    if function.to_spark is not None:
        return function.to_spark(trees)
    assert function.udf_name is not None
    return exp.Anonymous(this=function.udf_name, expressions=trees)


def translate(name: str, *args: Arg) -> str:
    return rewrite(name, *args).sql(dialect="spark")


def select(spark: Any, columns: dict[str, tuple[Arg, ...]], view: str = "t") -> list[dict[str, Any]]:
    """One query: column alias → (function, arg SQL…); rows in id order."""
    items = ", ".join(f"{translate(*call)} AS {alias}" for alias, call in columns.items())
    return [r.asDict(recursive=True) for r in spark.sql(f"SELECT {items} FROM {view} ORDER BY id").collect()]


@pytest.fixture(scope="module")
def view(spark: Any) -> str:
    catalog.register_udfs(spark)  # as an SQL transform does before its query; a second call is a no-op
    spark.sql("""
        SELECT * FROM VALUES
          (1, 'a b  c', 'a.b..c', 'FF', '16', '10', 'Hello', '0x0A0b', 1, 5, 2, 'a.b.c'),
          (2, NULL,     '',       'zz', '16', '10', NULL,    '0XFF',   5, 1, -2, NULL),
          (3, '',       'x',      '-1010_1', '2', '16', '',  NULL,     1, 1, NULL, 'x')
        AS t(id, words, dotted, num, src, dst, text, hexed, lo, hi, step, path)
    """).createOrReplaceTempView("t")
    return "t"


def test_gs_functions_expressed_in_spark(spark: Any, view: str) -> None:
    rows = select(spark, {
        "words": ("_gs_split_string_to_array", "words"),
        "dots": ("_gs_split_string_to_array", "dotted", "'.'"),
        "dots_col": ("_gs_split_string_to_array", "dotted", "substr(path, 2, 1)"),
        "chars": ("_gs_split_string_to_array", "'ab'", "''"),
        "series": ("_gs_generate_series", "lo", "hi"),
        "stepped": ("_gs_generate_series", "lo", "hi", "step"),
        "hex_bytes": ("_gs_hex_to_byte", "hexed"),
        "bad_hex": ("_gs_hex_to_byte", "'0x123'"),
        "back_hex": ("_gs_byte_to_hex", "unhex('0A0B')"),
        "json_num": ("json_string", "id"),
        "json_text": ("json_string", "text"),
        "json_list": ("json_string", "array(id, lo)"),
        "reversed": ("reverse_bytes32", "unhex('0102ff')"),
        "first": ("coalesce_meta", "text", "words", "'none'"),
        "same_list": ("to_large_list", "array(1, 2)"),
        "entries": ("_gs_map_to_array_struct", "map('k', text)"),
    }, view)
    assert [r["words"] for r in rows] == [["a", "b", "", "c"], None, [""]]
    assert [r["dots"] for r in rows] == [["a", "b", "", "c"], [""], ["x"]]
    assert rows[0]["dots_col"] == ["a", "b", "", "c"]
    assert rows[0]["chars"] == ["", "a", "b", ""]
    assert [r["series"] for r in rows] == [[1, 2, 3, 4, 5], [], [1]]
    assert [r["stepped"] for r in rows] == [[1, 3, 5], [5, 3, 1], [1]]
    assert [r["hex_bytes"] for r in rows] == [b"\x0a\x0b", b"\xff", b""]
    assert rows[0]["bad_hex"] == b""
    assert rows[0]["back_hex"] == "0a0b"
    assert [r["json_num"] for r in rows] == ["1", "2", "3"]
    assert [r["json_text"] for r in rows] == ['"Hello"', None, '""']
    assert rows[0]["json_list"] == "[1,1]"
    assert rows[0]["reversed"] == b"\xff\x02\x01"
    assert [r["first"] for r in rows] == ["Hello", "none", ""]
    assert rows[0]["same_list"] == [1, 2]
    assert rows[0]["entries"] == [{"key": "k", "value": "Hello"}]


def test_struct_list_helpers(spark: Any, view: str) -> None:
    items = "array(named_struct('k', 'a', 'n', 1), CAST(NULL AS STRUCT<k: STRING, n: INT>), " \
            "named_struct('k', CAST(NULL AS STRING), 'n', 2), named_struct('k', 'a', 'n', 3))"
    rows = select(spark, {
        "zipped": ("_gs_zip_arrays", "array(1, 2)", "array('x', 'y')", "array(true, false)"),
        "zip_null": ("_gs_zip_arrays", "array(1)", "CAST(NULL AS ARRAY<INT>)"),
        "numbered": ("array_enumerate", "array('x', 'y')"),
        "matches": ("array_filter", items, "'k'", "'a'"),
        "null_matches": ("array_filter", items, "'k'", "NULL"),
        "first_match": ("array_filter_first", items, "'n'", "3"),
        "no_match": ("array_filter_first", items, "'k'", "'zzz'"),
        "in_list": ("array_filter_in", items, "'n'", "array(2, 3)"),
        "keys": ("array_struct_field", items, "'k'"),
    }, view)
    row = rows[0]
    assert row["zipped"] == [{"f0": 1, "f1": "x", "f2": True}, {"f0": 2, "f1": "y", "f2": False}]
    assert row["zip_null"] == []
    assert row["numbered"] == [{"index": 0, "value": "x"}, {"index": 1, "value": "y"}]
    assert [m["n"] for m in row["matches"]] == [1, 3]
    assert [m["n"] for m in row["null_matches"]] == [2]
    assert row["first_match"] == {"k": "a", "n": 3}
    assert row["no_match"] is None
    assert [m["n"] for m in row["in_list"]] == [2, 3]
    assert row["keys"] == ["a", None, None, "a"]


def test_gs_udfs(spark: Any, view: str) -> None:
    rows = select(spark, {
        "conv": ("_gs_conv_base", "num", "src", "dst"),
        "xx": ("_gs_xxhash", "text"),
        "keccak": ("_gs_keccak256", "hexed"),
        "b58": ("_gs_to_base58", "CAST(text AS BINARY)"),
        "unb58": ("_gs_from_base58", "'9Ajdvzr'"),
        "tuples": ("_gs_json_objects_to_clickhouse_tuples",
                   "'[{\"a\": \"x\", \"b\": 1}, {\"b\": null}]'", "array('a', 'b')"),
        "uid": ("uuid7",),
    }, view)
    assert [r["conv"] for r in rows] == ["255", None, "-15"]
    assert rows[0]["xx"] is not None and len(rows[0]["xx"]) == 32 and rows[1]["xx"] is None
    assert rows[0]["keccak"] == "0x" + __import__("Crypto.Hash.keccak", fromlist=["new"]).new(
        digest_bits=256, data=b"\x0a\x0b").hexdigest()
    assert rows[1]["keccak"] is not None and rows[2]["keccak"] is None
    assert [r["b58"] for r in rows] == ["9Ajdvzr", None, ""]
    assert rows[0]["unb58"] == b"Hello"
    assert rows[0]["tuples"] == "[('x', 1), (null, null)]"
    uids = [r["uid"] for r in rows]
    assert len(set(uids)) == 3 and all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                                    r"[0-9a-f]{12}", u) for u in uids)


def test_u256_and_i256(spark: Any, view: str) -> None:
    big = str(2**255)
    u, i = (lambda a: ("to_u256", a)), (lambda a: ("to_i256", a))
    rows = select(spark, {
        "sum": ("u256_add", u(f"'{big}'"), u("id")),
        "product": ("u256_mul", u("'1000000000000000000'"), u("'1000000000000000000'")),
        "quotient": ("i256_div", i("'-7'"), i("2")),
        "remainder": ("i256_mod", i("'-7'"), i("2")),
        "text": ("u256_to_string", u("unhex(repeat('00', 31) || '2a')")),
        "neg": ("i256_neg", i("id")),
        "as_long": ("to_int64", i("'18446744073709551615'")),
    }, view)
    assert rows[0]["sum"] == str(2**255 + 1)
    assert rows[0]["product"] == "1" + "0" * 36
    assert (rows[0]["quotient"], rows[0]["remainder"]) == ("-3", "-1")
    assert rows[0]["text"] == "42"
    assert [r["neg"] for r in rows] == ["-1", "-2", "-3"]
    assert rows[0]["as_long"] == -1
    failing: list[tuple[Arg, ...]] = [
        ("u256_sub", u("'1'"), u("'2'")), ("u256_div", u("id"), u("0")), ("to_u256", "-id"),
        ("u256_mul", u(f"'{big}'"), u("2")), ("u256_add", u("id"), u("CAST(NULL AS STRING)"))]
    for call in failing:
        with pytest.raises(Exception, match="(?i)u256"):
            spark.sql(f"SELECT {translate(*call)} FROM t").collect()


def test_flink_string_functions(spark: Any, view: str) -> None:
    rows = select(spark, {
        "extract": ("regexp_extract", "'foo123bar'", "'([a-z]+)(\\\\d+)'", "2"),
        "whole": ("regexp_extract", "'foo123bar'", "'\\\\d+'"),
        "bad_group": ("regexp_extract", "'foo123'", "'(\\\\d+)'", "5"),
        "no_match": ("regexp_extract", "dotted", "'q'"),
        "all": ("regexp_extract_all", "'a1b22'", "'([a-z])(\\\\d+)'"),
        "substr": ("regexp_substr", "'ab12cd'", "'\\\\d+'"),
        "count": ("regexp_count", "'aaaa'", "'aa'"),
        "instr_re": ("regexp_instr", "'ab12cd34'", "'\\\\d+'", "1", "2"),
        "replaced": ("regexp_replace", "'a1b2'", "'\\\\d'", "'$1\\\\'"),
        "located": ("locate", "'b'", "'abcb'", "3"),
        "located_null": ("locate", "'b'", "'abcb'", "CAST(NULL AS INT)"),
        "instr2": ("instr", "'abcb'", "'b'"),
        "instr_back": ("instr", "'CORPORATE FLOOR'", "'OR'", "-3", "2"),
        "instr_occ0": ("instr", "'abc'", "'b'", "1", "0"),
        "binary": ("bin", "42"),
        "elt_ok": ("elt", "2", "'x'", "'y'"),
        "elt_out": ("elt", "3", "'x'", "'y'"),
        "host": ("parse_url", "'http://u@example.com:8080/p/q?k=v#frag'", "'HOST'"),
        "query_key": ("parse_url", "'http://example.com/p?k=v&z=1'", "'QUERY'", "'z'"),
        "bad_url": ("parse_url", "'http://exa mple.com/p q'", "'HOST'"),
        "split_kept": ("split", "'a,,b,'", "','"),
        "split_chars": ("split", "'abc'", "''"),
        "split_regexy": ("split", "'a|b'", "'|'"),
        "token": ("split_index", "'a,b,c'", "','", "1"),
        "token_out": ("split_index", "'a,b,c'", "','", "7"),
        "translated": ("translate", "'cat'", "'at'", "'o'"),
        "translated3": ("translate3", "'cat'", "'at'", "'o'"),
        "unhexed": ("unhex", "'F'"),
        "unhex_bad": ("unhex", "'zz'"),
        "encoded": ("url_encode", "'a b&c'"),
        "decoded": ("url_decode", "'a+b%26c'"),
        "decode_bad": ("url_decode", "'%zz'"),
        "lower": ("lowercase", "'AbC'"),
        "starts": ("startswith", "'abc'", "'ab'"),
        "like": ("similar", "'abc'", "'^a.c$'"),
        "chars": ("charlength", "'héllo'"),
        "hexed": ("hex", "255"),
    }, view)
    r = rows[0]
    assert (r["extract"], r["whole"], r["bad_group"], r["no_match"]) == ("123", "123", None, None)
    assert r["all"] == ["a", "b"]
    assert (r["substr"], r["count"], r["instr_re"]) == ("12", 2, 7)
    assert r["replaced"] == "a$1\\b$1\\"
    assert (r["located"], r["located_null"], r["instr2"]) == (4, None, 2)
    assert (r["instr_back"], r["instr_occ0"]) == (2, None)
    assert (r["binary"], r["elt_ok"], r["elt_out"]) == ("101010", "y", None)
    assert (r["host"], r["query_key"], r["bad_url"]) == ("example.com", "1", None)
    assert (r["split_kept"], r["split_chars"], r["split_regexy"]) == (["a", "", "b", ""], ["a", "b", "c"],
                                                                        ["a", "b"])
    assert (r["token"], r["token_out"]) == ("b", None)
    assert (r["translated"], r["translated3"]) == ("co", "co")
    assert (r["unhexed"], r["unhex_bad"]) == (b"\x0f", None)
    assert (r["encoded"], r["decoded"], r["decode_bad"]) == ("a+b%26c", "a b&c", None)
    assert (r["lower"], r["starts"], r["like"], r["chars"], r["hexed"]) == ("abc", True, True, 5, "ff")


def test_flink_json_functions(spark: Any, view: str) -> None:
    doc = "'{\"a\": {\"b\": [10, {\"c\": \"x\"}]}, \"s\": \"t/é\", \"n\": null}'"
    rows = select(spark, {
        "quoted": ("json_quote", "'a/é\"'"),
        "unquoted": ("json_unquote", "'\"a\\\\nb\"'"),
        "exists": ("json_exists", doc, "'$.a.b[1].c'"),
        "missing": ("json_exists", doc, "'$.a.z'"),
        "invalid_unknown": ("json_exists", "'{'", "'$'", "'UNKNOWN'"),
        "array": ("json_array", "1", "'x'", "NULL", "'{\"k\": 1}'"),
        "array_absent": ("json_array_absent_on_null", "1", "NULL"),
        "empty_array": ("json_array",),
        "object": ("json_object", "'k'", "id", "'o'", "'[1, 2]'", "'z'", "NULL"),
        "object_absent": ("json_object_absent_on_null", "'k'", "NULL"),
        "compact": ("json", "' { \"a\" : [1, 2] } '"),
        "blank": ("json", "'  '"),
        "query": ("json_query", doc, "'$.a.b'"),
        "query_scalar": ("json_query", doc, "'$.s'"),
        "query_wrapped": ("json_query", doc, "'$.s'", "'STRING'", "'CONDITIONAL_ARRAY'"),
        "value": ("json_value", doc, "'$.a.b[1].c'"),
        "value_int": ("json_value", doc, "'$.a.b[0]'", "'INT'"),
        "value_default": ("json_value", doc, "'$.nope'", "'STRING'", "'DEFAULT'", "'dflt'"),
        "value_object": ("json_value", doc, "'$.a'"),
        "parsed": ("try_parse_json", "'{\"a\":1}'"),
        "not_parsed": ("try_parse_json", "'{'"),
        "is_obj": ("is_json", "'{}'", "'OBJECT'"),
        "is_scalar": ("is_json", "'[1]'", "'SCALAR'"),
        "is_null": ("is_json", "CAST(NULL AS STRING)"),
    }, view)
    r = rows[0]
    assert r["quoted"] == '"a\\/\\u00e9\\""'
    assert r["unquoted"] == "a\nb"
    assert (r["exists"], r["missing"], r["invalid_unknown"]) == (True, False, None)
    assert r["array"] == '[1,"x",null,{"k":1}]'
    assert (r["array_absent"], r["empty_array"]) == ("[1]", "[]")
    assert r["object"] == '{"k":1,"o":[1,2],"z":null}'
    assert r["object_absent"] == "{}"
    assert (r["compact"], r["blank"]) == ('{"a":[1,2]}', None)
    assert (r["query"], r["query_scalar"], r["query_wrapped"]) == ('[10,{"c":"x"}]', None, '["t/é"]')
    assert (r["value"], r["value_int"], r["value_default"], r["value_object"]) == ("x", 10, "dflt", None)
    assert (r["parsed"], r["not_parsed"]) == ('{"a":1}', None)
    assert (r["is_obj"], r["is_scalar"], r["is_null"]) == (True, False, False)


def test_pipeline_sql_reaches_the_functions(runner: Any, tmp_path: Any, read_delta: Any) -> None:
    """Through the translator and the session's registered UDFs, as a pipeline writes them."""
    out = tmp_path / "out"
    runner.run(f"""
        sources:
          orders: {{type: generate, rows: 6, rows_per_batch: 3, primary_key: id}}
        transforms:
          shaped:
            type: sql
            sql: >-
              SELECT id, _gs_split_string_to_array(customer, '-') AS parts,
                     _GS_XXHASH(customer) AS hashed, uuid7() AS uid,
                     u256_to_string(u256_add(to_u256(id), to_u256('1'))) AS next_id
              FROM orders
        sinks:
          out: {{type: delta, from: shaped, path: "{out}"}}
    """)
    rows = read_delta(out)
    assert [r["id"] for r in rows] == list(range(6))
    assert all(r["parts"][0] == "customer" and len(r["hashed"]) == 32 for r in rows)
    assert [r["next_id"] for r in rows] == [str(i + 1) for i in range(6)]
    assert len({r["uid"] for r in rows}) == 6


def test_udfs_are_registered_once_per_jvm_session(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``foreachBatch`` gives every epoch a new Python wrapper of the query's JVM session: the
    functions registered for the first epoch must not be registered again (it cost ~100 ms an epoch)."""
    from pyspark.sql import SparkSession

    from streamling.functions import udfs

    catalog.register_udfs(spark)
    calls: list[Any] = []
    monkeypatch.setattr(udfs, "register", lambda session: calls.append(session))
    fresh = SparkSession(spark.sparkContext, spark._jsparkSession)  # what foreachBatch hands an epoch
    catalog.register_udfs(fresh)
    assert calls == []
    clone = SparkSession(spark.sparkContext, spark._jsparkSession.newSession())  # a session without them
    catalog.register_udfs(clone)
    assert len(calls) == 1
