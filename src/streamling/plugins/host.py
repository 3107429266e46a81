"""The runtime's side of a plugin: building instances, classifying failures, checking batches.

Shared by the Spark adapters (``sources/plugin.py``, ``transforms/plugin.py``, ``sinks/plugin.py``),
side outputs, preprocessors and the testing kit, so a plugin behaves the same under all of them.
No pyspark here: executors and the testing kit import it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from streamling.errors import NodeFailure, StreamlingError, is_retriable
from streamling.plugins.api import (
    MetricsRecorder,
    Plugin,
    PluginContext,
    PluginState,
    PreprocessorPlugin,
    TransientError,
)
from streamling.plugins.registry import Kind, find, ids, resolve_options

if TYPE_CHECKING:
    import pyarrow as pa

    from streamling.config import Settings

GS_OP = "_gs_op"
OPS = ("i", "u", "d")
#: the plugin class a job builds (``SourcePlugin``…): ``create`` returns one
PluginT = TypeVar("PluginT", bound=Plugin[Any])


@dataclass
class PluginJob(Generic[PluginT]):
    """Everything needed to build an instance of one node's plugin anywhere: plain, picklable data."""

    cls: type[PluginT]
    plugin_id: str
    kind: Kind
    node: str
    options: BaseModel
    primary_key: list[str] = field(default_factory=list)
    settings: Settings | None = None
    #: the input's Arrow schema (transforms, sinks, side outputs)
    input_schema: pa.Schema | None = None
    #: this job's own id, shipped with it: a node builds a job per run (and per input schema), so
    #: executor-side instances kept for one job are never handed to another run, whose options or
    #: plugin code may differ even under the same checkpoint
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def node_kind(self) -> str:
        """How messages name the node's kind: ``basic_plugin.random_source source``."""
        return f"{self.plugin_id} {self.kind.replace('_', ' ')}"

    def instance_family(self, partition: int) -> tuple[str, ...]:
        """What an executor-side instance of ``partition`` is valid for: plugin, node, this job (its
        run) and input schema; a worker keeps one instance per family (``plugins.instances``)."""
        schema = ""
        if self.input_schema is not None:
            schema = hashlib.sha256(self.input_schema.serialize().to_pybytes()).hexdigest()[:16]
        return self.plugin_id, self.node, self.run_id, schema, str(partition)

    def create(self, role: str, partition: int = -1, metrics: MetricsRecorder | None = None,
               partitions: int = 1) -> PluginT:
        """A fresh instance; a constructor failure is the plugin's, reported on the node."""
        ctx = PluginContext(plugin_id=self.plugin_id, node=self.node, options=self.options,
                            input_schema=self.input_schema, primary_key=list(self.primary_key),
                            state=PluginState(self.settings, self.node),
                            metrics=metrics or MetricsRecorder(self.node, self.plugin_id), role=role,
                            partition=partition, partitions=partitions)
        plugin: PluginT = self.call("starting", lambda: self.cls(ctx))
        return plugin

    def call(self, what: str, fn: Any) -> Any:
        """Run a plugin hook; anything it raises becomes a classified error naming plugin and node."""
        try:
            return fn()
        except StreamlingError:
            raise
        except NodeFailure:
            raise
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise self.error(f"{what} failed: {type(exc).__name__}: {exc}",
                             retriable=isinstance(exc, TransientError) or is_retriable(exc)) from exc

    def error(self, message: str, retriable: bool = False, hint: str | None = None) -> StreamlingError:
        code = "plugin_transient" if retriable else "plugin_failed"
        if not retriable and hint is None:
            hint = f"fix the plugin '{self.plugin_id}' or its options" + (
                "" if self.kind == "preprocessor" else "; the epoch was not committed and is replayed on restart")
        # A node of the pipeline speaks as "<id> <kind> '<node>'"; a preprocessor has no node.
        node, kind = (self.node, self.node_kind) if self.node else (self.plugin_id, f"{self.kind} plugin")
        return StreamlingError(message, node=node, node_kind=kind, retriable=retriable, hint=hint, code=code)

    def on_executor(self, what: str, fn: Any) -> Any:
        """``call`` for code running in a Spark worker: the error travels to the driver as a
        ``NodeFailure``, keeping its classification."""
        try:
            return self.call(what, fn)
        except StreamlingError as err:
            raise NodeFailure.of(err) from err


def job_for(kind: Kind, plugin_id: str, node: str, raw_options: dict[str, Any],
            settings: Settings | None = None) -> PluginJob[Plugin[Any]]:
    """The job of a preprocessor or side output named in the config (``plugin.*_ids``)."""
    info = find(kind, plugin_id)
    if info is None:
        known = ", ".join(ids(kind)) or "none installed"
        raise StreamlingError(f"{kind.replace('_', ' ')} plugin '{plugin_id}' is not available; known: {known}",
                              code="plugin_unknown", hint="install the plugin or set STREAMLING__PLUGIN__PATH; "
                              "`streamling plugins` lists what is installed")
    try:
        options = resolve_options(info, raw_options)
    except Exception as exc:
        raise StreamlingError(f"{kind.replace('_', ' ')} plugin '{plugin_id}': invalid options: {exc}",
                              code="plugin_options") from exc
    return PluginJob(info.cls, plugin_id, kind, node, options, settings=settings)


def preprocess(text: str, settings: Settings) -> str:
    """The pipeline text after every ``plugin.preprocessor_ids`` plugin rewrote it, in order."""
    for plugin_id in settings.plugin.preprocessor_ids:
        job = job_for("preprocessor", plugin_id, "", settings.plugin.preprocessor_options.get(plugin_id, {}),
                      settings)
        plugin = job.create("driver")
        # The registry holds every kind's classes by id, as installed distributions registered them
        # (checked against PreprocessorPlugin then): untyped by kind here, so narrowed at runtime.
        assert isinstance(plugin, PreprocessorPlugin)
        out = job.call("preprocessing the pipeline", functools.partial(plugin.preprocess, text))
        if not isinstance(out, str):
            raise job.error(f"preprocess() returned {type(out).__name__}, not the pipeline text")
        text = out
    return text


def conform(job: PluginJob, batch: Any, schema: pa.Schema, what: str) -> pa.RecordBatch:
    """``batch`` as ``schema`` says (columns by name, types cast where lossless); ``_gs_op`` added as
    inserts when the plugin's batch has none; anything else is a clear error on the node."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], schema)
    if not isinstance(batch, pa.RecordBatch):
        raise job.error(f"{what} returned {type(batch).__name__}, not a pyarrow.RecordBatch")
    if batch.schema.equals(schema):
        return _check_ops(job, batch, what)
    columns = []
    for target in schema:
        index = batch.schema.get_field_index(target.name)
        if index < 0:
            if target.name == GS_OP:
                columns.append(pa.array(["i"] * batch.num_rows, target.type))
                continue
            raise job.error(f"{what} returned no column '{target.name}' (it returned {batch.schema.names}); "
                            f"the declared schema is {schema.names}")
        column = batch.column(index)
        if column.type != target.type:
            try:
                column = column.cast(target.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise job.error(f"{what} returned column '{target.name}' as {column.type}, declared "
                                f"{target.type}: {exc}") from exc
        columns.append(column)
    extra = [n for n in batch.schema.names if schema.get_field_index(n) < 0]
    if extra:
        raise job.error(f"{what} returned column(s) {extra} its declared schema lacks ({schema.names})",
                        hint="declare them in output_schema()")
    return _check_ops(job, pa.RecordBatch.from_arrays(columns, schema=schema), what)


def _check_ops(job: PluginJob, batch: pa.RecordBatch, what: str) -> pa.RecordBatch:
    import pyarrow as pa
    import pyarrow.compute as pc

    index = batch.schema.get_field_index(GS_OP)
    if index >= 0 and batch.num_rows:
        ops = batch.column(index)
        bad = pc.fill_null(pc.invert(pc.is_in(ops, value_set=pa.array(OPS))), True)
        if pc.any(bad).as_py():
            found = sorted({str(v) for v in pc.filter(ops, bad).to_pylist()})
            raise job.error(f"{what} returned _gs_op values {found}; only i, u and d exist")
    return batch


def offset_json(value: Any) -> str:
    """An offset as canonical JSON text (how offsets are compared and checkpointed)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"offsets must be JSON values (numbers, strings, lists, dicts): {exc}") from exc


def node_job(kind: Kind, plugin_id: str, node: str, options: BaseModel, primary_key: list[str],
             settings: Settings) -> PluginJob[Plugin[Any]]:
    """The job of a pipeline node whose ``type`` is a plugin id (validated with the plugin's model)."""
    from streamling.plugins.discovery import ship_by_value

    info = find(kind, plugin_id)
    if info is None:  # validation found it: only a registry changed since then gets here
        raise StreamlingError(f"{kind} plugin '{plugin_id}' is not available", node=node, code="plugin_unknown")
    ship_by_value(info.cls)
    return PluginJob(info.cls, plugin_id, kind, node, options, list(primary_key), settings)


def check_configured_plugins(settings: Settings) -> None:
    """Every id in ``plugin.preprocessor_ids``/``side_output_ids`` names an installed plugin whose
    options validate (checked before anything runs, like the pipeline's own plugin nodes)."""
    for plugin_id in settings.plugin.preprocessor_ids:
        job_for("preprocessor", plugin_id, "", settings.plugin.preprocessor_options.get(plugin_id, {}), settings)
    for plugin_id in settings.plugin.side_output_ids:
        job_for("side_output", plugin_id, "", settings.plugin.side_output_options.get(plugin_id, {}), settings)
