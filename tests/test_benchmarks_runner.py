"""The benchmarks' runner (`python -m benchmarks NAME`) and their one timing helper: every benchmark
module is reachable by a name, the list explains each in a line, a wrong name is one line and exit 2,
and the helper alternates its variants and reports the median and quartiles of what it timed."""

from __future__ import annotations

import importlib.util
import re
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from helpers import require, subprocess_env, tiny_model
import warm_start

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_under_test_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


runner = load("__main__")
timing = load("timing")


def test_every_benchmark_module_has_a_name() -> None:
    benchmarks = {p.stem for p in FOLDER.glob("*.py") if p.name != "__main__.py" and "\ndef main(" in p.read_text()}
    assert benchmarks == set(runner.BENCHMARKS.values())


def test_the_list_explains_each_benchmark_in_one_line(capsys: pytest.CaptureFixture) -> None:
    assert runner.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(runner.BENCHMARKS)
    assert all(len(line.split(maxsplit=1)) == 2 and "\n" not in line for line in lines)


def test_an_unknown_benchmark_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert runner.main(["no_such_benchmark"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "--list" in captured.err


def test_a_python_without_the_environment_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """A package the benchmark imports missing (torch, for a Python not the project's): one line naming it; a
    module of the project missing is a bug and stays a traceback."""
    def missing(name: str) -> ModuleType:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(runner, "importlib", SimpleNamespace(import_module=lambda module: missing("torch")))
    assert runner.main(["goals", "--quickstart"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: python -m benchmarks goals: {sys.executable} has no 'torch'; ")
    monkeypatch.setattr(runner, "importlib", SimpleNamespace(import_module=lambda module: missing("captioner.no_such")))
    with pytest.raises(ModuleNotFoundError):
        runner.main(["goals"])


def test_a_benchmark_runs_by_its_name() -> None:
    done = warm_start.run([sys.executable, "-m", "benchmarks", "same_captions", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=subprocess_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: python -m benchmarks same_captions")


def test_alternate_reverses_the_order_every_other_round_and_takes_the_median() -> None:
    calls: list[str] = []
    now = [0.0]
    cost = {"a": iter([1.0, 2.0, 9.0]), "b": iter([5.0, 5.0, 5.0])}

    def action(name: str):
        def run() -> None:
            calls.append(name)
            now[0] += next(cost[name]) if len(calls) > 2 else 0.0  # the warm-up round costs nothing
        return run

    timings = timing.alternate({"a": action("a"), "b": action("b")}, repeats=3, warmup=1, clock=lambda: now[0])
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert timings["a"].seconds == (1.0, 2.0, 9.0) and timings["a"].median == 2.0
    assert timings["a"].quartiles == (1.5, 5.5) and timings["b"].median == 5.0


def test_the_environment_line_says_what_ran_beside_and_which_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from captioner.core.machine_cache import KERNEL_SETTINGS

    for name in KERNEL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    line = timing.environment("the test suite")
    assert line.startswith("# ") and "\n" not in line
    assert "cores" in line and "torch" in line and line.endswith("beside: the test suite")
    assert f", {torch.backends.cpu.get_cpu_capability()} kernels; " in line
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # read by oneDNN at its first use; the line says it was set
    assert " (ONEDNN_MAX_CPU_ISA=AVX2) kernels; " in timing.environment(None)


@pytest.mark.parametrize("malloc, says, sets", [
    ("captioner", "malloc: large blocks kept, as `captioner` sets", True),
    ("glibc", "malloc: glibc's defaults", False),
])
def test_the_environment_line_says_which_malloc_thresholds_the_benchmark_runs_with(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, malloc: str, says: str, sets: bool) -> None:
    from captioner.core import allocator

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    for name in allocator.CHOOSING:
        # Set, then removed: deleting a variable that is not there records nothing to undo, and the variable
        # print_environment sets would outlive the test (the allocator's tests that ran after it failed).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    args = timing.argument_parser("example", None).parse_args(["--malloc", malloc, "--beside", "nothing"])
    timing.print_environment(args)
    assert capsys.readouterr().out.rstrip("\n").endswith(f"beside: nothing; {says}")
    assert bool(calls) == sets
    # A `captioner` the benchmark starts (the demo's server) is told the same.
    assert os.environ.get(allocator.ENV) == (None if sets else "glibc")


def test_a_benchmark_quiets_the_profilers_own_log_lines_unless_asked_for(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """Kineto prints a CPU profile's start and stop, and a failed GPU probe as an ERROR line, unless told not to
    before its first use: the benchmark tells it, and a level the user set stays."""
    from captioner.core import allocator

    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda option, value: 1)
    monkeypatch.setenv("KINETO_LOG_LEVEL", "")
    monkeypatch.delenv("KINETO_LOG_LEVEL")  # set, then removed: the value the benchmark sets is undone after the test
    args = timing.argument_parser("example", None).parse_args(["--beside", "nothing"])
    timing.print_environment(args)
    assert os.environ["KINETO_LOG_LEVEL"] == "6"
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    timing.print_environment(args)
    assert os.environ["KINETO_LOG_LEVEL"] == "2"
    capsys.readouterr()


def test_malloc_glibc_holds_where_the_environment_names_no_choice(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """An empty CAPTIONER_MALLOC chooses nothing: --malloc glibc still leaves glibc's defaults."""
    from captioner.core import allocator

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    monkeypatch.setenv(allocator.ENV, "")
    timing.print_environment(timing.argument_parser("example", None).parse_args(["--malloc", "glibc"]))
    assert capsys.readouterr().out.rstrip("\n").endswith("malloc: glibc's defaults")
    assert calls == [] and os.environ[allocator.ENV] == "glibc"


def test_products_steps_time_each_workload_on_both_routes_in_turn(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """`python -m benchmarks products --steps`: each workload's calls take the two routes in turn (the order
    reversed every other pair), their products really through oneDNN or not, the machine's gradients'
    decision kept, and the machine's route back afterwards."""
    import argparse

    import torch
    from torch import nn

    from benchmarks import bench_products, workloads
    from captioner.models import products

    if not products.onednn_enabled():
        pytest.skip("this torch build has no oneDNN inner product")
    for name in ("_ENABLED", "_CHECKED", "_GRAM_MM", "_GRAD_MM"):  # restored after the benchmark's set_onednn
        monkeypatch.setattr(products, name, getattr(products, name))
    monkeypatch.setattr(products, "decided_here", lambda: {"onednn": False, "gram_mm": True, "grad_mm": False})
    products_made, inner = [], products._product
    monkeypatch.setattr(products, "_product", lambda *a: products_made.append(1) or inner(*a))
    seen: list[tuple[str, bool, bool, int]] = []
    for name in bench_products.STEPS:
        layer = products.onednn_linear(nn.Linear(8, 4))

        def run(name: str = name, layer: nn.Linear = layer) -> None:
            before = len(products_made)
            layer(torch.randn(3, 8))
            seen.append((name, products.route_taken(), products.gram_by_mm(), len(products_made) - before))

        monkeypatch.setitem(workloads.WORKLOADS, name, lambda name=name, layer=layer, run=run: workloads.Workload(
            name, f"tiny {name}", layer, run))
    bench_products.time_steps(argparse.Namespace(pairs=2))
    order = [False, False, True, True, True, True, False, False]  # an untimed call, then the timed one
    assert seen == [(name, onednn, onednn, int(onednn)) for name in bench_products.STEPS for onednn in order]
    assert products.route_taken() is False  # the machine's decision again
    table = capsys.readouterr().out
    assert all(f"| tiny {name} |" in table for name in bench_products.STEPS)


def test_checkpoint_load_reads_one_model_both_ways(tmp_path: Path) -> None:
    """The checkpoint it writes holds AdamW's moments beside the weights, and either read gives the model."""
    from benchmarks import bench_checkpoint_load as bench

    path = tmp_path / "best.pt"
    sizes = bench.write_checkpoint(ROOT / "configs/shapes_lstm.yaml", path)
    assert sizes["moments_mb"] > sizes["weights_mb"] > 0 and sizes["file_mb"] > sizes["moments_mb"]
    whole, inference = (bench.child(path, read) for read in bench.READS)
    assert whole["parameters"] == inference["parameters"] > 0


def test_checkpoint_load_hands_its_child_the_config_as_an_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child runs in the repository: a relative --config, named from elsewhere, was looked for there."""
    from benchmarks import bench_checkpoint_load as bench

    (tmp_path / "mine.yaml").write_bytes((ROOT / "configs/shapes_lstm.yaml").read_bytes())
    monkeypatch.chdir(tmp_path)
    handed: list[list[str]] = []

    def child_json(name: str, args: list[str]) -> dict:
        handed.append(args)
        raise SystemExit("stopped after the first child")

    monkeypatch.setattr(bench, "child_json", child_json)
    with pytest.raises(SystemExit, match="stopped after the first child"):
        bench.main(["--config", "mine.yaml", "--rounds", "1"])
    assert handed[0][handed[0].index("--config") + 1] == str(tmp_path / "mine.yaml")


def test_a_child_that_fails_stops_the_benchmark_in_one_line_naming_it() -> None:
    with pytest.raises(SystemExit, match=r"^no_such --x: exit 2: python -m benchmarks: no benchmark 'no_such'"):
        timing.child_json("no_such", ["--x"])
    with pytest.raises(SystemExit, match=r"^the step under glibc: exit 2: "):
        timing.child_json("no_such", [], what="the step under glibc")


@pytest.mark.parametrize("decoder, parts", [
    ("lstm", ["word maps (the gallery)", "downloadable figure"]),
    ("transformer", ["word maps (the gallery)", "downloadable figure", "transformer views (head view, per-head maps)"]),
])
def test_demo_pictures_times_each_part_a_caption_draws(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch, decoder: str,
                                                       parts: list[str]) -> None:
    """`python -m benchmarks demo_pictures CHECKPOINT`: a row per part of the page's pictures, the transformer's
    views only for a transformer, on real photos; torch's threads as they were after it."""
    import torch

    from captioner.models.checkpoint import save_checkpoint

    bench = load("bench_demo_pictures")
    photos = shared_data / "flickr8k" / "images"
    require(photos.is_dir(), f"Flickr8k photos not found: {photos}")
    monkeypatch.setattr(bench, "PHOTOS", photos)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint, tiny_model(f"model.decoder.type={decoder}"))
    threads = torch.get_num_threads()
    try:
        assert bench.main([str(checkpoint), "--photos", "1", "--rounds", "1", "--beside", "the test suite"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2:3] != "-"]
    assert [row.split(" | ")[0][2:] for row in rows[1:]] == parts
    assert all(float(row.rstrip(" |").split(" | ")[-1]) >= 0 for row in rows[1:])


def documented_commands() -> list[str]:
    """Every `python -m benchmarks NAME ARGS` the user's pages show, as code (inline or a block's line), its
    continuation lines joined and a trailing comment cut; the records' pages keep each run's command as it
    was, so results.md and experiments.md are not among them."""
    commands = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name in ("results.md", "experiments.md"):
            continue
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        for code in re.findall(r"`([^`\n]+)`|^(python -m benchmarks .*)$", text, re.M):
            command = (code[0] or code[1]).split("  #")[0].strip()
            if command.startswith("python -m benchmarks ") and "|" not in command and "..." not in command:
                commands.append(command)
    return commands


def test_every_benchmark_command_the_docs_show_parses_with_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """A documented option that a benchmark lost (or never had) fails here, naming the command; each command is
    parsed by its benchmark's own parser and nothing of it runs."""
    import argparse
    import importlib
    import shlex

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    commands = documented_commands()
    assert len(commands) >= 20 and any("--record ID" in command for command in commands)
    wrong = []
    for command in commands:
        name, *words = shlex.split(command)[3:]
        if name in ("--list", "NAME"):  # the runner's own list and help, no benchmark's arguments
            continue
        words = ["an_id" if word in ("ID", "PREFIX") else word for word in words]  # a record id the user would give
        try:
            importlib.import_module(f"benchmarks.{runner.BENCHMARKS[name]}").main(words)
            wrong.append(f"{command}: ran past its arguments")
        except Parsed:
            pass
        except (KeyError, SystemExit) as e:
            wrong.append(f"{command}: {e!r}")
    assert not wrong, "\n".join(wrong)
