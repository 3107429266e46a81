"""What a ``bundle.yml`` resolves to for one target: the ``Bundle`` and the typed resources it holds.

These dataclasses are what ``deploy``, the job runner and the driver read: every ``${...}`` replaced, every path
absolute, development prefixes, tags and pauses applied. How they are read from YAML lives beside them:
``loading`` (files, includes, targets), ``schema`` (which keys exist), ``variables`` (``${...}``), and the
builders ``builder``, ``jobs``, ``tasks`` and ``pipelines``, which check each value on the way. No pyspark
import here: ``streamling bundle validate`` must stay fast and JVM-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from streamling.errors import StreamlingError

BUNDLE_FILES = ("bundle.yml", "bundle.yaml", "databricks.yml", "databricks.yaml")
#: the payload keys of a task this runner runs; ``Task.kind`` is the key without ``_task``
PAYLOADS = ("notebook_task", "spark_python_task", "python_wheel_task", "condition_task", "sql_task", "run_job_task",
            "for_each_task", "pipeline_task")
UNSUPPORTED_PAYLOADS = ("dbt_task",
                        "spark_jar_task", "spark_submit_task", "clean_rooms_notebook_task", "dashboard_task",
                        "power_bi_task", "gen_ai_compute_task", "alert_task")
PauseStatus = Literal["PAUSED", "UNPAUSED"]


def unpaused(section: Any) -> bool:
    """A deployed job's continuous section (its pause status), schedule or periodic trigger that should fire."""
    if not section:
        return False
    status = section.get("pause_status") if isinstance(section, dict) else section
    return str(status or "UNPAUSED").upper() == "UNPAUSED"


@dataclass
class ForEach:
    """A for-each task's inputs (a JSON array, or a reference to one), how many iterations run at once,
    and the hidden job that runs one iteration (its nested task; see ``Job.iteration_of``)."""

    inputs: str
    concurrency: int
    job: str


@dataclass
class Task:
    """One task of a job: what it runs (a notebook, a Python file or the streamling wheel) and its retry policy."""

    key: str
    depends_on: list[str]
    kind: Literal["notebook", "spark_python", "python_wheel", "condition", "sql", "run_job", "for_each", "pipeline"]
    notebook_path: Path | None  #: absolute, resolved relative to the YAML file that declares it
    base_parameters: dict[str, str]
    python_file: Path | None  #: absolute, resolved relative to its YAML file
    package_name: str | None
    entry_point: str | None
    parameters: list[str]
    max_retries: int = 0  #: -1 = unlimited (Databricks)
    min_retry_interval_millis: int = 0
    retry_on_timeout: bool = False
    timeout_seconds: int = 0  #: 0 = none
    source: str = ""  #: ``bundle.yml:23``, for messages
    #: a condition task's {op, left, right} (evaluated by the runner, no process)
    condition: dict[str, str] | None = None
    #: dependency → the outcome ("true"/"false") of that condition task this task runs on
    outcomes: dict[str, str] = field(default_factory=dict)
    #: a SQL task's file (absolute, resolved relative to its YAML file); its parameters are ``base_parameters``
    sql_file: Path | None = None
    #: a run-job task: the job it runs (a key of this bundle's jobs) and that run's job parameters
    run_job: str | None = None
    job_parameters: dict[str, str] = field(default_factory=dict)
    #: a for-each task: its inputs (a JSON array, or a reference to one), how many iterations run at
    #: once, and the job that runs one iteration (its nested task; see ``Job.iteration_of``)
    for_each: ForEach | None = None
    run_if: str = "ALL_SUCCESS"
    #: a pipeline task: the pipeline it updates (a key of ``Bundle.pipelines``), and whether it recomputes all
    pipeline: str | None = None
    full_refresh: bool = False
    #: its cluster's Spark settings (``new_cluster``, ``job_cluster_key``, ``existing_cluster_id``): the
    #: ``spark_conf`` applies to the task's Spark session, ``spark_env_vars`` to its driver and executors
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_env_vars: dict[str, str] = field(default_factory=dict)
    #: what the task's Python needs besides streamling (``libraries`` and its job environment's
    #: ``dependencies``): pip requirement specs, ``-r <file>``, and wheel paths or globs (absolute)
    libraries: list[str] = field(default_factory=list)


@dataclass
class Schedule:
    """A Quartz cron schedule; checked for shape here, parsed by whoever fires it."""

    quartz_cron_expression: str
    timezone_id: str
    pause_status: PauseStatus


@dataclass
class Periodic:
    interval: int
    unit: Literal["MINUTES", "HOURS", "DAYS", "WEEKS"]
    pause_status: PauseStatus


@dataclass
class Job:
    """A job as the runner sees it: development prefixes, tags and pauses already applied."""

    key: str
    name: str  #: after the development prefix ``[dev <user>] ``
    tasks: list[Task]
    parameters: dict[str, str]
    schedule: Schedule | None
    periodic: Periodic | None
    continuous: PauseStatus | None  #: None = not a continuous job
    max_concurrent_runs: int
    timeout_seconds: int
    tags: dict[str, str]
    webhook_notifications: dict[str, list[str]]
    email_notifications: dict[str, list[str]]
    source: str
    #: (job, task) of the for-each task whose iterations this hidden job runs, each with ``{{input}}``
    iteration_of: tuple[str, str] | None = None


@dataclass
class Pipeline:
    """A Lakeflow (Databricks) declarative pipeline, run here by Apache Spark's Declarative Pipelines
    (``pyspark.pipelines``, the ``spark-pipelines`` CLI): its source files and folders (``folder/**``),
    its default catalog and schema, the Spark settings of its runs, and where it keeps its tables and
    checkpoints (``storage``, as on Databricks; see ``pipeline_locations``)."""

    key: str
    name: str
    libraries: list[str]  #: absolute file paths and folder globs (``…/**``)
    catalog: str | None
    schema: str | None
    configuration: dict[str, str]
    source: str = ""
    storage: str | None = None  #: a URI, or an absolute local path (relative ones resolved against the bundle root)


def pipeline_locations(root_path: str, key: str, storage_location: str | None) -> tuple[str, str]:
    """Where pipeline ``key`` keeps its checkpoints (the spec's ``storage``) and its tables (the
    warehouse): under its ``storage`` location when it names one — ``checkpoints/`` and ``tables/``,
    the folders a Databricks pipeline with a storage location uses — else under the target's root,
    ``state/pipelines/<key>/storage`` and the ``warehouse/`` every pipeline of the target shares."""
    from streamling import storage

    if storage_location:
        return storage.join(storage_location, "checkpoints"), storage.join(storage_location, "tables")
    return storage.join(root_path, "state", "pipelines", key, "storage"), storage.join(root_path, "warehouse")


@dataclass
class Artifact:
    """A wheel ``deploy`` builds (``artifacts.<name>``): ``build`` runs in ``path``, the wheels are its ``files``
    (default ``dist/*.whl`` under ``path``)."""

    name: str
    path: Path
    build: str | None
    files: list[str]


@dataclass
class Target:
    """Where a deployment lives and how it runs.

    ``config`` is a streamling extension: runtime settings overrides with the keys of ``config.yaml`` (for example
    ``{spark: {master: "spark://127.0.0.1:7077", conf: {...}}, application_id: ...}``), from
    ``targets.<t>.config`` merged over the top-level ``config``. It is how a target picks its Spark master.
    """

    name: str
    mode: Literal["development", "production"] | None
    root_path: str  #: absolute local path or URI; deployments, checkpoints and run logs live under it
    root_path_explicit: bool
    file_path: str
    config: dict[str, Any]  #: runtime settings overrides (config.yaml keys); see the module docstring


@dataclass
class Bundle:
    """The whole bundle resolved for one target: every ``${...}`` replaced, every path absolute."""

    name: str
    root: Path
    target: Target
    variables: dict[str, str]
    jobs: dict[str, Job]
    files: list[Path]
    user: str
    warnings: list[str] = field(default_factory=list)
    #: the secret scopes the bundle declares (``resources.secret_scopes``): deploy creates missing ones
    secret_scopes: list[str] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The resolved configuration (paths as text), for ``bundle validate -o json`` and deployment records."""
        return cast(dict[str, Any], _jsonable(asdict(self)))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def find_bundle_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding a bundle file, so commands work from any subfolder."""
    here = Path(start).resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        if any((folder / name).is_file() for name in BUNDLE_FILES):
            return folder
    raise StreamlingError(f"no bundle found in {here} or any folder above it", code="bundle_missing",
                          hint=f"run from inside a bundle folder, or create one of {', '.join(BUNDLE_FILES)}")

