"""The attention grounding score: how much of a word's attention falls on the object it names.

For each generated word that refers to an object (a colour or shape word in the shapes world; a
COCO category word or a common synonym in COCO), take the attention map at that step, upsample
it to the image, normalise it to sum 1 and add up the mass inside the object's mask. The score
is reported next to the uniform-attention baseline, the mean area fraction of those masks: a
map that ignores the image scores exactly the baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from captioner.errors import DatasetError
from captioner.models import Caption
from captioner.visualize import upsample

# COCO category -> words that name it in captions (singular and plural), after Lu et al.'s
# Neural Baby Talk lists, trimmed to common words.
COCO_SYNONYMS: dict[str, tuple[str, ...]] = {
    "person": ("person", "people", "man", "men", "woman", "women", "boy", "boys", "girl", "girls", "child",
               "children", "kid", "kids", "guy", "guys", "lady", "ladies", "player", "players", "skier",
               "skiers", "surfer", "surfers", "skateboarder", "snowboarder", "baby", "persons", "adult", "adults"),
    "bicycle": ("bicycle", "bicycles", "bike", "bikes"), "car": ("car", "cars", "vehicle", "vehicles"),
    "motorcycle": ("motorcycle", "motorcycles", "motorbike", "motorbikes", "scooter"),
    "airplane": ("airplane", "airplanes", "plane", "planes", "jet", "jets", "aircraft", "airliner"),
    "bus": ("bus", "buses", "busses"), "train": ("train", "trains", "locomotive"),
    "truck": ("truck", "trucks"), "boat": ("boat", "boats", "ship", "ships", "sailboat", "canoe", "kayak"),
    "traffic light": ("traffic", "stoplight", "light"), "fire hydrant": ("hydrant", "hydrants"),
    "stop sign": ("stop", "sign"), "parking meter": ("meter", "meters"), "bench": ("bench", "benches"),
    "bird": ("bird", "birds", "pigeon", "pigeons", "seagull", "duck", "ducks"), "cat": ("cat", "cats", "kitten", "kitty"),
    "dog": ("dog", "dogs", "puppy", "puppies"), "horse": ("horse", "horses", "pony"),
    "sheep": ("sheep", "lamb", "lambs"), "cow": ("cow", "cows", "cattle", "bull", "calf"),
    "elephant": ("elephant", "elephants"), "bear": ("bear", "bears"), "zebra": ("zebra", "zebras"),
    "giraffe": ("giraffe", "giraffes"), "backpack": ("backpack", "backpacks"), "umbrella": ("umbrella", "umbrellas"),
    "handbag": ("handbag", "handbags", "purse", "bag"), "tie": ("tie", "ties", "necktie"),
    "suitcase": ("suitcase", "suitcases", "luggage"), "frisbee": ("frisbee", "frisbees"),
    "skis": ("skis", "ski"), "snowboard": ("snowboard", "snowboards"), "sports ball": ("ball", "balls", "soccer", "football"),
    "kite": ("kite", "kites"), "baseball bat": ("bat", "bats"), "baseball glove": ("glove", "gloves", "mitt"),
    "skateboard": ("skateboard", "skateboards"), "surfboard": ("surfboard", "surfboards", "board"),
    "tennis racket": ("racket", "racquet", "rackets"), "bottle": ("bottle", "bottles"),
    "wine glass": ("glass", "glasses", "wine"), "cup": ("cup", "cups", "mug", "mugs"), "fork": ("fork", "forks"),
    "knife": ("knife", "knives"), "spoon": ("spoon", "spoons"), "bowl": ("bowl", "bowls"),
    "banana": ("banana", "bananas"), "apple": ("apple", "apples"), "sandwich": ("sandwich", "sandwiches"),
    "orange": ("orange", "oranges"), "broccoli": ("broccoli",), "carrot": ("carrot", "carrots"),
    "hot dog": ("hotdog", "hotdogs"), "pizza": ("pizza", "pizzas"), "donut": ("donut", "donuts", "doughnut", "doughnuts"),
    "cake": ("cake", "cakes", "cupcake"), "chair": ("chair", "chairs"), "couch": ("couch", "couches", "sofa", "sofas"),
    "potted plant": ("plant", "plants"), "bed": ("bed", "beds"), "dining table": ("table", "tables"),
    "toilet": ("toilet", "toilets"), "tv": ("tv", "television", "tvs"), "laptop": ("laptop", "laptops", "computer"),
    "mouse": ("mouse",), "remote": ("remote", "remotes", "controller"), "keyboard": ("keyboard", "keyboards"),
    "cell phone": ("phone", "phones", "cellphone"), "microwave": ("microwave", "microwaves"),
    "oven": ("oven", "ovens", "stove"), "toaster": ("toaster",), "sink": ("sink", "sinks"),
    "refrigerator": ("refrigerator", "fridge", "refrigerators"), "book": ("book", "books"), "clock": ("clock", "clocks"),
    "vase": ("vase", "vases"), "scissors": ("scissors",), "teddy bear": ("teddy",), "hair drier": ("dryer", "drier"),
    "toothbrush": ("toothbrush", "toothbrushes"),
}


@dataclass
class GroundingReport:
    words: int = 0
    score: float = 0.0  # mean attention mass inside the named object's mask
    baseline: float = 0.0  # mean mask area fraction: what uniform attention would score
    per_word: dict[str, list[float]] = field(default_factory=dict)  # word -> masses

    @property
    def ratio(self) -> float:
        return self.score / self.baseline if self.baseline else float("nan")

    def to_json(self) -> dict:
        return {
            "words": self.words,
            "score": round(self.score, 4),
            "uniform_baseline": round(self.baseline, 4),
            "ratio": round(self.ratio, 2),
            "per_word": {w: round(float(np.mean(v)), 4) for w, v in sorted(self.per_word.items())},
        }


class Instances:
    """Instance masks of a COCO-format instances file, looked up by image id."""

    def __init__(self, path: str | Path) -> None:
        from captioner.data.coco import read_coco

        path = Path(path)
        if not path.is_file():
            raise DatasetError(f"{path}: instances file not found")
        self.coco = read_coco(path, "COCO instances file", ("images", "annotations", "categories"))
        try:
            self.category_names = {c["id"]: c["name"] for c in self.coco.dataset["categories"]}
        except (KeyError, TypeError) as e:
            raise DatasetError(f"{path}: not a COCO instances file (a category lacks {e})") from None
        self.path = path

    def objects(self, image_id: int) -> list[dict]:
        return self.coco.loadAnns(self.coco.getAnnIds(imgIds=image_id, iscrowd=None))

    def mask(self, annotation: dict) -> np.ndarray:
        return self.coco.annToMask(annotation).astype(bool)  # (H, W)


def shapes_regions(words: list[str], objects: list[dict], categories: dict[int, str]) -> dict[int, list[dict]]:
    """Word position -> the object a colour or shape word names in the shapes world.

    A colour word names the object whose shape word follows it in the phrase ("red ... circle");
    a shape word the object whose colour word precedes it. Words naming no object of the image
    (a wrong caption) are not scored.
    """
    from captioner.data.shapes import COLOURS, SHAPES

    by_name = {(o["colour"], categories[o["category_id"]]): o for o in objects}
    regions: dict[int, list[dict]] = {}
    for i, word in enumerate(words):
        if word in COLOURS:
            shape = next((w for w in words[i + 1 : i + 3] if w in SHAPES), None)
            if shape and (word, shape) in by_name:
                regions[i] = [by_name[(word, shape)]]
        elif word in SHAPES:
            colour = next((w for w in reversed(words[max(0, i - 2) : i]) if w in COLOURS), None)
            if colour and (colour, word) in by_name:
                regions[i] = [by_name[(colour, word)]]
    return regions


def coco_regions(words: list[str], objects: list[dict], categories: dict[int, str]) -> dict[int, list[dict]]:
    """Word position -> all instances of the COCO category the word (or a synonym) names."""
    word_to_category = {w: name for name, synonyms in COCO_SYNONYMS.items() for w in synonyms}
    by_category: dict[str, list[dict]] = defaultdict(list)
    for o in objects:
        by_category[categories[o["category_id"]]].append(o)
    return {i: by_category[word_to_category[w]] for i, w in enumerate(words) if word_to_category.get(w) in by_category}


def word_regions(caption: Caption, image_id: int, instances: Instances, kind: str = "shapes") -> dict[int, np.ndarray]:
    """Word position -> (H, W) mask of the object(s) that word names, for the scored words."""
    find = shapes_regions if kind == "shapes" else coco_regions
    regions = find(caption.words, instances.objects(image_id), instances.category_names)
    masks = {o["id"]: instances.mask(o) for objs in regions.values() for o in objs}
    return {i: np.logical_or.reduce([masks[o["id"]] for o in objs]) for i, objs in regions.items()}


def grounding_score(
    captions: dict[int, Caption],
    instances: Instances,
    kind: str = "shapes",
    layer: int = -1,
    head: int | None = None,
) -> GroundingReport:
    """Score every object word of every caption against the instance masks."""
    masses, areas = [], []
    per_word: dict[str, list[float]] = defaultdict(list)
    for image_id, caption in captions.items():
        regions = word_regions(caption, image_id, instances, kind)
        if not regions:
            continue
        info = instances.coco.imgs[image_id]
        maps = upsample(caption.heatmaps(layer, head), (info["height"], info["width"]))  # (T, H, W), each sums to 1
        for position, region in regions.items():
            mass = float(maps[position][torch.from_numpy(region)].sum())
            masses.append(mass)
            areas.append(float(region.mean()))
            per_word[caption.words[position]].append(mass)
    if not masses:
        return GroundingReport()
    return GroundingReport(len(masses), float(np.mean(masses)), float(np.mean(areas)), dict(per_word))
