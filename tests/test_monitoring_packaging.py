"""The ``monitor:`` setting on its way into an archive: the packager validates a model's baseline and canary files,
copies them into the archive (the monitor reads them there), names them in ``model-config.yaml`` and hashes their
content into the fingerprint; a bad file is refused with one message; a models file's relative paths are its own;
``explain-serve``'s ``--monitor*`` flags reach every model's ``handler.monitor``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_store import package as package_module
from model_store.archive import MODEL_CONFIG_FILE
from monitoring.baseline import Baseline, BaselineEntry, read_baseline, write_baseline
from monitoring.canaries import Canary, Probe, ProbeAnswer, read_canaries, write_canaries
from monitoring.config import parse_monitor
from monitoring.monitor import load_monitor
from monitoring.readers import ClassificationReader
from serving_core.config import HandlerConfig
from tests import checkpoints


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.generic_labels(tmp_path_factory.mktemp("monitor-package") / "reviews")


def _baseline(path: Path, share: float = 0.25) -> Path:
    entries = {("attnlrp", "LABEL_1"): BaselineEntry("attnlrp", "LABEL_1", "words", 8, {"good": share, "the": 0.1})}
    write_baseline(Baseline("reviews", entries), path)
    return path


def _canaries(path: Path) -> Path:
    write_canaries("reviews", [Canary(Probe({"text": "good food"}, "attnlrp"), ProbeAnswer(1, [0.5, -0.25]))], path)
    return path


def _handler(archive: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((archive / MODEL_CONFIG_FILE).read_text())["handler"])


def _package_cli(*arguments: str) -> tuple[int, str]:
    capture = io.StringIO()
    with contextlib.redirect_stderr(capture):
        status = package_module.main([*arguments, "--quiet"])
    return status, capture.getvalue()


def test_the_monitor_files_are_copied_into_the_archive_and_read_there(folder: Path, tmp_path: Path) -> None:
    baseline, canaries = _baseline(tmp_path / "b.json"), _canaries(tmp_path / "c.json")
    settings = package_module.Settings(monitor={"window": 50, "k": 5, "baseline": str(baseline),
                                                "canaries": str(canaries)})  # fmt: skip
    out = tmp_path / "store"
    packaged = package_module.package(folder, "reviews", out, settings)
    archive = packaged.archive
    handler = _handler(archive)
    assert handler["monitor"] == {"window": 50, "k": 5, "baseline": "monitor-baseline.json",
                                  "canaries": "monitor-canaries.json"}  # fmt: skip
    for name, source in (("monitor-baseline.json", baseline), ("monitor-canaries.json", canaries)):
        copy = archive / name
        assert copy.is_file() and not copy.is_symlink() and copy.read_bytes() == source.read_bytes()
    # what the handler does at load: the setting of model-config.yaml, its files relative to the archive
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / MODEL_CONFIG_FILE).read_text()))
    parsed = parse_monitor(config.monitor, archive)
    monitor = load_monitor("reviews", parsed, ClassificationReader(config.labels), start=False)
    assert monitor is not None and monitor.config.window == 50
    assert monitor.baseline == read_baseline(baseline) and monitor.canaries == read_canaries(canaries)
    baseline.unlink()  # the archive stands alone
    assert load_monitor("reviews", parsed, ClassificationReader(config.labels), start=False) is not None


def test_a_changed_baseline_is_a_new_version(folder: Path, tmp_path: Path) -> None:
    """The fingerprint hashes the files' content: a baseline rewritten to the same size and modification time is
    packaged again, with a new model version."""
    baseline = _baseline(tmp_path / "b.json", 0.25)
    settings = package_module.Settings(monitor={"baseline": str(baseline)})
    out = tmp_path / "store"
    first = package_module.package(folder, "reviews", out, settings)
    version = _handler(first.archive)["model_version"]
    assert package_module.package(folder, "reviews", out, settings).reused
    stat = baseline.stat()
    _baseline(baseline, 0.75)
    assert baseline.stat().st_size == stat.st_size
    os.utime(baseline, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = package_module.package(folder, "reviews", out, settings)
    assert not again.reused and _handler(again.archive)["model_version"] != version
    assert read_baseline(again.archive / "monitor-baseline.json").entries["attnlrp", "LABEL_1"].shares["good"] == 0.75
    off = package_module.package(folder, "reviews", out, package_module.Settings(monitor=False))
    assert not off.reused and _handler(off.archive)["monitor"] is False
    assert not (off.archive / "monitor-baseline.json").exists()
    default = package_module.package(folder, "reviews", out, package_module.Settings())
    assert "monitor" not in _handler(default.archive)  # absent: on, with the defaults


@pytest.mark.parametrize(
    ("flag", "content", "reason"),
    [
        ("--monitor-baseline", None, "No such file or directory"),
        ("--monitor-baseline", "{not json", "bad baseline file"),
        ("--monitor-baseline", '{"format": "other"}', "not an explain-monitor-baseline document"),
        ("--monitor-canaries", '{"format": "explain-monitor-canaries", "version": 1, "model": "m", "probes": []}',
         "'probes' must be a non-empty list"),
    ],
)  # fmt: skip
def test_a_bad_monitor_file_is_refused_with_one_message(
    folder: Path, tmp_path: Path, flag: str, content: str | None, reason: str
) -> None:
    path = tmp_path / "file.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "store"
    status, message = _package_cli(str(folder), "--name", "reviews", "--out", str(out), flag, str(path))
    key = flag.removeprefix("--monitor-")
    assert status == 2 and message.count("\n") == 1, message
    kind = {"baseline": "baseline", "canaries": "canary"}[key]
    assert message.startswith(f"error: model reviews: monitor.{key}: bad {kind} file {path}: "), message
    assert reason in message
    assert not out.exists(), "nothing is written for a refused file"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (("made_up", "LABEL_1", "words"), "entry made_up / LABEL_1: 'made_up' is not a registered method"),
        (("attnlrp", "positive", "words"), "label 'positive' is none of this model's: LABEL_0, LABEL_1, other"),
        (("attnlrp", "LABEL_0", "patches"), "its shares are over patches, a text model's are over words"),
    ],
)
def test_a_baseline_of_another_model_is_refused(
    folder: Path, tmp_path: Path, entry: tuple[str, str, str], reason: str
) -> None:
    """A baseline whose entries the model's monitor would never compare with (another model's labels, an unknown
    method, patches for words) is refused at package time, not left to a silent first-window baseline."""
    method, label, kind = entry
    shares: dict[Any, float] = {(0, 1): 0.5} if kind == "patches" else {"good": 0.5}
    path = tmp_path / "other.json"
    write_baseline(Baseline("other", {(method, label): BaselineEntry(method, label, kind, 3, shares)}), path)
    out = tmp_path / "store"
    status, message = _package_cli(str(folder), "--name", "reviews", "--out", str(out), "--monitor-baseline", str(path))
    assert status == 2 and message.count("\n") == 1, message
    assert (
        message.startswith(f"error: model reviews: monitor.baseline: bad baseline file {path}: ") and reason in message
    )
    assert not out.exists()


def test_bad_monitor_settings_are_refused(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "store"
    status, message = _package_cli(str(folder), "--name", "r", "--out", str(out), "--monitor-k", "0")
    assert status == 2 and "monitor.k must be a positive integer, got 0" in message
    status, message = _package_cli(str(folder), "--name", "r", "--out", str(out), "--no-monitor", "--monitor-k", "3")
    assert status == 2 and "--no-monitor turns monitoring off: drop --monitor-k" in message
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"models": {"r": {"path": str(folder), "monitor": {"windows": 3}}}}))
    status, message = _package_cli("--config", str(models), "--out", str(out))
    assert status == 2 and "models.r: unknown monitor key(s) ['windows']" in message
    assert not out.exists()


def test_a_models_files_monitor_paths_are_relative_to_it(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "monitor").mkdir()
    _baseline(tmp_path / "monitor" / "reviews.json")
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({
        "defaults": {"monitor": {"k": 7}},
        "models": {
            "reviews": {"path": str(folder), "monitor": {"window_s": 60, "baseline": "monitor/reviews.json"}},
            "quiet": {"path": str(folder), "monitor": False},
        },
    }))  # fmt: skip
    out = tmp_path / "store"
    status, message = _package_cli("--config", str(models), "--out", str(out))
    assert status == 0, message
    assert _handler(out / "reviews")["monitor"] == {"window_s": 60, "baseline": "monitor-baseline.json"}
    assert (out / "reviews" / "monitor-baseline.json").is_file()
    assert _handler(out / "quiet")["monitor"] is False


# --- explain-serve's flags ------------------------------------------------------------------------------------------


@pytest.fixture
def serve_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """``explain-serve`` as it runs, but its launcher only packages (``package`` instead of ``serve``)."""
    from doors import launch

    for variable in ("EXPLAIN_WORKDIR", "INFERENCE_PORT", "GRPC_INFERENCE_PORT", "EXPLAIN_MONITOR"):
        monkeypatch.setenv(variable, "")  # restored after the test: explain_serve.main sets them
    for variable in ("MODEL_STORE", "RUN_DIR", "SERVER", "MODELS", "MODELS_FILE", "EXPLAIN_DEFAULT_METHOD"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(signal, "signal", lambda number, handler: signal.getsignal(number))  # leave pytest's handlers
    real = launch.main
    monkeypatch.setattr(launch, "main", lambda argv: real(["package", *argv[1:]]))


def _serve(*arguments: str) -> int:
    from doors import explain_serve

    return explain_serve.main(list(arguments))


@pytest.mark.usefixtures("serve_packages")
def test_explain_serve_flags_reach_every_archives_monitor_setting(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    store = work / "model_store" / "build"
    one, two = _baseline(tmp_path / "one.json"), _canaries(tmp_path / "two.json")
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"models": {
        "second": {"path": str(folder), "monitor": {"window_s": 30, "interval_s": 5}},
        "third": {"path": str(folder), "monitor": False},
    }}))  # fmt: skip
    code = _serve("--models", f"first={folder}", "--models-file", str(models), "--workdir", str(work),
                  "--monitor-window", "40", "--monitor-k", "9", "--monitor-interval", "120",
                  "--monitor-baseline", f"first={one}", "--monitor-canaries", f"second={two}")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    first, second, third = (_handler(store / "packages" / name) for name in ("first", "second", "third"))
    flags = {"window": 40, "k": 9, "interval_s": 120.0}
    assert first["monitor"] == {**flags, "baseline": "monitor-baseline.json"}
    assert second["monitor"] == {**flags, "canaries": "monitor-canaries.json"}  # the flags' window replaces window_s
    assert third["monitor"] is False  # the flags' keys leave a model that is off as it is; --monitor turns it on
    assert (store / "packages" / "first" / "monitor-baseline.json").read_bytes() == one.read_bytes()
    assert (store / "packages" / "second" / "monitor-canaries.json").read_bytes() == two.read_bytes()
    assert not (store / "packages" / "second" / "monitor-baseline.json").exists()
    assert _serve("--models-file", str(models), "--workdir", str(work), "--monitor", "--monitor-k", "4") == 0
    assert _handler(store / "packages" / "third")["monitor"] == {"k": 4}
    assert _serve("--models", f"first={folder}", "--workdir", str(work), "--no-monitor") == 0
    assert _handler(store / "packages" / "first")["monitor"] is False
    relative = Path(os.path.relpath(one))  # a bare FILE for the one model, relative to the current directory
    assert _serve("--models", f"first={folder}", "--workdir", str(work), "--monitor-baseline", str(relative)) == 0
    assert _handler(store / "packages" / "first")["monitor"] == {"baseline": "monitor-baseline.json"}


@pytest.mark.usefixtures("serve_packages")
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-monitor", "--monitor-window", "10"], "--no-monitor turns monitoring off: drop --monitor-window"),
        (["--monitor-window", "2"], "monitor.window must be at least 5 rows"),
        (["--monitor-baseline", "BASELINE"], "one baseline file for 2 models: give NAME=FILE"),
        (["--monitor-baseline", "nobody=BASELINE"], "baseline for ['nobody'], which is not served"),
        (["--monitor-canaries", "first=BAD"], "model first: monitor.canaries: bad canary file"),
    ],
)
def test_explain_serve_refuses_bad_monitor_flags_before_anything_starts(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    (tmp_path / "bad.json").write_text("[]")
    baseline = _baseline(tmp_path / "b.json")
    given = [flag.replace("BASELINE", str(baseline)).replace("BAD", str(tmp_path / "bad.json")) for flag in flags]
    work = tmp_path / "work"
    code = _serve("--models", f"first={folder},second={folder}", "--workdir", str(work), *given)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (work / "model_store" / "build" / "packages" / "first").exists()


def test_the_environment_is_json_of_the_flags() -> None:
    from doors import explain_serve
    from doors.models import MONITOR_ENV

    parser = explain_serve.build_parser()
    assert explain_serve.monitor_environment(parser.parse_args(["--models", "a=/x"])) == {}
    on = explain_serve.monitor_environment(parser.parse_args(["--models", "a=/x", "--monitor"]))
    assert json.loads(on[MONITOR_ENV]) is True
    on = explain_serve.monitor_environment(parser.parse_args(["--models", "a=/x", "--monitor", "--monitor-k", "2"]))
    assert json.loads(on[MONITOR_ENV]) == {"k": 2, "on": True}
    args = parser.parse_args(["--models", "a=/x", "--monitor-k", "3", "--monitor-baseline", "/b.json"])
    assert json.loads(explain_serve.monitor_environment(args)[MONITOR_ENV]) == {"k": 3, "baseline": {"": "/b.json"}}


def test_a_bad_monitor_variable_is_refused(folder: Path) -> None:
    from doors.models import MONITOR_ENV, monitor_from_environment

    entries = package_module.parse_models(f"a={folder},b={folder}")
    assert monitor_from_environment(entries, {}) == entries
    laid = monitor_from_environment(entries, {MONITOR_ENV: '{"k": 4, "baseline": {"b": "/x.json"}}'})
    assert [entry.settings.monitor for entry in laid] == [{"k": 4}, {"k": 4, "baseline": "/x.json"}]
    for value, message in (
        ("nope", "is not JSON"),
        ("[1]", "must be false, true or a mapping"),
        ('{"k": 0}', "monitor.k must be a positive integer"),
        ('{"baseline": "/x.json"}', "one baseline file for 2 models"),
    ):
        with pytest.raises(package_module.PackageError, match=message):
            monitor_from_environment(entries, {MONITOR_ENV: value})
