"""A user's own photographs and captions: an image folder in Hugging Face's `imagefolder` layout
(metadata.jsonl or metadata.csv) and a Hugging Face dataset on disk (save_to_disk or Parquet).
The loaders on tiny generated folders here; tests/test_own_data_flickr8k.py trains from both on
real photos."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from helpers import fifo_with_a_writer, require_module
import warm_start
from PIL import Image

from captioner.core.config import load_config
from captioner.core.errors import ConfigError, DatasetError, ImageLoadError
from captioner.data.batching import load_record_image
from captioner.data.datasets import load_split, seeded_split_record
from captioner.data.imagefolder import seeded_split

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255), "black": (0, 0, 0)}


def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), COLOURS[colour]).save(buffer, "PNG")
    return buffer.getvalue()


def write_folder(folder: Path, rows: list[dict], metadata: str = "metadata.jsonl") -> Path:
    """Images named by the rows' file_name (coloured as the name's first word), and the metadata file."""
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        image = folder / row["file_name"]
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(png(Path(row["file_name"]).stem.split("_")[0]))
    if metadata.endswith(".jsonl"):
        (folder / metadata).write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        import csv

        with (folder / metadata).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return folder


def data(root: Path, *overrides: str):
    return load_config(None, ["data.dataset=imagefolder", f"data.root={root}", *overrides]).data


def test_captions_gather_from_lists_and_repeated_rows(tmp_path: Path) -> None:
    rows = [
        {"file_name": "red_1.png", "text": ["a red square", "red"]},
        {"file_name": "green_1.png", "text": "a green square"},
        {"file_name": "red_1.png", "text": "something red"},  # a repeated row adds its caption
    ]
    write_folder(tmp_path, rows)
    config = data(tmp_path, "data.val_fraction=0", "data.test_fraction=0")
    records = load_split(config, "train")
    assert {r.path.name: r.captions for r in records} == {
        "red_1.png": ("a red square", "red", "something red"), "green_1.png": ("a green square",)}
    assert [r.image_id for r in records] == [0, 1]  # metadata order
    assert load_record_image(records[0]).getpixel((0, 0)) == (255, 0, 0)


def test_the_seeded_split_is_disjoint_complete_repeatable_and_recorded(tmp_path: Path) -> None:
    names = [f"{c}_{i}.png" for c in COLOURS for i in range(8)]  # 40 images
    write_folder(tmp_path, [{"file_name": n, "text": f"a {n.split('_')[0]} one"} for n in names])
    config = data(tmp_path, "data.val_fraction=0.1", "data.test_fraction=0.2", "data.split_seed=3")
    splits = {s: [r.path.name for r in load_split(config, s)] for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 28, "val": 4, "test": 8}
    assert sorted(sum(splits.values(), [])) == sorted(names)
    assert {s: [r.path.name for r in load_split(config, s)] for s in splits} == splits  # the same draw again
    other = data(tmp_path, "data.val_fraction=0.1", "data.test_fraction=0.2", "data.split_seed=4")
    assert [r.path.name for r in load_split(other, "test")] != splits["test"]
    recorded = seeded_split_record(config)
    assert recorded is not None and {s: recorded[s] for s in splits} == splits and recorded["split_seed"] == 3


def test_a_tiny_folder_still_validates_and_the_fractions_must_leave_training_images(tmp_path: Path) -> None:
    assert {k: len(v) for k, v in seeded_split(3, 0.05, 0.05, 0, "x").items()} == {"train": 1, "val": 1, "test": 1}
    with pytest.raises(DatasetError, match="leave none for training"):
        seeded_split(4, 0.49, 0.49, 0, "x")  # two and two: rounding can empty the training split
    with pytest.raises(ConfigError, match="data.val_fraction.*data.test_fraction.*below 1"):
        data(tmp_path, "data.val_fraction=0.6", "data.test_fraction=0.4")


def test_split_folders_give_the_splits_and_ids_run_on_across_them(tmp_path: Path) -> None:
    write_folder(tmp_path / "train",
                 [{"file_name": "red_1.png", "text": "red"}, {"file_name": "blue_1.png", "text": "blue"}])
    write_folder(tmp_path / "validation", [{"file_name": "green_1.png", "text": "green"}], "metadata.csv")
    write_folder(tmp_path / "test", [{"file_name": "white_1.png", "text": "white"}])
    config = data(tmp_path)
    got = {s: [(r.image_id, r.path.relative_to(tmp_path).as_posix()) for r in load_split(config, s)]
           for s in ("train", "val", "test")}
    assert got == {"train": [(0, "train/red_1.png"), (1, "train/blue_1.png")], "val": [(2, "validation/green_1.png")],
                   "test": [(3, "test/white_1.png")]}
    assert seeded_split_record(config) is None  # nothing drawn, nothing to record


def test_one_root_file_whose_names_start_with_split_folders(tmp_path: Path) -> None:
    rows = [{"file_name": "train/red_1.png", "caption": "red"}, {"file_name": "dev/blue_1.png", "caption": "blue"},
            {"file_name": "test/black_1.png", "caption": "black"}]
    write_folder(tmp_path, rows, "metadata.csv")
    config = data(tmp_path, "data.caption_column=caption")
    assert [r.path.name for r in load_split(config, "val")] == ["blue_1.png"]
    assert [r.captions for r in load_split(config, "test")] == [("black",)]


def test_a_missing_split_folder_is_one_line(tmp_path: Path) -> None:
    write_folder(tmp_path / "train", [{"file_name": "red_1.png", "text": "red"}])
    write_folder(tmp_path / "test", [{"file_name": "blue_1.png", "text": "blue"}])
    with pytest.raises(DatasetError,
                       match=r"no val split \(found: train, test\); add a validation/val/valid/dev folder"):
        load_split(data(tmp_path), "val")


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"file_name": "red_1.png", "caption": "red"}\n', (r"metadata.jsonl: no caption column 'text' \(columns: "
                                                            r"caption, file_name\); name yours with "
                                                            r"data.caption_column")),
        ('{"file_name": "red_1.png", "text": "red"}\n{"file_name": "red_1.png", "text": "red"\n',
         r"metadata.jsonl:2: not valid JSON"),
        ('["red_1.png", "red"]\n', r"metadata.jsonl:1: expected a JSON object per line, got list"),
        ('{"text": "red"}\n', r"metadata.jsonl:1: no 'file_name'"),
        ('{"file_name": "../outside.png", "text": "red"}\n',
         r"metadata.jsonl:1: file_name '../outside.png' leaves the image folder"),
        ('{"file_name": "/etc/passwd", "text": "red"}\n',
         r"metadata.jsonl:1: file_name '/etc/passwd' leaves the image folder"),
        ('{"file_name": "red_1.png", "text": 7}\n',
         r"metadata.jsonl:1: 'text' holds int 7, not a caption or a list of captions"),
        ("", r"metadata.jsonl: no rows"),
        ('{"file_name": "red_1.png", "text": "red", "n": ' + "[" * 5000 + "]" * 5000 + "}\n",
         r"metadata.jsonl:1: not valid JSON here: lists or objects nested hundreds of levels deep"),
        ('{"file_name": "red_1.png", "text": "red", "n": ' + "9" * 5000 + "}\n",
         r"metadata.jsonl:1: not valid JSON here: a number of thousands of digits"),
    ],
    ids=["no caption column", "bad json", "not an object", "no file name", "parent folder", "absolute path",
         "number", "empty", "nested too deep", "number too long"],
)
def test_a_malformed_metadata_file_is_one_line_naming_file_and_line(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "red_1.png").write_bytes(png("red"))
    (tmp_path / "metadata.jsonl").write_text(content)
    with pytest.raises(DatasetError, match=problem) as raised:
        load_split(data(tmp_path, "data.val_fraction=0", "data.test_fraction=0"), "train")
    assert "\n" not in str(raised.value)


def test_a_csv_saved_with_a_byte_order_mark_has_its_file_name_column(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" begins with a byte order mark, which was part of the first column's name: the header
    had no 'file_name' column, it said, while showing one."""
    write_folder(tmp_path, [{"file_name": "train/red_1.png", "text": "red"}], "metadata.csv")
    (tmp_path / "metadata.csv").write_text("\ufeff" + (tmp_path / "metadata.csv").read_text(), encoding="utf-8")
    assert [r.captions for r in load_split(data(tmp_path), "train")] == [("red",)]


def test_a_csv_without_file_name_and_a_folder_without_metadata(tmp_path: Path) -> None:
    (tmp_path / "metadata.csv").write_text("image,text\nred_1.png,red\n")
    with pytest.raises(DatasetError,
                       match=r"metadata.csv:1: the header has no 'file_name' column \(columns: image, text\)"):
        load_split(data(tmp_path), "train")
    (tmp_path / "metadata.csv").write_text("file_name,text\nred_1.png,red\nred_1.png," + "x" * 200_000 + "\n")
    with pytest.raises(DatasetError, match=r"metadata.csv:3: not valid CSV \(field larger than field limit"):
        load_split(data(tmp_path), "train")  # csv.Error's traceback
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no metadata.jsonl or metadata.csv"):
        load_split(data(empty), "train")
    with pytest.raises(DatasetError, match="image folder not found"):
        load_split(data(tmp_path / "nowhere"), "train")


def test_rows_without_a_caption_and_missing_images_are_counted_and_skipped(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    rows = [{"file_name": "red_1.png", "text": "red"}, {"file_name": "blue_1.png", "text": ""},
            {"file_name": "green_1.png", "text": None}, {"file_name": "white_1.png", "text": "white"}]
    write_folder(tmp_path, rows)
    (tmp_path / "white_1.png").unlink()
    whole = ["data.val_fraction=0", "data.test_fraction=0"]
    with caplog.at_level(logging.WARNING):
        records = load_split(data(tmp_path, *whole, "data.max_missing_fraction=1"), "train")
    assert [r.path.name for r in records] == ["red_1.png"]
    assert "2 rows have no caption" in caplog.text and "1 of 2 images are missing on disk" in caplog.text
    with pytest.raises(DatasetError, match="strict mode is on"):
        load_split(data(tmp_path, *whole, "data.strict=true"), "train")
    # half the listed images gone is a different dataset: by default the load stops and says how to go on
    with pytest.raises(DatasetError, match=r"1 of 2 images are missing on disk .*: 50.0%, more than "
                                           r"data.max_missing_fraction \(0.05\) "
                       r"allows; fetch them or point data.image_root at them, or set data.max_missing_fraction=1 to "
                       r"use the 1 there$"):
        load_split(data(tmp_path, *whole), "train")


# ---- a Hugging Face dataset on disk ---------------------------------------------------------


def hf_dataset(rows: list[tuple[str, object]], image_column: str = "image", caption_column: str = "text"):
    require_module("datasets", "the datasets package is not installed (pip install 'captioner[data]')")
    from datasets import Dataset, Features, Image as ImageFeature, List, Value

    caption_type = List(Value("string")) if isinstance(rows[0][1], list) else Value("string")
    features = Features({image_column: ImageFeature(), caption_column: caption_type})
    return Dataset.from_dict(
        {image_column: [{"bytes": png(colour), "path": None} for colour, _ in rows],
         caption_column: [c for _, c in rows]},
        features=features,
    )


def hf_data(root: Path, *overrides: str):
    return load_config(None, ["data.dataset=hf", f"data.root={root}", *overrides]).data


def test_a_saved_dataset_dict_with_embedded_images(tmp_path: Path) -> None:
    from datasets import DatasetDict

    train = hf_dataset([("red", ["a red square", "red"]), ("blue", ["blue"])])
    DatasetDict({"train": train, "validation": hf_dataset([("green", ["green"])]),
                 "test": hf_dataset([("white", ["white"])])}).save_to_disk(tmp_path / "saved")
    config = hf_data(tmp_path / "saved")
    splits = {s: load_split(config, s) for s in ("train", "val", "test")}
    assert [(r.image_id, r.captions) for r in splits["train"]] == [(0, ("a red square", "red")), (1, ("blue",))]
    assert [r.image_id for r in splits["val"]] == [2] and [r.image_id for r in splits["test"]] == [3]
    assert load_record_image(splits["train"][1]).getpixel((3, 3)) == (0, 0, 255)  # the bytes stored in the Arrow file
    assert load_record_image(splits["val"][0]).getpixel((3, 3)) == (0, 255, 0)
    assert seeded_split_record(config) is None


def test_parquet_files_and_a_single_split_drawn_with_the_seed(tmp_path: Path) -> None:
    rows = [(colour, f"a {colour} one") for colour in COLOURS for _ in range(4)]  # 20 rows, one caption each
    (tmp_path / "data").mkdir()
    hf_dataset(rows, "picture", "caption").to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    config = hf_data(tmp_path, "data.image_column=picture", "data.caption_column=caption", "data.val_fraction=0.25",
                     "data.test_fraction=0.25")
    splits = {s: load_split(config, s) for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 10, "val": 5, "test": 5}
    assert sorted(r.row for v in splits.values() for r in v) == list(range(20))
    for record in splits["test"]:
        colour = record.captions[0].split()[1]
        assert load_record_image(record).getpixel((0, 0)) == COLOURS[colour]
    recorded = seeded_split_record(config)
    assert recorded is not None and recorded["test"] == [r.row for r in splits["test"]]


def test_hf_problems_are_one_line(tmp_path: Path) -> None:
    from datasets import DatasetDict

    DatasetDict({"train": hf_dataset([("red", "red")]),
                 "test": hf_dataset([("blue", "blue")])}).save_to_disk(tmp_path / "saved")
    with pytest.raises(
            DatasetError,
            match=r"no val split \(the dataset has: train, test\); name one validation or val or valid or dev"):
        load_split(hf_data(tmp_path / "saved"), "val")
    with pytest.raises(DatasetError,
                       match=r"no column 'caption' \(columns: image, text\); name yours with data.caption_column"):
        load_split(hf_data(tmp_path / "saved", "data.caption_column=caption"), "train")
    with pytest.raises(DatasetError, match=r"no column 'photo' .*data.image_column"):
        load_split(hf_data(tmp_path / "saved", "data.image_column=photo"), "test")
    from datasets import Dataset, Features, Image as ImageFeature, Value

    labelled = Dataset.from_dict({"image": [{"bytes": png("red"), "path": None}], "text": ["red"], "label": [3]},
                                 features=Features(
                                     {"image": ImageFeature(), "text": Value("string"), "label": Value("int64")}))
    DatasetDict({"train": labelled}).save_to_disk(tmp_path / "labelled")
    with pytest.raises(DatasetError, match=(r"\(train\): row 0: 'label' holds int 3, not a caption or a list of "
                                            r"captions; name the caption column")):
        # was: every row silently "without a caption"
        load_split(hf_data(tmp_path / "labelled", "data.caption_column=label"), "train")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="not a Hugging Face dataset on disk"):
        load_split(hf_data(tmp_path / "plain"), "train")
    with pytest.raises(DatasetError, match="Hugging Face dataset not found"):
        load_split(hf_data(tmp_path / "nowhere"), "train")


def test_a_damaged_stored_image_names_the_row(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict, Features, Image as ImageFeature, Value

    features = Features({"image": ImageFeature(), "text": Value("string")})
    broken = Dataset.from_dict({"image": [{"bytes": png("red")[:40], "path": None}], "text": ["red"]},
                               features=features)
    DatasetDict({"train": broken, "validation": broken}).save_to_disk(tmp_path / "saved")
    record = load_split(hf_data(tmp_path / "saved"), "val")[0]
    with pytest.raises(ImageLoadError, match=r"saved/validation/0"):
        load_record_image(record)


def test_a_stored_image_path_or_a_shards_image_that_is_a_named_pipe_is_refused_unopened(tmp_path: Path) -> None:
    """A saved dataset whose image column names a file in its folder, and an image written into shards: a pipe in
    either place was opened, and its reader waited forever for a writer."""
    from datasets import Dataset, DatasetDict

    from captioner.data.records import ImageRecord
    from captioner.data.shards import image_bytes

    named = Dataset.from_dict({"image": ["pictures/red.png"], "text": ["red"]})  # a column of paths
    DatasetDict({"train": named, "validation": named}).save_to_disk(tmp_path / "saved")
    (tmp_path / "saved" / "pictures").mkdir()
    record = load_split(hf_data(tmp_path / "saved"), "val")[0]
    with fifo_with_a_writer(tmp_path / "saved" / "pictures" / "red.png"), \
            pytest.raises(ImageLoadError, match=r"red.png: image is not a regular file \(a pipe"):
        load_record_image(record)
    with fifo_with_a_writer(tmp_path / "blue.png") as fifo, \
            pytest.raises(ImageLoadError, match=r"blue.png: image is not a regular file \(a pipe"):
        image_bytes(ImageRecord(image_id=1, path=fifo, captions=("blue",)))


# ---- the command line ---------------------------------------------------------------------


def test_data_stats_describes_an_image_folder_with_overrides_after_it(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from captioner.apps.cli import main

    write_folder(tmp_path, [{"file_name": f"{c}_1.png", "caption": [f"a {c} square", c]} for c in COLOURS])
    assert main(["data", "stats", "--imagefolder", str(tmp_path), "data.caption_column=caption", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["images"], stats["captions"], stats["images on disk"]) == (5, 10, 5)
    assert main(["data", "stats", "--imagefolder", str(tmp_path)]) == 2  # the default column, text, is not there
    assert "no caption column 'text' (columns: caption, file_name)" in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    """`captioner data stats ... | head -1`: the pipe closes before the output is written."""
    import subprocess
    import sys

    from helpers import subprocess_env

    write_folder(tmp_path, [{"file_name": "red_1.png", "text": "red"}])
    command = [sys.executable, "-m", "captioner", "data", "stats", "--imagefolder", str(tmp_path), "--json"]
    process = warm_start.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    process.stdout.close()  # the reader is gone before the command prints anything
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_training_on_a_folder_without_splits_records_the_drawn_split(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from captioner.apps.cli import main
    from helpers import REPO, TINY_MODEL

    torch.set_num_threads(1)
    folder = write_folder(tmp_path / "photos",
                          [{"file_name": f"{c}_{i}.png", "text": f"a {c} square"} for c in COLOURS for i in range(4)])
    base = [str(REPO / "configs" / "shapes_lstm.yaml"), "data.dataset=imagefolder", f"data.root={folder}", *TINY_MODEL,
            "data.batch_size=4", "train.epochs=1", "train.warmup_steps=1", "data.val_fraction=0.1",
            "data.test_fraction=0.1"]
    assert main(["train", *base, f"train.out_dir={tmp_path / 'run'}"]) == 0
    recorded = json.loads((tmp_path / "run" / "splits.json").read_text())
    config = data(folder, "data.val_fraction=0.1", "data.test_fraction=0.1")
    assert {s: recorded[s] for s in ("train", "val", "test")} == {s: [r.path.name for r in load_split(config, s)]
                                                                  for s in ("train", "val", "test")}
    assert (len(recorded["train"]), len(recorded["val"]), len(recorded["test"])) == (16, 2, 2)

    assert main(["train", *base, "data.val_fraction=0", f"train.out_dir={tmp_path / 'no_val'}"]) == 2
    assert ("the val split is empty, and training picks best.pt on it: set data.val_fraction above "
            "0") in capsys.readouterr().err

    # the photos move (a shared checkpoint, another machine): evaluate is told where they are now
    moved = folder.rename(tmp_path / "elsewhere")
    assert main(["evaluate", str(tmp_path / "run"), "--fast", "--split", "test", "--json"]) == 2
    assert f"{folder}: image folder not found" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "run"), f"data.root={moved}", "--fast", "--split", "test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 2
    assert main(["evaluate", str(tmp_path / "run"), "train.epochs=3", "--fast"]) == 2
    assert "override 'train.epochs=3': only data.* keys can be set here" in capsys.readouterr().err


# ---- WebDataset shards ----------------------------------------------------------------------


def test_shards_hold_every_image_and_caption_in_img2datasets_layout(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    require_module("webdataset", "the webdataset package is not installed (pip install 'captioner[data]')")
    import webdataset

    from captioner.apps.cli import main

    rows = [{"file_name": f"{c}_{i}.png", "text": [f"a {c} square", f"{c} {i}"]} for c in COLOURS for i in range(5)]
    folder = write_folder(tmp_path / "photos", rows)
    (folder / "black_4.png").write_bytes(b"not an image at all")  # left out, counted
    out = tmp_path / "shards"
    argv = ["data", "shards", "--imagefolder", str(folder), "--out", str(out), "--max-count", "4", "--splits",
            "train,test",
            "data.val_fraction=0", "data.test_fraction=0.2", "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "train: 19 samples in 5 shards" in printed and "1 unreadable images left out" in printed

    config = data(folder, "data.val_fraction=0", "data.test_fraction=0.2")
    for split in ("train", "test"):
        index = json.loads((out / split / "shards.json").read_text())
        records = {f"{r.image_id:09d}": r for r in load_split(config, split) if r.path.name != "black_4.png"}
        assert [s["nsamples"] for s in index["shardlist"]] == [4] * (len(records) // 4) + ([len(records) % 4]
                                                                                           if len(records) % 4 else [])
        pattern = str(out / split / f"{{00000..{len(index['shardlist']) - 1:05d}}}.tar")
        # the library's own reader, as a user's would
        samples = list(webdataset.WebDataset(pattern, shardshuffle=False))
        assert sorted(s["__key__"] for s in samples) == sorted(records)
        for item in samples:
            record = records[item["__key__"]]
            assert item["png"] == record.path.read_bytes()  # the image's own bytes and format
            assert item["txt"].decode() == record.captions[0]
            assert json.loads(item["json"])["captions"] == list(record.captions)

    assert main(argv) == 2  # shards already there are never mixed with new ones
    assert "already holds 5 shards; remove them or choose another --out" in capsys.readouterr().err


def test_a_shapes_root_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """data.root a file, a device, or below a file: one DatasetError line naming data.root before any image is
    drawn (before, a FileExistsError or NotADirectoryError traceback from the generator)."""
    from captioner.data import datasets

    monkeypatch.setattr(datasets, "generate_shapes", lambda *a, **k: pytest.fail("the world was generated"))
    (tmp_path / "afile").write_text("hi")
    shapes = ["data.dataset=shapes", "data.shapes_num_train=2", "data.shapes_num_val=1", "data.shapes_num_test=1"]
    for root, said in [(tmp_path / "afile", "a file, not a folder to write into"), (Path("/dev/null"), "a file, not"),
                       (tmp_path / "afile" / "sub", r"cannot create the folder \(Not a directory\)")]:
        with pytest.raises(DatasetError, match=rf"^data\.root={re.escape(str(root))}: {said}"):
            datasets.ensure_shapes(load_config(None, [*shapes, f"data.root={root}"]).data)
    assert (tmp_path / "afile").read_text() == "hi"


def test_the_shapes_world_is_never_generated_into_a_folder_of_other_files(tmp_path: Path) -> None:
    from captioner.data.datasets import ensure_shapes

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "holiday.jpg").write_bytes(png("red"))
    shapes = ["data.dataset=shapes", "data.shapes_num_train=2", "data.shapes_num_val=1", "data.shapes_num_test=1"]
    config = load_config(None, [*shapes, f"data.root={tmp_path / 'mine'}"]).data
    with pytest.raises(
            DatasetError,
            match="no shapes caption files .* the folder holds other files: point data.root at a new or empty folder, "
                  "or at a world made by captioner data shapes --out DIR$"):  # which refuses this folder too
        ensure_shapes(config)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["holiday.jpg"]  # nothing written

    fresh = load_config(None, [*shapes, f"data.root={tmp_path / 'new'}"]).data
    ensure_shapes(fresh)  # a new folder is the generator's
    (tmp_path / "new" / "captions_test.json").unlink()  # cut short: the generator's own folder is finished again
    ensure_shapes(fresh)
    assert len(load_split(fresh, "test")) == 1
