"""Arrow UDF bodies of the Flink-compatible functions whose semantics no Spark built-in matches.

Regexes here use Python's ``re`` (Unicode-aware classes like Rust's ``regex``; Spark's own regex
functions use Java's). Each pattern is compiled once per batch and value. JSON paths support what
Streamling's do: ``$``, ``.key``, ``[n]`` and ``['key']``.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import pyarrow as pa

from streamling.errors import StreamlingError
from streamling.functions.arrow import elementwise, rows, values


def _fail(message: str) -> StreamlingError:
    return StreamlingError(message, code="sql_function_failed", user=True)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _fail(f"invalid regular expression '{pattern}': {exc}") from exc


def regexp_extract(text: pa.Array, pattern: pa.Array, group: pa.Array | None = None) -> pa.Array:
    """Group ``group`` (default 0) of the first match; no match, a bad or unmatched group: NULL."""

    def one(t: str, p: str, g: int = 0) -> str | None:
        regex = _regex(p)
        if not 0 <= g <= regex.groups:
            return None
        match = regex.search(t)
        return None if match is None else match.group(g)

    arrays = [text, pattern] if group is None else [text, pattern, group]
    return elementwise(one, arrays, pa.string())


def regexp_instr(text: pa.Array, pattern: pa.Array, start: pa.Array | None = None,
                 occurrence: pa.Array | None = None) -> pa.Array:
    """1-based position of the ``occurrence``-th match at or after ``start``; 0 when none."""

    def one(t: str, p: str, s: int = 1, n: int = 1) -> int:
        if s < 1 or n < 1:
            raise _fail(f"regexp_instr: start and occurrence must be at least 1, got {s} and {n}")
        for i, match in enumerate(_regex(p).finditer(t, s - 1), start=1):
            if i == n:
                return match.start() + 1
        return 0

    arrays = [a for a in (text, pattern, start, occurrence) if a is not None]
    return elementwise(one, arrays, pa.int32())


def instr(text: pa.Array, sub: pa.Array, start: pa.Array | None = None,
          occurrence: pa.Array | None = None) -> pa.Array:
    """1-based position of the ``occurrence``-th ``sub``; a negative start searches backwards from
    that position counted from the end; an occurrence below 1 gives NULL; not found gives 0."""

    def one(t: str, s: str, pos: int = 1, n: int = 1) -> int | None:
        if n < 1:
            return None
        if pos == 0:
            return 0
        if pos > 0:
            at = pos - 2
            for _ in range(n):
                at = t.find(s, at + 1)
                if at < 0:
                    return 0
            return at + 1
        end = len(t) + pos + len(s)  # the match may start at most at len + pos
        for _ in range(n):
            at = t.rfind(s, 0, end)
            if at < 0:
                return 0
            end = at + len(s) - 1
        return at + 1

    arrays = [a for a in (text, sub, start, occurrence) if a is not None]
    return elementwise(one, arrays, pa.int32())


# --- JSON -------------------------------------------------------------------------------------

_MISSING = object()
_PATH_STEP = re.compile(r"\.([A-Za-z_$][\w$]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")


@lru_cache(maxsize=256)
def _path(path: str) -> tuple[str | int, ...]:
    """``$.a[0]['b c']`` → ('a', 0, 'b c'); any other syntax is an error."""
    if not path.startswith("$"):
        raise _fail(f"invalid JSON path '{path}': it must start with $")
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        match = _PATH_STEP.match(path, at)
        if match is None:
            raise _fail(f"invalid JSON path '{path}' at position {at}: only $, .key, [n] and ['key'] are supported")
        key, index, quoted = match.groups()
        steps.append(int(index) if index is not None else key if key is not None
                     else re.sub(r"\\(.)", r"\1", quoted))
        at = match.end()
    return tuple(steps)


def _walk(document: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        if isinstance(step, int) and isinstance(document, list) and step < len(document):
            document = document[step]
        elif isinstance(step, str) and isinstance(document, dict) and step in document:
            document = document[step]
        else:
            return _MISSING
    return document


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads(text: str) -> Any:
    return json.loads(text)


def json_quote(text: pa.Array) -> pa.Array:
    """A JSON string literal; ``/`` and non-ASCII characters are escaped too."""
    return elementwise(lambda t: json.dumps(t, ensure_ascii=True).replace("/", "\\/"), [text], pa.string())


def json_unquote(text: pa.Array) -> pa.Array:
    """The value of a JSON string literal; any other text is returned unchanged."""

    def one(t: str) -> str:
        if len(t) >= 2 and t[0] == t[-1] == '"':
            try:
                value = _loads(t)
            except ValueError:
                return t
            if isinstance(value, str):
                return value
        return t

    return elementwise(one, [text], pa.string())


def json_(text: pa.Array) -> pa.Array:
    """Validated, compact JSON text; blank text gives NULL, invalid JSON fails the query."""

    def one(t: str) -> str | None:
        if not t.strip():
            return None
        try:
            return _compact(_loads(t))
        except ValueError as exc:
            raise _fail(f"json: invalid JSON: {exc}") from exc

    return elementwise(one, [text], pa.string())


def parse_json(text: pa.Array) -> pa.Array:
    """Compact JSON text of a valid document; invalid input fails the query."""

    def one(t: str) -> str:
        try:
            return _compact(_loads(t))
        except ValueError as exc:
            raise _fail(f"parse_json: invalid JSON: {exc}") from exc

    return elementwise(one, [text], pa.string())


def try_parse_json(text: pa.Array) -> pa.Array:
    """Compact JSON text of a valid document; invalid input gives NULL."""

    def one(t: str) -> str | None:
        try:
            return _compact(_loads(t))
        except ValueError:
            return None

    return elementwise(one, [text], pa.string())


def is_json(text: pa.Array, kind: pa.Array | None = None) -> pa.Array:
    """Is the text valid JSON (of the kind VALUE, OBJECT, ARRAY or SCALAR)? NULL gives false."""

    def one(t: str | None, k: str | None = "VALUE") -> bool:
        if t is None:
            return False
        try:
            value = _loads(t)
        except ValueError:
            return False
        wanted = (k or "VALUE").upper()
        if wanted == "OBJECT":
            return isinstance(value, dict)
        if wanted == "ARRAY":
            return isinstance(value, list)
        if wanted == "SCALAR":
            return not isinstance(value, (dict, list))
        if wanted == "VALUE":
            return True
        raise _fail(f"is_json: unknown type '{k}': expected VALUE, OBJECT, ARRAY or SCALAR")

    arrays = [text] if kind is None else [text, kind]
    return elementwise(one, arrays, pa.bool_(), null_in_null_out=False)


def json_exists(document: pa.Array, path: pa.Array, on_error: pa.Array | None = None) -> pa.Array:
    """Does ``path`` exist in the document? On invalid JSON: FALSE (default), TRUE, UNKNOWN
    (NULL) or ERROR."""

    def one(d: str, p: str, e: str | None = "FALSE") -> bool | None:
        try:
            value = _loads(d)
        except ValueError as exc:
            behaviour = (e or "FALSE").upper()
            if behaviour == "ERROR":
                raise _fail(f"json_exists: invalid JSON: {exc}") from exc
            return {"FALSE": False, "TRUE": True, "UNKNOWN": None}[behaviour]
        return _walk(value, _path(p)) is not _MISSING

    arrays = [document, path] if on_error is None else [document, path, on_error]
    out = [None if r[0] is None or r[1] is None else one(*r) for r in rows(arrays)]
    return pa.array(out, type=pa.bool_())


def _json_argument(value: Any) -> Any:
    """A value as embedded in json_array / json_object: text holding an object or array is
    embedded as JSON, other values as themselves."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = _loads(stripped)
            except ValueError:
                return value
            if isinstance(parsed, (dict, list)):
                return parsed
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _json_argument(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_argument(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return str(value)


def json_array(*items: pa.Array, absent_on_null: bool = False) -> pa.Array:
    n = len(items[0]) if items else 0
    columns = [values(a) for a in items]
    out = []
    for i in range(n):
        entries = [_json_argument(c[i]) for c in columns if not (absent_on_null and c[i] is None)]
        out.append(_compact(entries))
    return pa.array(out, type=pa.string())


def json_object(*pairs: pa.Array, absent_on_null: bool = False) -> pa.Array:
    if len(pairs) % 2:
        raise _fail("json_object takes key, value pairs")
    n = len(pairs[0]) if pairs else 0
    columns = [values(a) for a in pairs]
    out = []
    for i in range(n):
        obj: dict[str, Any] = {}
        for k in range(0, len(columns), 2):
            key, value = columns[k][i], columns[k + 1][i]
            if key is None:
                raise _fail("json_object: a key is NULL")
            if absent_on_null and value is None:
                continue
            obj[str(key)] = _json_argument(value)
        out.append(_compact(obj))
    return pa.array(out, type=pa.string())


def _behaviour(value: Any, default: str) -> str:
    return (str(value) if value is not None else default).upper().replace(" ", "_")


def json_query(document: pa.Array, path: pa.Array, *options: pa.Array) -> pa.Array:
    """The object or array at ``path`` as JSON text.

    Options (literals, in order): RETURNING type (text is returned; the rewrite casts), wrapper
    WITHOUT_ARRAY (default) / CONDITIONAL_ARRAY / UNCONDITIONAL_ARRAY, ON EMPTY and ON ERROR
    behaviours NULL (default) / EMPTY_ARRAY / EMPTY_OBJECT / ERROR.
    """
    fallback = {"NULL": None, "EMPTY_ARRAY": "[]", "EMPTY_OBJECT": "{}"}

    def outcome(behaviour: str, message: str) -> str | None:
        if behaviour == "ERROR":
            raise _fail(f"json_query: {message}")
        return fallback[behaviour]

    def one(d: str | None, p: str | None, _returning: Any = None, wrapper: Any = None, on_empty: Any = None,
            on_error: Any = None) -> str | None:
        if d is None or p is None:
            return None
        wrap = _behaviour(wrapper, "WITHOUT_ARRAY").removesuffix("_WRAPPER")
        empty, error = _behaviour(on_empty, "NULL"), _behaviour(on_error, "NULL")
        steps = _path(p)
        try:
            value = _walk(_loads(d), steps)
        except ValueError as exc:
            return outcome(error, f"invalid JSON: {exc}")
        if value is _MISSING:
            return outcome(empty, f"no value at {p}")
        if wrap == "UNCONDITIONAL_ARRAY" or (wrap == "CONDITIONAL_ARRAY" and not isinstance(value, (dict, list))):
            return _compact([value])
        if not isinstance(value, (dict, list)):
            return outcome(error, f"the value at {p} is a scalar, not an object or array")
        return _compact(value)

    return pa.array([one(*r) for r in rows([document, path, *options])], type=pa.string())


def json_value(document: pa.Array, path: pa.Array, *options: pa.Array) -> pa.Array:
    """The scalar at ``path`` as text (the rewrite casts it to the RETURNING type).

    Options (literals, in order): RETURNING type, ON EMPTY behaviour NULL (default) / ERROR /
    DEFAULT and its default value, ON ERROR behaviour and its default value. An object or array
    at the path is an error (handled by ON ERROR).
    """

    def text(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else _compact(value)

    def outcome(behaviour: str, default: Any, message: str) -> str | None:
        if behaviour == "ERROR":
            raise _fail(f"json_value: {message}")
        return text(default) if behaviour == "DEFAULT" else None

    def one(d: str | None, p: str | None, _returning: Any = None, on_empty: Any = None, empty_default: Any = None,
            on_error: Any = None, error_default: Any = None) -> str | None:
        if d is None or p is None:
            return None
        empty, error = _behaviour(on_empty, "NULL"), _behaviour(on_error, "NULL")
        try:
            value = _walk(_loads(d), _path(p))
        except ValueError as exc:
            return outcome(error, error_default, f"invalid JSON: {exc}")
        if value is _MISSING or value is None:
            return outcome(empty, empty_default, f"no value at {p}")
        if isinstance(value, (dict, list)):
            return outcome(error, error_default, f"the value at {p} is not a scalar")
        return text(value)

    return pa.array([one(*r) for r in rows([document, path, *options])], type=pa.string())
