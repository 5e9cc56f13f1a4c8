"""`python -m benchmarks goals`: each CPU speed goal judged against its target from the numbers its
benchmark ends with (`--json`), a goal that could not be measured saying why, and the children's output
passed through as they run."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from benchmarks import bench_goals, bench_reference, records, timing, workloads
from benchmarks.bench_goals import Goal, goals
from benchmarks.op_counter import flops_of
from captioner.core import machine_cache
from captioner.models import products
from helpers import REPO, render_results

REFERENCE = {"train_ratio": 8.8, "beam_ratio": 28.4}
ROOFLINE = {"work": {"lstm_train": {"seconds": 0.417, "roofline_seconds": 0.319, "ratio": 1.31},
                     "lstm_beam": {"seconds": 0.733, "roofline_seconds": 0.660, "ratio": 1.11}}}
DEMO = {"captions_per_s": 9.1, "p95": 0.63, "wrong": 0}


def test_each_goal_is_judged_on_its_own_side_of_its_target() -> None:
    rows = goals([REFERENCE, {"train_ratio": 5.2, "beam_ratio": 30.0}, {"train_ratio": 5.9, "beam_ratio": 19.0}],
                 ROOFLINE, {"captions_per_s": 6.4, "p95": 2.3, "wrong": 0})
    assert [row.met for row in rows] == [False, True, True, True, False, None]
    assert rows[0].measured == "5.90x (5.20-8.80x, 3 runs)"  # the median run is judged, the range shown
    assert rows[2].measured == "1.31x (417 ms against 319 ms)"
    assert rows[4].measured == "6.40 captions/s, p95 2.30 s"  # fast enough, but its p95 is over 2 s
    assert [row.met for row in goals([REFERENCE], ROOFLINE, DEMO)] == [True, True, True, True, True, None]
    slow = {"work": {name: {**work, "ratio": 2.5} for name, work in ROOFLINE["work"].items()}}
    assert [row.met for row in goals([REFERENCE], slow, DEMO)][2:4] == [False, False]


def test_a_goal_not_measured_says_why_and_is_neither_met_nor_missed() -> None:
    rows = goals([{"train_ratio": None, "beam_ratio": None}], "left out (--skip roofline)",
                 "no Flickr8k photos in /nowhere")
    assert [row.met for row in rows] == [None] * 6
    assert rows[0].measured == "not measured: the tutorial's checkout was not found (--reference)"
    assert rows[2].measured == "not measured: left out (--skip roofline)"
    assert rows[4].measured == "not measured: no Flickr8k photos in /nowhere"
    failed = goals(["it failed: benchmarks reference: exit 1: its output is above", REFERENCE], ROOFLINE, DEMO)
    assert failed[0] == Goal("LSTM training step against the tutorial's", ">= 6x", "8.80x", True)  # the run that ran
    # demo_load exits 1 when a served caption differs from the local one: a failed measure is a goal missed
    wrong = goals([REFERENCE], ROOFLINE, "it failed: benchmarks demo_load: exit 1: its output is above")[4]
    assert wrong == Goal("the demo with the packaged model", ">= 6 captions/s, p95 <= 2 s",
                         "it failed: benchmarks demo_load: exit 1: its output is above", False)
    assert goals(["it failed: benchmarks reference: exit 1"], ROOFLINE, DEMO)[1].met is False


def test_goals_run_each_benchmark_with_json_and_print_every_goal(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    calls: list[tuple[str, list[str]]] = []
    numbers = {"reference": REFERENCE, "roofline": ROOFLINE, "demo_load": DEMO}

    def run(name: str, args: Sequence[str]) -> dict:
        calls.append((name, list(args)))
        if name == "reference" and len(calls) == 2:
            raise SystemExit("benchmarks reference: exit 1: its output is above")
        return numbers[name]

    monkeypatch.setattr(bench_goals, "why_no_demo", lambda: "")
    assert bench_goals.main(["--runs", "3", "--threads", "2", "--beside", "nothing"], run=run) == 0
    assert [name for name, _ in calls] == ["reference"] * 3 + ["roofline", "demo_load"]
    assert all("--json" in args for _, args in calls)
    assert calls[0][1][calls[0][1].index("--threads") + 1] == "2"
    assert calls[3][1][-3:] == ["--only", "lstm_train", "lstm_beam"]
    assert calls[4][1][0].endswith("flickr8k_transformer_scst") and "--broken-every" in calls[4][1]
    out = capsys.readouterr().out
    assert "| LSTM training step against the tutorial's | >= 6x | 8.80x (8.80-8.80x, 2 runs) | met |" in out
    assert ("| the demo with the packaged model | >= 6 captions/s, p95 <= 2 s | 9.10 captions/s, p95 0.63 s | met |"
            in out)
    assert out.rstrip().endswith("| the quickstart in a fresh clone | <= 8 min, test BLEU-4 >= 0.9 | not measured: "
                                 "not run (--quickstart runs it in a fresh clone) | - |")

    calls.clear()
    quickstart = {"seconds": 245.0, "bleu4": 0.9092}
    assert bench_goals.main(["--runs", "1", "--skip", "reference", "demo", "--quickstart"], run=run,
                            quickstart=lambda: quickstart) == 0
    assert [name for name, _ in calls] == ["roofline"]
    out = capsys.readouterr().out
    assert "| beam search against the tutorial's (images/s) | >= 20x | not measured: left out | - |" in out
    assert out.rstrip().endswith("| 4 min 5 s, test BLEU-4 0.909 | met |")


def test_goals_hand_the_tutorial_checkout_to_its_benchmark_as_an_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The benchmarks run in the repository: a relative --reference, named from elsewhere, was looked for there."""
    calls: list[list[str]] = []
    monkeypatch.chdir(tmp_path)
    assert bench_goals.main(["--runs", "1", "--skip", "roofline", "demo", "--reference", "tutorial"],
                            run=lambda name, args: calls.append(list(args)) or REFERENCE) == 0
    assert calls[0][calls[0].index("--reference") + 1] == str(tmp_path / "tutorial")


def test_the_quickstart_goal_needs_both_its_time_and_its_score() -> None:
    assert [bench_goals.quickstart_goal({"seconds": s, "bleu4": b}).met
            for s, b in [(479.6, 0.9), (481.0, 0.95), (300.0, 0.899)]] == [True, False, False]
    failed = bench_goals.quickstart_goal("it failed: bash scripts/quickstart.sh: exit 1")
    assert failed.met is False and failed.measured == "it failed: bash scripts/quickstart.sh: exit 1"


def test_the_quickstart_runs_in_a_fresh_clone_named_captioner_of_the_last_commit(tmp_path, monkeypatch) -> None:
    """A stand-in repository whose quickstart writes what the real one does: the clone is of its last commit
    (a file left uncommitted is not there), in a folder named captioner, and its test BLEU-4 is read."""
    repository = tmp_path / "repository"
    (repository / "scripts").mkdir(parents=True)
    (repository / "scripts" / "quickstart.sh").write_text(
        "test \"$(basename \"$PWD\")\" = captioner && test ! -e uncommitted || exit 7\n"
        "mkdir -p runs/shapes_lstm && cd runs/shapes_lstm\n"
        "echo '{\"overall\": {\"Bleu_4\": 0.91, \"METEOR\": 0.64, \"CIDEr\": 5.2}}' > scores_test.json\n"
        "printf 'epoch,step,seconds\\n1,250,34.0\\n2,500,35.5\\n' > metrics.csv\n")
    git = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a stand-in"], check=True)
    (repository / "uncommitted").write_text("not in the clone")
    timed = bench_goals.quickstart_run(repository)
    assert timed["bleu4"] == 0.91 and 0 < timed["seconds"] < 60 and timed["epoch_seconds"] == [34.0, 35.5]
    assert bench_goals.quickstart_numbers({**timed, "seconds": 253.4}) == {
        "time": "4 min 13 s", "epoch": "34-36 s", "bleu4": "0.910", "meteor": "0.640", "cider": "5.200"}
    (repository / "scripts" / "quickstart.sh").write_text("exit 3\n")
    subprocess.run([*git, "commit", "-q", "-am", "a failing one"], check=True)
    with pytest.raises(SystemExit, match=r"^bash scripts/quickstart.sh: exit 3: its output is above$"):
        bench_goals.quickstart_run(repository)


def test_an_echoed_child_shows_its_lines_as_it_runs_and_returns_its_last_one(monkeypatch: pytest.MonkeyPatch,
                                                                             capsys: pytest.CaptureFixture) -> None:
    real = timing.subprocess.Popen
    script = ("print('| work | ours |'); print(); print('| step | 408 ms |', flush=True); "
              "print('{\"train_ratio\": 8.79}')")
    monkeypatch.setattr(timing.subprocess, "Popen", lambda command, **kw: real([sys.executable, "-c", script], **kw))
    assert timing.child_json("reference", ["--json"], echo=True) == {"train_ratio": 8.79}
    assert capsys.readouterr().out == "| work | ours |\n\n| step | 408 ms |\n"  # blank lines kept
    monkeypatch.setattr(timing.subprocess, "Popen", lambda command, **kw: real([sys.executable, "-c", "exit(3)"], **kw))
    with pytest.raises(SystemExit, match=r"^benchmarks reference: exit 3: its output is above$"):
        timing.child_json("reference", [], what="benchmarks reference", echo=True)


@pytest.mark.parametrize("script, last", [("print('| step | 408 ms |')", "'| step | 408 ms |'"), ("pass", "''"),
                                          ("print('[8.79]')", "'[8.79]'")])
def test_a_child_whose_last_line_is_not_its_numbers_stops_the_benchmark_in_one_line(
        monkeypatch: pytest.MonkeyPatch, script: str, last: str) -> None:
    """Exit 0 without the JSON object (no --json, nothing printed, another JSON value): one line, no traceback."""
    real = timing.subprocess.Popen
    monkeypatch.setattr(timing.subprocess, "Popen", lambda command, **kw: real([sys.executable, "-c", script], **kw))
    with pytest.raises(SystemExit, match=rf"^benchmarks reference: its last line is not a JSON object of its numbers: "
                                         rf"{re.escape(last)}$"):
        timing.child_json("reference", [], what="benchmarks reference", echo=True)


def test_the_reference_benchmark_ends_with_its_numbers_without_the_tutorial(capsys: pytest.CaptureFixture,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path) -> None:
    """No checkout of the tutorial: ours alone, its ratios null, the goals then say why they were not judged."""
    monkeypatch.setattr(workloads, "lstm_train", workloads.quickstart_step)  # smaller work, the same path
    monkeypatch.setattr(workloads, "lstm_beam", functools.partial(workloads.lstm_beam, images=2, steps=2))
    assert bench_reference.main(["--reference", str(tmp_path / "none"), "--repeats", "1", "--threads", "1",
                                 "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("reference not available, ours alone")
    numbers = json.loads(out[-1])
    assert numbers["train_ratio"] is None and numbers["beam_ratio"] is None and numbers["threads"] == 1
    assert numbers["train_ms"] > 0 and numbers["beam_images_per_s"] > 0
    assert goals([numbers], "left out", "left out")[0].met is None


def test_the_work_table_splits_the_speed_into_work_and_rate() -> None:
    lines = bench_reference.work_lines([("train step", 80e9, 0.5, 560e9, 3.5), ("beam", 4e9, 0.02, 56e9, 0.4)])
    assert lines[2] == ("| train step | 80.00 GFLOP at 160 GFLOP/s | 560.00 GFLOP at 160 GFLOP/s | 7.00x | 1.00x | "
                        "7.00x faster |")
    assert lines[3] == ("| beam | 4.00 GFLOP at 200 GFLOP/s | 56.00 GFLOP at 140 GFLOP/s | 14.00x | 1.43x | "
                        "20.00x faster |")  # the work's ratio times the rates' is the speed's


@pytest.fixture
def stand_in_tutorial(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference benchmark at small sizes, the tutorial's side a few products of known FLOPs: 3 for its
    train step, 2 an image for its search, 120,000 FLOPs each."""
    monkeypatch.setattr(workloads, "lstm_train", workloads.quickstart_step)
    monkeypatch.setattr(workloads, "lstm_beam", functools.partial(workloads.lstm_beam, images=2, steps=2))
    a, b = torch.ones(30, 40), torch.ones(40, 50)  # 2 * 30 * 40 * 50 = 120,000 FLOPs a product

    def reference_actions(location: str | None, images: int, their_products: str) -> dict[str, Callable[[], object]]:
        assert their_products == "onednn"
        return {"train": lambda: [a @ b for _ in range(3)], "beam": lambda: [a @ b for _ in range(2 * images)]}

    monkeypatch.setattr(bench_reference, "reference_actions", reference_actions)
    monkeypatch.setattr(bench_reference, "gemm_rates", lambda size: {"torch.mm": 1e11})


def test_the_reference_benchmark_counts_each_sides_work(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                                                          stand_in_tutorial: None) -> None:
    """With the tutorial: both sides' FLOPs counted as they run, the beam's per image on each side."""
    monkeypatch.delenv(bench_reference.CACHE_VARIABLE, raising=False)
    assert bench_reference.main(["--repeats", "1", "--threads", "1", "--reference-images", "3", "--json",
                                 "--their-products", "onednn"]) == 0
    out = capsys.readouterr().out
    assert f"{bench_reference.CACHE_VARIABLE} is unset" in out.splitlines()[1]  # the stand-in's caveat, said first
    work = json.loads(out.splitlines()[-1])["work"]
    assert work["train step"]["reference_gflop"] == pytest.approx(3 * 120e3 / 1e9)
    assert work["beam search, one image"]["reference_gflop"] == pytest.approx(2 * 120e3 / 1e9)  # 6 over 3 images
    ours = workloads.quickstart_step()
    assert work["train step"]["gflop"] == pytest.approx(flops_of(ours.run) / 1e9, rel=1e-6)
    assert "fp32 GEMM of 2048 squares here: torch.mm 100 GFLOP/s" in out


def test_the_reference_benchmark_writes_its_run_as_a_record(tmp_path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             stand_in_tutorial: None) -> None:
    """--record ID: the printed numbers under bench_reference.json's columns, with the command as run (the
    oneDNN cache it read, the tutorial's folder as a placeholder) and a file the results pages render."""
    shutil.copy(REPO / "docs" / "results" / "bench_reference.json", tmp_path)
    before = json.loads((tmp_path / "bench_reference.json").read_text(encoding="utf-8"))["records"]
    monkeypatch.setattr(records, "commit", lambda: "abc1234")
    monkeypatch.setenv(bench_reference.CACHE_VARIABLE, "8192")
    argv = ["--repeats", "1", "--threads", "1", "--reference-images", "3", "--their-products", "onednn",
            "--reference", str(tmp_path), "--beside", "nothing", "--record", "a_test", "--json"]
    assert bench_reference.main(argv, results=tmp_path) == 0
    numbers = json.loads(capsys.readouterr().out.splitlines()[-1])
    data = json.loads((tmp_path / "bench_reference.json").read_text(encoding="utf-8"))
    record = data["records"][-1]
    assert data["records"][:-1] == before and record["id"] == "a_test"
    assert record["numbers"]["train"] == f"{numbers['train_ms']:,.0f} / {numbers['reference_train_ms']:,.0f} ms"
    assert record["numbers"]["train_ratio"] == f"{numbers['train_ratio']:.2f}x"
    assert record["numbers"]["beam_ratio"] == f"{numbers['beam_ratio']:.1f}x"
    train, beam = numbers["work"]["train step"], numbers["work"]["beam search, one image"]
    assert record["numbers"]["work"] == (
        f"train {train['gflop']:.2f} / 0.00 GFLOP at {train['gflop'] / train['seconds']:.0f} / "
        f"{train['reference_gflop'] / train['reference_seconds']:.0f}; beam {beam['gflop']:.2f} / 0.00 GFLOP an image "
        f"at {beam['gflop'] / beam['seconds']:.0f} / {beam['reference_gflop'] / beam['reference_seconds']:.0f}")
    assert f" {bench_reference.CACHE_VARIABLE}=8192 " in f" {record['command']}"  # after any held kernels
    assert record["command"].endswith("python -m benchmarks reference " + " ".join(argv).replace(str(tmp_path),
                                                                                                   "TUTORIAL"))
    assert record["commit"] == "abc1234" and record["concurrent"] == "nothing"
    columns = {column["key"] for column in data["columns"]}
    assert render_results().record_problems("a_test", record, columns) == []


def test_a_reference_record_without_the_tutorial_stops_before_the_run(tmp_path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(REPO / "docs" / "results" / "bench_reference.json", tmp_path)
    before = (tmp_path / "bench_reference.json").read_bytes()
    monkeypatch.setattr(workloads, "lstm_train", lambda: pytest.fail("ours ran"))
    with pytest.raises(SystemExit, match=r"^--record a_test: the tutorial's code is not available, and a record"):
        bench_reference.main(["--reference", str(tmp_path / "none"), "--record", "a_test"], results=tmp_path)
    assert (tmp_path / "bench_reference.json").read_bytes() == before


def test_the_tutorials_linear_layers_can_run_through_onednn() -> None:
    """--their-products onednn: its nn.Linear layers take our products' route, its LSTM cell and numbers kept."""
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"fc": torch.nn.Linear(16, 8), "cell": torch.nn.LSTMCell(8, 4)})
    x = torch.randn(3, 16)
    expected = module["fc"](x)
    assert bench_reference.through_onednn(module) == 1
    assert module["fc"].forward.func is products._linear_forward  # type: ignore[attr-defined]
    torch.testing.assert_close(module["fc"](x), expected, rtol=1e-5, atol=1e-5)


def test_record_writes_the_goals_as_a_record_of_this_run(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """--record ID: the row goes into bench_goals.json under the measure's columns, with the command as run
    (the settings holding the kernels in front), the commit, the processor and the date; the same id again
    stops before the run unless --replace, and the file stays one the results pages render."""
    shutil.copy(REPO / "docs" / "results" / "bench_goals.json", tmp_path)
    before = json.loads((tmp_path / "bench_goals.json").read_text(encoding="utf-8"))["records"]
    numbers = {"reference": REFERENCE, "roofline": ROOFLINE, "demo_load": DEMO}
    monkeypatch.setattr(bench_goals, "why_no_demo", lambda: "")
    for name in machine_cache.KERNEL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path / "cache"))  # its path is the maker's: not written
    monkeypatch.setattr(records, "commit", lambda: "abc1234")  # the suite may run outside a git checkout
    argv = ["--runs", "1", "--beside", "nothing", "--record", "a_test"]
    assert bench_goals.main(argv, run=lambda name, args: numbers[name], results=tmp_path) == 0
    assert "record a_test written to" in capsys.readouterr().out
    data = json.loads((tmp_path / "bench_goals.json").read_text(encoding="utf-8"))
    record = data["records"][-1]
    assert data["records"][:-1] == before and record["id"] == "a_test"
    assert record["numbers"] == {"train": "8.80x", "beam": "28.40x", "train_roofline": "1.31x (417 ms against 319 ms)",
                                 "beam_roofline": "1.11x (733 ms against 660 ms)",
                                 "demo": "9.10 captions/s, p95 0.63 s", "verdict": "all five met"}
    assert record["command"] == ("ATEN_CPU_CAPABILITY=avx2 CAPTIONER_CACHE_DIR=<a folder of its own> "
                                 "python -m benchmarks goals --runs 1 --beside nothing --record a_test")
    assert record["processor"] == record["label"] and record["processor"].startswith(timing.processor())
    assert record["processor"].endswith(" (ATEN_CPU_CAPABILITY=avx2) kernels")
    assert record["commit"] == "abc1234"
    assert record["concurrent"] == "nothing" and re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"])

    # the same id again stops before anything runs, and the file is kept; with --replace it is replaced
    kept = (tmp_path / "bench_goals.json").read_bytes()
    with pytest.raises(SystemExit, match=r"bench_goals.json: already has record a_test: give --record another name, "
                                         r"or --replace to replace them$"):
        bench_goals.main(argv, run=lambda name, args: pytest.fail(f"{name} ran"), results=tmp_path)
    assert (tmp_path / "bench_goals.json").read_bytes() == kept
    slow = {**numbers, "reference": {"train_ratio": 5.5, "beam_ratio": 28.4}}
    assert bench_goals.main([*argv, "--replace", "--label", "a slow sitting"], run=lambda name, args: slow[name],
                            results=tmp_path) == 0
    again = json.loads((tmp_path / "bench_goals.json").read_text(encoding="utf-8"))["records"]
    assert len(again) == len(before) + 1 and again[-1]["label"] == "a slow sitting"
    assert again[-1]["numbers"]["verdict"] == "4 of 5 met; missed: LSTM training step against the tutorial's"
    columns = {column["key"] for column in data["columns"]}
    assert render_results().record_problems("a_test", again[-1], columns) == []


def test_record_with_the_quickstart_writes_its_time_and_scores_as_a_quickstart_record(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for measure in ("bench_goals", "quickstart"):
        shutil.copy(REPO / "docs" / "results" / f"{measure}.json", tmp_path)
    monkeypatch.setattr(records, "commit", lambda: "abc1234")
    timed = {"seconds": 253.4, "bleu4": 0.9092, "meteor": 0.6418, "cider": 5.2644, "epoch_seconds": [33.0, 36.2]}
    argv = ["--skip", "reference", "roofline", "demo", "--quickstart", "--beside", "nothing", "--record", "a_test"]
    assert bench_goals.main(argv, run=lambda name, args: pytest.fail(f"{name} ran"), quickstart=lambda: timed,
                            results=tmp_path) == 0
    assert "record a_test written to" in capsys.readouterr().out
    data = json.loads((tmp_path / "quickstart.json").read_text(encoding="utf-8"))
    record = data["records"][-1]
    assert record["id"] == "a_test" and record["numbers"] == {"time": "4 min 13 s", "epoch": "33-36 s",
                                                             "bleu4": "0.909", "meteor": "0.642", "cider": "5.264"}
    before = (REPO / "docs" / "results" / "quickstart.json").read_text(encoding="utf-8")
    after = (tmp_path / "quickstart.json").read_text(encoding="utf-8")
    assert after.startswith(before.rstrip().removesuffix("]\n}").rstrip())  # its layout kept: only the record added
    assert record["command"].endswith("python -m benchmarks goals " + " ".join(argv))
    goal = json.loads((tmp_path / "bench_goals.json").read_text(encoding="utf-8"))["records"][-1]
    assert goal["numbers"] == {"quickstart": "4 min 13 s, test BLEU-4 0.909", "verdict": "the one measured met"}
    columns = {column["key"] for column in data["columns"]}
    assert render_results().record_problems("a_test", record, columns) == []


def test_a_record_under_no_column_is_refused_and_the_file_kept(tmp_path) -> None:
    shutil.copy(REPO / "docs" / "results" / "bench_goals.json", tmp_path)
    text = (tmp_path / "bench_goals.json").read_text(encoding="utf-8")
    record = {"id": "x", "label": "x", "numbers": {"trains": "1x"}}
    with pytest.raises(SystemExit, match=r"bench_goals.json: no column for trains \(columns: beam, "):
        records.save_records("bench_goals", [record], tmp_path)
    assert (tmp_path / "bench_goals.json").read_text(encoding="utf-8") == text


def test_a_recorded_command_keeps_the_makers_paths_out() -> None:
    argv = ["--reference", "/home/me/tutorial", "--profile=/tmp/my profile", "--runs", "3", "--beside", "the suite"]
    command = records.command_line("goals", argv, {"--reference": "TUTORIAL", "--profile": "DIR"})
    assert command.endswith("python -m benchmarks goals --reference TUTORIAL --profile=DIR --runs 3 "
                            "--beside 'the suite'")


def test_the_commit_is_the_checkouts_and_says_when_files_differ_from_it(tmp_path) -> None:
    assert records.commit(tmp_path) == "unknown (not a git checkout)"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tracked").write_text("one")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "bench_x.json").write_text("{}")
    (tmp_path / "docs" / "results.md").write_text("its page")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked").write_text("not counted")
    assert records.commit(tmp_path) == head
    (tmp_path / "docs" / "results" / "bench_x.json").write_text('{"records": []}')  # an earlier run's record
    (tmp_path / "docs" / "results.md").write_text("its page, rendered again")
    assert records.commit(tmp_path) == head
    (tmp_path / "tracked").write_text("two")
    assert records.commit(tmp_path) == f"{head} + uncommitted changes"


def test_a_records_file_it_could_not_write_stops_the_run_before_it_starts(tmp_path) -> None:
    def run(name: str, args: Sequence[str]) -> dict:
        raise AssertionError(f"{name} ran")

    with pytest.raises(SystemExit, match=r"bench_goals.json: cannot read the records \(\[Errno 2\]"):
        bench_goals.main(["--record", "x"], run=run, results=tmp_path)
    (tmp_path / "bench_goals.json").write_text("[]", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"bench_goals.json: not a measure's records"):
        bench_goals.main(["--record", "x"], run=run, results=tmp_path)
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error
        bench_goals.main(["--record", " "], run=run, results=tmp_path)


@pytest.mark.parametrize(("family", "model", "core"), [(23, 1, "Zen or Zen+"), (23, 49, "Zen 2"), (25, 1, "Zen 3"),
                                                       (25, 17, "Zen 4"), (25, 33, "Zen 3"), (25, 97, "Zen 4"),
                                                       (26, 2, "Zen 5"), (6, 143, "")])
def test_an_amd_processor_is_named_by_its_zen_generation(family: int, model: int, core: str) -> None:
    assert timing.amd_core(family, model) == core
