"""The synthetic shapes world: COCO format, masks that cover the drawn objects, determinism."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from captioner.apps.cli import main
from captioner.data.shapes import COLOURS, SHAPES, finished_world, generate_shapes
from captioner.text.vocab import tokenize
from helpers import REPO, held_elsewhere, released_once_said


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shapes")
    generate_shapes(out, num_train=40, num_val=10, num_test=10, image_size=128, seed=3, image_format="png",
                    progress=False)
    return out


def load_coco(path: Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


def test_masks_cover_the_drawn_objects(shapes_dir: Path) -> None:
    """Render each instance mask with pycocotools and compare it with the pixels of the object's colour."""
    coco = load_coco(shapes_dir / "instances_train.json")
    ious = []
    for image_id in coco.getImgIds():
        info = coco.imgs[image_id]
        pixels = np.asarray(Image.open(shapes_dir / "train" / info["file_name"]), dtype=np.float32)  # (H, W, 3)
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id)):
            mask = coco.annToMask(ann).astype(bool)
            distance = np.linalg.norm(pixels - np.array(COLOURS[ann["colour"]]), axis=-1)  # (H, W)
            coloured = distance < 60  # object colour +- jitter and noise; the grey background is far away
            # Only pixels near this object: another object of the same colour may be elsewhere.
            x, y, w, h = ann["bbox"]
            window = np.zeros_like(mask)
            window[max(0, int(y) - 2) : int(y + h) + 3, max(0, int(x) - 2) : int(x + w) + 3] = True
            coloured &= window
            ious.append((mask & coloured).sum() / (mask | coloured).sum())
            assert abs(mask.sum() - ann["area"]) / ann["area"] < 0.15
    assert len(ious) >= 40
    assert min(ious) > 0.75 and float(np.mean(ious)) > 0.9


def test_captions_name_every_object_and_relations(shapes_dir: Path) -> None:
    captions = load_coco(shapes_dir / "captions_val.json")
    instances = load_coco(shapes_dir / "instances_val.json")
    names = {c["id"]: c["name"] for c in instances.loadCats(instances.getCatIds())}
    assert sorted(names.values()) == sorted(SHAPES)
    for image_id in captions.getImgIds():
        anns = captions.loadAnns(captions.getAnnIds(imgIds=image_id))
        objects = instances.loadAnns(instances.getAnnIds(imgIds=image_id))
        assert len(anns) == 5 and len({a["caption"] for a in anns}) == 5
        assert 1 <= len(objects) <= 3
        assert len({(o["colour"], o["category_id"]) for o in objects}) == len(objects)
        for ann in anns:
            words = tokenize(ann["caption"])
            for obj in objects:
                assert obj["colour"] in words and names[obj["category_id"]] in words, ann["caption"]
            if len(objects) > 1:
                assert {"left", "right", "above", "below"} & set(words), ann["caption"]


def test_objects_do_not_overlap(shapes_dir: Path) -> None:
    coco = load_coco(shapes_dir / "instances_train.json")
    for image_id in coco.getImgIds():
        masks = [coco.annToMask(a) for a in coco.loadAnns(coco.getAnnIds(imgIds=image_id))]
        if len(masks) > 1:
            assert np.sum(masks, axis=0).max() == 1


def test_deterministic_for_a_seed(tmp_path: Path, shapes_dir: Path) -> None:
    generate_shapes(tmp_path / "again", 40, 10, 10, image_size=128, seed=3, image_format="png", progress=False)
    for name in ("captions_train.json", "instances_test.json"):
        assert (tmp_path / "again" / name).read_bytes() == (shapes_dir / name).read_bytes()
    first = (shapes_dir / "train" / "train_000000.png").read_bytes()
    assert (tmp_path / "again" / "train" / "train_000000.png").read_bytes() == first
    generate_shapes(tmp_path / "other", 40, 0, 0, image_size=128, seed=4, image_format="png", progress=False)
    assert (tmp_path / "other" / "captions_train.json").read_bytes() != (
        shapes_dir / "captions_train.json").read_bytes()


def test_cli_generates_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["data", "shapes", "--out", str(tmp_path), "--num-train", "6", "--num-val", "2", "--num-test", "2",
                 "--image-size", "64", "--seed", "1", "--quiet"])
    assert code == 0
    assert "wrote 10 images" in capsys.readouterr().out
    data = json.loads((tmp_path / "captions_train.json").read_text())
    assert len(data["images"]) == 6 and len(data["annotations"]) == 30
    assert Image.open(tmp_path / "train" / data["images"][0]["file_name"]).size == (64, 64)


@pytest.mark.parametrize(("option", "message"), [
    (["--num-train", "-1"], r"--num-train must be in \[0, 250000\] images \(as data.shapes_num_train's largest\), "
                            r"got -1$"),
    (["--num-train", "10000000"], r"--num-train must be in \[0, 250000\] .*got 10000000$"),  # hours, tens of GB
    (["--num-test", "250001"], r"--num-test must be in \[0, 250000\] images \(as data.shapes_num_test's largest\), "
                               r"got 250001$"),
    (["--image-size", "0"], r"image size must be in \[32, 4096\] pixels, got 0$"),
    (["--image-size", "100000"], r"image size must be in \[32, 4096\] pixels, got 100000$"),  # tens of GB
    (["--image-size", "4096"], r"--num-train 4000, --num-val 250, --num-test 1 \(4,251 images\) at --image-size 4096 "
                               r"pixels a side: a shapes world of 71\.3 billion pixels, about 35\.7 GB of JPEG files, "
                               r"past its largest, 12\.3 billion pixels \(750,000 images at 128\); ask for fewer or "
                               r"smaller images$"),  # each bound alone allows it
    (["--seed", "-1"], r"seed must be in \[0, 4294967296\) \(numpy's seed range, as data.shapes_seed\), got -1$"),
    (["--seed", str(2**32)], r"seed must be in \[0, 4294967296\) .*got 4294967296$"),
])
def test_cli_rejects_bad_arguments_before_making_the_folder(option: list[str], message: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """One line and exit status 2, and no --out folder left behind; the bounds are data.image_size's and
    data.shapes_seed's. Nothing is ever drawn: a refusal comes first."""
    def never(*args: object) -> None:
        raise AssertionError("an image was drawn before the options were checked")

    monkeypatch.setattr("captioner.data.shapes.render", never)
    assert main(["data", "shapes", "--out", str(tmp_path / "world"), "--num-test", "1", *option]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err.strip()), err
    assert not (tmp_path / "world").exists()


def test_cli_writes_into_a_new_or_empty_folder_or_a_world_cut_short_only(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of the user's files is not written beside, a finished world is not written over (its images would
    mix with the new ones), an empty --out is not the current folder; a world cut short is generated again, as
    training does with a world it finds unfinished."""
    tiny = ["--num-train", "1", "--num-val", "0", "--num-test", "1", "--image-size", "32", "--quiet"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["data", "shapes", "--out", str(mine), *tiny]) == 2
    assert "mine: not empty and not a shapes world; give a new or empty folder" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    world = tmp_path / "world"
    assert main(["data", "shapes", "--out", str(world), *tiny]) == 0
    made = {p: p.read_bytes() for p in world.rglob("*") if p.is_file()}
    assert main(["data", "shapes", "--out", str(world), *tiny, "--seed", "7"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "world: already holds a shapes world (captions_train.json, ...); delete it or choose another folder")
    assert {p: p.read_bytes() for p in world.rglob("*") if p.is_file()} == made
    (world / "captions_test.json").unlink()  # cut short
    assert main(["data", "shapes", "--out", str(world), *tiny]) == 0
    assert {p: p.read_bytes() for p in world.rglob("*") if p.is_file()} == made

    monkeypatch.chdir(mine)
    assert main(["data", "shapes", "--out", "", *tiny]) == 2
    assert "data shapes --out: an empty name; give the folder to write into" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def world_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_world_made_again_over_one_cut_short_keeps_no_stray_file(tmp_path: Path) -> None:
    """A world cut short with more images, another seed and format (and a caption file's .tmp left by a kill):
    generated again, the folder holds what a new folder would, byte for byte; no image its captions do not list."""
    world = tmp_path / "world"
    first = ["--num-train", "3", "--num-val", "2", "--num-test", "1", "--image-size", "32", "--format", "png"]
    assert main(["data", "shapes", "--out", str(world), *first, "--seed", "1", "--quiet"]) == 0
    (world / "captions_test.json").unlink()  # cut short
    (world / "instances_val.json.tmp").write_text("{")
    again = ["--num-train", "1", "--num-val", "0", "--num-test", "1", "--image-size", "32", "--seed", "2", "--quiet"]
    assert main(["data", "shapes", "--out", str(world), *again]) == 0
    assert main(["data", "shapes", "--out", str(tmp_path / "fresh"), *again]) == 0
    assert world_files(world) == world_files(tmp_path / "fresh")
    assert sorted(p.name for p in world.glob("*/*")) == ["test_000000.jpg", "train_000000.jpg"]


def test_an_old_caption_file_never_finishes_a_world_cut_short_again(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A world cut short is generated again with another seed and cut short again, in its test split: the first
    world's captions_test.json must not be there to make it look finished, half one world and half the other."""
    from captioner.data import shapes
    from captioner.data.shapes import finished_world

    generate_shapes(tmp_path, 2, 1, 1, image_size=32, seed=1, progress=False)
    (tmp_path / "captions_val.json").unlink()  # cut short
    drawn = []

    def cut_in_the_test_split(objects: list, rng: np.random.Generator, image_size: int) -> Image.Image:
        drawn.append(1)
        if len(drawn) > 3:  # the two train images and the val image drawn
            raise KeyboardInterrupt
        return Image.new("RGB", (image_size, image_size))

    monkeypatch.setattr(shapes, "render", cut_in_the_test_split)
    with pytest.raises(KeyboardInterrupt):
        generate_shapes(tmp_path, 2, 1, 1, image_size=32, seed=2, progress=False)
    assert not finished_world(tmp_path)
    assert not (tmp_path / "captions_test.json").exists() and not (tmp_path / "instances_test.json").exists()


@pytest.mark.parametrize("theirs", ["notes.txt", "train/holiday.jpg", "test/test_1.jpg", "val/val_000001.png/",
                                    "more/", "captions_train.json.bak", "train/.DS_Store/"])
def test_a_world_cut_short_that_holds_another_file_is_refused_and_left_as_it_was(
        theirs: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The folder is the generator's, so a file there it never writes is the user's: one line naming it, and nothing
    removed or written (a new world would lie beside it, or the file be taken for one of its images)."""
    world = tmp_path / "world"
    tiny = ["--num-train", "2", "--num-val", "1", "--num-test", "1", "--image-size", "32", "--quiet"]
    assert main(["data", "shapes", "--out", str(world), *tiny, "--format", "png"]) == 0
    (world / "captions_test.json").unlink()  # cut short
    place = world / theirs
    if theirs.endswith("/"):
        place.mkdir()
    else:
        place.write_text("mine")
    before = world_files(world)
    assert main(["data", "shapes", "--out", str(world), *tiny]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.strip().endswith(
        f"{place}: not a file the shapes generator writes, in the world cut short in {world}; move it away to "
        "generate the world there again, or choose another folder"), err
    assert world_files(world) == before


def test_a_file_browsers_files_are_left_in_place_and_the_world_made_there(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """.DS_Store, Thumbs.db, desktop.ini (what Finder or Explorer drops into a folder it shows) are neither a user's
    files nor the generator's: a world cut short that holds them, or a new folder holding only them, is generated
    there as it would be elsewhere, and they are left as they were, never removed."""
    tiny = ["--num-train", "2", "--num-val", "1", "--num-test", "1", "--image-size", "32", "--quiet"]
    assert main(["data", "shapes", "--out", str(tmp_path / "fresh"), *tiny]) == 0
    world, new = tmp_path / "world", tmp_path / "new"
    assert main(["data", "shapes", "--out", str(world), *tiny, "--num-train", "3", "--seed", "4"]) == 0
    (world / "captions_val.json").unlink()  # cut short
    new.mkdir()
    dropped = {world / ".DS_Store": b"\0\0\0\1Bud1", world / "train" / "Thumbs.db": b"thumbs",
               world / "val" / "desktop.ini": b"[.ShellClassInfo]", world / "test" / "thumbs.db": b"lower case",
               new / ".DS_Store": b"Bud1"}
    for path, content in dropped.items():
        path.write_bytes(content)
    for out in (world, new):
        assert main(["data", "shapes", "--out", str(out), *tiny]) == 0, capsys.readouterr().err
        ours = {name: data for name, data in world_files(out).items() if (out / name) not in dropped}
        assert ours == world_files(tmp_path / "fresh")  # train_000002.jpg, a stray of the first world, removed
    assert all(path.read_bytes() == content for path, content in dropped.items())


def test_training_refuses_a_world_cut_short_beside_a_users_file(tmp_path: Path) -> None:
    """The same rule where training generates the world on first use (data.root)."""
    from captioner.core.config import load_config
    from captioner.core.errors import DatasetError
    from captioner.data.datasets import ensure_shapes

    counts = ["data.shapes_num_train=2", "data.shapes_num_val=1", "data.shapes_num_test=1", "data.image_size=32"]
    config = load_config(None, ["data.dataset=shapes", f"data.root={tmp_path}", *counts]).data
    ensure_shapes(config)
    (tmp_path / "captions_val.json").unlink()  # cut short
    (tmp_path / "train" / "mine.jpg").write_text("mine")
    before = world_files(tmp_path)
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'train' / 'mine.jpg'}: not a file the shapes")):
        ensure_shapes(config)
    assert world_files(tmp_path) == before


@pytest.mark.parametrize("key", ["shapes_num_train", "shapes_num_val", "shapes_num_test"])
def test_a_config_bounds_the_shapes_counts_as_data_shapes_does(key: str) -> None:
    """data.shapes_num_* and `data shapes --num-*` agree on the largest count."""
    from captioner.core.config import load_config
    from captioner.core.errors import ConfigError

    assert getattr(load_config(None, [f"data.{key}=250000"]).data, key) == 250000
    with pytest.raises(ConfigError, match=rf"'data.{key}' must be in \[[01], 250000\]; got 250001$"):
        load_config(None, [f"data.{key}=250001"])


def unreadable_folder(monkeypatch: pytest.MonkeyPatch, folder: Path, searchable: bool) -> None:
    """`folder` fails as mode 000 (`searchable`: 333) makes it fail for anyone but root: it cannot be listed, nor
    (unless searchable) a path in it looked at."""
    listing, looking = Path.iterdir, Path.stat

    def iterdir(self: Path) -> object:
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return listing(self)

    def stat(self: Path, **kwargs: bool) -> object:
        if self.parent == folder and not searchable:
            raise PermissionError(13, "Permission denied", str(self))
        return looking(self, **kwargs)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(Path, "stat", stat)


@pytest.mark.parametrize("broken", ["marker a folder", "split folder unreadable", "world folder unreadable",
                                    "world folder unsearchable", "caption file a folder"])
def test_a_broken_world_cut_short_is_one_line_naming_the_path(broken: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`data shapes` and training's first use (data.root) on a world whose marker is a folder, whose split folder
    or own folder cannot be read, or whose caption file is a folder: one line naming it (before, a traceback), and
    nothing removed."""
    from captioner.core.config import load_config
    from captioner.core.errors import CaptionerError
    from captioner.data.datasets import ensure_shapes

    world = tmp_path / "world"
    tiny = ["--num-train", "2", "--num-val", "1", "--num-test", "1", "--image-size", "32", "--quiet"]
    assert main(["data", "shapes", "--out", str(world), *tiny]) == 0
    (world / "captions_test.json").unlink()  # cut short
    named = world / {"marker a folder": ".captioner_shapes", "split folder unreadable": "val",
                     "caption file a folder": "captions_test.json"}.get(broken, "")
    if broken in ("marker a folder", "caption file a folder"):
        named.unlink(missing_ok=True)
        named.mkdir()
    before = world_files(world)
    if broken.startswith("world folder"):
        unreadable_folder(monkeypatch, world, searchable=broken == "world folder unreadable")
    elif broken == "split folder unreadable":
        unreadable_folder(monkeypatch, named, searchable=False)
    assert main(["data", "shapes", "--out", str(world), *tiny]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {named}:"), err
    counts = ["data.shapes_num_train=2", "data.shapes_num_val=1", "data.shapes_num_test=1", "data.image_size=32"]
    with pytest.raises(CaptionerError, match=f"^{re.escape(str(named))}:"):
        ensure_shapes(load_config(None, ["data.dataset=shapes", f"data.root={world}", *counts]).data)
    monkeypatch.undo()
    assert world_files(world) == before


def test_a_shapes_count_or_size_from_a_config_is_named_as_its_key(tmp_path: Path) -> None:
    """ensure_shapes names the data key the user set, not the --num-* option of `data shapes`; data.image_size
    allows 16 pixels, which the shapes world does not (a config refuses it, a DataConfig made in code here)."""
    from dataclasses import replace

    from captioner.core.config import load_config
    from captioner.core.errors import DatasetError
    from captioner.data.datasets import ensure_shapes

    config = load_config(None, ["data.dataset=shapes", f"data.root={tmp_path / 'world'}"]).data
    with pytest.raises(DatasetError, match=r"^data\.shapes_num_val must be in \[0, 250000\] images, got -1$"):
        ensure_shapes(replace(config, shapes_num_val=-1))  # a DataConfig made in code is not checked on its own
    with pytest.raises(DatasetError, match=r"^data\.image_size of a shapes world must be in \[32, 4096\] pixels, "
                                           r"got 16$"):
        ensure_shapes(replace(config, image_size=16))
    assert not (tmp_path / "world").exists()


@pytest.mark.parametrize("size", [16, 31])
def test_a_shapes_config_below_the_worlds_image_size_is_refused_when_loaded(size: int, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """data.image_size 16 to 31 on a shapes config is one line naming the key when the config loads, before train
    makes the run's or the world's folder (it was refused only when the world was about to be drawn, the empty
    folders left behind, and trained where a world was already there). Another dataset takes 16, and a checkpoint's
    stored config still loads: a rule for new configs, not a model already trained."""
    from captioner.core.config import config_from_dict, load_config
    from captioner.core.errors import ConfigError

    shapes_config = str(REPO / "configs" / "shapes_lstm.yaml")
    said = rf"^command line: 'data.image_size' {size} is too small for the shapes world \(at least 32 pixels: "
    with pytest.raises(ConfigError, match=said) as error:
        load_config(shapes_config, [f"data.image_size={size}"])
    assert "\n" not in str(error.value)
    assert load_config(shapes_config, ["data.image_size=32"]).data.image_size == 32
    assert load_config(None, ["data.dataset=flickr8k", f"data.image_size={size}"]).data.image_size == size
    stored = load_config(None, ["data.dataset=flickr8k", f"data.image_size={size}"])
    stored.data.dataset = "shapes"
    assert config_from_dict(stored.to_dict()).data.image_size == size
    run, world = tmp_path / "run", tmp_path / "world"
    assert main(["train", shapes_config, f"data.image_size={size}", f"data.root={world}",
                 f"train.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'data.image_size'" in err, err
    assert not run.exists() and not world.exists()


def test_a_world_is_bounded_by_its_pixels_and_every_shipped_config_is_well_within() -> None:
    """Images x pixels a side squared at most SHAPES_MOST_PIXELS: the count alone let 250,000 images a split through
    at 4,096 pixels, terabytes. The largest world at 128 pixels passes as before; every shipped shapes config (the
    quickstart's among them) draws at most a hundredth of it."""
    from captioner.core.config import load_config
    from captioner.core.config_sections import SHAPES_MOST_PIXELS
    from captioner.core.errors import DatasetError
    from captioner.data.shapes import check_world_pixels

    largest = dict.fromkeys(("train", "val", "test"), 250_000)
    check_world_pixels(largest, 128, "png")
    with pytest.raises(DatasetError, match=r"^data\.shapes_num_train 250000, data\.shapes_num_val 250000, "
                                           r"data\.shapes_num_test 250000 \(750,000 images\) at data\.image_size 129 "
                                           r"pixels a side: a shapes world of 12\.5 billion pixels, about 27\.5 GB of "
                                           r"PNG files, past its largest"):
        check_world_pixels(largest, 129, "png", from_config=True)
    shipped = [load_config(path).data for path in sorted((REPO / "configs").glob("*.yaml"))]
    shapes = [data for data in shipped if data.dataset == "shapes"]
    assert len(shapes) >= 4
    for data in shapes:
        images = data.shapes_num_train + data.shapes_num_val + data.shapes_num_test
        assert images * data.image_size**2 <= SHAPES_MOST_PIXELS / 100


def test_training_refuses_a_world_too_large_to_draw_before_making_a_folder(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A shapes config whose world would pass the pixel bound is one line naming its data keys, said before the
    run's folder or the world's is made, and before any image is drawn."""
    def never(*args: object) -> None:
        raise AssertionError("an image was drawn before the world's size was checked")

    monkeypatch.setattr("captioner.data.shapes.render", never)
    run, world = tmp_path / "run", tmp_path / "world"
    assert main(["train", str(REPO / "configs" / "shapes_lstm.yaml"), "data.image_size=2048", f"data.root={world}",
                 f"train.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    said = "error: data.shapes_num_train 4000, data.shapes_num_val 250, data.shapes_num_test 500 (4,750 images) at "
    assert err.count("\n") == 1 and err.startswith(f"{said}data.image_size 2048 pixels a side"), err
    assert not run.exists() and not world.exists()


def waiting_line(world: Path) -> str:
    return f"waiting for another process, which is generating the shapes world into {world}"


def tiny_world(world: Path) -> Callable[[], object]:
    return lambda: generate_shapes(world, 2, 1, 1, image_size=32, progress=False)


def test_training_waits_for_a_world_another_process_generates_and_takes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Before, a second first run on one data.root (two runs started together on the default data/shapes) found no
    caption files yet and generated the world beside the first, removing the caption files the first had written
    as a world cut short's: the first could then read a world without them. Now it waits and takes that world."""
    from captioner.core.config import load_config
    from captioner.data import datasets

    world = tmp_path / "world"
    world.mkdir()
    config = load_config(None, ["data.dataset=shapes", f"data.root={world}", "data.shapes_num_train=2",
                                "data.shapes_num_val=1", "data.shapes_num_test=1", "data.image_size=32"]).data
    monkeypatch.setattr(datasets, "generate_shapes", lambda *a, **k: pytest.fail("generated beside the other"))
    caplog.set_level("INFO", logger="captioner.data.datasets")
    with held_elsewhere("shapes", world, tiny_world(world)) as release:
        watcher = released_once_said(caplog, waiting_line(world), release)
        datasets.ensure_shapes(config)
        watcher.join()
    assert waiting_line(world) in caplog.messages
    assert datasets.finished_world(world)


def test_data_shapes_waits_for_another_generator_then_refuses_its_finished_world(
        tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """Before, it generated into the folder beside the other generator: with other options, a world of two
    image sizes."""
    world = tmp_path / "world"
    world.mkdir()
    caplog.set_level("INFO", logger="captioner.data.datasets")
    with held_elsewhere("shapes", world, tiny_world(world)) as release:
        watcher = released_once_said(caplog, waiting_line(world), release)
        code = main(["data", "shapes", "--out", str(world), "--num-train", "3", "--image-size", "48", "--quiet"])
        watcher.join()
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(
        "world: already holds a shapes world (captions_train.json, ...); delete it or choose another folder")
    assert {Image.open(p).size for p in world.rglob("*.jpg")} == {(32, 32)}


@pytest.mark.parametrize("lockless", ["a cache that is a file", "a file system without locks"])
def test_a_world_is_generated_unheld_where_no_lock_can_be_had(lockless: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The hold is a courtesy between processes: a cache folder that cannot be written, or a network file system
    whose flock fails (ENOLCK), leaves the world generated as before, never a traceback."""
    import errno
    import fcntl

    from captioner.core.config import load_config
    from captioner.data.datasets import ensure_shapes

    if lockless == "a cache that is a file":
        (tmp_path / "cache").write_text("not a folder")
        monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path / "cache"))
    else:
        def no_locks(*args: object) -> None:
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(fcntl, "flock", no_locks)
    config = load_config(None, ["data.dataset=shapes", f"data.root={tmp_path / 'world'}", "data.shapes_num_train=2",
                                "data.shapes_num_val=1", "data.shapes_num_test=1", "data.image_size=32"]).data
    ensure_shapes(config)
    assert finished_world(tmp_path / "world")
