"""The Java tools of the official metrics leave nothing behind and never hang an evaluation.

Most tests put a fake `java` first on PATH: a shell script that answers `-version`, tokenises like
the PTB tokenizer (lower-cases its input: a file, or stdin) and speaks METEOR's -stdio protocol (awk), or, when told
by $FAKE_JAVA, hangs or dies in the middle. One test kills a real METEOR process mid-evaluation.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from captioner.evaluation import java
from captioner.evaluation import meteor
from captioner.evaluation.java import JavaToolError
from captioner.evaluation.metrics import official_scores, pycocoevalcap_scores

REFS = {1: ["A dog runs on the grass.", "A brown dog running"], 2: ["A cat sits on a mat"],
        3: ["Two people ride bikes"]}
PREDS = {1: "a dog runs", 2: "a cat on a mat", 3: "people on bikes"}

# 23 whole-number fields, the shape of METEOR's alignment statistics.
_STATS = " ".join(["3.0"] * 2 + ["0.0"] * 2 + ["3.0"] * 2 + ["0.0"] * 14 + ["1.0", "3.0", "3.0"])
FAKE_JAVA = textwrap.dedent(
    f"""\
    #!/bin/sh
    case "$*" in
      *-version*) echo 'openjdk version "17.0.1" 2021-10-19' >&2; exit 0 ;;
      *PTBTokenizer*)
        case "$FAKE_JAVA" in
          tokenizer-hang) exec sleep 600 ;;
          tokenizer-die) echo 'Exception in thread "main" java.lang.OutOfMemoryError: Java heap space' >&2; exit 2 ;;
        esac
        for last; do :; done
        if [ -f "$last" ]; then tr 'A-Z' 'a-z' < "$last"; else tr 'A-Z' 'a-z'; fi; echo; exit 0 ;;
      *spice*) exec sleep 600 ;;
      *Normalizer*) cat; exit 0 ;;
      *meteor*)
        case "$FAKE_JAVA" in
          meteor-hang) exec sleep 600 ;;
          meteor-die) read -r line; echo 'java.lang.OutOfMemoryError: Java heap space' >&2; exit 3 ;;
        esac
        while read -r line; do
          case "$FAKE_JAVA:$line" in
            meteor-garbage:*) echo 'Error: specify hypothesis and at least one reference' ;;
            *:SCORE*) echo '{_STATS}' ;;
            *:EVAL*) n=$(printf '%s' "$line" | grep -o '|||' | wc -l); seq "$n" | sed 's/.*/0.5/'; echo 0.5 ;;
          esac
        done; exit 0 ;;
    esac
    echo "fake java: unexpected arguments $*" >&2; exit 64
    """
)


@pytest.fixture
def fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "java"
    script.write_text(FAKE_JAVA)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_JAVA", raising=False)
    return script


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


_BEFORE_THE_TEST: set[int] = set()


@pytest.fixture(autouse=True)
def _children_of_other_tests() -> None:
    """The processes this pytest process already had when a test began (a browser driver or a
    server another test module keeps for its session) are not the test's to count or to kill."""
    _BEFORE_THE_TEST.clear()
    _BEFORE_THE_TEST.update(all_children())


def children() -> list[int]:
    """The children this test started that are still there (running, or zombies not yet reaped)."""
    return [pid for pid in all_children() if pid not in _BEFORE_THE_TEST]


def all_children() -> list[int]:
    """Every process whose parent is this one (running or a zombie not yet reaped)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.append(int(entry))
    return found


def test_a_hundred_evaluations_leave_no_process_fd_or_thread(fake_java: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(java, "STALL_TIMEOUT_S", 20.0)  # a broken fake fails in seconds, not minutes
    official_scores(REFS, PREDS, meteor_processes=2)  # imports and first-use caches before counting
    fds, threads = open_fds(), threading.active_count()
    assert children() == []
    for _ in range(100):
        overall, per_image = official_scores(REFS, PREDS, meteor_processes=2)
        assert overall["METEOR"] == 0.5 and per_image[3]["METEOR"] == 0.5  # the fake's answers came through
    assert children() == []
    assert open_fds() == fds
    assert threading.active_count() == threads


def test_a_failed_pycocoevalcap_reference_leaves_no_lock_to_wait_on(
    fake_java: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pycocoevalcap's Meteor keeps its lock when its scoring fails, and its __del__ takes that lock:
    the object's end waited for ever, and a whole pytest worker with it."""
    monkeypatch.setenv("FAKE_JAVA", "meteor-die")
    failed: list[str] = []

    def score() -> None:
        try:
            pycocoevalcap_scores(REFS, PREDS)
        except Exception as error:  # noqa: BLE001 (whatever pycocoevalcap raises: the test is what follows)
            failed.append(type(error).__name__)

    scoring = threading.Thread(target=score, daemon=True)
    scoring.start()
    scoring.join(60)
    assert not scoring.is_alive() and failed, "the failed reference's METEOR never let go"
    assert children() == []


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("meteor-die",
         r"^METEOR \(process \d of 2\) failed: the Java process exited with status 3 after 0 of \d answers "
                       r"\(java\.lang\.OutOfMemoryError: Java heap space\)$"),
        ("meteor-hang", (r"^METEOR \(process \d of 2\) failed: the Java process gave no answer for 2 s \(0 of \d "
                         r"answers\) and was stopped$")),
        ("meteor-garbage",
         r"^METEOR \(process 1 of 2\) failed: answered 'Error: specify hypothesis.*' instead of alignment statistics$"),
        ("tokenizer-die",
         r"^PTB tokenizer failed: the Java process exited with status 2 \(.*OutOfMemoryError: Java heap space\)$"),
        ("tokenizer-hang", r"^PTB tokenizer failed: the Java process did not finish within 2 s and was stopped$"),
    ],
)
def test_a_java_tool_that_dies_or_hangs_is_one_line_error_in_time(
    fake_java: Path, monkeypatch: pytest.MonkeyPatch, mode: str, message: str
) -> None:
    monkeypatch.setenv("FAKE_JAVA", mode)
    monkeypatch.setattr(java, "STALL_TIMEOUT_S", 2.0)
    monkeypatch.setattr(java, "RUN_TIMEOUT_S", 2.0)
    monkeypatch.setattr(java, "PER_LINE_TIMEOUT_S", 0.0)
    fds = open_fds()
    start = time.monotonic()
    with pytest.raises(JavaToolError, match=message) as info:
        official_scores(REFS, PREDS, meteor_processes=2)
    assert time.monotonic() - start < 30  # the time limit, not the fake's 600 s sleep
    assert "\n" not in str(info.value)
    assert children() == [] and open_fds() == fds


def test_a_spice_run_that_hangs_is_stopped_with_one_line(fake_java: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SPICE runs as one Java process through pycocoevalcap's wrapper, which calls
    `subprocess.check_call` without a limit: ours stops it, and removes its temporary files."""
    monkeypatch.setattr(java, "SPICE_TIMEOUT_S", 2.0)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "in.json").write_text("[]")
    start = time.monotonic()
    with pytest.raises(JavaToolError,
                       match=r"^SPICE failed: the Java process did not finish within 2 s and was stopped$"):
        java._spice_check_call(["java", "-jar", "-Xmx8G", "spice-1.0.jar", "tmp/in.json", "-subset"], cwd=str(tmp_path))
    assert time.monotonic() - start < 30
    assert children() == [] and not (tmp_path / "tmp" / "in.json").exists()


@pytest.mark.usefixtures("java")
def test_a_real_meteor_killed_mid_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the real METEOR JVM while it loads or scores: the evaluation ends with one line."""
    monkeypatch.setattr(meteor, "MAX_TEXTS", 0)  # the whole table: a start of seconds to kill it in
    fds = open_fds()
    killed: list[int] = []

    def kill_meteor() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for pid in children():
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"meteor-1.5.jar" in command and b"-stdio" in command:  # not its normaliser
                    time.sleep(0.5)  # well inside its start-up: the paraphrase table takes seconds
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_meteor)
    killer.start()
    try:
        with pytest.raises(
                JavaToolError,
                match=r"^METEOR \(process 1 of 1\) failed: the Java process was killed after 0 of 3 answers") as info:
            official_scores(REFS, PREDS, meteor_processes=1)
    finally:
        killer.join()
    assert killed and "\n" not in str(info.value)
    assert children() == [] and open_fds() == fds


def test_every_java_tool_runs_on_the_client_compiler_and_the_serial_collector(java: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Their work is single-threaded: the server compiler's and G1's threads took the PTB tokenizer three times the
    CPU on COCO val2014's references. A real Java behind a `java` that writes down its arguments."""
    from captioner.evaluation.metrics import ptb_token_lines

    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "java"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{java}" "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    assert ptb_token_lines(["A dog, running."]) == ["a dog running"]
    assert "dog" in meteor.normalized_words(["A dog."])
    with meteor.MeteorPool(1):  # started, then killed on leaving, once its arguments are written down
        deadline = time.monotonic() + 30
        while len(calls.read_text().splitlines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    tools = calls.read_text().splitlines()
    assert len(tools) == 3, tools
    assert all(line.startswith("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC ") for line in tools), tools


@pytest.mark.usefixtures("java")
def test_the_metrics_benchmark_times_the_tokenizer_under_both_options_and_puts_them_back(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import json

    from benchmarks import bench_metrics

    annotations = tmp_path / "captions.json"
    captions = ["A dog, running.", "Two cats on a mat!", "A man rides a bike."]
    annotations.write_text(json.dumps({"annotations": [{"image_id": i // 2, "id": i, "caption": caption}
                                                       for i, caption in enumerate(captions)]}))
    assert bench_metrics.main([str(annotations), "--tokenizer-rounds", "2", "--beside", "nothing"]) == 0
    out = capsys.readouterr().out
    assert "3 captions, 2 rounds each" in out and "the same lines from every run: True" in out
    assert "| JVM_OPTIONS -XX:TieredStopAtLevel=1 -XX:+UseSerialGC |" in out and "| Java's defaults |" in out
    assert java.JVM_OPTIONS == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
