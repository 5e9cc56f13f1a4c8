"""Export in the Hub layout: safetensors + JSON + a model card, loaded back with no unpickling,
by path or Hub repo id (from the cache, offline), through every command that takes a model; and
every broken export refused in one line naming the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TrainedRun
from helpers import edit_json, subprocess_env
import warm_start

from captioner.apps.cli import main
from captioner.core.errors import CheckpointError, ExportError
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config, read_checkpoint
from captioner.models.export_format import CONFIG, VOCAB, WEIGHTS, sha256


@pytest.fixture(scope="module")
def exported(shapes_lstm: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run copy with a fast test evaluation beside its checkpoint, its export). A copy is no longer
    in the run folder it was written to: its dataset is named, as for anyone's model."""
    root = tmp_path_factory.mktemp("export")
    run = root / "run"
    shutil.copytree(shapes_lstm.run, run, ignore=shutil.ignore_patterns("tensorboard"))
    # scores_test.json beside it
    assert main(["evaluate", str(run / "best.pt"), f"data.root={shapes_lstm.shapes}", "--split", "test", "--fast"]) == 0
    assert main(["export", str(run), str(root / "model"), "--image", str(shapes_lstm.test_images[0])]) == 0
    return run, root / "model"


def card_metadata(folder: Path) -> dict:
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_export_writes_the_hub_layout_and_loads_back_identically(exported: tuple[Path, Path],
                                                                 shapes_lstm: TrainedRun) -> None:
    run, folder = exported
    assert {p.name for p in folder.iterdir()} == {WEIGHTS, CONFIG, VOCAB, "README.md", "attention.png"}
    config = json.loads((folder / CONFIG).read_text())
    original = Captioner.from_pretrained(run / "best.pt", device="cpu")
    spec = config["spec"]
    assert spec["vocab_size"] == len(original.vocab) == len(json.loads((folder / VOCAB).read_text()))
    assert spec["decoder"]["type"] == "lstm" and spec["preprocessing"]["image_size"] == 64
    assert spec["grid"] == list(original.grid_size()) and spec["special_tokens"] == {"pad": 0, "bos": 1,
                                                                                     "eos": 2, "unk": 3}
    assert config["files"][WEIGHTS]["sha256"] == sha256(folder / WEIGHTS)
    loaded = Captioner.from_pretrained(folder, device="cpu")
    for name, tensor in original.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    images = shapes_lstm.test_images[:4]
    before, after = original.caption(images), loaded.caption(images)
    assert [c.text for c in before] == [c.text for c in after] and [c.score for c in before] == [c.score for c in after]
    # The training config travels with the export: evaluate knows the dataset.
    assert checkpoint_config(folder).data.dataset == "shapes"


def test_the_card_carries_the_runs_own_scores(exported: tuple[Path, Path]) -> None:
    run, folder = exported
    meta = card_metadata(folder)
    assert meta["pipeline_tag"] == "image-to-text" and meta["library_name"] == "captioner"
    test_scores = json.loads((run / "scores_test.json").read_text())["overall"]
    (result,) = meta["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test"
    by_name = {m["name"]: m["value"] for m in result["metrics"]}
    assert by_name["CIDEr-D"] == round(test_scores["CIDEr"], 4) and by_name["BLEU-4"] == round(test_scores["Bleu_4"], 4)
    state = read_checkpoint(run / "best.pt")["train_state"]
    best = [row for row in state["history"] if row["epoch"] == state["best_epoch"]][-1]
    card = (folder / "README.md").read_text()
    assert f"| validation (best epoch {best['epoch']}) | {best['val_Bleu_1']:.3f} |" in card
    assert "![Attention of each word of a caption](attention.png)" in card and "## Intended use and limitations" in card



@pytest.mark.parametrize("train_state", ["not a state", {"history": "x", "best_epoch": "y"},
                                         {"history": [{"epoch": "x", "val_Bleu_1": 0.5}], "best_epoch": None}])
def test_a_training_history_of_other_shapes_leaves_the_cards_validation_scores_out(
    tmp_path: Path, train_state: object) -> None:
    """A stranger's checkpoint whose train_state is not a mapping, whose history is not a list of epochs or whose
    epoch is no number: `export` stopped on an AttributeError or ValueError traceback; its card goes without them."""
    from captioner.apps.model_card import read_scores

    scores = read_scores(tmp_path / "best.pt", train_state)  # type: ignore[arg-type]
    assert scores.validation_epoch is None
    assert scores.validation in ({}, {"Bleu_1": 0.5})

def test_loading_an_export_unpickles_nothing(exported: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = exported

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an export must load without torch.load or pickle")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr("pickle.load", refuse)
    monkeypatch.setattr("pickle.loads", refuse)
    assert Captioner.from_pretrained(folder, device="cpu").vocab


def test_caption_evaluate_and_demo_take_an_export(exported: tuple[Path, Path], shapes_lstm: TrainedRun, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    run, folder = exported
    image = shapes_lstm.test_images[0]
    assert main(["caption", str(folder), str(image)]) == 0
    by_export = capsys.readouterr().out
    assert main(["caption", str(run / "best.pt"), str(image)]) == 0
    assert capsys.readouterr().out.split("\t")[1] == by_export.split("\t")[1]
    assert main(["evaluate", str(folder), f"data.root={shapes_lstm.shapes}", "--split", "test", "--fast", "--out",
                 str(tmp_path)]) == 0
    assert (tmp_path / "scores_test.json").is_file()
    # untouched
    assert sorted(p.name for p in folder.iterdir()) == sorted([WEIGHTS, CONFIG, VOCAB, "README.md", "attention.png"])
    from captioner.apps.demo.cards import load_models, model_cards

    card = model_cards(load_models([folder]))
    assert "trained on **shapes**" in card and "validation at epoch" in card



@pytest.mark.parametrize("fields", [{"scores": "high"}, {"scores": {"test": [1], "validation": [2]}},
                                    {"scores": {"test": {"test": {"overall": [1]}}, "validation": {"Bleu_4": "y"}}},
                                    {"training_config": "a recipe"}, {"train_state": "x"},
                                    {"train_state": {"history": "x", "best_epoch": 1}}])
def test_the_demo_shows_a_model_whose_recorded_fields_have_other_shapes(tmp_path: Path, fields: dict) -> None:
    """The demo's card and serving line of a stranger's export or checkpoint read its scores, training config and
    history as mappings and lists: a string there was an AttributeError or ValueError traceback. The card now
    shows what is there and says the rest was not recorded."""
    from helpers import tiny_model

    from captioner.apps.demo.cards import load_models, model_cards, recorded, serving_line
    from captioner.models.checkpoint import save_checkpoint

    if "train_state" in fields:
        path = tmp_path / "model.pt"
        save_checkpoint(path, tiny_model(), **fields)
    else:
        path = tmp_path / "model"
        tiny_model().save_pretrained(path, **fields)
    models = load_models([path])
    card, line = model_cards(models), serving_line(str(path), models[str(path)], recorded(str(path)))
    assert "vocabulary" in card and "no test or validation scores recorded" in line, (card, line)

def broken_copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    return copy


def assert_one_line(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_a_truncated_or_flipped_weights_file_is_refused(exported: tuple[Path, Path], tmp_path: Path) -> None:
    folder = broken_copy(exported[1], tmp_path)
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(ExportError) as error:
        Captioner.from_pretrained(folder)
    assert_one_line(error, str(folder / WEIGHTS), "truncated")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    (folder / WEIGHTS).write_bytes(bytes(flipped))
    with pytest.raises(ExportError) as error:
        Captioner.from_pretrained(folder)
    assert_one_line(error, str(folder / WEIGHTS), "checksum")
    (folder / WEIGHTS).unlink()
    with pytest.raises(ExportError) as error:
        Captioner.from_pretrained(folder)
    assert_one_line(error, str(folder / WEIGHTS), "missing")



@pytest.mark.parametrize("kind", ["folder", "pipe", "size as text"])
def test_a_weights_file_that_is_no_file_or_a_size_that_is_no_number_is_named_for_what_it_is(
    exported: tuple[Path, Path], tmp_path: Path, kind: str,
) -> None:
    """A model.safetensors that is a folder or a pipe was reported "missing"; a size recorded as "152" read
    "152 bytes, but config.json records 152". Each line now says what is wrong."""
    folder = broken_copy(exported[1], tmp_path)
    if kind == "size as text":
        config = json.loads((folder / CONFIG).read_text())
        config["files"][WEIGHTS]["bytes"] = str(config["files"][WEIGHTS]["bytes"])
        (folder / CONFIG).write_text(json.dumps(config))
    else:
        (folder / WEIGHTS).unlink()
        (folder / WEIGHTS).mkdir() if kind == "folder" else os.mkfifo(folder / WEIGHTS)
    with pytest.raises(ExportError) as error:
        Captioner.from_pretrained(folder)
    if kind == "size as text":
        assert_one_line(error, str(folder / CONFIG), f"bytes for {WEIGHTS}, not a whole number")
    else:
        assert_one_line(error, str(folder / WEIGHTS), "not a regular file")

@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"format_version": 99}, ["export format version 99 is not supported"]),
        ({"format": "transformers"}, ["not a captioner export"]),
        ({"spec.decoder.hidden_dim": 48}, ["model.safetensors: weights do not fit the model its config describes"]),
        ({"spec.vocab_size": 7}, ["vocab.json", "says vocab_size 7"]),
        ({"spec.decoder.type": "gru"}, ["incompatible config", "model.decoder.type"]),
    ],
)
def test_a_config_that_does_not_match_its_files_is_refused(
    exported: tuple[Path, Path], tmp_path: Path, change: dict, fragments: list[str]
) -> None:
    folder = broken_copy(exported[1], tmp_path)
    edit_json(folder / CONFIG, change)
    with pytest.raises((ExportError, CheckpointError)) as error:
        Captioner.from_pretrained(folder)
    assert_one_line(error, *fragments)


def test_a_broken_export_is_one_line_from_the_cli(exported: tuple[Path, Path], shapes_lstm: TrainedRun,
                                                  tmp_path: Path) -> None:
    folder = broken_copy(exported[1], tmp_path)
    (folder / CONFIG).write_text("{not json")
    result = warm_start.run(
        [sys.executable, "-m", "captioner", "caption", str(folder), str(shapes_lstm.test_images[0])],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {folder / CONFIG}: not valid JSON")


def test_export_refuses_a_foreign_folder_and_an_export_as_source(exported: tuple[Path, Path], tmp_path: Path) -> None:
    run, folder = exported
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ExportError) as error:
        main_raising(["export", str(run), str(tmp_path)])
    assert_one_line(error, "not empty (notes.txt", "not an export")
    with pytest.raises(ExportError) as error:
        main_raising(["export", str(folder), str(tmp_path / "again")])
    assert_one_line(error, "already an exported folder")


def test_export_carries_decoding_defaults_tuned_after_training(exported: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = exported
    assert main(["export", str(run), str(tmp_path / "tuned"), "--beam", "5", "--length-penalty", "1.5"]) == 0
    config = json.loads((tmp_path / "tuned" / CONFIG).read_text())
    assert config["spec"]["decode"]["beam_size"] == 5 and config["spec"]["decode"]["length_penalty"] == 1.5
    loaded = Captioner.from_pretrained(tmp_path / "tuned", device="cpu")
    assert loaded.decode_config.length_penalty == 1.5 and loaded.decode_config.beam_size == 5
    untouched = json.loads((exported[1] / CONFIG).read_text())["spec"]["decode"]  # without the flags: the checkpoint's
    assert untouched["length_penalty"] == checkpoint_config(run / "best.pt").decode.length_penalty
    with pytest.raises(SystemExit):
        main(["export", str(run), str(tmp_path / "bad"), "--length-penalty", "-1"])


def main_raising(argv: list[str]) -> None:
    """Run a command's `run` directly, so its CaptionerError reaches the test."""
    from captioner.apps.cli import build_parser

    args = build_parser().parse_args(argv)
    args.func(args)


def hub_cache_with(folder: Path, cache: Path, repo_id: str) -> None:
    """The layout huggingface_hub's cache gives a downloaded repo: refs/main -> snapshots/<rev>/files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


def test_a_hub_repo_id_loads_from_the_cache_offline_and_is_refused_in_one_line_when_absent(
    exported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    hub_cache_with(exported[1], cache, "someone/shapes-lstm")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model = Captioner.from_pretrained("someone/shapes-lstm", device="cpu")
    assert len(model.vocab) == json.loads((exported[1] / CONFIG).read_text())["spec"]["vocab_size"]
    with pytest.raises(ExportError) as error:
        Captioner.from_pretrained("someone/not-there")
    assert_one_line(error, "someone/not-there", "offline (HF_HUB_OFFLINE is set)", "no cached copy")
    with pytest.raises(CheckpointError) as error:
        Captioner.from_pretrained("runs/missing.pt")  # a missing file is not taken for a repo id
    assert_one_line(error, "runs/missing.pt: checkpoint not found")


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return warm_start.run([sys.executable, "-m", "captioner", *argv], capture_output=True, text=True,
                          env=subprocess_env(**env), timeout=120)


def test_push_without_a_token_offline_or_without_a_network_is_one_line(exported: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    folder = str(exported[1])
    home = {"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
    result = run_cli("push", folder, "someone/model", **home)
    assert result.returncode == 2 and result.stderr.strip().endswith(
        "no Hugging Face token; run `hf auth login` or set HF_TOKEN to a token with write access")
    result = run_cli("push", folder, "someone/model", HF_HUB_OFFLINE="1", **home)
    assert (result.returncode == 2 and "offline (HF_HUB_OFFLINE is set)" in result.stderr
            and "Traceback" not in result.stderr)
    # A token, but no Hub to reach (a closed local port): the connection error in one line.
    result = run_cli("push", folder, "someone/model", HF_HOME=str(tmp_path / "hf"), HF_TOKEN="hf_fake",
                     HF_ENDPOINT="http://127.0.0.1:9")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "push someone/model: could not reach the Hub" in result.stderr.strip().splitlines()[-1]
    result = run_cli("push", folder, "not a repo")
    assert result.returncode == 2 and "'not a repo' is not a Hub repo id" in result.stderr


def test_push_uploads_the_export_of_a_checkpoint(exported: tuple[Path, Path], shapes_lstm: TrainedRun,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's side is replaced by a recorder (no network here); what reaches it is real: the
    folder export_model wrote, whole."""
    run, _ = exported
    uploaded: dict[str, object] = {}

    class RecordingApi:
        def create_repo(self, repo_id: str, private: bool, exist_ok: bool) -> str:
            uploaded["repo"] = (repo_id, private, exist_ok)
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, repo_id: str, folder_path: str, commit_message: str) -> None:
            uploaded["files"] = sorted(p.name for p in Path(folder_path).iterdir())
            uploaded["loads"] = len(Captioner.from_pretrained(folder_path, device="cpu").vocab) > 0

    monkeypatch.setattr("huggingface_hub.HfApi", RecordingApi)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_recorded")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from captioner.apps.export import push_model

    assert push_model(run, "someone/shapes", private=True,
                      image=shapes_lstm.test_images[0]) == "https://huggingface.co/someone/shapes"
    assert uploaded["repo"] == ("someone/shapes", True, True)
    assert uploaded["files"] == sorted([WEIGHTS, CONFIG, VOCAB, "README.md", "attention.png"]) and uploaded["loads"]
    assert os.environ.get("HF_TOKEN") != "hf_recorded"



def test_a_push_failing_with_a_message_less_error_is_one_line(exported: tuple[Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload that dies on an OSError with no message (a full disk, a closed socket) names its type."""
    class FailingApi:
        def create_repo(self, repo_id: str, private: bool, exist_ok: bool) -> str:
            raise OSError()

    monkeypatch.setattr("huggingface_hub.HfApi", FailingApi)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_recorded")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from captioner.apps.export import push_model

    with pytest.raises(ExportError, match=r"^push someone/shapes: could not reach the Hub \(OSError\)$"):
        push_model(exported[1], "someone/shapes")


CLI_WITHOUT_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, NoTorch())
from captioner.apps.cli import main
code = main(sys.argv[1:])
assert not any(m.split(".")[0] == "torch" for m in sys.modules)
sys.exit(code)
"""


def test_export_onnx_and_caption_with_the_onnx_runtime_without_torch(
    exported: tuple[Path, Path], shapes_lstm: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run, _ = exported
    folder = tmp_path / "with-onnx"
    assert main(["export", str(run), str(folder), "--onnx"]) == 0
    assert {"encoder.onnx", "decoder_init.onnx", "decoder_step.onnx",
            "onnx.json"} <= {p.name for p in (folder / "onnx").iterdir()}
    capsys.readouterr()
    images = [str(p) for p in shapes_lstm.test_images[:3]]
    assert main(["caption", str(folder), *images, "--beam", "2"]) == 0
    by_torch = capsys.readouterr().out
    result = subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, "caption", str(folder), *images, "--beam", "2",
                             "--runtime", "onnx"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == by_torch
    result = subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, "caption", str(folder), images[0], "--runtime",
                             "onnx", "--sample"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert (result.returncode == 2 and result.stderr.strip()
            == "error: caption --runtime onnx: --sample need the PyTorch runtime (leave out --runtime onnx)")
    result = subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, "caption", str(exported[1]), images[0],
                             "--runtime", "onnx"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 2 and "no onnx.json" in result.stderr and "Traceback" not in result.stderr


def test_a_transformer_exports_with_its_layers_and_heads_on_the_card(tmp_path: Path) -> None:
    """The card of a transformer names its layers and heads (the export crashed on a
    DecoderConfig attribute that does not exist, first met with the Flickr8k SCST transformer)."""
    from helpers import tiny_model
    from PIL import Image

    from captioner.apps.export import export_model
    from captioner.models.checkpoint import save_checkpoint

    model = tiny_model("model.decoder.type=transformer", "model.decoder.num_layers=3", "model.decoder.num_heads=2",
                       "model.decoder.d_model=16")
    save_checkpoint(tmp_path / "transformer.pt", model)
    image = tmp_path / "photo.png"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(image)
    export_model(tmp_path / "transformer.pt", tmp_path / "export", image=image)
    card = (tmp_path / "export" / "README.md").read_text()
    assert "transformer decoder (3 layers, 2 heads;" in card


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny checkpoints of different weights, a photo, and the first one's export with its figure."""
    from helpers import tiny_model
    from PIL import Image

    from captioner.models.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("two_models")
    for name, seed in (("first", 0), ("second", 1)):
        save_checkpoint(root / f"{name}.pt", tiny_model("decode.max_length=4", seed=seed))
    Image.new("RGB", (40, 30), (200, 30, 30)).save(root / "photo.png")
    assert main(["export", str(root / "first.pt"), str(root / "earlier"), "--image", str(root / "photo.png")]) == 0
    return {"first": root / "first.pt", "second": root / "second.pt", "photo": root / "photo.png",
            "earlier": root / "earlier"}


def contents(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder`, hidden ones too: a file's bytes, None for a folder."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def bad_images(root: Path) -> dict[str, Path]:
    """An --image for each way a figure's photo can be refused: missing, text, empty, a folder, cut short, too big."""
    import struct
    import zlib

    from PIL import Image

    (root / "text.jpg").write_text("not an image")
    (root / "empty.jpg").write_bytes(b"")
    (root / "folder.jpg").mkdir()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(root / "whole.jpg")
    (root / "cut.jpg").write_bytes((root / "whole.jpg").read_bytes()[:300])
    header = b"IHDR" + struct.pack(">IIBBBBB", 40_000, 40_000, 8, 2, 0, 0, 0)  # 1.6 gigapixels, by its header alone
    (root / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + header
                                    + struct.pack(">I", zlib.crc32(header)))
    names = ("missing.jpg", "text.jpg", "empty.jpg", "folder.jpg", "cut.jpg", "huge.png")
    return {name: root / name for name in names}


def test_an_export_refused_for_its_image_leaves_an_earlier_export_as_it_was_and_writes_no_new_one(
    two_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture,
) -> None:
    """A bad --image is one line and exit 2, said before anything is written: the earlier export keeps every
    byte (it became a mix of both models), and a new folder is not made (it held a partial export that loaded)."""
    folder = tmp_path / "earlier"
    shutil.copytree(two_models["earlier"], folder)
    before = contents(folder)
    for name, image in bad_images(tmp_path).items():
        for target in (folder, tmp_path / "new" / "export"):
            capsys.readouterr()
            assert main(["export", str(two_models["second"]), str(target), "--image", str(image)]) == 2, name
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"error: {image}: ") and "Traceback" not in err, err
        assert contents(folder) == before, name
        assert not (tmp_path / "new").exists(), name


@pytest.mark.parametrize("stop", [RuntimeError("a bug mid-export"), KeyboardInterrupt()], ids=["bug", "ctrl-c"])
@pytest.mark.parametrize("source", ["checkpoint", "exported", "web"])
def test_an_export_that_stops_midway_leaves_the_folder_as_it_was(
    two_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, stop: BaseException,
) -> None:
    """Stopped while it writes (the ONNX graphs half written here), an export, the --onnx of an exported folder and
    a --web site leave the earlier one at the folder byte for byte, and no folder of their own behind."""
    from captioner.apps.export import export_model

    def half_written(model: Captioner, folder: Path, *args: object, **kwargs: object) -> list[Path]:
        (Path(folder) / "onnx").mkdir(parents=True, exist_ok=True)
        (Path(folder) / "onnx" / "encoder.onnx").write_bytes(b"half a graph")
        raise stop

    monkeypatch.setattr("captioner.models.onnx_export.export_onnx", half_written)
    folder = tmp_path / "earlier"
    shutil.copytree(two_models["earlier"], folder)
    if source == "web":  # an earlier site, as far as the export can tell
        (folder / "site.json").write_text("{}")
        (folder / "model").mkdir()
        (folder / "model" / "onnx.json").write_text("{}")
    before = contents(folder)
    model = {"checkpoint": two_models["second"], "exported": folder, "web": two_models["second"]}[source]
    for target in (folder, tmp_path / "new"):
        with pytest.raises(type(stop)):
            export_model(model, target, image=two_models["photo"] if source == "checkpoint" else None,
                         onnx=source != "web", web=source == "web")
    assert contents(folder) == before
    assert not (tmp_path / "new").exists()


def test_an_export_over_an_earlier_one_replaces_it_whole(two_models: dict[str, Path], tmp_path: Path) -> None:
    """Written again without --onnx, nor a figure, an export keeps nothing of the earlier one: its onnx/ ran the
    earlier model under `caption --runtime onnx`, silently."""
    folder = tmp_path / "earlier"
    shutil.copytree(two_models["earlier"], folder)
    (folder / "onnx").mkdir()
    (folder / "onnx" / "onnx.json").write_text("{}")  # as the earlier model's graphs and manifest
    (folder / "model.safetensors.tmp").write_bytes(b"a write cut short")
    assert {"attention.png", "onnx"} <= {p.name for p in folder.iterdir()}
    assert main(["export", str(two_models["second"]), str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    from helpers import tiny_model

    loaded, second = Captioner.from_pretrained(folder, "cpu").state_dict(), tiny_model(seed=1).state_dict()
    assert all(torch.equal(tensor, loaded[name]) for name, tensor in second.items())


def test_a_file_in_the_folders_path_is_one_line_and_left_alone(two_models: dict[str, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """`export M afile/sub` was a NotADirectoryError traceback; now it is one line, as `caption --heatmaps` says it,
    and the file keeps its bytes."""
    (tmp_path / "afile").write_text("keep")
    capsys.readouterr()
    assert main(["export", str(two_models["first"]), str(tmp_path / "afile" / "sub")]) == 2
    said = capsys.readouterr().err
    assert said == f"error: {tmp_path / 'afile' / 'sub'}: cannot create the folder (Not a directory)\n"
    assert (tmp_path / "afile").read_text() == "keep"


def test_a_failure_while_moving_the_export_in_puts_the_earlier_one_back(
    two_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    """The last step, the renames that swap the new files in, failing halfway (some earlier files set aside, some
    new ones in) is one line, and every earlier file is back in its place."""
    folder = tmp_path / "earlier"
    shutil.copytree(two_models["earlier"], folder)
    before = contents(folder)
    renames = []

    def failing_rename(source: str, target: str) -> None:
        renames.append(source)
        if len(renames) == 7:  # the earlier 5 set aside, 1 new one in
            raise OSError(28, "No space left on device")
        os.replace(source, target)

    monkeypatch.setattr("captioner.core.files.os.rename", failing_rename)
    capsys.readouterr()
    assert main(["export", str(two_models["second"]), str(folder)]) == 2
    assert capsys.readouterr().err == (f"error: {folder}: could not move the new files in (No space left on device); "
                                       "the earlier files are kept\n")
    assert len(renames) > 7 and contents(folder) == before


def test_an_export_into_the_current_folder_is_titled_by_its_name(two_models: dict[str, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`captioner export RUN .` titled its card '# ': the name of '.' is empty; the card names the folder."""
    folder = tmp_path / "my-shapes-model"
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert main(["export", str(two_models["first"]), "."]) == 0
    titles = [line for line in (folder / "README.md").read_text().splitlines() if line.startswith("# ")]
    assert titles[:1] == ["# my-shapes-model"], titles
