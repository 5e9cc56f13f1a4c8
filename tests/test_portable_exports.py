"""What a model carries of the machine that made it: nothing. An export (with its ONNX graphs), a
push (of a checkpoint, and of an export written before its places were left out) and a packaged
model hold the recipe of the run, every place of its config a name or null, and no file written
(text or binary) holds the checkout's path, $HOME, the temporary folder or the run folder's
absolute path. The model packaged in this checkout is held to the same, and reads its own
settings without a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO, tiny_config, tiny_model, tiny_vocab
from PIL import Image

from captioner.apps.export import export_model, make_portable, push_model
from captioner.core.config import leaf_fields, load_config
from captioner.core.portable_config import UNNAMED, place_keys, value_at
from captioner.core.specs import Place, Text
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config, model_settings, save_checkpoint
from captioner.models.export_format import CARD, CONFIG

NAME = re.compile(r"[\w{][\w.{}-]*")  # what a place may become: a name, never a path
LITE = ["model.encoder.name=efficientnet_lite0", "model.encoder.pretrained=true", "model.encoder.fine_tune_blocks=0",
        "data.image_size=64", "model.decoder.type=transformer", "decode.max_length=6"]


def this_machine(run: Path, tmp_path: Path) -> dict[str, bytes]:
    """The concrete strings of the machine that writes the files: where they must never appear."""
    home = os.environ.get("HOME", "")
    found = {"the checkout": str(REPO), "the run folder": str(run.resolve()), "the test's folder": str(tmp_path),
             "the temporary folder": tempfile.gettempdir(), "$HOME": home}
    return {what: value.encode() for what, value in found.items() if len(value.strip("/")) >= 3}


def leaks(folder: Path, needles: dict[str, bytes]) -> list[str]:
    """'file: what' for every file under `folder` that holds one of `needles`."""
    return [f"{path.relative_to(folder)}: {what}" for path in sorted(folder.rglob("*")) if path.is_file()
            for what, needle in needles.items() if needle in path.read_bytes()]


def assert_portable(training_config: dict) -> None:
    for dotted, (spec, default) in place_keys().items():
        value = value_at(training_config, dotted)
        assert value in (None, default) or (spec.travels != "null" and NAME.fullmatch(value)), (dotted, value)


def places_of_this_machine(run: Path, tmp_path: Path) -> list[str]:
    """A value for every key that names a place, absolute and relative, in the machine's folders."""
    home = Path(os.environ.get("HOME") or tmp_path)
    return [f"data.root={REPO / 'data' / 'flickr8k'}",
            f"data.image_root={home / 'datasets' / 'flickr8k_224' / 'images'}",
            f"data.karpathy_file={tmp_path / 'dataset_flickr8k.json'}",
            f"data.train_shards={tmp_path / 'shards'}/{{0..3}}.tar",
            f"data.val_shards=pipe:cat {home}/shards/val.tar", "data.test_shards=../shared/shards/test.tar",
            f"data.feature_store={run / 'features'}", f"train.out_dir={run}",
            f"train.init={run.parent / 'xe' / 'best.pt'}"]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as training leaves it: a tiny model whose config names the writing machine's places
    in every place key."""
    run = tmp_path / "runs" / "flickr8k_run"
    config = tiny_config("data.dataset=flickr8k", *places_of_this_machine(run, tmp_path))
    save_checkpoint(run / "best.pt", tiny_model(), config)
    return run


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "photo.png")
    return tmp_path / "photo.png"


def test_every_text_key_is_a_place_or_a_name() -> None:
    """A key added to the config that holds free text is declared a Place (and so left out of what
    a model carries) or is one of the names that are no place."""
    text_keys = {dotted for dotted, f,
                 _ in leaf_fields() if type(f.metadata.get("spec")) is Text and f.metadata["spec"].pattern is None}
    assert text_keys == {"data.caption_column", "data.image_column"}
    assert set(place_keys()) >= {"data.root", "data.image_root", "data.karpathy_file", "data.train_shards",
                                 "data.feature_store",
                                 "train.out_dir", "train.init"}
    assert all(isinstance(spec, Place) for spec, _ in place_keys().values())


def test_an_export_and_its_onnx_graphs_name_no_place_of_the_machine(run: Path, photo: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    export_model(run, out, image=photo, onnx=True)
    config = json.loads((out / CONFIG).read_text())["training_config"]
    assert_portable(config)
    assert (value_at(config, "data.root"), value_at(config, "train.out_dir"),
            value_at(config, "train.init")) == ("flickr8k", "flickr8k_run", "xe")
    assert value_at(config, "data.val_shards") == "val.tar" and value_at(config, "data.image_root") is None
    assert {p.name for p in (out / "onnx").iterdir()} >= {"encoder.onnx",
                                                          "onnx.json"} and (out / "attention.png").is_file()
    assert leaks(out, this_machine(run, tmp_path)) == []
    # The card's recipe is the same config, and trains again with the reader's places.
    card = (out / CARD).read_text()
    recipe = yaml.safe_load(card.split("```yaml\n")[-1].split("```")[0])
    assert recipe == config and "captioner train recipe.yaml data.root=PATH data.karpathy_file=PATH" in card
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    again = load_config(tmp_path / "recipe.yaml", ["data.root=mine/flickr8k", "train.out_dir=runs/mine"])
    assert again.model == checkpoint_config(run).model and again.data.root == "mine/flickr8k"
    # An exported folder to ONNX alone writes nothing of the machine either.
    export_model(out, tmp_path / "onnx_only", onnx=True)
    assert leaks(tmp_path / "onnx_only", this_machine(run, tmp_path)) == []
    # Nor does the web page's site, of the checkpoint or of its export.
    for source in (run, out):
        site = export_model(source, tmp_path / f"site_{source.name}", web=True)[0].parent
        assert (site / "index.html").is_file() and (site / "model" / "decoder_step.onnx").is_file()
        assert leaks(site, this_machine(run, tmp_path)) == []


def test_push_uploads_nothing_of_the_machine(run: Path, photo: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkpoint (exported on the way) and from an export that still names places (written
    before they were left out): what reaches the Hub is portable, and the export itself is left as it was."""
    uploaded: list[Path] = []

    class RecordingApi:
        def create_repo(self, repo_id: str, private: bool, exist_ok: bool) -> str:
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, repo_id: str, folder_path: str, commit_message: str) -> None:
            uploaded.append(Path(shutil.copytree(folder_path, tmp_path / "hub" / f"{len(uploaded)}")))

    monkeypatch.setattr("huggingface_hub.HfApi", RecordingApi)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_recorded")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    push_model(run, "someone/model", image=photo)
    old = tmp_path / "old_export"
    export_model(run, old, image=photo)
    stored = tiny_config("data.dataset=flickr8k", *places_of_this_machine(run, tmp_path)).to_dict()
    config = json.loads((old / CONFIG).read_text())
    (old / CONFIG).write_text(json.dumps({**config, "training_config": stored}))  # as an older version wrote it
    card = (old / CARD).read_text()
    (old / CARD).write_text(card.split("```yaml\n")[0] + "```yaml\n"
                            + yaml.safe_dump(stored, sort_keys=False) + "```\n")
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    push_model(old, "someone/model")
    assert len(uploaded) == 2 and {p.name: p.read_bytes() for p in old.iterdir()} == before
    for folder in uploaded:
        assert leaks(folder, this_machine(run, tmp_path)) == []
        assert_portable(json.loads((folder / CONFIG).read_text())["training_config"])
        assert Captioner.from_pretrained(folder, device="cpu").vocab
    assert not make_portable(uploaded[1], write=False)  # nothing left to leave out


def test_a_packaged_model_names_no_place_of_the_machine(photo: Path, tmp_path: Path) -> None:
    from captioner.apps.packaged_model import package_model

    run = tmp_path / "runs" / "flickr8k_lite"
    config = tiny_config(*LITE, "data.dataset=flickr8k", *places_of_this_machine(run, tmp_path))
    save_checkpoint(run / "best.pt", Captioner.from_config(config, tiny_vocab()).eval(), config)
    folder = package_model(run, "tiny", into=tmp_path / "packaged", images=[photo]).folder
    assert_portable(json.loads((folder / CONFIG).read_text())["training_config"])
    assert leaks(folder, this_machine(run, tmp_path)) == []
    # checksums hold
    assert "## Recipe" in (folder / CARD).read_text() and Captioner.from_pretrained(folder, device="cpu").vocab


def packaged_folder() -> Path:
    from captioner.models.model_paths import packaged_models

    found = packaged_models()
    assert len(found) == 1, found  # the checkout ships one
    return found[0]


def test_the_packaged_model_carries_names_only_and_reads_its_settings_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The model in captioner/pretrained/: its config and card name no folder of the machine that
    trained it, its files match their checksums, and the demo's examples and evaluate read its
    settings without a warning about them (a stranger's model that names paths still has one)."""
    from captioner.apps.demo.cards import model_examples
    from captioner.core.files import sha256_of

    folder = packaged_folder()
    config = json.loads((folder / CONFIG).read_text())
    assert_portable(config["training_config"])
    card = (folder / CARD).read_text()
    assert "../" not in card and "shared/data" not in card and "runs/" not in card.split("## Recipe")[1]
    for name, recorded in config["files"].items():
        assert sha256_of(folder / name) == recorded["sha256"], name
    assert not make_portable(folder, write=False)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert model_settings(folder).set_aside == {}
        assert model_examples(folder) == []  # its Flickr8k is not here: no examples, and nothing said
    assert [r.getMessage() for r in caplog.records] == []


def test_a_place_with_no_name_becomes_unnamed_where_a_value_is_needed() -> None:
    from captioner.core.portable_config import portable_config

    stored = load_config(None, ["data.dataset=karpathy", "data.karpathy_file=x.json"]).to_dict()
    # cache: a key an older version wrote
    stored["data"] |= {"karpathy_file": "~", "root": "/", "cache": "/home/someone/cache"}
    stored["train"]["init"] = ".."
    portable = portable_config(stored)
    assert (portable["data"]["root"], portable["data"]["karpathy_file"],
            portable["train"]["init"]) == (UNNAMED, UNNAMED, UNNAMED)
    assert portable["data"]["cache"] == "cache" and stored["data"]["root"] == "/"


def test_a_name_keeps_its_spaces_a_command_its_pattern_and_a_default_stays() -> None:
    """A folder named with a space is one name ('my photos', not 'photos'); a shard command carries
    the pattern it reads; a key at its own default (data/shapes, where the project puts the shapes
    world) names nothing of the maker's and stays, so evaluating a shapes export reads it there."""
    from captioner.core.portable_config import portable_config

    stored = load_config(None, ["data.dataset=imagefolder", "data.root=/home/someone/my photos",
                                "data.val_shards=pipe:cat '/home/someone/shards/val {0..3}.tar'"]).to_dict()
    portable = portable_config(stored)
    assert portable["data"]["root"] == "my photos" and portable["data"]["val_shards"] == "val {0..3}.tar"
    assert portable_config(load_config(None, []).to_dict())["data"]["root"] == "data/shapes"


def test_an_older_exports_traced_graph_is_stripped_on_its_way_to_the_hub(
    run: Path, photo: Path, tmp_path: Path
) -> None:
    """An ONNX graph that still holds the dynamo exporter's stack traces (from an export written
    before they were dropped): make_portable, as push runs it on a copy, drops them and the
    checksum in onnx.json follows, so the bundle still verifies."""
    onnx = pytest.importorskip("onnx")
    from captioner.core.files import sha256_of

    folder = tmp_path / "old_export"
    export_model(run, folder, image=photo)
    node = onnx.helper.make_node("Identity", ["images"], ["feats"])
    trace = node.metadata_props.add()
    trace.key = "pkg.torch.onnx.stack_trace"
    trace.value = f'File "{REPO}/captioner/models/onnx_export.py", line 57, in forward'
    images, feats = (onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1])
                     for name in ("images", "feats"))
    graph = onnx.helper.make_graph([node], "encoder", [images], [feats])
    (folder / "onnx").mkdir()
    onnx.save(onnx.helper.make_model(graph), str(folder / "onnx" / "encoder.onnx"))
    digest = sha256_of(folder / "onnx" / "encoder.onnx")
    manifest = {"files": {"encoder": {"path": "encoder.onnx", "sha256": digest}}}
    (folder / "onnx" / "onnx.json").write_text(json.dumps(manifest))
    assert make_portable(folder)
    assert leaks(folder, this_machine(run, tmp_path)) == []
    assert b"stack_trace" not in (folder / "onnx" / "encoder.onnx").read_bytes()
    recorded = json.loads((folder / "onnx" / "onnx.json").read_text())["files"]["encoder"]["sha256"]
    assert recorded == sha256_of(folder / "onnx" / "encoder.onnx") and not make_portable(folder, write=False)
