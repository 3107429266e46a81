"""``file`` source: parquet, csv, json/ndjson/jsonl (and avro with the spark-avro connector)
through Spark's own file streaming source, which tracks files in the checkpoint.

The schema is inferred once, from the files present at start; every file added later is read
with it. A file that does not fit that schema must stop the flow, never be misread: Spark's
defaults would map CSV columns by position whatever the header says and turn unparsable values
into NULL. So CSV headers are checked against the schema (``enforceSchema=false``), and CSV/JSON
rows are read in PERMISSIVE mode into a corrupt-record column that a filter checks in the JVM:
the first bad row raises inside the epoch, before any sink has written it, so the checkpoint does
not advance. Parquet and Avro files with other column types fail in Spark's reader. The failure is
then diagnosed on the driver (``explain_failure``) into one line naming file, line, column and value.
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import json
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from streamling import storage
from streamling.errors import StreamlingError, chain_text, first_line
from streamling.runtime.jvm_death import jvm_failure
from streamling.runtime.nodes import GS_OP, NodeContext, Source
from streamling.spec.sources import FileSourceOptions
from streamling.util import parse_duration_secs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

SPARK_FORMAT = {"parquet": "parquet", "csv": "csv", "json": "json", "ndjson": "json", "jsonl": "json",
                "avro": "avro"}
REMOTE_SCHEMES = {"s3", "s3a", "gs", "hdfs", "viewfs", "abfs", "abfss", "wasbs"}
TEXT_FORMATS = {"csv", "json"}  # formats with lines, parsed row by row (corrupt-record column)
CORRUPT = "_streamling_bad_record"
BAD_RECORD = "streamling-bad-record:"
RECORD_CHARS = 20000  # how much of a bad record travels in the error (enough to find its line)
HINT = "fix the file (or remove it from the folder) and restart; nothing from this epoch was written"
# univocity's words when a CSV field outgrows ``maxCharsPerColumn`` (file_source.max_field_chars).
FIELD_TOO_LONG = "exceeds the maximum number of characters defined in your parser settings"
JSON_STRING_LIMIT = 20_000_000  # Jackson's StreamReadConstraints.maxStringLength, as Spark leaves it
_FAILED_READ = re.compile(r"Encountered error while reading file (\S+?)\.(?:\s|$)")
_PARQUET_TYPE = re.compile(r"Encountered error while reading file (\S+?)\. Data type mismatches when reading Parquet "
                           r"column \[?(.+?)\]?\. Expected Spark type (\S+?), actual Parquet type (\S+?)\.")
_AVRO_TYPE = re.compile(r"Cannot convert Avro field '([^']+)' to SQL field '[^']*' because schema is incompatible "
                        r"\(avroType = \"?(.+?)\"?, sqlType = \"?(.+?)\"?\)")


class FileSource(Source[FileSourceOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.bounded = self.options.mode.type == "bounded"
        self.poll_interval_secs = parse_duration_secs(self.options.mode.poll_interval)
        self.schema: StructType | None = None  # the data columns every file must fit

    def shared_paths(self) -> dict[str, str]:
        return {"path": self.options.path}  # executors read the files

    def _local_path(self) -> str | None:
        path = self.options.path
        if storage.is_local(path):
            return str(storage.local_path(path))
        if storage.scheme(path) in REMOTE_SCHEMES:
            return None
        raise self.ctx.error(f"unsupported scheme '{storage.scheme(path)}' in path {self.options.path!r}",
                             hint="use a local path or one of " + ", ".join(f"{s}://" for s in sorted(REMOTE_SCHEMES)),
                             code="unsupported_scheme")

    def read_stream(self, spark: SparkSession) -> DataFrame:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructType

        local = self._local_path()
        fmt = SPARK_FORMAT[self.options.format]
        options: dict[str, str] = {}
        if fmt == "csv":
            # enforceSchema=false: each file's header must name the schema's columns, in order.
            options.update(header="true", enforceSchema="false",
                           maxCharsPerColumn=str(self.ctx.settings.file_source.max_field_chars))
        if fmt in TEXT_FORMATS:
            options.update(mode="PERMISSIVE", columnNameOfCorruptRecord=CORRUPT)
        path = self.options.path
        if local is not None:
            path = os.path.abspath(local)
            files = [f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(f)] \
                if os.path.isdir(path) else glob.glob(path)
            data_files = [f for f in files if not os.path.basename(f).startswith((".", "_"))]
            if not data_files:
                raise self.ctx.error(f"no files matching {self.options.path!r}",
                                     hint="check the path, or add files before starting", code="no_files")
            if os.path.isdir(path) and not any("=" in os.path.basename(os.path.dirname(f)) for f in data_files):
                options["recursiveFileLookup"] = "true"
        try:
            inferred = spark.read.format(fmt).options(**options, **({"inferSchema": "true"} if fmt == "csv" else {})) \
                .load(path).schema
        except Exception as exc:
            if FIELD_TOO_LONG in chain_text(exc):
                raise self._field_too_long(path if local is not None else None) from exc
            jvm = jvm_failure(exc)
            if jvm is not None:
                raise self.ctx.error(f"inferring the schema of {self.options.path!r}: {jvm.what}", hint=jvm.hint,
                                     code="jvm_failed") from exc
            if not isinstance(exc, AnalysisException):
                raise
            if "avro" in str(exc).lower() and fmt == "avro":
                raise self.ctx.error("reading avro files needs the spark-avro connector, which is not installed",
                                     hint="convert the files to parquet, or add spark-avro to the connector jars",
                                     code="connector_missing") from exc
            raise self.ctx.error(f"cannot read {self.options.format} files at {self.options.path!r}: "
                                 f"{first_line(exc)}", code="file_unreadable") from exc
        # A malformed JSON line among the starting files makes inference add the corrupt-record
        # column; it is never a data column.
        self.schema = StructType([f for f in inferred.fields if f.name != CORRUPT])
        schema = self.schema
        if fmt in TEXT_FORMATS:
            schema = StructType([*self.schema.fields]).add(CORRUPT, StringType())
        df = spark.readStream.format(fmt).schema(schema).options(**options).load(path)
        if fmt in TEXT_FORMATS:
            df = df.where(self._no_bad_record()).drop(CORRUPT)
        if GS_OP not in df.columns:
            df = df.withColumn(GS_OP, F.lit("i"))
        return df

    def _no_bad_record(self) -> Column:
        """True for a row that fit the schema; raises (in the JVM, mid-epoch) for one that did not.

        The error carries the file, the raw record and the columns Spark left NULL. Naming every
        column here also makes Spark parse every column, not only those the pipeline selects. No
        higher-order function (``array_compact``) here: it would take the filter out of codegen.
        """
        from pyspark.sql import functions as F

        assert self.schema is not None
        cols = [(f.name, F.col("`" + f.name.replace("`", "``") + "`")) for f in self.schema.fields]
        nulls = F.array(*[F.when(c.isNull(), F.lit(name)) for name, c in cols])  # NULL where the value parsed
        # input_file_name(), not _metadata.file_path: it is read only for a bad row, whereas the
        # metadata column would be materialised for every row (it doubled the CPU of a scan).
        payload = F.to_json(F.struct(F.input_file_name().alias("file"),
                                     F.substring(F.col(CORRUPT), 1, RECORD_CHARS).alias("record"),
                                     nulls.alias("nulls")))
        return F.when(F.col(CORRUPT).isNull(), F.lit(True)).otherwise(
            F.raise_error(F.concat(F.lit(BAD_RECORD), payload)))

    # --- diagnosis (driver side, only once an epoch failed) ---------------------------------------

    def explain_failure(self, raw: DataFrame, exc: BaseException) -> StreamlingError | None:
        text = chain_text(exc)
        if FIELD_TOO_LONG in text and self.options.format == "csv":
            local = self._local_path()
            return self._field_too_long(os.path.abspath(local) if local is not None else None)
        spark = raw.sparkSession
        found = self._bad_record(spark, text)
        if found is None and ("CSV header does not conform" in text or "Number of column in CSV header" in text):
            found = self._bad_header(text)
        if found is None:
            found = self._bad_file(spark, text)
        if found is None:
            return None
        uri, message, code = found
        if not self._owns(uri):  # another source of the same flow read that file
            return None
        return self.ctx.error(message, hint=HINT, code=code)

    def _field_too_long(self, local: str | None) -> StreamlingError:
        """A CSV field longer than ``file_source.max_field_chars``: name the file and line (local
        files are scanned for it; univocity's error names neither) and the key to raise."""
        limit = self.ctx.settings.file_source.max_field_chars
        found = _long_line(local, limit) if local is not None else None
        where = f"field at {self._display(found[0])}:{found[1]}" if found else f"a field in {self.options.path}"
        return self.ctx.error(
            f"{where} is longer than {limit} characters (file_source.max_field_chars)",
            hint="raise file_source.max_field_chars (STREAMLING__FILE_SOURCE__MAX_FIELD_CHARS) above the field's "
                 "length, with spark.driver.memory to match, or fix the file; nothing from the file was written",
            code="field_too_long")

    def _bad_record(self, spark: SparkSession, text: str) -> tuple[str, str, str] | None:
        start = text.find(BAD_RECORD)
        if start < 0 or self.schema is None:
            return None
        try:
            payload, _ = json.JSONDecoder().raw_decode(text, start + len(BAD_RECORD))
        except ValueError:
            return None
        uri, record = str(payload.get("file") or ""), str(payload.get("record") or "")
        nulls = [str(n) for n in payload.get("nulls") or [] if n is not None]
        line = _line_number(spark, uri, record)
        where = self._display(uri) + (f" line {line}" if line else "")
        truncated = len(record) >= RECORD_CHARS
        problem = None
        if not truncated:
            explain = self._csv_problem if self.options.format == "csv" else self._json_problem
            problem = explain(record, nulls)
        if problem is None and truncated and SPARK_FORMAT[self.options.format] == "json":
            problem = _json_too_long(uri, line)
        if problem is None:
            columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in self.schema.fields)
            problem = f"the record does not fit the source's columns ({columns}): '{_short(record)}'"
        return uri, f"{where}: {problem}", "bad_record"

    def _type_of(self, column: str) -> str:
        assert self.schema is not None
        return self.schema[column].dataType.simpleString()

    def _csv_problem(self, record: str, nulls: list[str]) -> str | None:
        assert self.schema is not None
        names = self.schema.fieldNames()
        tokens = next(csv.reader([record], delimiter=",", quotechar='"', escapechar="\\"), [])
        if len(tokens) != len(names):
            values = f"{len(tokens)} value{'s' if len(tokens) != 1 else ''}"
            return f"{values} for the {len(names)} columns ({', '.join(names)})"
        for name in nulls:
            if name in names and tokens[names.index(name)] != "":  # "" is CSV's null value
                return f"column '{name}' expects {self._type_of(name)}, got '{_short(tokens[names.index(name)])}'"
        return None

    def _json_problem(self, record: str, nulls: list[str]) -> str | None:
        try:
            value = json.loads(record)
        except ValueError:
            return f"not valid JSON: '{_short(record)}'"
        if not isinstance(value, dict):
            return f"not a JSON object: '{_short(record)}'"
        lowered = {k.lower(): v for k, v in value.items()}
        for name in nulls:
            got = value[name] if name in value else lowered.get(name.lower())
            if got is not None:
                shown = f"'{_short(got)}'" if isinstance(got, str) else _short(json.dumps(got, separators=(",", ":")))
                return f"column '{name}' expects {self._type_of(name)}, got {shown}"
        return None

    def _bad_header(self, text: str) -> tuple[str, str, str] | None:
        match = re.search(r"CSV file: (\S+)", text)
        if match is None or self.schema is None:
            return None
        uri = match.group(1)
        expected = self.schema.fieldNames()
        header = _csv_header(uri)
        if header is None:
            in_message = re.search(r"Header: (.*)", text)
            header = [h.strip() for h in in_message.group(1).split(",")] if in_message else None
        where = self._display(uri)
        if header is None:
            return uri, f"{where}: the header does not match the source's columns ({', '.join(expected)})", "bad_header"
        missing = [c for c in expected if c not in header]
        extra = [h for h in header if h not in expected]
        listed, wanted = ", ".join(header), ", ".join(expected)
        if not missing and not extra:
            return (uri, f"{where}: the header ({listed}) has the source's columns in another order than ({wanted}), "
                    "so its values would land in the wrong columns", "bad_header")
        problems = []
        if missing:
            problems.append(f"lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        if extra:
            problems.append(f"has {'extra columns' if len(extra) > 1 else 'an extra column'} {', '.join(extra)}")
        return uri, f"{where}: the header ({listed}) {' and '.join(problems)}; the source's columns are ({wanted})", \
            "bad_header"

    def _bad_file(self, spark: SparkSession, text: str) -> tuple[str, str, str] | None:
        """Parquet/Avro files whose column types differ from the schema, or any unreadable file."""
        parquet = _PARQUET_TYPE.search(text)
        if parquet is not None:
            uri, column, expected, physical = parquet.groups()
            actual = _parquet_type(spark, uri, column) or physical.lower()
            return uri, f"{self._display(uri)}: column '{column}' expects {expected}, the file has {actual}", "bad_file"
        failed = _FAILED_READ.search(text)
        if failed is None:
            return None
        uri = failed.group(1)
        where = self._display(uri)
        avro = _AVRO_TYPE.search(text)
        if avro is not None:
            column, actual, expected = avro.groups()
            return uri, f"{where}: column '{column}' expects {expected.lower()}, the file has {actual}", "bad_file"
        causes = re.findall(r"Caused by: [\w.$]+: (.+)", text)
        reason = causes[-1].strip() if causes else "it does not fit the source's schema"
        return uri, f"{where} cannot be read: {reason}", "bad_file"

    def _owns(self, uri: str) -> bool:
        """Whether ``uri`` is one of this source's files (a flow may read several sources)."""
        given = self._local_path()
        if given is not None:
            file, base = _local_file(uri), os.path.abspath(given)
        else:  # compared without the scheme: s3:// and s3a:// name the same objects
            file, base = _decoded(uri).split("://", 1)[-1], self.options.path.split("://", 1)[-1]
        if file is None:
            return False
        return file == base or file.startswith(base.rstrip("/") + "/") or fnmatch.fnmatch(file, base)

    def _display(self, uri: str) -> str:
        """The file as the user named it: under the configured folder when it is in there."""
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            return uri
        path = unquote(parsed.path)
        given = self._local_path()
        if given is not None:
            base = os.path.abspath(given)
            if os.path.isdir(base) and path.startswith(base.rstrip(os.sep) + os.sep):
                return os.path.join(given, os.path.relpath(path, base))
        return path


def _short(value: Any, limit: int = 80) -> str:
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "…"


def _local_file(uri: str) -> str | None:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("", "file") else None


def _decoded(uri: str) -> str:
    parsed = urlparse(uri)
    return parsed._replace(path=unquote(parsed.path)).geturl()


def _line_number(spark: SparkSession, uri: str, record: str) -> int | None:
    """The line of ``uri`` where ``record`` (a raw record Spark could not parse) starts."""
    first = record.split("\n", 1)[0].rstrip("\r")
    prefix = len(record) >= RECORD_CHARS
    local = _local_file(uri)
    try:
        if local is not None:
            with open(local, encoding="utf-8", errors="replace", newline="") as fh:
                for number, line in enumerate(fh, 1):
                    line = line.rstrip("\r\n")
                    if line == first or prefix and line.startswith(first):
                        return number
            return None
        return _line_number_spark(spark, _decoded(uri), first, prefix)
    except Exception:  # noqa: BLE001 - the line is a courtesy; the message stands without it
        return None


def _line_number_spark(spark: SparkSession, uri: str, first: str, prefix: bool) -> int | None:
    """Remote files: number the lines in the JVM (two small jobs, only when an epoch failed)."""
    from pyspark.sql import functions as F

    lines = spark.read.text(uri).select(F.monotonically_increasing_id().alias("n"), "value")
    match = F.col("value").startswith(first) if prefix else F.col("value") == first
    hit = lines.where(match).agg(F.min("n")).first()
    if hit is None or hit[0] is None:
        return None
    return lines.where(F.col("n") < hit[0]).count() + 1


def _long_line(path: str, limit: int) -> tuple[str, int] | None:
    """The first file under ``path`` (a file, folder or glob) with a line longer than ``limit``
    bytes, and that line's number: where a too-long field is. Read in chunks, never a whole line."""
    files = sorted(glob.glob(os.path.join(path, "**", "*"), recursive=True)) if os.path.isdir(path) \
        else sorted(glob.glob(path))
    for file in files:
        if not os.path.isfile(file) or os.path.basename(file).startswith((".", "_")):
            continue
        try:
            with open(file, "rb") as fh:
                number, length = 1, 0
                while chunk := fh.read(1 << 20):
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        if length + end - start > limit:
                            return file, number
                        number, length, start = number + 1, 0, end + 1
                    length += len(chunk) - start
                    if length > limit:
                        return file, number
        except OSError:
            continue
    return None


def _json_too_long(uri: str, line: int | None) -> str | None:
    """Why a long JSON line did not parse, when it holds more than Jackson's string limit."""
    local = _local_file(uri)
    found = _long_line(local, JSON_STRING_LIMIT) if local is not None and line else None
    if found is None or found[1] != line:
        return None
    return (f"the line is longer than {JSON_STRING_LIMIT} characters and does not parse: a string value over "
            f"the JSON reader's limit of {JSON_STRING_LIMIT} characters (not configurable) is the likely cause")


def _csv_header(uri: str) -> list[str] | None:
    local = _local_file(uri)
    if local is None:
        return None
    try:
        with open(local, encoding="utf-8", errors="replace", newline="") as fh:
            for line in fh:
                if line.strip():
                    return [h.strip() for h in next(csv.reader([line.rstrip("\r\n")]), [])]
    except OSError:
        return None
    return None


def _parquet_type(spark: SparkSession, uri: str, column: str) -> str | None:
    """The column's type in the offending file (its footer), as Spark names types."""
    try:
        schema = spark.read.parquet(_decoded(uri)).schema
        return schema[column].dataType.simpleString() if column in schema.fieldNames() else None
    except Exception:  # noqa: BLE001 - best effort: the Parquet physical type is shown instead
        return None
