"""The command-line contract of the scripts in scripts/: a user's mistake (a missing file, a folder where a file is
expected or the reverse, a file that is empty, not UTF-8, not JSON or JSON of another shape, an option value that
means nothing, an output that cannot be written) is one `error:` line on stderr naming the file or option, exit
status 2, no traceback, and an output file that was there is left as it was. Each script runs in this process
through its `main(argv)` where it has one, cheap cases only: nothing trains or decodes a split."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (not run as __main__), loaded once."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refusal(capsys: pytest.CaptureFixture[str], name: str, argv: list[str], status: int = 2) -> str:
    """The one line scripts/<name>.py's main(argv) refuses `argv` with (exit `status`, nothing on stdout)."""
    try:
        code = script(name).main(argv)
    except SystemExit as stop:  # argparse's refusal
        code = stop.code
    out, err = capsys.readouterr()
    assert code == status, (code, out, err)
    assert out == "" and "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# Files that are no scores file, by what is wrong with them, and the words of their refusal.
NOT_SCORES = {
    "empty": (b"", "not valid JSON"),
    "truncated": (b'{"overall": {', "not valid JSON"),
    "not UTF-8": (b"\xff\xfe{}", "not UTF-8"),
    "a list": (b"[1, 2]", "not a scores file (a JSON list"),
}
OFFICIAL = dict.fromkeys(("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"), 0.5)


# --- results_table.py ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", NOT_SCORES)
def test_results_table_names_a_scores_file_it_cannot_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          kind: str) -> None:
    content, says = NOT_SCORES[kind]
    write(tmp_path / "run" / "scores_test.json", content)
    assert says in refusal(capsys, "results_table", [str(tmp_path / "run")])


@pytest.mark.parametrize("report, says", [
    ({"overall": {**OFFICIAL, "CIDEr": "high"}}, "overall: CIDEr is 'high', not a number"),
    ({"overall": OFFICIAL, "grounding": {"words": 3}}, "grounding: no 'score'"),
    ({"overall": OFFICIAL, "caption_stats": [0.1]}, "caption_stats: expected an object of scores, found a JSON list"),
], ids=["a word for a score", "grounding without its score", "statistics not an object"])
def test_results_table_names_the_field_of_a_scores_file_of_another_shape(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, report: dict, says: str) -> None:
    write(tmp_path / "run" / "scores_test.json", json.dumps(report))
    assert refusal(capsys, "results_table", [str(tmp_path / "run")]) == (
        f"error: {tmp_path / 'run' / 'scores_test.json'}: {says}")


def test_results_table_says_a_file_is_no_run_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scores = write(tmp_path / "scores_test.json", json.dumps({"overall": OFFICIAL}))
    assert refusal(capsys, "results_table", [str(scores)]) == (
        f"error: {scores}: a file, not a run folder (give the folder that holds scores_test.json)")


def test_results_table_prints_a_score_that_was_not_finite_as_a_dash(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    write(tmp_path / "run" / "scores_test.json", json.dumps({"overall": {**OFFICIAL, "METEOR": None}}))
    assert script("results_table").main([str(tmp_path / "run")]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row == "| run | - | - | " + "0.500 | " * 4 + "- | 0.500 | 0.500 | - | - | - |"


# --- interpret_table.py ----------------------------------------------------------------------------------------


def per_head(**changes: object) -> dict:
    """A scores file with per-map grounding, as `captioner evaluate --grounding` writes it, with `changes`."""
    table = {"words": 4, "best_head": "L10H1",
             "baselines": {"uniform_grounding": 0.05, "random_point": 0.125, "centre_point": 0.25},
             "maps": {"L10H1": {"grounding": 0.4, "pointing": 0.75}, "L10H0": {"grounding": 0.2, "pointing": 0.5},
                      "L10 mean": {"grounding": 0.3, "pointing": 0.6}}}
    return {"grounding": {"per_head": {**table, **changes}}}


@pytest.mark.parametrize("kind", NOT_SCORES)
def test_interpret_table_names_a_scores_file_it_cannot_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            kind: str) -> None:
    content, says = NOT_SCORES[kind]
    path = write(tmp_path / "scores.json", content)
    assert refusal(capsys, "interpret_table", [f"TF={path}"]).startswith(f"error: {path}: ")


@pytest.mark.parametrize("scores, says", [
    (per_head(baselines=None), "grounding.per_head.baselines: expected an object of scores, found nothing"),
    (per_head(maps={"gradcam": {"grounding": "x", "pointing": 1}}), "grounding.per_head.maps.gradcam: grounding is"),
    (per_head(maps=[1]), "grounding.per_head.maps: expected an object of map kinds"),
    ({"grounding": [1]}, "no per-map grounding scores"),
], ids=["no baselines", "a word for a score", "maps a list", "grounding a list"])
def test_interpret_table_names_the_field_of_a_scores_file_of_another_shape(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, scores: dict, says: str) -> None:
    path = write(tmp_path / "scores.json", json.dumps(scores))
    assert refusal(capsys, "interpret_table", [f"TF={path}"]).startswith(f"error: {path}: {says}")


@pytest.mark.parametrize("given, says", [
    ("missing", "no scores file"), ("folder", "scores file is a folder"),
    ("device", "scores file is not a regular file"),
    ("deep", "nested deeper than the 32 levels a scores file may have; refused")])
def test_interpret_table_refuses_a_path_that_holds_no_scores_file(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path, given: str, says: str) -> None:
    """A device is refused unread: /dev/zero was read until memory ran out (/dev/null stands for it here)."""
    path = {"missing": tmp_path / "nowhere.json", "folder": tmp_path, "device": Path("/dev/null"),
            "deep": write(tmp_path / "deep.json", "[" * 100_000)}[given]
    assert refusal(capsys, "interpret_table", [f"TF={path}"]).startswith(f"error: {path}: {says}")


def test_interpret_table_names_layers_of_two_digits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path / "scores.json", json.dumps(per_head()))
    assert script("interpret_table").main([f"TF={path}"]) == 0
    assert [row.split(" | ")[1] for row in capsys.readouterr().out.splitlines()[2:]] == [
        "layer 10, head 1 (best)", "layer 10, head 0", "layer 10, mean of heads"]


# --- paired_bootstrap.py ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, says", [
    (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["--samples", "0"], "argument --samples: must be at least 1, got 0"),
    (["--goal", "nan"], "argument --goal: expected a finite number"),
    (["--samples", "100000000000"], "100,000,000,000 draws of 3 images do not fit in memory"),
], ids=["negative seed", "no samples", "goal not a number", "draws past any memory"])
def test_paired_bootstrap_refuses_a_count_or_number_that_means_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, option: list[str], says: str) -> None:
    rows = [{"image_id": i, "CIDEr": 0.5 + i} for i in range(3)]
    scores = write(tmp_path / "scores.json", json.dumps({"overall": {"CIDEr": 1.5}, "per_image": rows}))
    assert says in refusal(capsys, "paired_bootstrap", [str(scores), str(scores), *option])


# --- run_state.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("under", ["", "run"], ids=["the file", "a folder below it"])
def test_run_state_refuses_a_file_for_a_run_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   under: str) -> None:
    """"new" would send a sweep on to train into it."""
    file = write(tmp_path / "best.pt", b"x")
    assert refusal(capsys, "run_state", [str(file / under)]) == (
        f"error: {file / under}: not a run folder ({file} is a file)")


# --- plot_runs.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("out, says", [
    ("file/curves.png", "{tmp}/file: a file, not a folder to write into"),
    ("folder", "{tmp}/folder: a folder, not a file to write"),
    ("curves.xyz", "{tmp}/curves.xyz: matplotlib writes no .xyz figures"),
], ids=["under a file", "a folder", "no such format"])
def test_plot_runs_refuses_a_figure_it_cannot_write_before_reading_the_runs(tmp_path: Path, out: str, says: str,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "file", b"mine")
    (tmp_path / "folder").mkdir()
    assert script("plot_runs").main([str(tmp_path / out), f"{tmp_path / 'no_run'}:x"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: " + says.format(tmp=tmp_path))
    assert (tmp_path / "file").read_bytes() == b"mine"


# --- compare_decoding.py ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, says", [
    (["--batch-size", "-1"], "argument --batch-size: must be at least 1, got -1"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--length-penalties", "1", "--beam", "0"], "argument --beam: beam_size must be a whole number in [1, 100]"),
    (["--length-penalties", "0,nan"], "--length-penalties: length_penalty must be a finite number in [0, 10]; got nan"),
    (["--length-penalties", ""], "--length-penalties: expected numbers separated by commas, got ''"),
    (["--json", "{tmp}"], "{tmp}: a folder, not a file to write"),
    (["--json", "{tmp}/file/scores.json"], "{tmp}/file: a file, not a folder to write into"),
], ids=["negative batch", "empty batch", "no beam", "penalty not a number", "no penalties", "json a folder",
        "json under a file"])
def test_compare_decoding_refuses_its_options_before_loading_anything(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, options: list[str], says: str) -> None:
    """The checkpoint is not there: each refusal comes before it is looked for, not after the split is encoded."""
    write(tmp_path / "file", b"mine")
    options = [option.format(tmp=tmp_path) for option in options]
    assert says.format(tmp=tmp_path) in refusal(capsys, "compare_decoding", [str(tmp_path / "best.pt"), *options])
    assert (tmp_path / "file").read_bytes() == b"mine"


# --- flickr8k_report.py ----------------------------------------------------------------------------------------


def report_run(folder: Path, monkeypatch: pytest.MonkeyPatch, scores: dict) -> Path:
    """A run folder of two test images with their results and `scores`; its checkpoint's split stands in for the
    one best.pt would name (nothing is loaded, encoded or scored)."""
    from captioner.data import datasets
    from captioner.data.records import ImageRecord
    from captioner.models import checkpoint

    records = [ImageRecord(i, folder / f"{i}.jpg", ("a dog runs", "a dog is running")) for i in (1, 2)]
    monkeypatch.setattr(checkpoint, "checkpoint_config", lambda path: type("Config", (), {"data": None}))
    monkeypatch.setattr(datasets, "load_split", lambda data, split, check_images=True: records)
    write(folder / "results_test.json", json.dumps([{"image_id": i, "caption": "a dog"} for i in (1, 2)]))
    write(folder / "scores_test.json", json.dumps(scores))
    return folder


@pytest.mark.parametrize("scores, says", [
    ([1], "not a scores file (a JSON list, not an object)"),
    ({"overall": {"CIDEr": "high"}}, "overall: CIDEr is 'high', not a number"),
    ({"overall": {"CIDEr": 1.0}}, "'per_image' is not a list of rows with an image_id and a numeric CIDEr"),
    ({"overall": {}, "per_image": [{"image_id": 7, "CIDEr": 1.0}]}, "'per_image' holds image 7, which is not in"),
    ({"overall": {}, "per_image": [{"image_id": 1, "CIDEr": float("nan")}]}, "'per_image' holds a CIDEr that is not"),
    ({"overall": {}, "per_image": [{"image_id": 1, "CIDEr": 10**400}]}, "'per_image' is not a list of rows with"),
], ids=["a list", "a word for a score", "no per-image rows", "another split's image", "a NaN", "past a float"])
def test_flickr8k_report_names_the_field_of_a_scores_file_of_another_shape(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scores: object,
        says: str) -> None:
    run = report_run(tmp_path / "run", monkeypatch, scores)
    line = refusal(capsys, "flickr8k_report", ["--run", f"a={run}", "--best", "a", "--out", str(tmp_path / "out")])
    assert line.startswith(f"error: {run / 'scores_test.json'}: {says}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, says", [
    (["--run", "a={run}", "--run", "a={run}"], "--run a: named twice"),
    (["--run", "a={run}", "--out", "{tmp}/file"], "{tmp}/file: a file, not a folder to write into"),
    (["--run", "a={run}", "--out", "{tmp}/file/report"], "{tmp}/file/report: cannot create the folder"),
    (["--run", "a={run}", "--out", ""], "--out: give the folder the report is written into"),
    (["--run", "a={run}", "--gallery-images", "{tmp}/file"], "--gallery-images {tmp}/file: not a folder"),
    (["--run", "a={run}", "--gallery-images", "{tmp}"], "--gallery-images {tmp}: holds none of the 2 test photo"),
], ids=["a name twice", "out a file", "out under a file", "out empty", "gallery a file", "gallery without them"])
def test_flickr8k_report_refuses_its_arguments_before_the_report(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str],
        says: str) -> None:
    """Before, each of these ended in a traceback once the leave-one-out scores and the figures were made."""
    run = report_run(tmp_path / "run", monkeypatch, {"overall": {}, "per_image": [{"image_id": 1, "CIDEr": 1.0}]})
    write(tmp_path / "file", b"mine")
    argv = ["--best", "a", "--out", str(tmp_path / "out"), *(o.format(run=run, tmp=tmp_path) for o in options)]
    assert refusal(capsys, "flickr8k_report", argv).startswith("error: " + says.format(tmp=tmp_path))
    assert (tmp_path / "file").read_bytes() == b"mine"


# --- packaged_captions.py --------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, says", [
    (["--split", "{tmp}/missing.txt"], "{tmp}/missing.txt: split file not found"),
    (["--split", "{tmp}/photos"], "{tmp}/photos: split file is a folder, not a file"),
    (["--split", "{tmp}/latin1.txt"], "{tmp}/latin1.txt: split file is not UTF-8 text"),
    (["--photos", "{tmp}/missing"], "--photos {tmp}/missing: not a folder of photographs"),
    (["--photos", "{tmp}/split.txt"], "--photos {tmp}/split.txt: not a folder of photographs"),
    (["--photos", "{tmp}/empty"], "--photos {tmp}/empty: holds none of the 2 photographs that {tmp}/split.txt names"),
    (["--count", "0"], "argument --count: must be at least 1, got 0"),
    (["--count", "-1"], "argument --count: must be at least 1, got -1"),
    (["--out", "{tmp}/photos"], "{tmp}/photos: a folder, not a file to write"),
    (["--out", "{tmp}/split.txt/captions.json"], "{tmp}/split.txt: a file, not a folder to write into"),
], ids=["split missing", "split a folder", "split not UTF-8", "photos missing", "photos a file", "photos without them",
        "count 0", "count -1", "out a folder", "out under a file"])
def test_packaged_captions_refuses_before_it_loads_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             options: list[str], says: str) -> None:
    """Before, a missing split was a traceback, and a folder without the photographs or --count 0 replaced the
    record with one of no captions (--count -1: all but the last photograph)."""
    write(tmp_path / "split.txt", "b.jpg\na.jpg\n")
    write(tmp_path / "latin1.txt", "café.jpg\n".encode("latin-1"))
    write(tmp_path / "photos" / "a.jpg", b"a photograph")
    (tmp_path / "empty").mkdir()
    record = write(tmp_path / "captions.json", b'{"captions": "as recorded"}')
    argv = ["--photos", str(tmp_path / "photos"), "--split", str(tmp_path / "split.txt"), "--out", str(record),
            *(option.format(tmp=tmp_path) for option in options)]
    assert says.format(tmp=tmp_path) in refusal(capsys, "packaged_captions", argv)
    assert record.read_bytes() == b'{"captions": "as recorded"}'


# --- check_ddp_resume.py ---------------------------------------------------------------------------------------


def test_check_ddp_resume_refuses_a_file_for_its_work_folder(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """Before, generating the shapes world in it raised a DatasetError with its traceback."""
    file = write(tmp_path / "scores.json", b"{}")
    assert refusal(capsys, "check_ddp_resume", [str(file)]) == f"error: {file}: a file, not a folder to write into"
    assert refusal(capsys, "check_ddp_resume", [str(file / "work")]) == (
        f"error: {file / 'work'}: cannot create the folder (Not a directory)")


def test_check_ddp_resume_refuses_an_empty_work_folder_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Before, "" was the current folder: the shapes world and both runs were written beside the user's files."""
    said = refusal(capsys, "check_ddp_resume", [""])
    assert ": argument work_dir: an empty name; give the folder to write into (see " in said


def test_check_ddp_resume_runs_a_relative_work_folder_where_the_user_named_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs start in the repository (cwd=ROOT): a relative folder was read from there, so the runs went into
    the repository while the shapes world was made in the user's folder."""
    import sys

    module = script("check_ddp_resume")
    given: list[tuple[Path, Path]] = []

    def stand_in(data: Path, out: Path, *extra: str) -> list[str]:
        given.append((data, out))
        return [sys.executable, "-c", "import sys; print('error: stopped here', file=sys.stderr); sys.exit(2)"]

    monkeypatch.setattr(module, "command", stand_in)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work" / "shapes").mkdir(parents=True)  # generated already
    assert module.main(["work"]) == 2
    assert given == [(tmp_path / "work" / "shapes", tmp_path / "work" / "reference")]
    assert capsys.readouterr().err == f"error: {tmp_path / 'work' / 'reference'}: the uninterrupted run failed: " \
        "stopped here\n"


@pytest.mark.parametrize("fails", ["reference", "killed"])
def test_check_ddp_resume_says_why_a_run_failed_rather_than_wait_for_its_checkpoint(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    """A run that ends without a checkpoint (here a stand-in for torchrun that fails at once, as `captioner train`
    does on a damaged shapes folder or a run folder already used) left the script waiting for last.pt forever."""
    import sys

    module = script("check_ddp_resume")
    said = "import sys; print('error: rank 0: data.root=x: a file', file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(module, "command", lambda data, out, *extra: [
        sys.executable, "-c", said if out.name == fails else "pass"])
    (tmp_path / "shapes").mkdir()  # generated already
    capsys.readouterr()
    assert module.main([str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    ended = "the uninterrupted run failed" if fails == "reference" else (
        "the run to be killed ended (exit 2) before its first checkpoint")
    assert err == f"error: {tmp_path / fails}: {ended}: rank 0: data.root=x: a file\n"


# --- package_default_model.py ----------------------------------------------------------------------------------


@pytest.mark.parametrize("options, says", [
    (["--into", "{tmp}/file"], "{tmp}/file: a file, not a folder to write into"),
    (["--into", "{tmp}/file/models"], "{tmp}/file/models: cannot create the folder (Not a directory)"),
    (["--into", "{tmp}", "--name", "file"], "{tmp}/file: a file, where the packaged model's folder goes; it is kept"),
    (["--into", "{tmp}/models", "--name", ""], "'': not a packaged model's name"),
], ids=["into a file", "into under a file", "a file where it goes", "an empty name"])
def test_package_default_model_refuses_where_it_cannot_write_before_reading_the_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, options: list[str], says: str) -> None:
    """Before, a place it could not write ended in a traceback once the model was checked and stored (a file
    where the folder goes: in removing it), and an empty --name took the run folder's name."""
    write(tmp_path / "run" / "best.pt", b"not read: every refusal comes first")
    write(tmp_path / "file", b"mine")
    argv = [str(tmp_path / "run"), *(option.format(tmp=tmp_path) for option in options)]
    assert refusal(capsys, "package_default_model", argv).startswith("error: " + says.format(tmp=tmp_path))
    assert (tmp_path / "file").read_bytes() == b"mine"


# --- golden_captions.py ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared, options, says", [
    ("missing", ["--models"], "{tmp}/missing: shared data folder not found (set CAPTIONER_SHARED_DATA)"),
    ("", ["--out", "{tmp}"], "{tmp}: a folder, not a file to write"),
    ("", ["--out", "{tmp}/file/captions.json"], "{tmp}/file: a file, not a folder to write into"),
], ids=["no shared data", "out a folder", "out under a file"])
def test_golden_captions_refuses_before_training_or_decoding(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: str,
        options: list[str], says: str) -> None:
    """Before, a missing shared folder was said (exit 1, without `error:`) after --models had trained, and an --out
    that could not be written ended in a traceback after every decoding."""
    module = script("golden_captions")
    monkeypatch.setenv("CAPTIONER_SHARED_DATA", str(tmp_path / shared))
    monkeypatch.setattr(module, "train_models", lambda work: pytest.fail("trained before the check"))
    monkeypatch.setattr(module, "golden_record", lambda shared, onnx: pytest.fail("decoded before the check"))
    write(tmp_path / "file", b"mine")
    argv = [option.format(tmp=tmp_path) for option in options]
    assert refusal(capsys, "golden_captions", argv).startswith("error: " + says.format(tmp=tmp_path))
    assert (tmp_path / "file").read_bytes() == b"mine"


# --- floor_constraints.py --------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, says", [
    (None, "cannot be read (No such file or directory)"),
    (b"\xff\xfe[project]", "not UTF-8 text"),
    (b'{"project": 1}', "not valid TOML"),
    (b"[project]\ndependencies = 3\n", "no [project] dependencies and optional-dependencies lists"),
    (b"[project]\ndependencies = []\noptional-dependencies = {}\n", "no >= floor for torch, torchvision"),
], ids=["missing", "not UTF-8", "not TOML", "dependencies not a list", "no floors"])
def test_floor_constraints_names_a_pyproject_it_cannot_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            content: bytes | None, says: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    if content is not None:
        write(pyproject, content)
    assert refusal(capsys, "floor_constraints", ["--pyproject", str(pyproject)]).startswith(
        f"error: {pyproject}: {says}")


# --- quickstart.sh ---------------------------------------------------------------------------------------------


def test_quickstart_refuses_a_bad_override_with_exit_status_2(tmp_path: Path) -> None:
    """As captioner's commands refuse it (the quickstart exited 1), before anything is trained."""
    from test_scripts import run_quickstart

    result, calls = run_quickstart(tmp_path, "train.epochs=0", java=True)
    assert (result.returncode, result.stdout, calls) == (2, "", [])
    assert result.stderr == "error: command line: 'train.epochs' must be >= 1; got 0\n"


# --- index_answers.sh ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments, says", [
    ([], "give URL [SECONDS]"),
    (["http://127.0.0.1:9/", "1", "more"], "give URL [SECONDS]"),
    (["http://127.0.0.1:9/", "soon"], "SECONDS 'soon': expected a number of seconds above 0, at most 3600"),
    (["http://127.0.0.1:9/", "inf"], "SECONDS 'inf': expected a number of seconds above 0, at most 3600"),
    (["http://127.0.0.1:9/", "0"], "SECONDS '0': expected a number of seconds above 0, at most 3600"),
], ids=["no URL", "a third argument", "seconds a word", "seconds infinite", "no seconds"])
def test_index_answers_refuses_arguments_that_are_no_url_and_seconds(arguments: list[str], says: str) -> None:
    """Before: bash's "$1: unbound variable" or Python's traceback, exit 1 (unreachable), or exit 1 for a timeout
    of 0 seconds as if the server were not there."""
    import subprocess

    done = subprocess.run(["bash", str(ROOT / "scripts" / "index_answers.sh"), *arguments], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: scripts/index_answers.sh: {says}\n")


# --- flickr8k_full.sh ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments, out, says", [
    (["data", "", "lsmt"], "runs", "step 'lsmt' is not one of: lstm lstm_blind transformer lstm_scst "
                                   "transformer_scst ensemble report export"),
    (["data"], "file", "OUT=file: not a folder it can write into"),
], ids=["a misspelt step", "out a file"])
def test_flickr8k_full_refuses_its_arguments_before_any_step(tmp_path: Path, arguments: list[str], out: str,
                                                             says: str) -> None:
    """Before, a misspelt step ran nothing and ended on `cat`'s "No such file" (exit 1), and OUT naming a file was
    said by mkdir (exit 1)."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "flickr8k_full.sh", repo / "scripts")  # no .venv: nothing past the checks runs
    write(repo / "data" / "Flickr8k.token.txt", "")
    write(repo / "file", b"mine")
    done = subprocess.run(["bash", str(repo / "scripts" / "flickr8k_full.sh"), *arguments], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": out})
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"flickr8k_full.sh: {says}\n")
    assert (repo / "file").read_bytes() == b"mine"
