"""Your own data, checked on real photos: the same Flickr8k photographs and captions laid out as a
user's image folder (metadata.jsonl) and as a Parquet dataset with the photos inside it give the
Flickr8k loader's captions, split by split, and train the shipped Flickr8k config for an epoch to
the same vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from helpers import REPO, require_module
from test_flickr8k import flickr8k_224, subset  # noqa: F401 - the fixture is used by name

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.data.datasets import load_split
from captioner.data.flickr8k import TOKEN_FILE, read_token_file
from captioner.models.checkpoint import load_captioner
from captioner.text.vocab import Vocabulary

CONFIG = REPO / "configs" / "flickr8k_lstm_lite0.yaml"
OWN = REPO / "configs" / "imagefolder_lstm_lite0.yaml"  # the shipped config for a user's own photos
FOLDERS = {"train": "train", "val": "validation", "test": "test"}  # Hugging Face's split names
TINY = ["data.batch_size=4", "data.min_word_count=1", "model.decoder.embed_dim=16", "model.decoder.hidden_dim=24",
        "model.decoder.attention_dim=12", "train.epochs=1", "train.warmup_steps=1", "decode.max_length=12"]


def as_image_folder(flickr8k: Path, chosen: dict[str, list[str]], folder: Path) -> None:
    """train/, validation/, test/: the photos and a metadata.jsonl of file_name and text (five captions)."""
    captions = read_token_file(flickr8k / TOKEN_FILE)
    for split, names in chosen.items():
        target = folder / FOLDERS[split]
        target.mkdir(parents=True)
        for name in names:
            shutil.copy(flickr8k / "Flicker8k_Dataset" / name, target / name)
        rows = [json.dumps({"file_name": name, "text": captions[name]}) for name in names]
        (target / "metadata.jsonl").write_text("\n".join(rows) + "\n")


def as_parquet(flickr8k: Path, chosen: dict[str, list[str]], folder: Path) -> None:
    """data/<split>-00000-of-00001.parquet with the JPEG bytes in an Image column, as the Hub stores datasets."""
    from datasets import Dataset, Features, Image, List, Value

    captions = read_token_file(flickr8k / TOKEN_FILE)
    features = Features({"image": Image(), "text": List(Value("string"))})
    (folder / "data").mkdir(parents=True)
    for split, names in chosen.items():
        images = [{"bytes": (flickr8k / "Flicker8k_Dataset" / n).read_bytes(), "path": None} for n in names]
        table = Dataset.from_dict({"image": images, "text": [captions[n] for n in names]}, features=features)
        table.to_parquet(str(folder / "data" / f"{FOLDERS[split]}-00000-of-00001.parquet"))


def test_an_image_folder_and_a_parquet_dataset_give_flickr8ks_captions_and_train(  # noqa: F811
        flickr8k_224: tuple[Path, Path], tmp_path: Path) -> None:
    require_module("datasets", "the datasets package is not installed (pip install 'captioner[data]')")
    torch.set_num_threads(1)
    flickr8k = tmp_path / "flickr8k"
    chosen = subset(*flickr8k_224, flickr8k, {"train": 8, "val": 2, "test": 2})
    as_image_folder(flickr8k, chosen, tmp_path / "folder")
    as_parquet(flickr8k, chosen, tmp_path / "parquet")
    layouts = {
        "flickr8k": [str(CONFIG), f"data.root={flickr8k}"],
        "imagefolder": [str(OWN), f"data.root={tmp_path / 'folder'}"],
        "hf": [str(OWN), "data.dataset=hf", f"data.root={tmp_path / 'parquet'}"],
    }
    captions = {
        layout: {split: [r.captions for r in load_split(load_config(config, overrides).data, split)]
                 for split in FOLDERS}
        for layout, (config, *overrides) in layouts.items()
    }
    assert captions["imagefolder"] == captions["flickr8k"] and captions["hf"] == captions["flickr8k"]
    assert [len(c) for c in captions["hf"]["train"]] == [5] * 8

    expected = Vocabulary.build((c for caps in captions["flickr8k"]["train"] for c in caps), 1).words
    for layout in ("imagefolder", "hf"):
        out = tmp_path / f"run_{layout}"
        assert main(["train", *layouts[layout], *TINY, f"train.out_dir={out}"]) == 0
        assert load_captioner(out / "best.pt").vocab.words == expected, layout
        assert (out / "features" / "train.npy").is_file()  # the frozen Lite0 store, encoded from the layout's images
        assert not (out / "splits.json").exists()  # the splits were the dataset's own: nothing drawn
