"""The benchmarks' command-line contract under a user's mistakes: a wrong benchmark name, a missing or wrong file or
folder, an option value out of range, a record id the results pages cannot take, an option given without the one it
needs. Each is one line on stderr, `error: WHAT: PROBLEM`, exit status 2 and no traceback, said before the measured
work starts (here anything that would start it fails the test), and a refused run leaves docs/results and an --out
file as they were. Most cases run `python -m benchmarks NAME ARGS` in this process; none measures anything."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import records
from benchmarks.__main__ import main as benchmarks
from helpers import REPO, subprocess_env

PACKAGED = str(REPO / "captioner" / "pretrained" / "flickr8k_transformer_scst")


def began(*args: Any, **kwargs: Any) -> None:
    pytest.fail("the measured work began")


def run(command: Callable[[list[str] | None], int | None], argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """`command(argv)` -> its one error line, checked: exit status 2, nothing else on stderr, no traceback (a bug's
    exception fails the test as it propagates). A SystemExit with a text exits 1 after printing it, as Python does."""
    try:
        code = command(argv)
    except SystemExit as e:
        code = 1 if isinstance(e.code, str) else e.code
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, (code, err)
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Wrong inputs: a missing path, a folder, a file that is not a model or a picture, damaged JSON."""
    made = {"missing": tmp_path / "missing", "folder": tmp_path / "folder", "text": tmp_path / "notes.txt",
            "empty": tmp_path / "empty.json", "truncated": tmp_path / "truncated.json", "list": tmp_path / "list.json",
            "no_beams": tmp_path / "no_beams.json", "nothing": tmp_path / "nothing.json",
            "one_caption": tmp_path / "one_caption.json"}
    made["folder"].mkdir()
    made["text"].write_text("not a model, not a picture\n")
    made["empty"].write_text("")
    made["truncated"].write_text('{"annotations": [{"image_id": 1, ')
    made["list"].write_text("[1, 2]")
    made["no_beams"].write_text('{"run": {"images": 3}}')
    made["nothing"].write_text("{}")
    made["one_caption"].write_text('{"annotations": [{"image_id": 1, "caption": "a dog runs"}]}')
    return made


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """A folder of one photo, standing in for the shared Flickr8k photos (which a machine may lack)."""
    from PIL import Image

    (tmp_path / "photos").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "a.jpg")
    return tmp_path / "photos"


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch, photos: Path) -> None:
    """Every benchmark's measured work (or the processes and servers that do it) fails the test if it starts."""
    from benchmarks import (bench_allocator, bench_checkpoint_load, bench_cpu_amp, bench_demo_load, bench_gpu,
                            bench_packaged_model, bench_products, bench_reference, bench_roofline, bench_stored_step,
                            bench_threads, bench_web_page)

    for module, name in [(bench_demo_load, "served_run"), (bench_demo_load, "load_run"), (bench_threads, "run"),
                         (bench_cpu_amp, "config_batches"), (bench_products, "alternating"),
                         (bench_products, "time_steps"), (bench_stored_step, "load_config"),
                         (bench_roofline, "gemm_peak"), (bench_reference, "reference_actions"),
                         (bench_allocator, "child_json"), (bench_checkpoint_load, "child_json"),
                         (bench_web_page, "print_environment"), (bench_gpu.reference_sat, "load_reference"),
                         (bench_packaged_model.subprocess, "run")]:
        monkeypatch.setattr(module, name, began)
    monkeypatch.setattr(bench_demo_load, "PHOTOS", photos)


@pytest.mark.parametrize("argv, says", [
    (["no_such"], "error: python -m benchmarks: no benchmark 'no_such'"),
    (["threads", "--steps", "x"], "argument --steps: expected a whole number, got 'x'"),
    (["threads", "--steps", "0"], "argument --steps: must be at least 1"),
    (["threads", "--config", "{missing}"], "{missing}: config file not found"),
    (["cpu_amp", "--threads", "0"], "argument --threads: must be a whole number in [1, 1024], got 0"),
    (["products", "--repeats", "0"], "argument --repeats: must be at least 1"),
    (["products", "--pairs", "3"], "--pairs applies only with --steps"),
    (["stored_step", "--profile", "-1"], "argument --profile: must be at least 0"),
    (["roofline", "--peak-size", "1"], "argument --peak-size: must be at least 2"),
    (["roofline", "--profile", ""], "argument --profile: an empty name; give the folder to write into"),
    (["allocator", "--threads", "100000"], "argument --threads: must be a whole number in [1, 1024]"),
    (["checkpoint_load", "--config", "{folder}"], "{folder}: config file is a folder, not a file"),
    (["demo_load"], "give a CHECKPOINT to serve, or --url of a running demo"),
    (["demo_load", "{missing}"], "{missing}: checkpoint not found"),
    (["demo_load", "{text}", "--check", "0"], "{text}: not a readable captioner checkpoint"),
    (["demo_load", PACKAGED, "--check", "0", "--clients", "0"], "argument --clients: must be at least 1, got 0"),
    (["demo_load", PACKAGED, "--check", "0", "--requests", "-1"], "argument --requests: must be at least 1"),
    (["demo_load", PACKAGED, "--check", "0", "--broken-every", "-1"], "argument --broken-every: must be at least 0"),
    (["demo_load", PACKAGED, "--check", "0", "--beside", ""], "argument --beside: needs a text"),
    (["demo_load", PACKAGED, "--check", "0", "--pid", "42"], "--pid applies only with --url"),
    (["demo_load", "--url", "localhost:7860"], "argument --url: 'localhost:7860': expected the demo's address"),
    (["metrics", "{folder}"], "{folder}: annotation file is a folder, not a file"),
    (["metrics", "{truncated}"], "{truncated}: not valid JSON"),
    (["metrics", "{one_caption}", "--held-out", "--no-before"], "{one_caption}: --held-out scores a first caption"),
    (["tokenizer", "{missing}"], "{missing}: annotation file not found"),
    (["tokenizer", "{list}"], "{list}: expected a COCO caption annotation object, got a JSON list"),
    (["same_captions", "compare", "{empty}", "{list}"], "{empty}: not valid JSON"),
    (["same_captions", "compare", "{list}", "{list}"], "{list}: not a record of `same_captions record`"),
    (["same_captions", "compare", "{nothing}", "{nothing}"], "{nothing}: not a record of `same_captions record`"),
    (["same_captions", "compare", "{no_beams}", "{no_beams}"], "{no_beams}: run 'run': no \"beams\" object"),
    (["same_captions", "record", "{folder}", "{missing}"], "{folder}: a folder; give the file the record goes to"),
    (["onnx", "--run", "a", PACKAGED, "{missing}"], "--run IMAGES {missing}: not a folder of images"),
    (["onnx", "--out", "{text}"], "--out {text}: a file, not a folder to write into"),
    (["onnx", "--out", " "], "argument --out: an empty name; give the folder to write into"),
    (["packaged_model", "{text}"], "{text}: not an image file"),
    (["beam_photos", "{folder}", "--beam", "0"], "argument --beam: beam_size must be a whole number in [1, 100]"),
    (["web_page", "--chromium", "{missing}"], "--chromium {missing}: no such program"),
    (["web_page", "--site", "{folder}"], "--site {folder}: not an exported site"),
    (["gpu", "--device", "xyz"], "--device 'xyz': expected cuda, cuda:N or cpu"),
    (["gpu", "--device", "cpu", "--tiny", "--out", "{folder}"], "--out {folder}: a folder"),
    (["cuda_graphs", PACKAGED, "{text}", "--device", "cpu"], "{text}: not a folder of images"),
    (["cuda_graphs", PACKAGED, "{folder}", "--device", "xyz"], "--device 'xyz': expected cuda, cuda:N or cpu"),
    (["cuda_graphs", PACKAGED, "{folder}", "--device", "meta"], "--device 'meta': expected cuda, cuda:N or cpu"),
    (["gpu", "--device", "meta"], "--device 'meta': expected cuda, cuda:N or cpu"),
    (["reference", "--replace"], "--replace applies only with --record"),
    (["goals", "--runs", "0"], "argument --runs: must be at least 1"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_a_mistake_is_one_line_and_exit_2_before_any_work(argv: list[str], says: str, files: dict[str, Path],
                                                            no_work: None, capsys: pytest.CaptureFixture) -> None:
    names = {name: str(path) for name, path in files.items()}
    line = run(benchmarks, [word.format(**names) for word in argv], capsys)
    assert says.format(**names) in line


@pytest.mark.parametrize("record", ["a b", "a/b", "", "Zen5", "../bench_demo_load"])
def test_a_record_id_the_pages_cannot_take_is_refused_and_the_records_are_kept(
        record: str, no_work: None, capsys: pytest.CaptureFixture) -> None:
    kept = (records.RESULTS / "bench_demo_load.json").read_bytes()
    line = run(benchmarks, ["demo_load", PACKAGED, "--check", "0", "--record", record], capsys)
    assert f"argument --record: {record!r}: a record's id is lower case letters, digits and _" in line
    assert (records.RESULTS / "bench_demo_load.json").read_bytes() == kept


@pytest.mark.parametrize("damage, says", [
    (lambda data: data, "already has record {id}: give --record another name, or --replace"),
    (lambda data: {**data, "records": [*data["records"], ["not", "a", "record"]]},
     "not a measure's records (a record that is not an object with an id)"),
    (lambda data: {**data, "records": [*data["records"], {"label": "no id"}]},
     "not a measure's records (a record that is not an object with an id)"),
], ids=["taken", "a list", "no id"])
def test_a_records_file_that_refuses_the_run_is_one_line_and_stays_as_it_was(
        damage: Callable[[dict], dict], says: str, tmp_path: Path, no_work: None,
        capsys: pytest.CaptureFixture) -> None:
    from benchmarks import bench_reference
    from benchmarks.timing import run_main

    data = json.loads((records.RESULTS / "bench_reference.json").read_text(encoding="utf-8"))
    taken = data["records"][0]["id"]
    (tmp_path / "bench_reference.json").write_text(json.dumps(damage(data), indent=1), encoding="utf-8")
    before = (tmp_path / "bench_reference.json").read_bytes()
    line = run(lambda argv: run_main(lambda words: bench_reference.main(words, results=tmp_path), argv),
               ["--record", taken], capsys)
    assert line.startswith(f"error: {tmp_path / 'bench_reference.json'}: ") and says.format(id=taken) in line
    assert (tmp_path / "bench_reference.json").read_bytes() == before


def test_a_photo_folder_without_the_photos_asked_for_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from benchmarks import bench_beam_photos

    monkeypatch.setattr(bench_beam_photos, "PHOTOS", tmp_path)
    monkeypatch.setattr(bench_beam_photos, "load_captioner", began)
    line = run(benchmarks, ["beam_photos", PACKAGED, "--images", "2"], capsys)
    assert line == f"error: {tmp_path}: 0 photographs, --images asks for 2"


def test_an_address_where_no_demo_answers_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, photos: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    """--url of a port nothing listens on: gradio's client fails to connect; said in one line naming the address,
    its temporary folder removed."""
    import socket
    import tempfile

    from benchmarks import bench_demo_load

    monkeypatch.setattr(bench_demo_load, "PHOTOS", photos)
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"  # bound, not listening: the connection is refused
        line = run(benchmarks, ["demo_load", "--url", url, "--clients", "1", "--requests", "1", "--photos", "1"],
                   capsys)
    assert line.startswith(f"error: {url}: no demo answers there (")
    assert list((tmp_path / "temp").iterdir()) == []


@pytest.mark.parametrize("script, argv, says", [
    ("bench_tokenizer.py", ["{missing}"], "error: {missing}: annotation file not found"),
    ("bench_packaged_model.py", ["{folder}"], "error: {folder}: not a file"),
])
def test_a_benchmark_run_as_a_file_keeps_the_contract(script: str, argv: list[str], says: str,
                                                      files: dict[str, Path]) -> None:
    names = {name: str(path) for name, path in files.items()}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *[a.format(**names) for a in argv]],
                          capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert done.returncode == 2 and done.stderr.strip() == says.format(**names) and done.stdout == ""


@pytest.mark.parametrize("argv, says", [
    (["same_captions", "record", "{out}", "{missing}"], "{missing}: checkpoint not found"),
    (["same_captions", "record", "{out}", "{text}", "--beams", "0"], "argument --beams: must be at least 1"),
    (["same_captions", "record", "{out}", "{text}", "{missing}"], "{text}: not a readable captioner checkpoint"),
    (["gpu", "--device", "nowhere", "--out", "{out}"], "--device 'nowhere': expected cuda, cuda:N or cpu"),
], ids=["same_captions missing run", "same_captions beams", "same_captions not a model", "gpu device"])
def test_a_refused_run_leaves_its_out_file_as_it_was(argv: list[str], says: str, files: dict[str, Path],
                                                    tmp_path: Path, no_work: None,
                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "earlier.json"
    out.write_text('{"kept": true}\n')
    names = {"out": str(out), "missing": str(files["missing"]), "text": str(files["text"])}
    assert says.format(**names) in run(benchmarks, [word.format(**names) for word in argv], capsys)
    assert out.read_text() == '{"kept": true}\n'
