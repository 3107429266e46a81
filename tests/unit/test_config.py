"""Settings: embedded defaults < config file (``--config NAME``) < ``STREAMLING__…`` environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamling.config import env_variables, load_settings, mask_secrets, normalize_sink_name
from streamling.config.settings import env_overrides, find_config_file
from streamling.errors import StreamlingError


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults -------------------------------------------------------------------------------------

def test_defaults_without_file_or_environment(tmp_path: Path) -> None:
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.application_id == "local_app_v1"
    assert s.log_format == "text"
    assert s.pipeline_definition_location == "./pipeline.yaml"
    assert s.record_batch_interval_ms == 100
    assert s.record_batch_size == 1000
    assert s.checkpoint_interval_sec == 5
    assert s.enforce_primary_keys is False
    assert s.num_records_before_stop is None
    assert s.job_mode is False
    assert s.drain_policy == "auto"
    assert s.state_backend.backend_type == "InMemory"
    assert s.state_backend.sqlite.database_path == "./state.db"
    assert (s.state_backend.postgres.db, s.state_backend.postgres.sslmode) == ("streamling", "require")
    pg = s.postgres_sink
    assert (pg.host, pg.port, pg.user, pg.pass_, pg.db, pg.sslmode) == (
        "127.0.0.1", 5432, "graph-node", None, "postgres", "disable")
    assert (pg.batch_flush_interval, pg.batch_size, pg.statement_timeout_secs) == ("1s", 100, 60)
    assert (pg.pool_acquire_timeout_secs, pg.pool_idle_timeout_secs, pg.pool_max_lifetime_secs) == (
        30, 600, 1800)
    assert s.print_sink.sample_every == 1
    assert s.postgres_sink_connections == {}


# --- config file ----------------------------------------------------------------------------------

def test_config_yaml_overrides_defaults_and_keeps_the_rest(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", """
application_id: orders_v2
log_format: json
postgres_sink:
  host: db.internal
  batch_size: 500
""")
    s = load_settings(environ={}, cwd=tmp_path)
    assert (s.application_id, s.log_format) == ("orders_v2", "json")
    assert (s.postgres_sink.host, s.postgres_sink.batch_size) == ("db.internal", 500)
    # Keys the file does not mention keep their defaults, also inside a section it touches.
    assert (s.postgres_sink.port, s.postgres_sink.db) == (5432, "postgres")
    assert s.record_batch_size == 1000


def test_config_file_may_hold_sections_for_other_connectors(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "kafka_source:\n  brokers: redpanda:19092\nclickhouse_sink:\n  url: http://ch\n")
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.kafka_source.brokers == "redpanda:19092"
    assert s.clickhouse_sink.url == "http://ch"


def test_missing_config_file_is_fine(tmp_path: Path) -> None:
    assert find_config_file("config", tmp_path) is None
    assert load_settings("does-not-exist", environ={}, cwd=tmp_path).application_id == "local_app_v1"


@pytest.mark.parametrize("ext", [".yaml", ".yml", ".json"])
def test_config_name_is_tried_with_each_extension(tmp_path: Path, ext: str) -> None:
    body = json.dumps({"application_id": f"from{ext}"})  # JSON is also valid YAML
    _write(tmp_path / f"prod{ext}", body)
    assert find_config_file("prod", tmp_path) == tmp_path / f"prod{ext}"
    assert load_settings("prod", environ={}, cwd=tmp_path).application_id == f"from{ext}"


def test_default_config_name_is_config(tmp_path: Path) -> None:
    _write(tmp_path / "config.yml", "application_id: default_name\n")
    assert load_settings(environ={}, cwd=tmp_path).application_id == "default_name"


def test_yaml_is_preferred_over_yml_and_json(tmp_path: Path) -> None:
    for ext in (".json", ".yml", ".yaml"):
        _write(tmp_path / f"config{ext}", json.dumps({"application_id": ext}))
    assert find_config_file(None, tmp_path) == tmp_path / "config.yaml"
    (tmp_path / "config.yaml").unlink()
    assert find_config_file(None, tmp_path) == tmp_path / "config.yml"


def test_config_name_with_extension_is_used_as_is(tmp_path: Path) -> None:
    _write(tmp_path / "staging.json", '{"application_id": "staging"}')
    _write(tmp_path / "staging.json.yaml", "application_id: wrong\n")
    assert find_config_file("staging.json", tmp_path) == tmp_path / "staging.json"
    assert load_settings("staging.json", environ={}, cwd=tmp_path).application_id == "staging"


def test_unreadable_config_file_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", "{not json")
    with pytest.raises(StreamlingError) as info:
        load_settings(environ={}, cwd=tmp_path)
    assert info.value.headline().startswith(f"cannot read config file {path}: ")
    assert info.value.hint == "fix the file's syntax"


def test_config_file_must_be_a_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.yaml", "- a\n- b\n")
    with pytest.raises(StreamlingError) as info:
        load_settings(environ={}, cwd=tmp_path)
    assert info.value.headline() == f"config file {path} must hold a mapping of keys"


# --- environment ----------------------------------------------------------------------------------

def test_environment_wins_over_config_file(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "application_id: from_file\npostgres_sink:\n  host: file-host\n")
    env = {"STREAMLING__APPLICATION_ID": "from_env", "STREAMLING__POSTGRES_SINK__HOST": "env-host"}
    s = load_settings(environ=env, cwd=tmp_path)
    assert s.application_id == "from_env"
    assert s.postgres_sink.host == "env-host"


def test_environment_values_are_coerced_to_the_setting_type(tmp_path: Path) -> None:
    env = {
        "STREAMLING__POSTGRES_SINK__PORT": "6543",
        "STREAMLING__ENFORCE_PRIMARY_KEYS": "true",
        "STREAMLING__NUM_RECORDS_BEFORE_STOP": "25",
        "STREAMLING__CHECKPOINT_INTERVAL_SEC": "0.5",
    }
    s = load_settings(environ=env, cwd=tmp_path)
    assert s.postgres_sink.port == 6543
    assert s.enforce_primary_keys is True
    assert s.num_records_before_stop == 25
    assert s.checkpoint_interval_sec == 0.5


def test_environment_nests_with_double_underscore_and_lower_cases() -> None:
    env = {
        "STREAMLING__STATE_BACKEND__POSTGRES__HOST": "state-db",
        "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Postgres",
        "STREAMLING__KAFKA_SOURCE__BROKERS": "k1:9092,k2:9092",
        "STREAMLING__": "ignored",
        "OTHER__APPLICATION_ID": "ignored",
    }
    assert env_overrides(env) == {
        "state_backend": {"postgres": {"host": "state-db"}, "backend_type": "Postgres"},
        "kafka_source": {"brokers": "k1:9092,k2:9092"},
    }


def test_environment_does_not_touch_unrelated_keys_of_a_section(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "postgres_sink:\n  host: file-host\n  db: analytics\n")
    s = load_settings(environ={"STREAMLING__POSTGRES_SINK__PORT": "7000"}, cwd=tmp_path)
    pg = s.postgres_sink
    assert (pg.host, pg.db, pg.port) == ("file-host", "analytics", 7000)


def test_explicit_overrides_win_over_environment(tmp_path: Path) -> None:
    s = load_settings(environ={"STREAMLING__APPLICATION_ID": "env"}, cwd=tmp_path,
                      overrides={"application_id": "code"})
    assert s.application_id == "code"


# --- per-sink Postgres connections ----------------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "normalised"),
    [
        ("orders", "orders"),
        ("Orders", "orders"),
        ("pg.orders-v2", "pg_orders_v2"),
        ("My  Sink!!", "my_sink"),
        ("__raw..transactions__", "raw_transactions"),
        ("a__b", "a_b"),
        ("sink_1", "sink_1"),
    ],
)
def test_sink_name_normalisation(name: str, normalised: str) -> None:
    assert normalize_sink_name(name) == normalised


def test_per_sink_connection_overrides_the_shared_postgres_sink(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "postgres_sink:\n  host: shared-host\n  pass: shared-pass\n")
    env = {
        "STREAMLING__POSTGRES_SINK_CONNECTIONS__PG-ANALYTICS__HOST": "analytics-host",
        "STREAMLING__POSTGRES_SINK_CONNECTIONS__PG-ANALYTICS__PORT": "6432",
        "STREAMLING__POSTGRES_SINK_CONNECTIONS__PG-ANALYTICS__DB": "analytics",
        "STREAMLING__POSTGRES_SINK__BATCH_SIZE": "250",
    }
    s = load_settings(environ=env, cwd=tmp_path)
    assert s.postgres_sink_connections == {
        "pg_analytics": {"host": "analytics-host", "port": "6432", "db": "analytics"},
    }
    # The sink's own name, spelt as in the pipeline, finds the normalised entry.
    conn = s.postgres_connection_for("pg.analytics")
    assert (conn.host, conn.port, conn.db) == ("analytics-host", 6432, "analytics")
    # Everything not overridden comes from postgres_sink (file and environment).
    assert (conn.user, conn.pass_, conn.batch_size) == ("graph-node", "shared-pass", 250)
    # Another sink keeps the shared connection.
    other = s.postgres_connection_for("pg_main")
    assert (other.host, other.port, other.db) == ("shared-host", 5432, "postgres")


def test_per_sink_connection_describe_hides_the_password(tmp_path: Path) -> None:
    env = {"STREAMLING__POSTGRES_SINK_CONNECTIONS__OUT__PASS": "hunter2",
           "STREAMLING__POSTGRES_SINK_CONNECTIONS__OUT__USER": "writer"}
    conn = load_settings(environ=env, cwd=tmp_path).postgres_connection_for("out")
    assert conn.describe() == "postgres://writer@127.0.0.1:5432/postgres"
    assert "password=hunter2" in conn.conninfo()


# --- invalid values -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STREAMLING__RECORD_BATCH_SIZE": "lots"},
         "invalid configuration: record_batch_size: must be a valid integer, unable to parse string as an "
         "integer (got 'lots') — fix it in the config file or in STREAMLING__RECORD_BATCH_SIZE"),
        ({"STREAMLING__LOG_FORMAT": "xml"},
         "invalid configuration: log_format: must be 'text' or 'json' (got 'xml') — fix it in the config "
         "file or in STREAMLING__LOG_FORMAT"),
        ({"STREAMLING__STATE_BACKEND__BACKEND_TYPE": "redis"},
         "invalid configuration: state_backend.backend_type: unknown state backend 'redis'; use InMemory, "
         "Sqlite or Postgres — fix it in the config file or in STREAMLING__STATE_BACKEND__BACKEND_TYPE"),
        ({"STREAMLING__PRINT_SINK__SAMPLE_EVRY": "3"},
         "invalid configuration: print_sink.sample_evry: unknown key (did you mean 'sample_every'?) — fix it in "
         "the config file or in STREAMLING__PRINT_SINK__SAMPLE_EVRY"),
        ({"STREAMLING__PRINT_SINK__SAMPLE_EVERY": "0"},
         "invalid configuration: print_sink.sample_every: must be greater than or equal to 1 (got '0') — "
         "fix it in the config file or in STREAMLING__PRINT_SINK__SAMPLE_EVERY"),
    ],
)
def test_invalid_value_names_the_key(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(StreamlingError) as info:
        load_settings(environ=env, cwd=tmp_path)
    assert info.value.headline() == message
    assert info.value.user and info.value.code == "config_invalid"


def test_every_invalid_value_is_reported_at_once(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "log_format: xml\npostgres_sink:\n  port: five\n")
    with pytest.raises(StreamlingError) as info:
        load_settings(environ={}, cwd=tmp_path)
    assert info.value.message == (
        "invalid configuration: log_format: must be 'text' or 'json' (got 'xml'); postgres_sink.port: must "
        "be a valid integer, unable to parse string as an integer (got 'five')"
    )
    assert info.value.hint == (
        "fix it in the config file or in STREAMLING__LOG_FORMAT, STREAMLING__POSTGRES_SINK__PORT"
    )


def test_invalid_secret_is_not_echoed(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", "state_backend:\n  postgres:\n    password: 8675309\n")
    with pytest.raises(StreamlingError) as info:
        load_settings(environ={}, cwd=tmp_path)
    assert info.value.message == (
        "invalid configuration: state_backend.postgres.password: must be a valid string"
    )


# --- masking --------------------------------------------------------------------------------------

def test_masked_hides_every_secret_and_nothing_else(tmp_path: Path) -> None:
    _write(tmp_path / "config.yaml", """
postgres_sink:
  pass: pg-secret
state_backend:
  postgres:
    password: state-secret
kafka_source:
  sasl_username: alice
  sasl_password: kafka-secret
  schema_registry_password: registry-secret
spark:
  conf:
    spark.hadoop.fs.s3a.secret.key: s3-secret
    spark.hadoop.fs.s3a.session.token: s3-token
    spark.sql.shuffle.partitions: "4"
""")
    env = {"STREAMLING__POSTGRES_SINK_CONNECTIONS__ANALYTICS__PASS": "per-sink-secret"}
    masked = load_settings(environ=env, cwd=tmp_path).masked()
    assert masked["postgres_sink"]["pass"] == "***"
    assert masked["postgres_sink"]["user"] == "graph-node"
    assert masked["state_backend"]["postgres"]["password"] == "***"
    kafka = masked["kafka_source"]
    assert (kafka["sasl_username"], kafka["sasl_password"], kafka["schema_registry_password"]) == (
        "alice", "***", "***")
    assert masked["spark"]["conf"] == {"spark.hadoop.fs.s3a.secret.key": "***",
                                       "spark.hadoop.fs.s3a.session.token": "***",
                                       "spark.sql.shuffle.partitions": "4"}
    assert masked["postgres_sink_connections"] == {"analytics": {"pass": "***"}}
    text = json.dumps(masked)
    for secret in ("pg-secret", "state-secret", "kafka-secret", "registry-secret", "s3-secret", "s3-token",
                   "per-sink-secret"):
        assert secret not in text


def test_unset_secrets_stay_unset() -> None:
    assert mask_secrets({"password": None, "pass": "", "api_key": "k", "user": "u"}) == {
        "password": None, "pass": "", "api_key": "***", "user": "u",
    }


def test_masked_does_not_change_the_settings(tmp_path: Path) -> None:
    s = load_settings(environ={"STREAMLING__POSTGRES_SINK__PASS": "pg-secret"}, cwd=tmp_path)
    assert s.masked()["postgres_sink"]["pass"] == "***"
    assert s.postgres_sink.pass_ == "pg-secret"


def test_spark_conf_keys_from_the_environment_keep_their_case() -> None:
    settings = load_settings(environ={"STREAMLING__SPARK__CONF__spark.sql.adaptive.coalescePartitions.enabled":
                                      "false"}, cwd=Path("/nonexistent"))
    assert settings.spark.conf == {"spark.sql.adaptive.coalescePartitions.enabled": "false"}


def test_env_variables_is_the_inverse_of_env_overrides() -> None:
    tree = {"state_dir": "/jobs/state", "checkpoint_interval_sec": 1,
            "spark": {"master": "spark://127.0.0.1:7077", "conf": {"spark.sql.adaptive.Enabled": "false"}},
            "postgres_sink": {"host": "db", "pass": None}}
    env = env_variables(tree)
    assert env == {"STREAMLING__STATE_DIR": "/jobs/state", "STREAMLING__CHECKPOINT_INTERVAL_SEC": "1",
                   "STREAMLING__SPARK__MASTER": "spark://127.0.0.1:7077",
                   "STREAMLING__SPARK__CONF__spark.sql.adaptive.Enabled": "false",
                   "STREAMLING__POSTGRES_SINK__HOST": "db"}
    assert env_overrides(env) == {"state_dir": "/jobs/state", "checkpoint_interval_sec": "1",
                                  "spark": {"master": "spark://127.0.0.1:7077",
                                            "conf": {"spark.sql.adaptive.Enabled": "false"}},
                                  "postgres_sink": {"host": "db"}}
