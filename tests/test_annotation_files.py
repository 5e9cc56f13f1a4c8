"""Malformed annotation and results files stop with one line naming the file and the record.

Each case writes a small broken file of one kind (COCO captions, COCO instances, Karpathy split,
Flickr8k token and split files, COCO results) and expects `DatasetError` with a message of one
line that starts with the file's path and says which record or line is wrong. A few go through
the CLI too, which prints that line and exits 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import fifo_with_a_writer

from captioner.apps.cli import main
from captioner.core.errors import DatasetError
from captioner.data.coco import load_coco_captions, load_karpathy
from captioner.data.flickr8k import load_flickr8k, read_token_file
from captioner.evaluation.grounding import Instances
from captioner.evaluation.results_files import load_references, load_results

IMAGES = [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}]
CAPTIONS = [{"id": 10, "image_id": 1, "caption": "a cat"}, {"id": 11, "image_id": 2, "caption": "a dog"}]


def captions_file(**changes) -> dict:
    return {"images": IMAGES, "annotations": CAPTIONS, **changes}


def instances_file(**changes) -> dict:
    square = [[1, 1, 5, 1, 5, 5, 1, 5]]
    return {
        "images": [{"id": 1, "file_name": "a.jpg", "height": 8, "width": 8}],
        "categories": [{"id": 3, "name": "cat"}],
        "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "segmentation": square, "area": 16,
                         "bbox": [1, 1, 4, 4], "iscrowd": 0}],
        **changes,
    }


def karpathy_file(*entries: dict) -> dict:
    ok = {"filepath": "val2014", "filename": "a.jpg", "cocoid": 5, "split": "test", "sentences": [{"raw": "a cat ."}]}
    return {"images": [ok, *entries]}


def write(path: Path, content: object) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def coco(path: Path) -> object:
    return load_coco_captions(path, path.parent, check_images=False)


def instances(path: Path) -> object:
    return Instances(path)


def karpathy(path: Path) -> object:
    return load_karpathy(path, path.parent, "test", check_images=False)


def references(path: Path) -> object:
    return load_references(path)


def results(path: Path) -> object:
    return load_results(path, {1: ["a cat"], 2: ["a dog"]})


TRUNCATED = json.dumps(captions_file()).encode()[:50]
DEEP = b"[" * 5000 + b"]" * 5000  # past Python's recursion limit: json.loads raised RecursionError
LONG_NUMBER = b'[{"image_id": ' + b"9" * 5000 + b', "caption": "x"}]'  # past int()'s 4,300 digits: a ValueError
DEEP_SAID = r"not valid JSON here: lists or objects nested hundreds of levels deep"
LONG_SAID = r"not valid JSON here: a number of thousands of digits"

CASES: list[tuple[str, Callable[[Path], object], object, str]] = [
    # COCO caption files
    ("coco_truncated", coco, TRUNCATED, r"not valid JSON \(.* at line 1 column \d+\); truncated\?"),
    ("coco_not_utf8", coco, b'{"images": [], "annotations": ["\xff\xfe"]}', r"not UTF-8 text"),
    ("coco_list", coco, [1, 2], r"not a COCO caption file \(needs 'images' and 'annotations' lists\)"),
    ("coco_no_caption", coco, captions_file(annotations=[{"id": 1, "image_id": 1}]),
     r"annotations\[0\] has no 'caption'"),
    ("coco_caption_number", coco, captions_file(annotations=[CAPTIONS[0], {"id": 2, "image_id": 2, "caption": 7}]),
     r"annotations\[1\]: 'caption' must be a string, got 7"),
    ("coco_image_id_string", coco, captions_file(annotations=[{"id": 1, "image_id": "1", "caption": "x"}]),
     r"annotations\[0\]: 'image_id' must be an integer, got '1'"),
    ("coco_image_id_bool", coco, captions_file(images=[{"id": True, "file_name": "a.jpg"}]),
     r"images\[0\]: 'id' must be an integer, got True"),
    ("coco_file_name_number", coco, captions_file(images=[{"id": 1, "file_name": 3}]),
     r"images\[0\]: 'file_name' must be a string, got 3"),
    ("coco_no_file_name", coco, captions_file(images=[{"id": 1}]), r"images\[0\] has no 'file_name'"),
    ("coco_duplicate_image", coco, captions_file(images=[*IMAGES, {"id": 1, "file_name": "c.jpg"}]),
     r"images\[2\] repeats id 1 of images\[0\]"),
    ("coco_duplicate_annotation", coco, captions_file(annotations=[
        *CAPTIONS, {"id": 10, "image_id": 2, "caption": "x"}]), r"annotations\[2\] repeats id 10 of annotations\[0\]"),
    ("coco_unknown_image", coco, captions_file(annotations=[{"id": 1, "image_id": 9, "caption": "x"}]),
     r"annotations\[0\] names image_id 9, which 'images' does not list"),
    ("coco_entry_not_object", coco, captions_file(annotations=["a cat"]), r"annotations\[0\] is a str, not an object"),
    # COCO instances files
    ("inst_no_categories", instances, captions_file(),
     r"not a COCO instances file \(needs 'images' and 'annotations' and 'categories' lists\)"),
    ("inst_no_height", instances, instances_file(images=[{"id": 1, "width": 8}]), r"images\[0\] has no 'height'"),
    ("inst_zero_width", instances, instances_file(images=[{"id": 1, "height": 8, "width": 0}]),
     r"images\[0\]: 'width' must be a positive integer, got 0"),
    ("inst_category_no_name", instances, instances_file(categories=[{"id": 3}]), r"categories\[0\] has no 'name'"),
    ("inst_duplicate_category", instances,
     instances_file(categories=[{"id": 3, "name": "cat"}, {"id": 3, "name": "dog"}]), r"categories\[1\] repeats id 3"),
    ("inst_no_segmentation", instances, instances_file(annotations=[{"id": 7, "image_id": 1, "category_id": 3}]),
     r"annotations\[0\] has no 'segmentation'"),
    ("inst_bad_segmentation", instances,
     instances_file(annotations=[{"id": 7, "image_id": 1, "category_id": 3, "segmentation": [[1, 2]]}]),
     r"annotations\[0\]: 'segmentation' must be polygons or RLE"),
    ("inst_unknown_category", instances,
     instances_file(annotations=[{"id": 7, "image_id": 1, "category_id": 4, "segmentation": [[0, 0, 4, 0, 4, 4]]}]),
     r"annotations\[0\] names category_id 4"),
    ("inst_truncated", instances, json.dumps(instances_file()).encode()[:-3], r"not valid JSON"),
    # Karpathy split files
    ("karpathy_truncated", karpathy, json.dumps(karpathy_file()).encode()[:40], r"not valid JSON"),
    ("karpathy_images_dict", karpathy, {"images": {"a": 1}}, r"not a Karpathy split file \(no 'images' list\)"),
    ("karpathy_entry_string", karpathy, karpathy_file("a.jpg"), r"images\[1\] is a str, not an object"),
    ("karpathy_no_filename", karpathy, karpathy_file({"split": "test", "cocoid": 6, "sentences": []}),
     r"images\[1\] has no 'filename'"),
    ("karpathy_id_string", karpathy,
     karpathy_file({"filename": "b.jpg", "split": "test", "cocoid": "6", "sentences": []}),
     r"images\[1\]: 'cocoid'/'imgid' must be an integer, got '6'"),
    ("karpathy_duplicate_id", karpathy,
     karpathy_file({"filename": "b.jpg", "split": "train", "cocoid": 5, "sentences": []}),
     r"images\[1\] repeats image id 5 of images\[0\]"),
    ("karpathy_raw_number", karpathy,
     karpathy_file({"filename": "b.jpg", "split": "test", "cocoid": 6, "sentences": [{"raw": 5}]}),
     r"images\[1\]\.sentences\[0\]: needs a 'raw' string or a 'tokens' list of strings"),
    ("karpathy_no_sentences", karpathy,
     karpathy_file({"filename": "b.jpg", "split": "test", "cocoid": 6, "sentences": []}),
     r"images\[1\]: 'sentences' must be a non-empty list"),
    ("karpathy_filename_list", karpathy,
     karpathy_file({"filename": ["b.jpg"], "split": "test", "cocoid": 6, "sentences": [{"raw": "x"}]}),
     r"images\[1\]: 'filename' and 'filepath' must be strings"),
    ("karpathy_blank_sentences", karpathy, karpathy_file(
        {"filename": "b.jpg", "split": "test", "cocoid": 6, "sentences": [{"raw": "  "}, {"tokens": []}]}),
     r"images\[1\]: every sentence is blank \(no 'raw' text and no 'tokens'\)"),
    # image names leading out of the image folder (absolute, or climbing with '..')
    ("coco_file_name_parent", coco, captions_file(images=[IMAGES[0], {"id": 2, "file_name": "../../secret.jpg"}]),
     r"images\[1\]: file_name '\.\./\.\./secret\.jpg' leads out of the image folder .* refused"),
    ("coco_file_name_absolute", coco, captions_file(images=[{"id": 1, "file_name": "/etc/passwd"}, IMAGES[1]]),
     r"images\[0\]: file_name '/etc/passwd' leads out of the image folder"),
    ("karpathy_filename_absolute", karpathy,
     karpathy_file({"filename": "/etc/passwd", "split": "test", "cocoid": 6, "sentences": [{"raw": "x"}]}),
     r"images\[1\]: 'filename' '/etc/passwd' leads out of the image folder"),
    ("karpathy_filepath_parent", karpathy, karpathy_file(
        {"filepath": "val2014/../..", "filename": "b.jpg", "split": "train", "cocoid": 6, "sentences": [{"raw": "x"}]}),
     r"images\[1\]: 'filepath' 'val2014/\.\./\.\.' leads out of the image folder"),
    ("karpathy_filepath_absolute", karpathy, karpathy_file(
        {"filepath": "/etc", "filename": "passwd", "split": "test", "cocoid": 6, "sentences": [{"raw": "x"}]}),
     r"images\[1\]: 'filepath' '/etc' leads out of the image folder"),
    # results and reference files for scoring
    ("results_truncated", results, b'[{"image_id": 1, "caption": "a c', r"not valid JSON"),
    ("results_object", results, {"image_id": 1, "caption": "x"}, r"expected a JSON list .* got a JSON dict"),
    ("results_no_caption", results, [{"image_id": 1}], r"item 0 has no \"caption\""),
    ("results_caption_list", results, [{"image_id": 1, "caption": ["a", "cat"]}],
     r"item 0 \(image 1\): \"caption\" must be a string"),
    ("results_id_string", results, [{"image_id": "1", "caption": "a cat"}],
     r"item 0: \"image_id\" must be an integer, got '1'"),
    ("results_duplicate", results, [{"image_id": 1, "caption": "a"}, {"image_id": 1, "caption": "b"}],
     r"image 1 has more than one caption \(items 0 and 1\)"),
    ("results_unknown_image", results, [{"image_id": 3, "caption": "a"}],
     r"1 of 1 image ids are not in the annotations \(3\)"),
    ("results_empty_caption", results, [{"image_id": 1, "caption": "  "}], r"item 0 \(image 1\) has an empty caption"),
    ("references_no_annotations", references, {"images": []}, r'missing "annotations"'),
    ("references_caption_number", references, {"annotations": [{"image_id": 1, "caption": None}]},
     r'annotations\[0\]: "caption" must be a string, got None'),
    # nested past Python's recursion limit, or a number of more digits than Python converts, in any of them
    *((f"{kind}_deep", load, DEEP, DEEP_SAID) for kind, load in
      (("coco", coco), ("instances", instances), ("karpathy", karpathy), ("results", results))),
    ("references_deep_object", references, b'{"annotations": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, DEEP_SAID),
    *((f"{kind}_long_number", load, LONG_NUMBER, LONG_SAID) for kind, load in
      (("coco", coco), ("karpathy", karpathy), ("references", references), ("results", results))),
]


@pytest.mark.parametrize(("name", "load", "content", "message"), CASES, ids=[c[0] for c in CASES])
def test_malformed_file_is_one_line_naming_file_and_record(tmp_path: Path, name: str, load, content,
                                                           message: str) -> None:
    path = write(tmp_path / f"{name}.json", content)
    with pytest.raises(DatasetError) as info:
        load(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text, text
    assert re.search(message, text), text


def test_a_caption_file_that_is_a_named_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """`data stats --coco FIFO` waited forever for a writer: a pipe is not a caption file."""
    with fifo_with_a_writer(tmp_path / "captions.json") as fifo, pytest.raises(
            DatasetError, match=r"captions.json: COCO caption file is not a regular file \(a pipe"):
        coco(fifo)


def test_good_files_still_load(tmp_path: Path) -> None:
    """The cases above are broken copies of these, which load."""
    assert [r.captions for r in coco(write(tmp_path / "c.json", captions_file()))] == [("a cat",), ("a dog",)]
    assert len(instances(write(tmp_path / "i.json", instances_file())).objects(1)) == 1
    assert [r.image_id for r in karpathy(write(tmp_path / "k.json", karpathy_file()))] == [5]
    inside = captions_file(images=[{"id": 1, "file_name": "sub/a..b.jpg"}, {"id": 2, "file_name": "./b.jpg"}])
    assert [r.path for r in coco(write(tmp_path / "s.json", inside))] == [tmp_path / "sub/a..b.jpg", tmp_path / "b.jpg"]
    assert results(write(tmp_path / "r.json", [{"image_id": 1, "caption": "a cat"}])) == {1: "a cat"}


def test_blank_captions_are_skipped_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A caption of no words ("", spaces, an empty 'tokens' list) was kept, teaching the model to say nothing."""
    blank = captions_file(annotations=[{"image_id": 1, "caption": " "}, *CAPTIONS, {"image_id": 2, "caption": ""}])
    sentences = [{"raw": "\t"}, {"raw": "a dog ."}, {"tokens": []}, {"tokens": ["", " "]}]
    split = karpathy_file({"filename": "b.jpg", "split": "test", "cocoid": 6, "sentences": sentences})
    with caplog.at_level("WARNING"):
        assert [r.captions for r in coco(write(tmp_path / "c.json", blank))] == [("a cat",), ("a dog",)]
        assert [r.captions for r in karpathy(write(tmp_path / "k.json", split))] == [("a cat .",), ("a dog .",)]
        one = captions_file(annotations=[*CAPTIONS, {"image_id": 2, "caption": ""}])
        assert [r.captions for r in coco(write(tmp_path / "one.json", one))] == [("a cat",), ("a dog",)]
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warned == [f"{tmp_path / 'c.json'}: 2 blank captions skipped (image 1, ...)",
                      f"{tmp_path / 'k.json'}: 3 blank sentences skipped (images[1].sentences[0], ...)",
                      f"{tmp_path / 'one.json'}: 1 blank caption skipped (image 2)"], warned


def flickr_root(root: Path, tokens: str, test_split: str = "b.jpg\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Flickr8k.token.txt").write_text(tokens)
    (root / "Flickr_8k.testImages.txt").write_text(test_split)
    return root


GOOD_TOKENS = "a.jpg#0\tA cat .\na.jpg#1\tA small cat .\nb.jpg#0\tA dog .\n"


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ("a.jpg#0\tA cat .\na.jpg#1 A cat without a tab\n",
         r"Flickr8k.token.txt:2: expected '<image>.jpg#<n><TAB><caption>'"),
        ("a.jpg\tA cat with no number\n", r"Flickr8k.token.txt:1: expected"),
        ("a.jpg#0\tA cat .\na.jpg#1\t   \n", r"Flickr8k.token.txt:2: a.jpg#1 has an empty caption"),
        ("a.jpg#0\tA cat .\nb.jpg#0\tA dog .\na.jpg#0\tA cat again .\n",
         r"Flickr8k.token.txt:3: a.jpg#0 repeats line 1"),
        ("", r"Flickr8k.token.txt: no captions"),
        ("a.jpg#0\tA cat .\n../../b.jpg#0\tA dog .\n",
         r"Flickr8k.token.txt:2: image '\.\./\.\./b\.jpg' leads out of the image folder"),
        ("/etc/passwd#0\tA cat .\n", r"Flickr8k.token.txt:1: image '/etc/passwd' leads out of the image folder"),
    ],
)
def test_malformed_flickr8k_token_file(tmp_path: Path, tokens: str, message: str) -> None:
    root = flickr_root(tmp_path, tokens)
    with pytest.raises(DatasetError, match=message) as info:
        read_token_file(root / "Flickr8k.token.txt")
    assert "\n" not in str(info.value) and str(root) in str(info.value)


def test_flickr8k_token_file_not_utf8(tmp_path: Path) -> None:
    root = flickr_root(tmp_path, "")
    (root / "Flickr8k.token.txt").write_bytes(b"a.jpg#0\tA caf\xe9 .\n")  # Latin-1, not UTF-8
    with pytest.raises(DatasetError, match=r"Flickr8k.token.txt: Flickr8k caption file is not UTF-8 text"):
        read_token_file(root / "Flickr8k.token.txt")


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ("b.jpg\nc.jpg\n", r"Flickr_8k.testImages.txt:2: c.jpg has no captions in Flickr8k.token.txt"),
        ("b.jpg\na.jpg\nb.jpg\n", r"Flickr_8k.testImages.txt:3: b.jpg repeats line 1"),
    ],
)
def test_malformed_flickr8k_split_file(tmp_path: Path, split: str, message: str) -> None:
    root = flickr_root(tmp_path, GOOD_TOKENS, split)
    with pytest.raises(DatasetError, match=message):
        load_flickr8k(root, "test", check_images=False)


def test_files_saved_with_a_byte_order_mark_load_as_without_one(tmp_path: Path) -> None:
    """Notepad and Excel begin UTF-8 files with a byte order mark: the Flickr8k files said "b.jpg has no captions"
    (the mark was part of the first image's name), a JSON file was "not valid JSON"."""
    root = flickr_root(tmp_path / "flickr", "\ufeff" + GOOD_TOKENS, "\ufeffb.jpg\n")
    assert [r.captions for r in load_flickr8k(root, "test", check_images=False)] == [("A dog .",)]
    marked = tmp_path / "c.json"
    marked.write_text("\ufeff" + json.dumps(captions_file()), encoding="utf-8")
    assert [r.captions for r in coco(marked)] == [("a cat",), ("a dog",)]


def test_flickr8k_missing_split_file_and_good_files(tmp_path: Path) -> None:
    root = flickr_root(tmp_path, GOOD_TOKENS)
    assert [r.captions for r in load_flickr8k(root, "test", check_images=False)] == [("A dog .",)]
    with pytest.raises(DatasetError, match=r"Flickr_8k.trainImages.txt: Flickr8k split file not found"):
        load_flickr8k(root, "train", check_images=False)


def test_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "captions.json", captions_file(annotations=[{"id": 1, "image_id": 1, "caption": 3}]))
    assert main(["data", "stats", "--coco", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: annotations[0]: 'caption' must be a string")
    results_file = write(tmp_path / "results.json", [{"image_id": 1, "caption": 5}])
    assert main(["evaluate", "--fast", "--results", str(results_file), "--annotations",
                 str(write(tmp_path / "ok.json", captions_file()))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.json: item 0 (image 1): \"caption\" must be a string" in err


def test_a_caption_longer_than_any_written_is_one_line(tmp_path: Path) -> None:
    """A results or reference caption of hundreds of thousands of characters was scored until METEOR's Java
    failed, after the wait, saying only that it exited."""
    long = "dog " * 2_501  # 10,004 characters
    said = "a caption of 10,004 characters, more than the 10,000 one may have"
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'r.json'}: item 0 (image 1): {said}")):
        results(write(tmp_path / "r.json", [{"image_id": 1, "caption": long}]))
    annotations = captions_file(annotations=[{"id": 1, "image_id": 1, "caption": long}])
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'a.json'}: annotations[0]: a caption of 10,004")):
        load_references(write(tmp_path / "a.json", annotations))
    assert results(write(tmp_path / "ok.json", [{"image_id": 1, "caption": long[:10_000]}])) == {1: long[:10_000]}
