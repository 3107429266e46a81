"""How the CLI ends when something breaks: one line and exit 2 for an internal error, the trace only
with ``--debug``; ``log_format`` from the config file shapes the log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamling import cli

pytestmark = pytest.mark.usefixtures("restore_logging")


def _crash(_args: object) -> int:
    raise KeyError("flows")


def test_an_internal_error_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "run", _crash)
    assert cli.main(["p.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert err[0].endswith("ERROR streamling: internal error: KeyError: 'flows' (run with --debug for the trace, "
                           "and report it)")

    assert cli.main(["p.yaml", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_log_format_from_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("log_format: json\n")
    monkeypatch.setattr(cli, "run", _crash)
    assert cli.main(["p.yaml"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["message"].startswith("internal error: KeyError")
