"""Typed settings: embedded defaults < deployment defaults < config file < ``STREAMLING__…`` environment.

Deployment defaults (``STREAMLING_DEPLOYMENT_DEFAULTS``, a JSON object of keys) are set by a
deployment for the processes it starts: what "not configured" means there (a bundle task's state
backend keeps positions, so a job resumes after a restart). Every layer above still wins.

The keys and defaults are Streamling's where they apply, so an existing ``config.yaml`` and the
same environment variables keep working. Unknown top-level keys are kept (a config written for
connectors this build does not use must still load) but typed sections reject typos. The
sections themselves are ``streamling.config.sections``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streamling.config.sections import (
    ClickHouseSinkSettings,
    ClickHouseSourceSettings,
    DynamicTableBackendSettings,
    ExternalHttpHandlerSettings,
    FileSourceSettings,
    JobRunnerSettings,
    KafkaSinkSettings,
    KafkaSourceSettings,
    LiveDataInspectSettings,
    OpenTelemetrySettings,
    PluginSettings,
    PostgresConnection,
    PostgresSinkSettings,
    PrintSinkSettings,
    RetrySettings,
    SparkSettings,
    StateBackendSettings,
    WasmScriptSettings,
)
from streamling.errors import StreamlingError
from streamling.util import did_you_mean

ENV_PREFIX = "STREAMLING__"
DEPLOYMENT_DEFAULTS_ENV = "STREAMLING_DEPLOYMENT_DEFAULTS"
_SECRET_KEYS = re.compile(r"(pass(word)?|secret|secret[._-]?key|token|sasl_password|api_key|credentials?)$",
                          re.I)
MASK = "***"


class Settings(BaseModel):
    """The whole runtime configuration.

    Unknown keys are rejected like unknown pipeline keys (a typo must not fall back to a default
    silently). Keys Streamling defines for features this build does not run are accepted and
    reported by ``ineffective_keys``, so a config written for Streamling still loads and says so.
    """

    model_config = ConfigDict(extra="forbid")

    application_id: str = "local_app_v1"
    log_format: Literal["text", "json"] = "text"
    pipeline_definition_location: str = "./pipeline.yaml"
    record_batch_interval_ms: int = 100
    record_batch_size: int = 1000
    checkpoint_interval_sec: float = Field(default=5, ge=0)
    enforce_primary_keys: bool = False
    num_records_before_stop: int | None = Field(default=None, ge=1)
    job_mode: bool = False
    drain_policy: Literal["auto", "drain", "fast"] = "auto"
    #: after SIGTERM/SIGINT, how long the epoch in flight may take before the process exits non-zero
    shutdown_budget_secs: float = Field(default=25, gt=0)
    state_dir: str = "./.streamling"
    spark: SparkSettings = Field(default_factory=SparkSettings)
    state_backend: StateBackendSettings = Field(default_factory=StateBackendSettings)
    postgres_sink: PostgresSinkSettings = Field(default_factory=PostgresSinkSettings)
    postgres_sink_connections: dict[str, dict[str, Any]] = Field(default_factory=dict)
    print_sink: PrintSinkSettings = Field(default_factory=PrintSinkSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    kafka_source: KafkaSourceSettings = Field(default_factory=KafkaSourceSettings)
    kafka_sink: KafkaSinkSettings = Field(default_factory=KafkaSinkSettings)
    wasm_script: WasmScriptSettings = Field(default_factory=WasmScriptSettings)
    file_source: FileSourceSettings = Field(default_factory=FileSourceSettings)
    external_http_handler: ExternalHttpHandlerSettings = Field(default_factory=ExternalHttpHandlerSettings)
    dynamic_table_backend: DynamicTableBackendSettings = Field(default_factory=DynamicTableBackendSettings)
    #: ``STREAMLING__HTTP_SECRET_HEADER__<NAME>`` / ``…_VALUE__<NAME>``: the environment lower-cases
    #: ``<NAME>``, so both maps are keyed by the lower-cased secret name (see ``http_secret``).
    http_secret_header: dict[str, str] = Field(default_factory=dict)
    http_secret_value: dict[str, str] = Field(default_factory=dict)
    # Streamling keys for what this build does not run (yet): accepted, reported when set.
    internal_buffer_size: int = Field(default=10, ge=1)
    #: the admin API (health, topology, epochs, sampled rows, Prometheus ``/metrics``) of a CLI run;
    #: 0 turns it off. streamling binds it to ``admin_api_host`` (loopback unless set).
    admin_api_port: int = Field(default=3000, ge=0, le=65535)
    admin_api_host: str = "127.0.0.1"
    live_data_inspect_enabled: bool = False
    live_data_inspect: LiveDataInspectSettings = Field(default_factory=LiveDataInspectSettings)
    open_telemetry_metrics: OpenTelemetrySettings = Field(default_factory=OpenTelemetrySettings)
    plugin: PluginSettings = Field(default_factory=PluginSettings)
    plugin_drain_budget_secs: float = 60
    backpressure_event_threshold_ms: int = 100
    clickhouse_source: ClickHouseSourceSettings = Field(default_factory=ClickHouseSourceSettings)
    clickhouse_sink: ClickHouseSinkSettings = Field(default_factory=ClickHouseSinkSettings)
    job_runner: JobRunnerSettings = Field(default_factory=JobRunnerSettings)

    def ineffective_keys(self) -> list[tuple[str, str]]:
        """``(key, why)`` for each key set away from its default that does nothing on Spark here."""
        defaults = Settings()
        out: list[tuple[str, str]] = []

        def changed(*path: str) -> bool:
            mine: Any = self
            theirs: Any = defaults
            for part in path:
                mine, theirs = getattr(mine, part), getattr(theirs, part)
            return bool(mine != theirs)

        for key, why in _INEFFECTIVE.items():
            if changed(*key.split(".")):
                out.append((key, why))
        if self.drain_policy == "fast":
            out.append(("drain_policy", "'fast' stops like 'drain' here: on a stop request the epoch in flight "
                                        "finishes and commits (bounded by shutdown_budget_secs, then exit code 3) "
                                        "because Spark cannot abandon an epoch without failing the query; the rows "
                                        "written are the same either way"))
        return out

    def postgres_connection_for(self, sink_name: str) -> PostgresSinkSettings:
        """The sink's connection: ``postgres_sink`` overlaid with its per-sink override.

        ``STREAMLING__POSTGRES_SINK_CONNECTIONS__<SINK>__HOST`` etc. let two sinks write to
        different databases; the sink name is normalised as Streamling does.
        """
        override = self.postgres_sink_connections.get(normalize_sink_name(sink_name), {})
        merged = {**self.postgres_sink.model_dump(by_alias=True), **override}
        return PostgresSinkSettings.model_validate(merged)

    def dynamic_table_connection(self) -> PostgresConnection:
        """Where Postgres dynamic tables live: ``dynamic_table_backend.postgres`` over ``postgres_sink``."""
        own = self.dynamic_table_backend.postgres
        merged = self.postgres_sink.model_dump(by_alias=True, include={"host", "port", "user", "pass_", "db",
                                                                       "sslmode"})
        for key, value in (("host", own.host), ("port", own.port), ("user", own.user), ("pass", own.password),
                           ("db", own.db), ("sslmode", own.sslmode)):
            if value is not None:
                merged[key] = value
        return PostgresConnection.model_validate(merged)

    def http_secret(self, name: str) -> tuple[str, str]:
        """The (header name, header value) a node's ``secret_name`` refers to.

        Secret names are matched case-insensitively because environment keys arrive lower-cased;
        a missing half is a configuration error that names both variables to set.
        """
        key = name.strip().lower()
        header = self.http_secret_header.get(key)
        value = self.http_secret_value.get(key)
        if not header or value is None:
            missing = [f"{ENV_PREFIX}HTTP_SECRET_{part}__{name.strip().upper()}"
                       for part, present in (("HEADER", bool(header)), ("VALUE", value is not None)) if not present]
            raise StreamlingError(f"HTTP secret '{name}' is not configured", code="config_invalid",
                                  hint=f"set {' and '.join(missing)}")
        return header, value

    def masked(self) -> dict[str, Any]:
        """A JSON-able dump with every secret replaced by ``***`` (for logs and widgets)."""
        dump = mask_secrets(self.model_dump(by_alias=True))
        dump["http_secret_value"] = {k: MASK for k in self.http_secret_value}
        return dump


#: Keys that keep Streamling's name but cannot act on Spark, with what to use instead.
_INEFFECTIVE: dict[str, str] = {
    "record_batch_interval_ms": "on Spark rows move in epochs: an epoch starts every checkpoint_interval_sec, and "
                                "its Arrow batches are cut by record_batch_size, not by a timer",
    "internal_buffer_size": "Spark has no channel between operators to size; an epoch is processed as one Spark job",
    "plugin.channel_capacity": "plugins exchange whole Arrow batches with Spark's operators; there is no channel "
                               "between them to size",
    "plugin_drain_budget_secs": "a plugin's epoch in flight is bounded by shutdown_budget_secs like every node's",
    "backpressure_event_threshold_ms": "backpressure events are not emitted by this build; Spark's query progress "
                                       "(input vs processing rate) shows backpressure",
    "postgres_sink.batch_flush_interval": "a Postgres sink flushes once per epoch, in one transaction; set "
                                          "checkpoint_interval_sec to flush more or less often",
    "clickhouse_sink.batch_flush_interval": "a ClickHouse sink writes each epoch when it ends; set "
                                            "checkpoint_interval_sec to write more or less often",
    "clickhouse_sink.compression_level": "clickhouse-connect compresses inserts at its own fixed level; "
                                         "clickhouse_sink.compression picks the codec",
}


def normalize_sink_name(name: str) -> str:
    """Lower-case, non-alphanumerics to ``_``, runs collapsed, ends trimmed (Streamling's rule)."""
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9]", "_", name.lower())).strip("_")


def mask_secrets(value: Any, key: str = "") -> Any:
    if isinstance(value, Mapping):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v, key) for v in value]
    if value not in (None, "") and _SECRET_KEYS.search(key):
        return MASK
    return value


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: nested mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``STREAMLING__A__B=v`` → ``{"a": {"b": "v"}}`` (lower-cased; ``__`` nests).

    Spark settings are case-sensitive, so the key after ``STREAMLING__SPARK__CONF__`` keeps its
    case: ``STREAMLING__SPARK__CONF__spark.sql.adaptive.coalescePartitions.enabled=false``.
    """
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX:
            continue
        raw = [p for p in name[len(ENV_PREFIX):].split("__") if p]
        parts = [p.lower() for p in raw]
        if not parts:
            continue
        if parts[:2] == ["spark", "conf"] and len(parts) > 2:
            parts = ["spark", "conf", "__".join(raw[2:])]
        if parts[0] == "postgres_sink_connections" and len(parts) == 3:
            parts[1] = normalize_sink_name(parts[1])
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return tree


def env_variables(tree: Mapping[str, Any]) -> dict[str, str]:
    """The inverse of ``env_overrides``: settings as ``STREAMLING__…`` variables, for a child process
    (e.g. a bundle job task running the CLI) to receive them in the layer users set themselves."""
    out: dict[str, str] = {}

    def walk(node: Mapping[str, Any], name: str) -> None:
        for key, value in node.items():
            child = f"{name}__{key.upper()}" if name else f"{ENV_PREFIX}{key.upper()}"
            if isinstance(value, Mapping) and child == f"{ENV_PREFIX}SPARK__CONF":
                out.update({f"{child}__{k}": str(v) for k, v in value.items()})  # Spark keys keep their case
            elif isinstance(value, Mapping):
                walk(value, child)
            elif value is not None:
                out[child] = json.dumps(value) if isinstance(value, (list, bool)) else str(value)

    walk(tree, "")
    return out


def _default_tree() -> dict[str, Any]:
    text = resources.files("streamling.config").joinpath("default_config.yaml").read_text()
    return yaml.safe_load(text) or {}


def find_config_file(name: str | None, cwd: Path | None = None) -> Path | None:
    """``--config NAME``: NAME itself, else NAME.yaml / .yml / .json. A missing file is fine
    (Streamling's rule): the defaults and the environment still apply."""
    base = (cwd or Path.cwd()) / (name or "config")
    candidates = [base] if base.suffix in {".yaml", ".yml", ".json"} else []
    candidates += [base.with_name(base.name + ext) for ext in (".yaml", ".yml", ".json")]
    return next((c for c in candidates if c.is_file()), None)


def load_settings(
    config_name: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build settings from the layers (plus explicit overrides from code, highest)."""
    environ = os.environ if environ is None else environ
    tree = _default_tree()
    if environ.get(DEPLOYMENT_DEFAULTS_ENV):
        try:
            defaults = json.loads(environ[DEPLOYMENT_DEFAULTS_ENV])
        except ValueError:
            defaults = None
        if not isinstance(defaults, dict):
            raise StreamlingError(f"{DEPLOYMENT_DEFAULTS_ENV} is not a JSON object of settings",
                                  code="config_invalid", hint=f"unset {DEPLOYMENT_DEFAULTS_ENV}")
        tree = deep_merge(tree, defaults)
    path = find_config_file(config_name, cwd)
    if path is not None:
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise StreamlingError(f"cannot read config file {path}: {exc}", code="config_invalid",
                                  hint="fix the file's syntax") from exc
        if data is not None and not isinstance(data, Mapping):
            raise StreamlingError(f"config file {path} must hold a mapping of keys", code="config_invalid")
        tree = deep_merge(tree, data or {})
    tree = deep_merge(tree, env_overrides(environ))
    if overrides:
        tree = deep_merge(tree, overrides)
    try:
        return Settings.model_validate(tree)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(_config_problem(err) for err in errors)
        names = ", ".join(dict.fromkeys(
            ENV_PREFIX + "__".join(str(p).upper() for p in err["loc"]) for err in errors))
        raise StreamlingError(f"invalid configuration: {problems}", code="config_invalid",
                              hint=f"fix it in the config file or in {names}") from exc


def _config_problem(err: Any) -> str:
    """``key: what is wrong (got value)`` in plain words; secret values are never echoed."""
    loc = [str(p) for p in err["loc"]]
    text = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        text = "unknown key" + did_you_mean(loc[-1] if loc else "", _section_keys(loc[:-1]))
    elif text.startswith("Input should be"):
        text = text.replace("Input should be", "must be", 1)
        value = err.get("input")
        if isinstance(value, (str, int, float, bool)) and not _SECRET_KEYS.search(loc[-1] if loc else ""):
            text += f" (got {value!r})"
    return f"{'.'.join(loc)}: {text}"


def _section_keys(loc: list[str]) -> list[str]:
    """The keys allowed at ``loc`` in the settings model, for did-you-mean hints."""
    model: Any = Settings
    for part in loc:
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return [f.alias or k for k, f in model.model_fields.items()]
