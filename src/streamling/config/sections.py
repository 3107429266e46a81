"""The typed sections of the settings: one model per key of ``config.yaml`` that holds keys.

Each section validates its own keys (typed sections reject typos) and derives what its client needs
from them (libpq's conninfo, librdkafka's and Spark's Kafka options, the schema registry's). The
whole configuration, its layers and how it is reported are ``streamling.config.settings``'.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from streamling.util import csv_list, parse_duration_secs


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SparkSettings(_Section):
    master: str = "local[*]"
    shuffle_partitions: int = 2
    conf: dict[str, str] = Field(default_factory=dict)
    #: where executors' Python workers get the job's packages: ``shipped`` packs this environment
    #: and the driver serves it to each worker host once per content (workers need only Java, Spark
    #: and a Python of the same minor version), ``local`` runs this interpreter's path on every
    #: worker (same install on every host), ``auto`` ships on masters that span hosts and stays
    #: local otherwise
    python_environment: Literal["auto", "shipped", "local"] = "auto"
    #: the driver's port for serving the shipped environment to workers (0: any free port; set one
    #: when a firewall between workers and the driver opens only chosen ports, as for
    #: ``spark.driver.port``)
    python_environment_port: int = Field(default=0, ge=0, le=65535)
    #: distributions added to the shipped environment besides streamling's and the plugins' own
    python_packages: list[str] = Field(default_factory=list)

    def ships_environment(self) -> bool:
        """Whether executors get the packed environment (see ``python_environment``)."""
        from streamling.storage import is_multi_host

        if self.python_environment == "auto":
            return is_multi_host(self.master)
        return self.python_environment == "shipped"


class SqliteStateSettings(_Section):
    database_path: str = "./state.db"


class PostgresStateSettings(_Section):
    host: str = "127.0.0.1"
    port: int = 5432
    db: str = "streamling"
    user: str = "graph-node"
    password: str | None = None
    sslmode: str = "require"
    max_connections: int = 4
    state_schema_name: str = "streamling"
    state_table_name: str = "state"


class StateBackendSettings(_Section):
    backend_type: str = "InMemory"
    sqlite: SqliteStateSettings = Field(default_factory=SqliteStateSettings)
    postgres: PostgresStateSettings = Field(default_factory=PostgresStateSettings)

    @field_validator("backend_type")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        norm = normalize_backend(value)
        if norm not in {"inmemory", "sqlite", "postgres"}:
            raise ValueError(f"unknown state backend {value!r}; use InMemory, Sqlite or Postgres")
        return value


class PostgresConnection(_Section):
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "graph-node"
    pass_: str | None = Field(default=None, alias="pass")
    db: str = "postgres"
    sslmode: str = "disable"

    def conninfo(self) -> str:
        """libpq keyword string; the password is passed separately so it never lands in logs."""
        parts = {"host": self.host, "port": str(self.port), "user": self.user, "dbname": self.db,
                 "sslmode": self.sslmode}
        if self.pass_:
            parts["password"] = self.pass_
        return " ".join(f"{k}={_quote_libpq(v)}" for k, v in parts.items())

    def describe(self) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{self.db}"


class JobRunnerPostgresSettings(PostgresConnection):
    #: one schema per bundle root: two roots sharing a database must not share runs
    schema_name: str | None = None


class JobRunnerSettings(_Section):
    """``job_runner.*``: where a bundle target's job runner keeps runs, attempts and its lease.

    ``sqlite`` (a file under the bundle root) serves one host. ``postgres`` is the store several hosts
    reach: runners on any of them hold a lease there, one supervises at a time, and a second one takes
    over within ``lease_secs`` when the first dies (its drivers are fenced before new ones start).
    """

    store: Literal["sqlite", "postgres"] = "sqlite"
    postgres: JobRunnerPostgresSettings = Field(default_factory=JobRunnerPostgresSettings)
    lease_secs: float = Field(default=10, ge=2, le=600)
    #: a warm standby driver per running task of a continuous job, so a dead driver is replaced in
    #: seconds (``auto``: production-mode targets on a local master; it costs one idle driver per such task)
    standby: bool | Literal["auto"] = "auto"
    #: drivers kept warm for the target's settings, for any notebook task that starts without a standby
    #: of its own (a new deploy's first run): ``auto`` keeps one on production-mode targets
    warm_drivers: Annotated[int, Field(ge=0, le=8)] | Literal["auto"] = "auto"
    #: executors each waiting standby holds on a cluster (pooled warm drivers hold none), started and warmed
    #: (their Python workers with the job's modules imported), so taking over runs the first epoch at
    #: once instead of starting executors. They are cores the active driver cannot have: leave them
    #: free with ``spark.cores.max``. 0 (default): a standby holds none and claims them as it takes over
    standby_executors: Annotated[int, Field(ge=0, le=64)] = 0


class PostgresSinkSettings(PostgresConnection):
    batch_flush_interval: str = "1s"
    batch_size: int = 100
    statement_timeout_secs: int = 60
    pool_acquire_timeout_secs: int = 30
    pool_idle_timeout_secs: int = 600
    pool_max_lifetime_secs: int = 1800


class PostgresDynamicTableSettings(_Section):
    """``dynamic_table_backend.postgres.*``. Connection keys left unset (null) fall back to
    ``postgres_sink.*``, so one Postgres configured for the sink also serves dynamic tables."""

    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = Field(default=None, validation_alias=AliasChoices("password", "pass"))
    db: str | None = None
    sslmode: str | None = None
    max_connections: int | None = Field(default=None, ge=1)
    #: schema of the tables (a node's ``schema`` overrides it)
    dt_schema_name: str = "streamling"
    #: keep each table's values in memory, refreshed incrementally by ``time_column`` (a node's
    #: ``cache`` overrides it); off: the table is re-read every epoch, so direct deletes are seen
    cache_enabled: bool = False
    #: with the cache on, look for rows written by others at most this often (a node's
    #: ``cache_refresh_debounce_ms`` overrides it; 0 = every epoch)
    cache_refresh_debounce_ms: int = Field(default=1000, ge=0)
    statement_timeout_secs: int = Field(default=30, ge=0)


class DynamicTableBackendSettings(_Section):
    postgres: PostgresDynamicTableSettings = Field(default_factory=PostgresDynamicTableSettings)
    #: most values in one INSERT statement when a dynamic table's ``sql`` fills it
    max_batch_size: int = Field(default=1000, ge=1)


class KafkaConnection(_Section):
    """``kafka_source.*`` / ``kafka_sink.*``: brokers, security and the schema registry."""

    brokers: str = "localhost:9092"
    security_protocol: str = "plaintext"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    schema_registry_url: str = "http://localhost:18081"
    schema_registry_username: str | None = None
    schema_registry_password: str | None = None
    client_id: str | None = None

    def librdkafka(self) -> dict[str, str | int | float | bool]:
        """Settings for confluent-kafka clients (admin, offset commits, tests)."""
        conf: dict[str, str | int | float | bool] = {"bootstrap.servers": self.brokers,
                                                     "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password
        if self.client_id:
            conf["client.id"] = self.client_id
        return conf

    def spark_options(self) -> dict[str, str]:
        """The same connection for Spark's Kafka connector (``kafka.``-prefixed Java client keys)."""
        opts = {"kafka.bootstrap.servers": self.brokers, "kafka.security.protocol": self.security_protocol.upper()}
        if self.sasl_mechanism:
            opts["kafka.sasl.mechanism"] = self.sasl_mechanism.upper()
            module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
                      if self.sasl_mechanism.upper().startswith("SCRAM")
                      else "org.apache.kafka.common.security.plain.PlainLoginModule")
            user = (self.sasl_username or "").replace('"', '\\"')
            password = (self.sasl_password or "").replace('"', '\\"')
            opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
        if self.client_id:
            opts["kafka.client.id"] = self.client_id
        return opts

    def registry(self) -> dict[str, str]:
        conf = {"url": self.schema_registry_url}
        if self.schema_registry_username:
            conf["basic.auth.user.info"] = f"{self.schema_registry_username}:{self.schema_registry_password or ''}"
        return conf


class KafkaSourceSettings(KafkaConnection):
    """``kafka_source.*``. Every key Streamling reads is accepted; the ones Spark gives no meaning
    are reported by the Kafka and hybrid sources (``Node.ineffective_settings``) when a pipeline uses them."""

    #: offsets are committed to ``<consumer_group_id>-<node>`` (default ``<application_id>.<node>``)
    consumer_group_id: str | None = None
    lag_report_interval_ms: int = Field(default=60000, ge=1)
    #: Streamling: how long the consumer waits for its first assignment before logging and retrying
    consumer_fetch_timeout_sec: int | None = Field(default=None, ge=1)
    #: Streamling: after this long without records while lag is positive, log a stall warning
    stall_watchdog_timeout_sec: int | None = Field(default=None, ge=1)
    #: streamling addition: upper bound of records per epoch (Spark's maxOffsetsPerTrigger), so a first
    #: epoch from ``earliest`` cannot pull a whole topic into one epoch (driver-side sinks hold an epoch
    #: in memory); ``null`` removes the bound.
    max_offsets_per_epoch: int | None = Field(default=1_000_000, ge=1)


class KafkaSinkSettings(KafkaConnection):
    """``kafka_sink.*``. Streamling reads the sink with the source's connection model, so the two
    consumer-only keys are accepted here too (they do nothing for a producer, there or here)."""

    consumer_group_id: str | None = None
    lag_report_interval_ms: int | None = Field(default=None, ge=1)


class RetrySettings(_Section):
    max_attempts: int = Field(default=8, ge=1)
    initial_backoff_ms: int = 200
    max_backoff_ms: int = 10000


class ExternalHttpHandlerSettings(_Section):
    """``external_http_handler.*``: limits shared by the ``handler`` transform and ``webhook`` sink."""

    #: most rows in one batch-mode request (a node's ``batch_size`` can only lower it).
    trigger_max_count: int = Field(default=2000, ge=1)
    #: how long one request may take, in seconds, before it counts as a (retriable) timeout.
    operator_timeout_sec: float = Field(default=300, gt=0)
    #: how many requests of one node are in flight at once.
    buffer_size: int = Field(default=25, ge=1)


class WasmScriptSettings(_Section):
    """Sandbox of the ``script`` transform: runtime ``.wasm`` (default: packaged QuickJS) and limits per batch."""

    runtime_wasm_file_path: str | None = None
    memory_limit_mb: int = Field(default=256, ge=8)
    cpu_limit_ms: int = Field(default=30000, ge=10)


class FileSourceSettings(_Section):
    """``file_source.*``: limits of the ``file`` source."""

    #: the longest CSV field (in characters) a file may hold. Spark's own default is no limit, and a
    #: field of hundreds of MB then exhausts the JVM's memory with no word of the file or node; a
    #: bound turns that into an error naming the file and line.
    max_field_chars: int = Field(default=10_485_760, ge=1024)


class PrintSinkSettings(_Section):
    sample_every: int = Field(default=1, ge=1)


class ClickHouseConnection(_Section):
    """``clickhouse_source.*`` / ``clickhouse_sink.*``: where the ClickHouse HTTP interface is."""

    url: str = "http://localhost:8123"
    user: str = "default"
    password: str | None = None
    database: str = "default"

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value.strip(), re.I):
            raise ValueError(f"must be an http:// or https:// URL of ClickHouse's HTTP interface (got {value!r})")
        return value.strip().rstrip("/")

    def describe(self) -> str:
        return f"{self.url} (database {self.database}, user {self.user})"


class ClickHouseSourceSettings(ClickHouseConnection):
    #: most rows in one epoch (one page of the sort key)
    page_size: int = Field(default=10_000_000, ge=1)
    #: widest span of a numeric sort key one query reads; halved when a query times out
    sort_key_range: int = Field(default=1_000_000, ge=1, validation_alias=AliasChoices("sort_key_range", "block_range"))


class ClickHouseSinkSettings(ClickHouseConnection):
    compression: Literal["none", "gzip", "zstd", "lz4"] = "zstd"
    compression_level: int = Field(default=6, ge=0, le=22)
    #: rows per INSERT (an epoch larger than this is sent as several inserts)
    batch_size: int = Field(default=100_000, ge=1)
    batch_flush_interval: str = "1s"

    @field_validator("batch_flush_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration_secs(value)
        return value


class OpenTelemetrySettings(BaseModel):
    """Streamling's ``open_telemetry_metrics``: where metrics go over OTLP. ``ingestion_endpoint: none``
    with no ``OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT`` set exports nothing over OTLP; the admin API's
    ``/metrics`` serves the same metrics for a Prometheus scrape either way."""

    model_config = ConfigDict(extra="forbid")

    ingestion_endpoint: str = "none"
    endpoint_protocol: Literal["http/protobuf", "http/json", "grpc"] | None = None
    batch_interval_secs: float = Field(default=15, gt=0)
    #: ``k:v,k2:v2``: tags on every series
    global_tags: str = ""
    metric_deny_list: list[str] = Field(default_factory=lambda: ["kafka_consumer.msg_decode_latency",
                                                                   "kafka_producer.msg_encode_latency"])

    _deny_csv = field_validator("metric_deny_list", mode="before")(classmethod(lambda cls, v: csv_list(v)))

    @field_validator("global_tags")
    @classmethod
    def _tags(cls, value: str) -> str:
        for pair in filter(None, (p.strip() for p in value.split(","))):
            if ":" not in pair or not pair.split(":", 1)[0].strip():
                raise ValueError(f"global_tags: '{pair}' is not 'key:value' (write 'k:v,k2:v2')")
        return value

    def tags(self) -> dict[str, str]:
        return {k.strip(): v.strip() for k, v in (p.split(":", 1) for p in self.global_tags.split(",") if ":" in p)}


class LiveDataInspectSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    records_per_topology_node: int = Field(default=15, ge=1, le=1000)
    refresh_in_secs: float = Field(default=30, gt=0)


class PluginSettings(BaseModel):
    """Streamling's ``plugin`` section. Other keys under it are per-plugin option overrides
    (``STREAMLING__PLUGIN__<PLUGIN_ID>__<KEY>``, the id upper-cased with ``.`` as ``_``), which the
    plugin's options model validates when the pipeline is checked."""

    model_config = ConfigDict(extra="allow")

    #: a plugin file or a folder of them (``STREAMLING__PLUGIN__PATH``), loaded besides the
    #: ``streamling.plugins`` entry points of installed distributions
    path: str | None = None
    channel_capacity: int = Field(default=50, ge=1)
    preprocessor_ids: list[str] = Field(default_factory=list)
    preprocessor_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    side_output_ids: list[str] = Field(default_factory=list)
    side_output_options: dict[str, dict[str, Any]] = Field(default_factory=dict)

    _ids_csv = field_validator("preprocessor_ids", "side_output_ids", mode="before")(
        classmethod(lambda cls, v: csv_list(v)))

    @field_validator("preprocessor_options", "side_output_options", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        if isinstance(value, str):  # from the environment: a JSON object keyed by plugin id
            return json.loads(value) if value.strip() else {}
        return value


def normalize_backend(value: str) -> str:
    return re.sub(r"[^a-z]", "", value.lower())


def _quote_libpq(value: str) -> str:
    if value and re.fullmatch(r"[A-Za-z0-9_.:/@-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
