"""Streamling's SQL functions without a JVM: the Arrow UDF bodies on Arrow arrays, the catalogue,
and the shape of the expression rewrites."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
import sqlglot

from streamling.errors import StreamlingError
from streamling.functions import catalog, flink, gs, u256, udfs
from streamling.spec.sql_calls import Unfaithful


def strings(*items: str | None) -> pa.Array:
    return pa.array(list(items), type=pa.string())


def test_catalogue_names_are_lower_case_and_every_udf_is_registered() -> None:
    for name, function in catalog.FUNCTIONS.items():
        assert name == name.lower() == function.name
        assert (function.to_spark is None) != (function.udf_name is None), name
        if function.udf_name:
            assert function.udf_name == udfs.udf_name(name) and function.udf_name in udfs.UDFS
    assert catalog.lookup("regexpExtract") is catalog.lookup("regexpextract") is not None
    assert catalog.lookup("DATEFORMAT") is not None and catalog.lookup("charLength") is not None
    assert catalog.lookup("_GS_XXHASH") is catalog.FUNCTIONS["_gs_xxhash"]


def test_arity() -> None:
    zip_arrays = catalog.FUNCTIONS["_gs_zip_arrays"]
    assert zip_arrays.arity_problem(1) == "_gs_zip_arrays takes 2 to 4 arguments, found 1"
    assert zip_arrays.arity_problem(4) is None
    assert catalog.FUNCTIONS["regexp_substr"].arity_problem(3) is not None  # Streamling fails at run time
    assert catalog.FUNCTIONS["json_object"].arity_problem(0) is None


def spark_sql(name: str, *args: str) -> str:
    function = catalog.FUNCTIONS[name]
    assert function.to_spark is not None
    return function.to_spark([sqlglot.parse_one(a, read="spark") for a in args]).sql(dialect="spark")


def test_expression_rewrites() -> None:
    assert spark_sql("_gs_split_string_to_array", "t") == "SPLIT(t, ' ', -1)"
    assert spark_sql("_gs_split_string_to_array", "t", "'a.b|'") == "SPLIT(t, 'a\\\\.b\\\\|', -1)"
    assert spark_sql("split", "t", "'$'") == "SPLIT(t, '\\\\$', -1)"
    assert spark_sql("_gs_byte_to_hex", "b") == "LOWER(HEX(b))"
    assert spark_sql("to_large_list", "l") == "l"
    assert spark_sql("parse_url", "u", "'HOST'") == "TRY_PARSE_URL(u, 'HOST')"
    assert spark_sql("regexp_replace", "t", "'x'", "'$1'") == "REGEXP_REPLACE(t, 'x', '\\\\$1')"
    assert spark_sql("uuid7") == "STREAMLING_UUID7(0)"
    assert spark_sql("json_array") == "'[]'"
    assert spark_sql("json_value", "j", "'$.a'", "'INT'") == "CAST(STREAMLING_JSON_VALUE(j, '$.a', 'INT') AS INT)"
    series = spark_sql("_gs_generate_series", "a", "b")
    assert "SEQUENCE(CAST(a AS BIGINT), CAST(b AS BIGINT), CAST(COALESCE(1, 1) AS BIGINT))" in series
    assert "RAISE_ERROR('Step size cannot be 0 in _gs_generate_series!')" in series
    # lambda variables cannot capture user columns named x or i
    assert re.search(r"\(__gs_x, __gs_i\) ->", spark_sql("array_enumerate", "l"))


def test_constant_arguments_are_enforced() -> None:
    with pytest.raises(Unfaithful, match="must be a constant"):
        spark_sql("array_filter_in", "l", "'f'", "wanted")
    with pytest.raises(Unfaithful, match="must be a constant"):
        spark_sql("_gs_json_objects_to_clickhouse_tuples", "j", "keys")
    with pytest.raises(Unfaithful, match="string literal"):
        spark_sql("array_struct_field", "l", "name_column")
    assert "ARRAY_CONTAINS(ARRAY('a', 'b')" in spark_sql("array_filter_in", "l", "'f'", "array('a', 'b')")
    # through the translator, a problem of the query at validation, never a crash
    from streamling.spec.sql import analyze_sql

    problems = analyze_sql("SELECT array_filter_in(items, 'k', wanted) AS x FROM t").problems
    assert any("must be a constant" in p for p in problems), problems


def test_conv_base() -> None:
    out = gs.conv_base(strings("FF", "1010", "-ff", "1_0", "_1", "G", "10", None, "7"),
                       strings("16", "2", "16", "2", "2", "16", "37", "10", "+8"),
                       strings("10", "16", "10", "10", "10", "10", "10", "2", "2"))
    assert out.to_pylist() == ["255", "a", "-255", "2", None, None, None, None, "111"]
    ints = gs.conv_base(strings("255"), pa.array([10], pa.int32()), pa.array([36], pa.int32()))
    assert ints.to_pylist() == ["73"]
    huge = str(2**200)
    assert gs.conv_base(strings(huge), strings("10"), strings("16")).to_pylist() == [format(2**200, "x")]


def test_hashes() -> None:
    import xxhash

    out = gs.xxhash128(strings("hello", None, ""))
    assert out.to_pylist()[0] == xxhash.xxh3_128_hexdigest(b"hello") and len(out[0].as_py()) == 32
    assert out.to_pylist()[1] is None
    keccak = gs.keccak256(strings("", "0x", "0xzz", "0x123", None))
    # Keccak-256 of empty input (Ethereum's well-known value), for text and for 0x-hex alike
    empty = "0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
    assert keccak.to_pylist() == [empty, empty, None, None, None]


def test_base58() -> None:
    assert gs.to_base58(pa.array([b"Hello", b"\x00\x00\x01", None], pa.binary())).to_pylist() == \
        ["9Ajdvzr", "112", None]
    assert gs.from_base58(strings("9Ajdvzr", "0OIl", None)).to_pylist() == [b"Hello", b"", b""]


def test_clickhouse_tuples() -> None:
    keys = pa.array([["pubkey", "signer"]] * 3, pa.list_(pa.string()))
    docs = strings('[{"pubkey": "abc", "signer": true}, {"signer": false, "x": {"b": 1, "a": 2}}]', None, "[]")
    assert gs.json_objects_to_clickhouse_tuples(docs, keys).to_pylist() == \
        ["[('abc', true), (null, false)]", "[]", "[]"]
    with pytest.raises(StreamlingError, match="failed to parse JSON"):
        gs.json_objects_to_clickhouse_tuples(strings("{"), keys[:1])


def test_uuid7_is_fresh_per_row_and_version_7() -> None:
    out = gs.uuid7(pa.array([0] * 1000)).to_pylist()
    assert len(set(out)) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u) for u in out)


def test_u256() -> None:
    assert u256.to_u256(pa.array([0, 5], pa.int64())).to_pylist() == ["0", "5"]
    assert u256.to_u256(pa.array([b"\x00" * 31 + b"\x2a"], pa.binary(32))).to_pylist() == ["42"]
    assert u256.to_u256(strings(str(u256.U256_MAX))).to_pylist() == [str(u256.U256_MAX)]
    for bad in (pa.array([-1], pa.int64()), strings(None), strings("12a"), strings(str(2**256)), strings("-1")):
        with pytest.raises(StreamlingError):
            u256.to_u256(bad)
    add, sub, div, mod = (u256.binary(op, False) for op in ("add", "sub", "div", "mod"))
    assert add(strings("1"), strings("2")).to_pylist() == ["3"]
    assert div(strings("7"), strings("2")).to_pylist() == ["3"] and mod(strings("7"), strings("2")).to_pylist() == ["1"]
    with pytest.raises(StreamlingError, match="overflow"):
        add(strings(str(u256.U256_MAX)), strings("1"))
    with pytest.raises(StreamlingError, match="underflow"):
        sub(strings("1"), strings("2"))
    with pytest.raises(StreamlingError, match="division by zero"):
        div(strings("1"), strings("0"))
    with pytest.raises(StreamlingError, match="null"):
        add(strings(None), strings("1"))


def test_i256() -> None:
    div, mod, mul = (u256.binary(op, True) for op in ("div", "mod", "mul"))
    assert div(strings("-7", "7"), strings("2", "-2")).to_pylist() == ["-3", "-3"]
    assert mod(strings("-7", "7"), strings("2", "-2")).to_pylist() == ["-1", "1"]
    assert u256.to_i256(pa.array([b"\xff" * 32], pa.binary(32))).to_pylist() == ["-1"]
    assert u256.i256_abs(strings("-5")).to_pylist() == ["5"]
    with pytest.raises(StreamlingError, match="overflow"):
        u256.i256_neg(strings(str(u256.I256_MIN)))
    with pytest.raises(StreamlingError, match="overflow"):
        mul(strings(str(2**254)), strings("2"))
    out = u256.to_int64(strings("-5", str(2**63), str(2**64 - 1), str(2**64), str(-(2**63) - 1), None))
    assert out.to_pylist() == [-5, -(2**63), -1, None, None, None]


def test_regexp_extract_and_instr() -> None:
    out = flink.regexp_extract(strings("foo123", "foo123", "abc", "ab", None),
                               strings(r"(\d+)", r"[a-z]+(\d)", "x", "(x)?b", "a"), pa.array([0, 1, 0, 1, 0]))
    assert out.to_pylist() == ["123", "1", None, None, None]
    assert flink.regexp_extract(strings("a1"), strings("(a)"), pa.array([2])).to_pylist() == [None]
    assert flink.regexp_instr(strings("ab12cd34", "abc"), strings(r"\d+", "z")).to_pylist() == [3, 0]
    with pytest.raises(StreamlingError, match="at least 1"):
        flink.regexp_instr(strings("a"), strings("a"), pa.array([0]))
    out = flink.instr(strings("CORPORATE FLOOR", "CORPORATE FLOOR", "abcabc", "abc", "abc"),
                      strings("OR", "OR", "bc", "b", "b"), pa.array([3, -3, -1, 1, 1]), pa.array([2, 2, 1, 0, 3]))
    assert out.to_pylist() == [14, 2, 5, None, 0]


def test_json_functions() -> None:
    doc = '{"a": {"b": [10, {"c": "x"}]}, "s": "t", "n": null}'
    docs = strings(doc, doc, doc, "{")
    paths = strings("$.a.b[1]['c']", "$.a", "$.zz", "$")
    assert flink.json_exists(docs, paths).to_pylist() == [True, True, False, False]
    assert flink.json_exists(docs[3:], paths[3:], strings("TRUE")).to_pylist() == [True]
    with pytest.raises(StreamlingError, match="invalid JSON"):
        flink.json_exists(docs[3:], paths[3:], strings("ERROR"))
    with pytest.raises(StreamlingError, match="only \\$, .key"):
        flink.json_exists(docs[:1], strings("$..a"))
    assert flink.json_value(docs[:3], strings("$.a.b[0]", "$.a", "$.s")).to_pylist() == ["10", None, "t"]
    defaulted = flink.json_value(docs[:1], strings("$.n"), strings("STRING"), strings("DEFAULT"), strings("d"))
    assert defaulted.to_pylist() == ["d"]
    assert flink.json_query(docs[:3], strings("$.a.b", "$.s", "$.zz")).to_pylist() == ['[10,{"c":"x"}]', None, None]
    assert flink.json_query(docs[:1], strings("$.zz"), strings("STRING"), strings("WITHOUT_ARRAY"),
                            strings("EMPTY_OBJECT")).to_pylist() == ["{}"]
    assert flink.json_quote(strings('a/"é')).to_pylist() == ['"a\\/\\"\\u00e9"']
    assert flink.json_unquote(strings('"a\\tb"', "plain", '"bad')).to_pylist() == ["a\tb", "plain", '"bad']
    assert flink.json_(strings(" [1, 2] ", "  ", None)).to_pylist() == ["[1,2]", None, None]
    with pytest.raises(StreamlingError):
        flink.json_(strings("{"))
    assert flink.try_parse_json(strings("{", '{"a": 1}')).to_pylist() == [None, '{"a":1}']
    with pytest.raises(StreamlingError):
        flink.parse_json(strings("{"))
    assert flink.is_json(strings("1", "{}", None, "x"), strings("SCALAR", "ARRAY", "VALUE", "VALUE")).to_pylist() == \
        [True, False, False, False]
    assert flink.json_array(pa.array([1, None]), strings('{"k": 1}', "t")).to_pylist() == \
        ['[1,{"k":1}]', '[null,"t"]']
    assert flink.json_array(pa.array([1, None]), absent_on_null=True).to_pylist() == ["[1]", "[]"]
    assert flink.json_object(strings("k"), pa.array([None], pa.int64())).to_pylist() == ['{"k":null}']
    with pytest.raises(StreamlingError, match="key is NULL"):
        flink.json_object(strings(None), strings("v"))


def test_a_query_calling_no_udf_registers_none() -> None:
    # Registering the Arrow UDFs costs ~0.25 s of a cold start; a query that calls none skips it
    # without touching the session, and one that calls one (any case, quoted or not) registers them.
    from streamling.functions.catalog import _CALL, register_udfs

    class NoSession:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the session was used: {name}")

    register_udfs(NoSession(), "SELECT id, upper(name) AS n, amount * 2 FROM `orders` WHERE x IN (1, 2)")  # type: ignore[arg-type]
    calls = {n.lower() for n in _CALL.findall("SELECT `STREAMLING_gs_xxhash` (a), streamling_plugin_mask(b) FROM t")}
    assert calls == {"streamling_gs_xxhash", "streamling_plugin_mask"}
