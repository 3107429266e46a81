"""Base for Python-side transforms: whole Arrow record batches through ``mapInArrow``.

Subclasses say what the output schema is and build a *picklable* batch function that runs in
Spark's Python workers. Rows never cross one by one: each call receives a ``pyarrow.RecordBatch``
and yields batches. Failures raised as ``NodeFailure`` inside the function reach the user as
"<type> transform '<name>': …" instead of a worker traceback.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from streamling.runtime.nodes import Epoch, OptionsT, Transform

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

BatchFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]


class ArrowTransform(Transform[OptionsT]):
    """A transform implemented as a function over Arrow record batches."""

    @abstractmethod
    def output_schema(self, input_schema: StructType) -> StructType:
        """The Spark schema of what ``batch_function`` yields, given the input's."""

    @abstractmethod
    def batch_function(self, input_schema: StructType, epoch: Epoch | None) -> BatchFunction:
        """A picklable function run on executors; it must not capture the SparkSession."""

    def apply(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        frames = list(inputs.values())
        df = frames[0]
        for other in frames[1:]:
            df = df.unionByName(other, allowMissingColumns=True)
        return df.mapInArrow(self.batch_function(df.schema, epoch), self.output_schema(df.schema))
