"""Turn a DataFusion SQL tree (``sql_dialect``) into one whose Spark SQL gives the same rows.

Translation works in place, children before parents, and collects every construct it cannot
translate faithfully as a problem (validation reports them all at once). Some differences depend
on types — DataFusion divides integers as integers, casts integers to timestamps as nanoseconds,
reads ``to_timestamp_millis(int)`` as milliseconds — so the caller may pass the input columns'
Spark types; without them (validation without a schema) those spots keep the type-free reading.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from importlib import resources

from sqlglot import exp

from streamling.functions import catalog
from streamling.spec import sql_calls as sc
from streamling.spec import sql_functions as fn
from streamling.util import did_you_mean

DYNAMIC_TABLE_CHECK = "dynamic_table_check"
_NUMERIC = sc.INTEGRAL | {"float", "double"}


@functools.cache
def spark_function_names() -> frozenset[str]:
    """Spark 4.2's built-in function names (a snapshot of ``SHOW FUNCTIONS``, kept with the package)."""
    text = resources.files("streamling.spec").joinpath("spark_functions.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def accepted_function_names() -> list[str]:
    """Every function name a Streamling SQL query may call."""
    return sorted({*fn.BUILDERS, *catalog.function_names(), DYNAMIC_TABLE_CHECK})


class Translator:
    def __init__(self, columns: Mapping[str, str] | None) -> None:
        self.columns = {k.lower(): v.lower() for k, v in (columns or {}).items()}
        self.problems: list[str] = []

    # --- types ------------------------------------------------------------------------------------

    def type_of(self, node: exp.Expression) -> str | None:
        """The Spark type of a (translated) expression, where it matters and is known."""
        if isinstance(node, exp.Paren):
            return self.type_of(node.this)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return "string"
            return "bigint" if str(node.this).isdigit() else "double"
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return node.to.sql(dialect="spark").lower()
        if isinstance(node, exp.Column):
            return self.columns.get(node.name.lower())
        if isinstance(node, exp.Neg):
            return self.type_of(node.this)
        if isinstance(node, exp.IntDiv):
            return "bigint"
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
            left, right = self.type_of(node.this), self.type_of(node.expression)
            if left in sc.INTEGRAL and right in sc.INTEGRAL:
                return "bigint"
            if left in _NUMERIC and right in _NUMERIC:
                return "double"
        return node.meta.get("spark_type") if node.meta else None

    # --- the walk ---------------------------------------------------------------------------------

    def translate(self, tree: exp.Expression) -> exp.Expression:
        _fold_identifiers(tree)
        self._check_unnest(tree)
        for node in list(_children_first(tree)):
            if node is tree:
                new = self._node(node)
                if new is not node:
                    tree = new
                continue
            new = self._node(node)
            if new is not node:
                node.replace(new)
        return tree

    def _node(self, node: exp.Expression) -> exp.Expression:
        try:
            if isinstance(node, exp.Anonymous):
                return self._call(node)
            if isinstance(node, exp.Div):
                return self._div(node)
            if isinstance(node, exp.Literal) and not node.is_string and not node.is_int \
                    and not isinstance(node.parent, (exp.DataTypeParam, exp.DataType)):
                # DataFusion reads 2.5 as a 64-bit float, Spark as a decimal.
                return sc.cast(node.copy(), "double")
            if isinstance(node, (exp.Cast, exp.TryCast)):
                return self._cast(node)
            if isinstance(node, exp.Extract):
                part = fn.date_part(node.this.name, node.expression)
                if node.this.name.lower() != "epoch":
                    part.meta["spark_type"] = "int"
                return part
            if isinstance(node, exp.Substring):
                args = [a for a in (node.this, node.args.get("start") or sc.num(1), node.args.get("length")) if a]
                return fn.BUILDERS["substr"].build(args, self.type_of)
            if isinstance(node, exp.Bracket):
                return self._bracket(node)
            if isinstance(node, exp.RegexpILike):
                return sc.call("regexp_like", node.this, sc.call("concat", sc.lit("(?i)"), node.expression))
            if isinstance(node, exp.SimilarTo):
                self.problems.append("SIMILAR TO is not supported; use regexp_like(text, pattern)")
        except sc.Unfaithful as exc:
            self.problems.append(f"{_construct(node)}: {exc}")
        return node

    def _call(self, node: exp.Anonymous) -> exp.Expression:
        name = str(node.name).lower()
        args = list(node.expressions)
        if name == DYNAMIC_TABLE_CHECK or isinstance(node.parent, exp.Window):
            return node  # rewritten per epoch / rejected as a window
        own = catalog.lookup(name)
        if own is not None:
            problem = own.arity_problem(len(args))
            if problem:
                self.problems.append(problem)
                return node
            if own.to_spark is not None:
                return own.to_spark(args)
            return exp.Anonymous(this=own.udf_name or name, expressions=args)
        if name in fn.NOT_FAITHFUL:
            self.problems.append(f"{name}() cannot run on Spark with DataFusion's meaning: {fn.NOT_FAITHFUL[name]}")
            return node
        builtin = fn.BUILDERS.get(name)
        if builtin is None:
            spark_has = (f" (Spark's {name} is not part of Streamling SQL)" if name in spark_function_names()
                         else "")
            self.problems.append(f"unknown function {name}(){spark_has}"
                                 f"{did_you_mean(name, accepted_function_names())}")
            return node
        problem = builtin.arity_problem(name, len(args))
        if problem:
            self.problems.append(problem)
            return node
        out = builtin.build(args, self.type_of)
        if name in _INTEGER_RESULTS and not _is_epoch(name, args):
            out.meta["spark_type"] = "int"  # so that dividing it divides integers, as in DataFusion
        return out

    def _div(self, node: exp.Div) -> exp.Expression:
        # DataFusion divides integers as integers (truncating toward zero), as Spark's DIV does.
        if self.type_of(node.this) in sc.INTEGRAL and self.type_of(node.expression) in sc.INTEGRAL:
            return exp.IntDiv(this=node.this, expression=node.expression)
        return node

    def _cast(self, node: exp.Cast) -> exp.Expression:
        source = self.type_of(node.this)
        target = node.to.sql(dialect="spark").lower()
        # Arrow casts between integers and timestamps count nanoseconds; Spark's count seconds.
        if source == "timestamp" and target in sc.INTEGRAL:
            return sc.cast(exp.Mul(this=sc.call("unix_micros", node.this), expression=sc.num(1000)), target)
        if source in sc.INTEGRAL and target == "timestamp":
            return sc.call("timestamp_micros", exp.IntDiv(this=node.this, expression=sc.num(1000)))
        return node

    def _bracket(self, node: exp.Bracket) -> exp.Expression:
        # DataFusion's array[i] is 1-based and NULL out of range; Spark's fails out of range.
        index = node.expressions[0] if len(node.expressions) == 1 else None
        if index is None or (isinstance(index, exp.Literal) and index.is_string):
            return node
        return sc.call("try_element_at", node.this, index)

    def _check_unnest(self, tree: exp.Expression) -> None:
        """``unnest`` runs as Spark's ``explode``: faithful only alone, at the top of a select list."""
        for call in tree.find_all(exp.Anonymous):
            if str(call.name).lower() != "unnest":
                continue
            holder = call.parent.parent if isinstance(call.parent, exp.Alias) else call.parent
            select = holder if isinstance(holder, exp.Select) else None
            if select is None or call.parent not in select.expressions and call not in select.expressions:
                self.problems.append("unnest() is supported only as a whole column of a SELECT list")
            elif sum(1 for c in select.find_all(exp.Anonymous) if str(c.name).lower() == "unnest") > 1:
                self.problems.append("only one unnest() per SELECT is supported on Spark")


#: DataFusion functions whose result is an integer (Spark's translation may not say so)
_INTEGER_RESULTS = {"to_unixtime", "strpos", "instr", "length", "char_length", "character_length", "charlength",
                    "octet_length", "bit_length", "array_length", "array_position", "date_part", "datepart",
                    "ascii", "levenshtein", "find_in_set"}


def _is_epoch(name: str, args: list[exp.Expression]) -> bool:
    return name in {"date_part", "datepart"} and bool(args) and str(args[0].name).lower() == "epoch"


def _children_first(node: exp.Expression) -> Iterator[exp.Expression]:
    """Post-order, left to right: arguments are translated before their call, problems come in SQL order."""
    for child in list(node.iter_expressions()):
        yield from _children_first(child)
    yield node


def _fold_identifiers(tree: exp.Expression) -> None:
    """Unquoted names fold to lower case, as in DataFusion; node (table) names are matched apart."""
    for ident in list(tree.find_all(exp.Identifier)):
        if not ident.quoted and not isinstance(ident.parent, exp.Table):
            ident.set("this", str(ident.this).lower())


def _construct(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return f"{str(node.name).lower()}()"
    return node.key.upper()


def translate(tree: exp.Expression, columns: Mapping[str, str] | None = None) -> tuple[exp.Expression, list[str]]:
    """The tree made Spark-ready (in place where possible) and the problems found, in order."""
    translator = Translator(columns)
    out = translator.translate(tree)
    return out, list(dict.fromkeys(translator.problems))
