"""``streamling [PIPELINE_FILE] [--config NAME] [--dry-run] [--validate]`` — Streamling's CLI.

Logs go to stderr; stdout carries only what a user asked for (print-sink rows, the validate
JSON, the dry-run plan). Exit codes: 0 success, 1 invalid pipeline or user error, 2 internal error,
3 stopped (SIGTERM/SIGINT) before the epoch in flight was committed (it is replayed on the next start).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from streamling import __version__
from streamling.config import Settings, load_settings
from streamling.errors import StreamlingError, ValidationError
from streamling.execution import execute, setup_logging

log = logging.getLogger("streamling")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamling", description="Run a Streamling pipeline on Spark.")
    p.add_argument("pipeline", nargs="?", help="pipeline YAML (default: pipeline_definition_location)")
    p.add_argument("--config", default=None, help="config file name or path (default: config[.yaml|.yml|.json])")
    p.add_argument("--dry-run", action="store_true", help="plan and resolve schemas without touching sinks")
    p.add_argument("--validate", action="store_true", help="check the pipeline; print one JSON result")
    p.add_argument("--debug", action="store_true", help="show full causes (incl. Java traces) on errors")
    p.add_argument("--master", default=None, metavar="URL",
                   help="Spark master, e.g. spark://host:7077 (over spark.master of config and environment)")
    p.add_argument("--version", action="version", version=f"streamling {__version__}")
    return p


def _load(args: argparse.Namespace) -> tuple[Settings, Any]:
    from streamling.plugins.discovery import load_plugins
    from streamling.plugins.host import check_configured_plugins, preprocess
    from streamling.spec import load_pipeline

    settings = load_settings(args.config, overrides={"spark": {"master": args.master}} if args.master else None)
    load_plugins(settings.plugin.path)
    check_configured_plugins(settings)
    path = args.pipeline or settings.pipeline_definition_location
    rewrite = (lambda text: preprocess(text, settings)) if settings.plugin.preprocessor_ids else None
    return settings, load_pipeline(path, rewrite)


class _WarningMessages(logging.Handler):
    """The messages of the warnings logged, each once, in the order they first came."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno == logging.WARNING and message not in self.messages:
            self.messages.append(message)


def validate(args: argparse.Namespace) -> int:
    """``--validate``: exactly one JSON object on stdout; ``warnings`` holds the messages of the
    warnings logged meanwhile (not whole log lines), each once, in order."""
    captured = io.StringIO()
    setup_logging("text", args.debug, capture=captured)
    warnings = _WarningMessages()
    logging.getLogger().addHandler(warnings)
    result: dict[str, Any] = {"success": True, "is_valid": True, "errors": [], "warnings": []}
    try:
        settings, spec = _load(args)
        _schema_check(settings, spec)
    except ValidationError as exc:
        result.update(is_valid=False, errors=[p.headline() for p in exc.problems])
    except StreamlingError as exc:
        result.update(is_valid=False, errors=[exc.headline()], success=exc.user)
    except Exception as exc:  # noqa: BLE001 - an internal error is still reported as JSON
        result.update(success=False, is_valid=False, errors=[f"internal error: {exc}"])
    result["warnings"] = warnings.messages
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["is_valid"] else 1


def _schema_check(settings: Settings, spec: Any) -> Any:
    from streamling.runtime.planner import analyze, build_plan
    from streamling.runtime.session import build_session

    plan = build_plan(spec, settings, dry_run=True)
    spark = build_session(settings)
    analyze(plan, spark)
    return plan


def run(args: argparse.Namespace) -> int:
    settings, spec = _load(args)
    if args.dry_run:
        plan = _schema_check(settings, spec)
        sys.stdout.write(json.dumps(plan.describe(), indent=2) + "\n")
        return 0
    return execute(spec, settings)


def main(argv: Sequence[str] | None = None) -> int:
    """``streamling ARGV…`` in this process, returning its exit code: the console script's entry
    point, and what a bundle's job driver calls for a task that runs Streamling itself, so such a
    task parses, logs and exits exactly as the command does."""
    command = argv is None  # the console script itself, not a caller (a bundle task, a test)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bundle"]:
        from streamling.bundle.cli import main as bundle_main

        setup_logging("text", debug=False)
        return bundle_main(argv[1:])
    if argv[:1] == ["plugins"]:
        setup_logging("text", debug=False)
        return list_plugins(argv[1:])
    args = _parser().parse_args(argv)
    if args.validate:
        return validate(args)
    setup_logging(_log_format(args), args.debug)
    try:
        return run(args)
    except StreamlingError as exc:
        _release_closed_stdout()
        log.error("%s", exc.describe(debug=args.debug))
        return 1 if exc.user else 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug is still one line; the trace is for --debug
        from streamling.runtime.jvm_death import jvm_failure

        jvm = jvm_failure(exc)
        if jvm is not None:  # not a bug of ours: the JVM ran out of memory or died
            log.error("%s — %s", jvm.what, jvm.hint, exc_info=args.debug)
            return 2
        log.error("internal error: %s: %s%s", type(exc).__name__, exc,
                  "" if args.debug else " (run with --debug for the trace, and report it)",
                  exc_info=args.debug)
        return 2
    finally:
        if command:  # the next run of the command starts with the JVM's classes ready
            from streamling.runtime.session import build_missing_class_archive

            build_missing_class_archive()


def _release_closed_stdout() -> None:
    """A reader that closed stdout (``streamling … | head``) must not get Python's "Exception ignored
    … BrokenPipeError" at exit on top of the print sink's one-line error: the unflushed rest goes to
    /dev/null."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def list_plugins(argv: Sequence[str]) -> int:
    """``streamling plugins [--json]``: every installed plugin and UDF, and plugins that failed to load."""
    from streamling.plugins import registry
    from streamling.plugins.discovery import FAILURES, load_plugins

    parser = argparse.ArgumentParser(prog="streamling plugins", description="List installed plugins.")
    parser.add_argument("--config", default=None, help="config file (for plugin.path)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(list(argv))
    try:
        path = load_settings(args.config).plugin.path
    except StreamlingError as exc:
        log.error("%s", exc.describe())
        return 1
    load_plugins(path)
    plugins = [{"id": i.plugin_id, "kind": i.kind, "class": f"{i.cls.__module__}.{i.cls.__qualname__}",
                "from": i.origin} for i in sorted(registry.PLUGINS.values(), key=lambda i: (i.kind, i.plugin_id))]
    udfs = [{"id": u.name, "kind": "udf", "returns": u.returns, "from": u.origin}
            for u in sorted(registry.UDFS.values(), key=lambda u: u.name)]
    failed = [{"from": f.origin, "error": f.message} for f in FAILURES]
    if args.json:
        sys.stdout.write(json.dumps({"plugins": plugins + udfs, "failed": failed}) + "\n")
        return 0
    rows = [(p["kind"], p["id"], p["from"]) for p in plugins + udfs]
    if not rows:
        sys.stdout.write("no plugins installed (entry-point group 'streamling.plugins', or STREAMLING__PLUGIN__PATH)\n")
    width = max((len(r[1]) for r in rows), default=0)
    for kind, pid, origin in rows:
        sys.stdout.write(f"{kind:<12} {pid:<{width}}  {origin}\n")
    for f in failed:
        sys.stdout.write(f"failed       {f['from']}: {f['error']}\n")
    return 0


def _log_format(args: argparse.Namespace) -> str:
    """``log_format`` from the config layers (file < environment); text when they do not load —
    the run itself then reports why."""
    try:
        return load_settings(args.config).log_format
    except StreamlingError:
        fmt = os.environ.get("STREAMLING__LOG_FORMAT", "text")
        return fmt if fmt in ("text", "json") else "text"


if __name__ == "__main__":
    sys.exit(main())
