"""The web page's resize (captioner/deploy/web/preprocess.js `resizeBilinear`) gives byte for byte what the Python
runtime feeds the encoder: Pillow's `resize((S, S), Image.BILINEAR)`, channels first. Seeded random pictures of
awkward sizes (1 pixel, lines, huge ratios, Pillow's vertical-first path for tall pictures, enlarging, identity)
and a real Flickr8k photograph, all resized by ONE node process (tests/js/resize_cli.mjs)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from helpers import REPO, require

SIZES = (224, 128)
# (name, width, height): Pillow resizes a picture over 100 times taller than wide vertically first.
PICTURES = [
    ("1x1", 1, 1),
    ("1x300 tall", 1, 300),
    ("300x1", 300, 1),
    ("7x5", 7, 5),
    ("640x480", 640, 480),
    ("500x375 Flickr-like", 500, 375),
    ("37x1000", 37, 1000),
    ("224x224", 224, 224),
    ("100x100", 100, 100),
    ("3x400 tall", 3, 400),
    ("2x20000 tall", 2, 20000),
    ("20000x3 wide", 20000, 3),
    ("129x223", 129, 223),
    ("white 33x17", 33, 17),
]
PHOTO = "Flickr8k photograph"


def picture_array(name: str, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """(height, width, 3) uint8: noise (every value, 0 and 255 included), or all 255 (the top of the clip)."""
    if name.startswith("white"):
        return np.full((height, width, 3), 255, np.uint8)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def photo(request: pytest.FixtureRequest) -> np.ndarray | None:
    """The first Flickr8k photograph as the runtime loads it, or None where ../shared/data lacks it: then only
    `test_photograph_matches_pillow` skips (fails in CI), and the other pictures are still compared."""
    try:
        folder = request.getfixturevalue("shared_data") / "flickr8k" / "images"
    except (pytest.skip.Exception, pytest.fail.Exception):
        return None
    from captioner.data.image_files import load_image

    photos = sorted(folder.glob("*.jpg"))
    return np.asarray(load_image(photos[0])) if photos else None


@pytest.fixture(scope="module")
def resized(tmp_path_factory: pytest.TempPathFactory, photo: np.ndarray | None) -> dict:
    """{(case, size): (expected (3, S, S) from Pillow, got (3, S, S) from resize.js)}, one node run for all."""
    node = shutil.which("node")
    require(node is not None, "node is not on PATH (the web page's JavaScript tests need Node 20)")
    folder = tmp_path_factory.mktemp("web_preprocess")
    rng = np.random.default_rng(59)
    pictures = {name: picture_array(name, width, height, rng) for name, width, height in PICTURES}
    if photo is not None:
        pictures[PHOTO] = photo
    jobs, expected = [], {}
    for i, (name, array) in enumerate(pictures.items()):
        (folder / f"{i}.rgb").write_bytes(array.tobytes())
        picture = Image.fromarray(array, "RGB")
        for size in SIZES:
            expected[name, size] = np.asarray(picture.resize((size, size), Image.BILINEAR)).transpose(2, 0, 1)
            jobs.append({"path": str(folder / f"{i}.rgb"), "width": array.shape[1], "height": array.shape[0],
                         "size": size, "out": str(folder / f"{i}-{size}.out"), "key": [name, size]})
    (folder / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run([node, str(REPO / "tests" / "js" / "resize_cli.mjs"), str(folder / "jobs.json")], check=True,
                   timeout=120)
    return {(job["key"][0], job["key"][1]): (expected[job["key"][0], job["key"][1]],
                                             np.fromfile(job["out"], np.uint8)) for job in jobs}


def assert_same_bytes(expected: np.ndarray, got: np.ndarray) -> None:
    assert got.size == expected.size, f"{got.size} bytes, Pillow gives {expected.size}"
    got = got.reshape(expected.shape)
    differ = np.argwhere(got != expected)
    if len(differ):
        worst = int(np.abs(got.astype(int) - expected).max())
        raise AssertionError(f"{len(differ)} of {expected.size} bytes differ from Pillow's (by up to {worst}); "
                             f"the first at (c, y, x) = {tuple(differ[0])}: {got[tuple(differ[0])]} for "
                             f"{expected[tuple(differ[0])]}")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [name for name, _, _ in PICTURES])
def test_resize_matches_pillow(resized: dict, name: str, size: int) -> None:
    assert_same_bytes(*resized[name, size])


@pytest.mark.parametrize("size", SIZES)
def test_photograph_matches_pillow(resized: dict, photo: np.ndarray | None, size: int) -> None:
    require(photo is not None, "no Flickr8k photograph in ../shared/data/flickr8k/images")
    assert_same_bytes(*resized[PHOTO, size])
