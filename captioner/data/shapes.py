"""The synthetic shapes world: a dataset in COCO format with ground-truth masks. 1 to 3 shapes of distinct
(colour, shape) per image, so each word has one true region for scoring attention; seeded, byte-identical."""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from captioner.core.config_sections import SHAPES_MIN_IMAGE_SIZE, SHAPES_MOST_PIXELS, DataConfig, key_spec
from captioner.core.errors import DatasetError
from captioner.core.files import make_folder, write_atomically, write_failure
from captioner.core.progress import progress_bar

SHAPES = ("circle", "square", "triangle", "diamond", "star")
COLOURS = {"red": (215, 40, 40), "green": (40, 165, 60), "blue": (40, 80, 215), "yellow": (235, 205, 35),
           "purple": (145, 55, 190), "orange": (245, 135, 25)}
SIZES = {"small": 0.10, "large": 0.165}  # circumradius as a fraction of the image side
SPLITS = ("train", "val", "test")
NUMBER_WORDS = ("zero", "one", "two", "three")


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    colour: str
    size: str
    x: float  # centre, pixels
    y: float
    radius: float
    angle: float = 0.0  # small rotation, radians

    def with_article(self, with_size: bool = True) -> str:
        phrase = f"{self.size} {self.colour} {self.shape}" if with_size else f"{self.colour} {self.shape}"
        return ("an " if phrase[0] in "aeiou" else "a ") + phrase

    def polygon(self) -> list[tuple[float, float]]:
        """Vertices of the drawn outline; the same polygon is the instance segmentation."""
        if self.shape == "circle":
            angles = np.linspace(0, 2 * math.pi, 48, endpoint=False)
            radii = np.full_like(angles, self.radius)
        elif self.shape == "square":
            angles = self.angle + math.pi / 4 + np.arange(4) * math.pi / 2
            radii = np.full(4, self.radius)
        elif self.shape == "diamond":  # a rhombus standing on a corner, taller than wide
            angles = self.angle + np.arange(4) * math.pi / 2
            radii = self.radius * np.array([0.7, 1.0, 0.7, 1.0])
        elif self.shape == "triangle":
            angles = self.angle - math.pi / 2 + np.arange(3) * 2 * math.pi / 3
            radii = np.full(3, self.radius)
        elif self.shape == "star":
            angles = self.angle - math.pi / 2 + np.arange(10) * math.pi / 5
            radii = self.radius * np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        else:
            raise ValueError(f"unknown shape {self.shape!r}")
        xs = self.x + radii * np.cos(angles)
        ys = self.y + radii * np.sin(angles)
        return [(round(float(x), 2), round(float(y), 2)) for x, y in zip(xs, ys)]


def relation(a: ShapeObject, b: ShapeObject) -> str:
    """Where `a` stands relative to `b`: the dominant axis of their displacement."""
    dx, dy = b.x - a.x, b.y - a.y
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def sample_scene(rng: np.random.Generator, image_size: int) -> list[ShapeObject]:
    """1 to 3 non-overlapping objects with distinct (colour, shape), in left-to-right order."""
    count = int(rng.integers(1, 4))
    while True:  # rejection sampling; a scene of three small objects almost always fits
        objects: list[ShapeObject] = []
        used: set[tuple[str, str]] = set()
        for _ in range(count):
            for _attempt in range(50):
                shape = SHAPES[int(rng.integers(len(SHAPES)))]
                colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
                if (colour, shape) in used:
                    continue
                size = list(SIZES)[int(rng.integers(len(SIZES)))]
                radius = SIZES[size] * image_size * float(rng.uniform(0.92, 1.08))
                margin = radius + 2
                x, y = (float(v) for v in rng.uniform(margin, image_size - margin, size=2))
                if all(_apart(x, y, radius, o) for o in objects):
                    angle = float(rng.uniform(-0.15, 0.15))
                    objects.append(ShapeObject(shape, colour, size, x, y, radius, angle))
                    used.add((colour, shape))
                    break
        if len(objects) == count:
            return sorted(objects, key=lambda o: o.x)


def _apart(x: float, y: float, radius: float, other: ShapeObject) -> bool:
    """No overlap, and a clear dominant axis between the two, so a relation word is unambiguous."""
    dx, dy = abs(x - other.x), abs(y - other.y)
    return math.hypot(dx, dy) >= radius + other.radius + 4 and abs(dx - dy) > 0.15 * max(dx, dy)


def _chain(objects: list[ShapeObject], with_size: bool) -> str:
    """'a A left of a B above a C': each object placed relative to the one before it."""
    steps = (f"{relation(prev, obj)} {obj.with_article(with_size)}" for prev, obj in zip(objects, objects[1:]))
    return " ".join([objects[0].with_article(with_size), *steps])


def _listing(objects: list[ShapeObject], with_size: bool) -> str:
    names = [o.with_article(with_size) for o in objects]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _with_relations(head: str, objects: list[ShapeObject]) -> str:
    pairs = zip(objects, objects[1:])
    relations = (f"the {a.colour} {a.shape} is {relation(a, b)} the {b.colour} {b.shape}" for a, b in pairs)
    return " . ".join([head, *relations])  # one object: the head alone


Template = Callable[[list[ShapeObject]], str]
# (weight, template): weights are how often an annotator would phrase a scene this way.
TEMPLATES: tuple[tuple[float, Template], ...] = (
    (10.0, lambda o: _chain(o, True)),
    (4.0, lambda o: _chain(o, False)),
    (2.0, lambda o: "there is " + _chain(o, True)),
    (1.5, lambda o: "a picture of " + _chain(o, True)),
    (1.0, lambda o: _chain(o[::-1], True)),  # right to left
    (1.0, lambda o: _chain(o, True) + " on a textured background"),
    (1.0, lambda o: _with_relations(
        f"{NUMBER_WORDS[len(o)]} {'shape' if len(o) == 1 else 'shapes'} : " + _listing(o, True), o)),
    (1.0, lambda o: _with_relations("the image shows " + _listing(o, False), o)),
    (0.5, lambda o: _with_relations(_listing(o[::-1], True), o)),
)


def write_captions(objects: list[ShapeObject], rng: np.random.Generator, count: int = 5) -> list[str]:
    """`count` different captions from templates drawn by weight without replacement."""
    weights = np.array([w for w, _ in TEMPLATES])
    keys = rng.random(len(TEMPLATES)) ** (1.0 / weights)  # Efraimidis-Spirakis weighted order
    captions = dict.fromkeys(TEMPLATES[i][1](objects) for i in np.argsort(-keys))  # in drawn order, once each
    return list(captions)[:count]


def render(objects: list[ShapeObject], rng: np.random.Generator, image_size: int) -> Image.Image:
    """A textured grey background (low-frequency blotches and stripes), the shapes, pixel noise."""
    s = image_size
    base = rng.uniform(95, 165)
    blotches = rng.normal(0, 22, size=(6, 6)).astype(np.float32)
    blotches = np.asarray(Image.fromarray(blotches, mode="F").resize((s, s), Image.Resampling.BILINEAR))
    period, phase = rng.uniform(6, 16), rng.uniform(0, 2 * math.pi)
    direction = rng.uniform(0, math.pi)
    yy, xx = _pixel_grid(s)
    stripes = 10 * np.sin((xx * math.cos(direction) + yy * math.sin(direction)) * (2 * math.pi / period) + phase)
    grey = base + blotches + stripes  # (s, s)
    tint = rng.uniform(-8, 8, size=3)  # a faint colour cast, far from the saturated object colours
    background = np.clip(grey[..., None] + tint, 0, 255).astype(np.uint8)  # (s, s, 3)
    image = Image.fromarray(background, mode="RGB")
    draw = ImageDraw.Draw(image)
    for obj in objects:
        jitter = rng.integers(-12, 13, size=3)
        fill = tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(COLOURS[obj.colour], jitter))
        draw.polygon(obj.polygon(), fill=fill)
    noise = rng.integers(-10, 11, size=(s, s, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, mode="RGB")


@functools.lru_cache(maxsize=4)
def _pixel_grid(size: int) -> np.ndarray:
    return np.mgrid[0:size, 0:size].astype(np.float32)  # (2, size, size)


def polygon_area(points: list[tuple[float, float]]) -> float:
    xs, ys = np.array(points).T
    return float(0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))))


MIN_IMAGE_SIZE = SHAPES_MIN_IMAGE_SIZE  # pixels a side: below it the shapes cannot be told apart


def check_shapes_options(num_train: int, num_val: int, num_test: int, image_size: int, seed: int,
                         image_format: str, from_config: bool = False) -> None:
    """The generator's options, each refused in one DatasetError line before anything is written: the image size
    within data.image_size's largest (a side of 100,000 pixels would take tens of GB), the seed within
    data.shapes_seed's range (numpy's), each count from 0 to data.shapes_num_*'s largest (a typo of 10,000,000
    would be hours of drawing and tens of GB), the world's pixels within SHAPES_MOST_PIXELS (250,000 images at
    4,096 pixels would be terabytes). Each is named as the user gave it: the command's option, or with
    `from_config` the data key."""
    if image_format not in ("png", "jpg"):
        raise DatasetError(f"image format must be png or jpg, got {image_format!r}")
    largest = key_spec(DataConfig, "image_size").le
    if not MIN_IMAGE_SIZE <= image_size <= largest:
        size = "data.image_size of a shapes world" if from_config else "image size"
        raise DatasetError(f"{size} must be in [{MIN_IMAGE_SIZE}, {largest:g}] pixels, got {image_size}")
    seeds = key_spec(DataConfig, "shapes_seed")
    if not seeds.allows(seed):
        said = "data.shapes_seed must be {} (numpy's seed range)" if from_config else \
            "seed must be {} (numpy's seed range, as data.shapes_seed)"
        raise DatasetError(f"{said.format(seeds.describe())}, got {seed}")
    for split, n in {"train": num_train, "val": num_val, "test": num_test}.items():
        most = int(key_spec(DataConfig, f"shapes_num_{split}").le)
        if not 0 <= n <= most:
            said = f"data.shapes_num_{split}" if from_config else f"--num-{split}"
            largest_of = "" if from_config else f" (as data.shapes_num_{split}'s largest)"
            raise DatasetError(f"{said} must be in [0, {most}] images{largest_of}, got {n}")
    check_world_pixels({"train": num_train, "val": num_val, "test": num_test}, image_size, image_format, from_config)


BYTES_PER_PIXEL = {"jpg": 0.5, "png": 2.2}  # what a world's image files take, measured from 128 to 2,048 pixels a side
NUMBERS = ("", " thousand", " million", " billion", " trillion")
BYTES = (" bytes", " KB", " MB", " GB", " TB", " PB")
FORMAT_NAMES = {"jpg": "JPEG", "png": "PNG"}


def check_world_pixels(counts: dict[str, int], image_size: int, image_format: str, from_config: bool = False) -> None:
    """A world of `counts` images a split at `image_size` pixels a side within SHAPES_MOST_PIXELS (the count
    bound alone lets terabytes through at a large size), else one DatasetError line naming the counts, the size, and
    the pixels and bytes it would write."""
    images = sum(counts.values())
    pixels = images * image_size**2
    if pixels <= SHAPES_MOST_PIXELS:
        return
    given = ", ".join(f"{'data.shapes_num_' if from_config else '--num-'}{split} {n}" for split, n in counts.items())
    size = f"{'data.image_size' if from_config else '--image-size'} {image_size}"
    written = _scaled(pixels * BYTES_PER_PIXEL[image_format], BYTES)
    raise DatasetError(f"{given} ({images:,} images) at {size} pixels a side: a shapes world of {_scaled(pixels)} "
                       f"pixels, about {written} of {FORMAT_NAMES[image_format]} files, past its largest, "
                       f"{_scaled(SHAPES_MOST_PIXELS)} pixels ({SHAPES_MOST_PIXELS // 128**2:,} images at 128); "
                       "ask for fewer or smaller images")


def _scaled(value: float, units: tuple[str, ...] = NUMBERS) -> str:
    """`value` in the largest of `units` (each 1,000 times the one before) it reaches: 12.3 billion, 1.8 TB."""
    unit = 0
    while value >= 1000 and unit + 1 < len(units):
        value, unit = value / 1000, unit + 1
    return f"{value:.1f}{units[unit]}" if unit else f"{value:,.0f}{units[unit]}"


def generate_shapes(out: str | Path, num_train: int = 4000, num_val: int = 250, num_test: int = 500,
                    image_size: int = 128, seed: int = 0, image_format: str = "jpg",
                    progress: bool = True) -> dict[str, int]:
    """Write `out/{split}/*.png` and `out/{captions,instances}_{split}.json`; the number of images per split."""
    check_shapes_options(num_train, num_val, num_test, image_size, seed, image_format)
    counts = {"train": num_train, "val": num_val, "test": num_test}
    out = Path(out)
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(SHAPES)]
    category_id = {c["name"]: c["id"] for c in categories}
    image_ids, caption_ids, object_ids = itertools.count(1), itertools.count(1), itertools.count(1)
    save_options = {"compress_level": 1} if image_format == "png" else {"quality": 95}  # JPEG: 10x faster to write
    clear_a_world_cut_short(out, counts, image_format)
    bar = progress_bar(total=sum(counts.values()), desc="shapes", unit="img", enabled=progress)
    make_folder(out, str(out), DatasetError)
    _write(out / SHAPES_MARKER, lambda path: path.write_text("written by captioner's shapes generator; "
                                                             "an unfinished world here is generated again\n"))
    for split_index, split in enumerate(SPLITS):
        make_folder(out / split, str(out / split), DatasetError)
        images, captions, instances = [], [], []
        for i in range(counts[split]):
            rng = np.random.default_rng([seed, split_index, i])
            objects = sample_scene(rng, image_size)
            file_name = f"{split}_{i:06d}.{image_format}"
            _write(out / split / file_name, functools.partial(render(objects, rng, image_size).save, **save_options))
            image_id = next(image_ids)
            images.append({"id": image_id, "file_name": file_name, "width": image_size, "height": image_size})
            captions += [{"id": next(caption_ids), "image_id": image_id, "caption": text}
                         for text in write_captions(objects, rng)]
            for obj in objects:
                polygon = obj.polygon()
                xs, ys = zip(*polygon)
                bbox = [round(min(xs), 2), round(min(ys), 2), round(max(xs) - min(xs), 2), round(max(ys) - min(ys), 2)]
                instances.append({"id": next(object_ids), "image_id": image_id, "category_id": category_id[obj.shape],
                                  "segmentation": [[v for point in polygon for v in point]],
                                  "area": round(polygon_area(polygon), 2), "bbox": bbox, "iscrowd": 0,
                                  "colour": obj.colour, "size": obj.size})
            bar.update()
        info = {"description": f"captioner shapes world, {split} split", "seed": seed, "image_size": image_size}
        _write_json(out / f"captions_{split}.json", {"info": info, "images": images, "annotations": captions})
        _write_json(out / f"instances_{split}.json",
                    {"info": info, "images": images, "annotations": instances, "categories": categories})
    bar.close()
    return counts


SHAPES_MARKER = ".captioner_shapes"  # marks a folder the generator owns (a run may finish a world it cut short)


def finished_world(root: str | Path) -> bool:
    """Whether `root` holds every split's caption file: a world training reads as it is, never generated again (a
    caption file that is a folder is refused as the generator's world cut short). A folder that cannot be looked
    into is one DatasetError line naming it."""
    try:
        return all((Path(root) / f"captions_{split}.json").is_file() for split in SPLITS)
    except OSError as e:
        raise DatasetError(f"{root}: cannot look into this shapes world's folder ({e.strerror or e})") from None


# Files an OS file browser drops into any folder it shows (Finder, Explorer, Dolphin), compared case-folded: a world
# is generated beside them and they are left where they are, as a user's files are.
OS_FILES = frozenset({".ds_store", ".localized", "thumbs.db", "ehthumbs.db", "desktop.ini", ".directory"})


def os_file(path: Path) -> bool:
    """Whether `path` is one of OS_FILES, a plain file: not the user's data, nor the generator's."""
    return path.name.casefold() in OS_FILES and not path.is_symlink() and path.is_file()


def holds_a_users_files(out: Path) -> bool:
    """Whether the folder `out` holds files (other than OS_FILES) and no marker of the generator's: a user's folder,
    never written into. A folder that cannot be read is one DatasetError line naming it."""
    try:
        return not os.path.lexists(out / SHAPES_MARKER) and any(not os_file(path) for path in out.iterdir())
    except OSError as e:
        raise DatasetError(f"{out}: cannot read the folder ({e.strerror or e})") from None


def clear_a_world_cut_short(out: Path, counts: dict[str, int], image_format: str) -> None:
    """Before a world is generated where the generator wrote before (its marker is there: a world cut short), remove
    the files of that world the new one will not list (every caption file, images past the new counts or in the
    other format), so no stray image lies in a split folder and no old caption file outlives another cut. The folder
    is the generator's, so a file it never writes is a user's: refused in one line naming it, nothing removed, as a
    world is never written beside a user's files. An OS file browser's (OS_FILES) is left where it is."""
    if not os.path.lexists(out / SHAPES_MARKER):
        return  # a new or empty folder: the callers refuse any other (a marker that is no file is refused below)
    stale = []
    for path in _generator_files(out):  # all of them, checked before any is removed
        if path.parent == out:
            kept = path.is_dir() or path.name == SHAPES_MARKER
        else:
            kept = path.suffix == f".{image_format}" and int(path.stem.rpartition("_")[2]) < counts[path.parent.name]
        if not kept:
            stale.append(path)
    for path in stale:
        try:
            path.unlink()
        except OSError as e:
            raise DatasetError(f"{path}: cannot remove this file of the shapes world cut short in {out} "
                               f"({e.strerror or e}); remove it or choose another folder") from None


# what the generator writes directly under its folder: its marker, split folders, caption files and their .tmp
TOP_NAMES = frozenset({SHAPES_MARKER, *SPLITS} | {f"{kind}_{split}.json{tmp}" for kind in ("captions", "instances")
                                                   for split in SPLITS for tmp in ("", ".tmp")})


def _generator_files(out: Path) -> list[Path]:
    """Every file and split folder under `out`, each one the generator writes (its marker, caption files, their
    unfinished .tmp, split folders, `{split}_NNNNNN.{png,jpg}` images in them), past OS_FILES; else a DatasetError
    naming one, as is a folder or file that cannot be looked at."""
    try:
        return _listed_generator_files(out)
    except OSError as e:
        raise DatasetError(f"{e.filename or out}: cannot read this part of the shapes world cut short in {out} "
                           f"({e.strerror or e}); make it readable or choose another folder") from None


def _listed_generator_files(out: Path) -> list[Path]:
    found = []
    for path in sorted(out.iterdir()):
        if os_file(path):
            continue
        if path.name not in TOP_NAMES or path.is_symlink() or path.is_dir() != (path.name in SPLITS):
            raise _not_the_generators(out, path)
        found.append(path)
        if path.is_dir():
            for image in sorted(path.iterdir()):
                if os_file(image):
                    continue
                number = re.fullmatch(rf"{path.name}_(\d{{6,}})\.(png|jpg)", image.name)
                if not number or number[1] != f"{int(number[1]):06d}" or image.is_symlink() or not image.is_file():
                    raise _not_the_generators(out, image)
                found.append(image)
    return found


def _not_the_generators(out: Path, path: Path) -> DatasetError:
    return DatasetError(f"{path}: not a file the shapes generator writes, in the world cut short in {out}; move it "
                        "away to generate the world there again, or choose another folder")


def _write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(path)`; the system refusing it (a folder there, no permission, a full disk) is one line naming it."""
    try:
        write(path)
    except OSError as e:
        raise write_failure(path, e) from None


def _write_json(path: Path, data: dict) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, separators=(",", ":"))))
