"""``file`` source: parquet, csv, json/ndjson/jsonl (and avro with the spark-avro connector)
through Spark's own file streaming source, which tracks files in the checkpoint."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from streamling.runtime.nodes import GS_OP, NodeContext, Source
from streamling.spec.nodes import FileSourceOptions
from streamling.util import parse_duration_secs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPARK_FORMAT = {"parquet": "parquet", "csv": "csv", "json": "json", "ndjson": "json", "jsonl": "json",
                "avro": "avro"}
REMOTE_SCHEMES = {"s3", "s3a", "gs"}


class FileSource(Source):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        assert isinstance(self.options, FileSourceOptions)
        self.opts: FileSourceOptions = self.options
        self.bounded = self.opts.mode.type == "bounded"
        self.poll_interval_secs = parse_duration_secs(self.opts.mode.poll_interval)

    def _local_path(self) -> str | None:
        parsed = urlparse(self.opts.path)
        if parsed.scheme in ("", "file"):
            return parsed.path if parsed.scheme == "file" else self.opts.path
        if parsed.scheme in REMOTE_SCHEMES:
            return None
        raise self.ctx.error(f"unsupported scheme '{parsed.scheme}' in path {self.opts.path!r}",
                             hint="use a local path, s3://, s3a:// or gs://", code="unsupported_scheme")

    def read_stream(self, spark: SparkSession) -> DataFrame:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        local = self._local_path()
        fmt = SPARK_FORMAT[self.opts.format]
        options: dict[str, str] = {}
        if fmt == "csv":
            options.update(header="true", inferSchema="true")
        path = self.opts.path
        if local is not None:
            path = os.path.abspath(local)
            files = [f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(f)] \
                if os.path.isdir(path) else glob.glob(path)
            data_files = [f for f in files if not os.path.basename(f).startswith((".", "_"))]
            if not data_files:
                raise self.ctx.error(f"no files matching {self.opts.path!r}",
                                     hint="check the path, or add files before starting", code="no_files")
            if os.path.isdir(path) and not any("=" in os.path.basename(os.path.dirname(f)) for f in data_files):
                options["recursiveFileLookup"] = "true"
        try:
            schema = spark.read.format(fmt).options(**options).load(path).schema
        except AnalysisException as exc:
            if "avro" in str(exc).lower() and fmt == "avro":
                raise self.ctx.error("reading avro files needs the spark-avro connector, which is not installed",
                                     hint="convert the files to parquet, or add spark-avro to the connector jars",
                                     code="connector_missing") from exc
            raise self.ctx.error(f"cannot read {self.opts.format} files at {self.opts.path!r}: "
                                 f"{str(exc).splitlines()[0]}", code="file_unreadable") from exc
        options.pop("inferSchema", None)
        df = spark.readStream.format(fmt).schema(schema).options(**options).load(path)
        if GS_OP not in df.columns:
            df = df.withColumn(GS_OP, F.lit("i"))
        return df
