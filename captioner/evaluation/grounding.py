"""Where a caption's attention falls against the objects its words name. The grounding score: the
map is upsampled, summing to 1, and its mass inside the object's mask (a colour or shape word in
shapes, a COCO category word or synonym in COCO) is set beside the masks' mean area fraction. Looking
inside: per-head grounding, the pointing game and Grad-CAM against attention, each grounded word's maps
scored (pointing: a hit when the maximum falls in the mask dilated by `TOLERANCE` px, Zhang et al.
2016) beside exact baselines: a uniform map, a random pixel, the centre. `upsample` brings grid maps to
image resolution, here and for the overlays."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner

# COCO category -> words or phrases that name it (after Neural Baby Talk's lists, trimmed). Words
# that often name something else ("orange", "glass", "sign", "board", "computer") are left out or
# kept only in a phrase. A phrase is scored at its last word, its other words not on their own.
COCO_SYNONYMS: dict[str, tuple[str, ...]] = {
    "person": ("person", "people", "man", "men", "woman", "women", "boy", "boys", "girl", "girls", "child",
               "children", "kid", "kids", "guy", "guys", "lady", "ladies", "player", "players", "skier",
               "skiers", "surfer", "surfers", "skateboarder", "snowboarder", "baby", "persons", "adult", "adults"),
    "bicycle": ("bicycle", "bicycles", "bike", "bikes"), "car": ("car", "cars"),
    "motorcycle": ("motorcycle", "motorcycles", "motorbike", "motorbikes", "scooter"),
    "airplane": ("airplane", "airplanes", "plane", "planes", "jet", "jets", "aircraft", "airliner"),
    "bus": ("bus", "buses", "busses"), "train": ("train", "trains", "locomotive"),
    "truck": ("truck", "trucks"), "boat": ("boat", "boats", "ship", "ships", "sailboat", "canoe", "kayak"),
    "traffic light": ("traffic light", "traffic lights", "stoplight", "stoplights", "stop light", "stop lights"),
    "fire hydrant": ("hydrant", "hydrants"), "stop sign": ("stop sign", "stop signs"),
    "parking meter": ("meter", "meters"), "bench": ("bench", "benches"),
    "bird": ("bird", "birds", "pigeon", "pigeons", "seagull", "duck", "ducks"),
    "cat": ("cat", "cats", "kitten", "kitty"),
    "dog": ("dog", "dogs", "puppy", "puppies"), "horse": ("horse", "horses", "pony"),
    "sheep": ("sheep", "lamb", "lambs"), "cow": ("cow", "cows", "cattle", "bull", "calf"),
    "elephant": ("elephant", "elephants"), "bear": ("bear", "bears"), "zebra": ("zebra", "zebras"),
    "giraffe": ("giraffe", "giraffes"), "backpack": ("backpack", "backpacks"), "umbrella": ("umbrella", "umbrellas"),
    "handbag": ("handbag", "handbags", "purse", "purses"), "tie": ("tie", "ties", "necktie"),
    "suitcase": ("suitcase", "suitcases", "luggage"), "frisbee": ("frisbee", "frisbees"),
    "skis": ("skis",), "snowboard": ("snowboard", "snowboards"),
    "sports ball": ("ball", "balls", "soccer ball", "football", "baseball", "tennis ball"),
    "kite": ("kite", "kites"), "baseball bat": ("bat", "bats", "baseball bat"),
    "baseball glove": ("baseball glove", "baseball mitt", "mitt"),
    "skateboard": ("skateboard", "skateboards"), "surfboard": ("surfboard", "surfboards", "surf board"),
    "tennis racket": ("racket", "racquet", "rackets", "racquets"), "bottle": ("bottle", "bottles"),
    "wine glass": ("wine glass", "wine glasses", "wineglass"), "cup": ("cup", "cups", "mug", "mugs"),
    "fork": ("fork", "forks"), "knife": ("knife", "knives"), "spoon": ("spoon", "spoons"), "bowl": ("bowl", "bowls"),
    "banana": ("banana", "bananas"), "apple": ("apple", "apples"), "sandwich": ("sandwich", "sandwiches"),
    "orange": ("oranges",), "broccoli": ("broccoli",), "carrot": ("carrot", "carrots"),
    "hot dog": ("hot dog", "hot dogs", "hotdog", "hotdogs"), "pizza": ("pizza", "pizzas"),
    "donut": ("donut", "donuts", "doughnut", "doughnuts"),
    "cake": ("cake", "cakes", "cupcake"), "chair": ("chair", "chairs"), "couch": ("couch", "couches", "sofa", "sofas"),
    "potted plant": ("plant", "plants", "potted plant"), "bed": ("bed", "beds"), "dining table": ("table", "tables"),
    "toilet": ("toilet", "toilets"), "tv": ("tv", "television", "tvs"), "laptop": ("laptop", "laptops"),
    "mouse": ("computer mouse",), "remote": ("remote", "remotes", "controller"), "keyboard": ("keyboard", "keyboards"),
    "cell phone": ("phone", "phones", "cellphone", "cell phone"), "microwave": ("microwave", "microwaves"),
    "oven": ("oven", "ovens", "stove"), "toaster": ("toaster",), "sink": ("sink", "sinks"),
    "refrigerator": ("refrigerator", "fridge", "refrigerators"), "book": ("book", "books"),
    "clock": ("clock", "clocks"),
    "vase": ("vase", "vases"), "scissors": ("scissors",), "teddy bear": ("teddy", "teddy bear", "teddy bears"),
    "hair drier": ("hair dryer", "hair drier", "blow dryer"), "toothbrush": ("toothbrush", "toothbrushes"),
}
# Phrase (as a word tuple) -> category, longest phrases first so that they win over their words.
_COCO_PHRASES: list[tuple[tuple[str, ...], str]] = sorted(
    ((tuple(phrase.split()), name) for name, phrases in COCO_SYNONYMS.items() for phrase in phrases),
    key=lambda item: -len(item[0]),
)


@dataclass
class GroundingReport:
    words: int = 0
    score: float = 0.0  # mean attention mass inside the named object's mask
    baseline: float = 0.0  # mean mask area fraction: what uniform attention would score
    per_word: dict[str, list[float]] = field(default_factory=dict)  # word -> masses
    per_category: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # category -> (mass, area)s

    @property
    def ratio(self) -> float:
        return self.score / self.baseline if self.baseline else float("nan")

    def to_json(self) -> dict:
        return {"words": self.words, "score": round(self.score, 4), "uniform_baseline": round(self.baseline, 4),
                "ratio": round(self.ratio, 2),
                "per_category": {name: _summary(pairs) for name, pairs in sorted(self.per_category.items())},
                "per_word": {w: round(float(np.mean(v)), 4) for w, v in sorted(self.per_word.items())}}


def _summary(pairs: list[tuple[float, float]]) -> dict:
    """Words, score, baseline and ratio of one category's scored words."""
    score, baseline = (float(np.mean(column)) for column in zip(*pairs))
    ratio = round(score / baseline, 2) if baseline else None
    return {"words": len(pairs), "score": round(score, 4), "uniform_baseline": round(baseline, 4), "ratio": ratio}


class Instances:
    """Instance masks of a COCO-format instances file, looked up by image id."""

    def __init__(self, path: str | Path) -> None:
        from captioner.data.coco import read_coco

        path = Path(path)
        # read_coco checks that the file is there, and every image, category and annotation this class relies on.
        self.coco = read_coco(path, "COCO instances file", ("images", "annotations", "categories"))
        self.category_names = {c["id"]: c["name"] for c in self.coco.dataset["categories"]}
        self.path = path

    def objects(self, image_id: int) -> list[dict]:
        return self.coco.loadAnns(self.coco.getAnnIds(imgIds=image_id, iscrowd=None))

    def mask(self, annotation: dict) -> np.ndarray:
        return self.coco.annToMask(annotation).astype(bool)  # (H, W)


def shapes_regions(words: list[str], objects: list[dict], categories: dict[int, str]) -> dict[int, list[dict]]:
    """Word position -> the object a colour word (with the shape word after it) or a shape word
    (with the colour word before it) names; words naming no object of the image are not scored."""
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
    """Word position -> all instances of the COCO category the word or phrase names; a phrase
    ("hot dog", "stop sign") is scored at its last word and its other words not at all."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    for o in objects:
        by_category[categories[o["category_id"]]].append(o)
    regions: dict[int, list[dict]] = {}
    taken: set[int] = set()
    for phrase, name in _COCO_PHRASES:
        n = len(phrase)
        for start in range(len(words) - n + 1):
            span = range(start, start + n)
            if tuple(words[start : start + n]) == phrase and not taken.intersection(span):
                taken.update(span)
                if name in by_category:
                    regions[start + n - 1] = by_category[name]
    return dict(sorted(regions.items()))


def _object_regions(caption: Caption, image_id: int, instances: Instances, kind: str) -> dict[int, list[dict]]:
    find = shapes_regions if kind == "shapes" else coco_regions
    return find(caption.words, instances.objects(image_id), instances.category_names)


def word_regions(caption: Caption, image_id: int, instances: Instances, kind: str = "shapes") -> dict[int, np.ndarray]:
    """Word position -> (H, W) mask of the object(s) that word names, for the scored words."""
    regions = _object_regions(caption, image_id, instances, kind)
    masks = {o["id"]: instances.mask(o) for objs in regions.values() for o in objs}
    return {i: np.logical_or.reduce([masks[o["id"]] for o in objs]) for i, objs in regions.items()}


@functools.lru_cache(maxsize=64)
def linear_weights(source: int, target: int) -> torch.Tensor:
    """The (target, source) matrix R for which R @ v is F.interpolate's linear resize of v."""
    position = ((torch.arange(target, dtype=torch.float64) + 0.5) * (source / target) - 0.5).clamp_min(0)  # (target,)
    low = position.floor().long().clamp_max(source - 1)  # (target,)
    high = (low + 1).clamp_max(source - 1)  # (target,): the last point's neighbour is itself
    share = position - low  # (target,): the weight of `high`
    rows = torch.arange(target)
    weights = torch.zeros(target, source, dtype=torch.float64)
    weights.index_put_((rows, low), 1 - share, accumulate=True)
    weights.index_put_((rows, high), share, accumulate=True)
    return weights.float()


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(T, h, w) grid weights -> (T, H, W) maps at image resolution, each summing to 1: F.interpolate's
    bilinear map as two small products, faster (docs/results/bench_demo.json)."""
    rows = linear_weights(maps.shape[1], size[0]).to(maps.device)  # (H, h)
    columns = linear_weights(maps.shape[2], size[1]).to(maps.device)  # (W, w)
    maps = rows @ (maps.float() @ columns.T)  # (T, h, W) -> (T, H, W)
    # In place: page-faulting a fresh (T, H, W) buffer costs more than the arithmetic.
    maps.clamp_min_(0)
    return maps.div_(maps.sum(dim=(1, 2), keepdim=True).clamp_min_(1e-12))


def grounding_score(captions: dict[int, Caption], instances: Instances, kind: str = "shapes", layer: int = -1,
                    head: int | None = None) -> GroundingReport:
    """Score every object word of every caption against the instance masks, overall, per word
    and per category (the category of the object the word names)."""
    masses, areas = [], []
    per_word: dict[str, list[float]] = defaultdict(list)
    per_category: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for image_id, caption in captions.items():
        objects = _object_regions(caption, image_id, instances, kind)
        if not objects:
            continue
        regions = word_regions(caption, image_id, instances, kind)
        info = instances.coco.imgs[image_id]
        maps = upsample(caption.heatmaps(layer, head), (info["height"], info["width"]))  # (T, H, W), each sums to 1
        for position, region in regions.items():
            mass = float(maps[position][torch.from_numpy(region)].sum())
            area = float(region.mean())
            masses.append(mass)
            areas.append(area)
            per_word[caption.words[position]].append(mass)
            per_category[instances.category_names[objects[position][0]["category_id"]]].append((mass, area))
    if not masses:
        return GroundingReport()
    return GroundingReport(len(masses), float(np.mean(masses)), float(np.mean(areas)), dict(per_word),
                           dict(per_category))


TOLERANCE = 15  # pixels: the pointing game's usual tolerance


def dilate(mask: torch.Tensor, radius: int = TOLERANCE) -> torch.Tensor:
    """(H, W) bool -> (H, W) bool: every pixel within `radius` (Euclidean) of the mask."""
    r = torch.arange(-radius, radius + 1, dtype=torch.float32)
    disk = ((r[:, None] ** 2 + r[None, :] ** 2) <= radius**2).float()  # (2r+1, 2r+1)
    hits = F.conv2d(mask.float()[None, None], disk[None, None], padding=radius)[0, 0]  # (H, W)
    return hits > 0.5


def pointing_hits(maps: torch.Tensor, dilated: torch.Tensor) -> torch.Tensor:
    """maps (M, H, W) at image resolution, dilated (H, W) bool -> (M,) hit in [0, 1] per map; with
    ties, the fraction of the tied maxima in the mask (the expected hit of a uniform tie-break)."""
    flat = maps.flatten(1)  # (M, H*W)
    top = flat.max(dim=1, keepdim=True).values  # (M, 1)
    at_max = flat >= top - 1e-7 * top.abs().clamp_min(1e-12)  # (M, H*W): float noise counts as a tie
    inside = dilated.flatten()[None]  # (1, H*W)
    return (at_max & inside).sum(dim=1).float() / at_max.sum(dim=1).float()  # (M,)


@dataclass
class MapScores:
    """Grounding and pointing over the grounded words of one kind of map."""

    masses: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"grounding": round(float(np.mean(self.masses)), 4), "pointing": round(float(np.mean(self.hits)), 4)}


@dataclass
class InterpretReport:
    """Every map kind's grounding and pointing, beside the baselines, over the same words."""

    areas: list[float] = field(default_factory=list)  # per scored word, its mask area fraction: uniform grounding
    random_hits: list[float] = field(default_factory=list)  # dilated area fraction: a random point
    centre_hits: list[float] = field(default_factory=list)  # the image centre in the dilated mask
    maps: dict[str, MapScores] = field(default_factory=dict)  # "L0H1", "L0 mean", "mean", "gradcam"

    def best_head(self) -> str | None:
        """The (layer, head) with the highest pointing hit rate, ties by grounding."""
        heads = [name for name in self.maps if name.startswith("L") and "mean" not in name]
        if len(heads) < 2:  # one map a word (the LSTM): nothing to choose
            return None
        return max(heads, key=lambda n: (np.mean(self.maps[n].hits), np.mean(self.maps[n].masses)))

    def to_json(self) -> dict:
        if not self.areas:
            return {"words": 0}
        return {
            "words": len(self.areas),
            "pointing_tolerance_px": TOLERANCE,
            "baselines": {
                "uniform_grounding": round(float(np.mean(self.areas)), 4),
                "random_point": round(float(np.mean(self.random_hits)), 4),
                "centre_point": round(float(np.mean(self.centre_hits)), 4),
                "how": "exact: mask area fraction, dilated-mask area fraction, centre pixel in the dilated mask",
            },
            "maps": {name: scores.to_json() for name, scores in self.maps.items()},
            "best_head": self.best_head(),
        }


def map_kinds(caption: Caption) -> dict[str, torch.Tensor]:
    """Every attention map kind of a caption: name -> (T, h, w)."""
    attn = caption.attn  # (T, L, H, h, w)
    L, H = attn.shape[1:3]
    kinds = {f"L{l}H{h}": attn[:, l, h] for l in range(L) for h in range(H)}  # (T, h, w) each
    if H > 1:
        kinds |= {f"L{l} mean": attn[:, l].mean(dim=1) for l in range(L)}  # (T, h, w) each
    if L * H > 1:
        kinds["mean"] = attn.flatten(1, 2).mean(dim=1)  # (T, h, w)
    return kinds


def interpret_scores(captions: dict[int, Caption], instances: Instances, kind: str = "shapes",
                     saliency: dict[int, dict[int, torch.Tensor]] | None = None) -> InterpretReport:
    """Score every attention map kind (and `saliency[image_id][word position]` (h, w) maps,
    reported as "gradcam") on every grounded word of every caption."""
    report = InterpretReport()
    for image_id, caption in captions.items():
        regions = word_regions(caption, image_id, instances, kind)
        if not regions:
            continue
        info = instances.coco.imgs[image_id]
        size = (info["height"], info["width"])
        positions = sorted(regions)
        masks = [torch.from_numpy(regions[p]) for p in positions]  # (H, W) each
        grown = [dilate(mask) for mask in masks]  # once per word, for every map kind
        for name, maps in map_kinds(caption).items():
            _score(report.maps.setdefault(name, MapScores()), maps[positions], masks, grown, size)
        if saliency is not None:
            cams = torch.stack([saliency[image_id][p] for p in positions])  # (W, h, w)
            _score(report.maps.setdefault("gradcam", MapScores()), cams, masks, grown, size)
        centre = (size[0] // 2, size[1] // 2)
        for mask, dilated in zip(masks, grown):
            report.areas.append(float(mask.float().mean()))
            report.random_hits.append(float(dilated.float().mean()))
            report.centre_hits.append(float(dilated[centre]))
    return report


def _score(scores: MapScores, maps: torch.Tensor, masks: list[torch.Tensor], grown: list[torch.Tensor],
           size: tuple[int, int]) -> None:
    """maps (W, h, w) of W words, their masks and dilated masks (H, W) each: add each word's
    grounding and pointing hit."""
    image_maps = upsample(maps, size)  # (W, H, W), each sums to 1
    for image_map, region, dilated in zip(image_maps, masks, grown):
        scores.masses.append(float(image_map[region].sum()))
        scores.hits.append(float(pointing_hits(image_map[None], dilated)[0]))


def grad_cam(score: Callable[[torch.Tensor], torch.Tensor], feats: torch.Tensor) -> torch.Tensor:
    """Grad-CAM over a grid: feats (R, N, D), score(feats) -> (R,) (row r's from row r's features
    only) -> (R, N) maps ReLU(sum_c a_c A_nc), a_c = 1/N sum_n dS/dA_nc (Selvaraju et al. 2017)."""
    feats = feats.detach().requires_grad_(True)
    with torch.enable_grad():
        scores = score(feats)  # (R,)
        (grads,) = torch.autograd.grad(scores.sum(), feats)  # (R, N, D): rows are independent
    weights = grads.mean(dim=1, keepdim=True)  # (R, 1, D)
    return F.relu((weights * feats.detach()).sum(dim=-1))  # (R, N)


def caption_grad_cam(model: Captioner, feats: torch.Tensor, caption: Caption,
                     positions: list[int]) -> dict[int, torch.Tensor]:
    """Grad-CAM of log p(word_t | words before t, image) for each t in `positions`, the decoder run
    teacher-forced on the caption: feats (N, D) -> position -> (h, w) map."""
    if not positions:
        return {}
    h, w = caption.attn.shape[-2:]
    device = feats.device
    tokens = torch.tensor([model.vocab.bos_id, *caption.tokens], device=device)[None]  # (1, T+1)
    rows = len(positions)
    index = torch.tensor(positions, device=device)  # (R,)
    words = torch.tensor(caption.tokens, device=device)[index]  # (R,)
    was_training = model.training
    model.eval()  # no dropout: the same function that produced the caption

    def score(grid: torch.Tensor) -> torch.Tensor:
        out = model.decoder(grid, tokens.expand(rows, -1))  # logits (R, T+1, V)
        logprobs = out.logits.float().log_softmax(dim=-1)  # (R, T+1, V)
        return logprobs[torch.arange(rows, device=device), index, words]  # (R,): row r's word at its position

    try:
        cams = grad_cam(score, feats[None].expand(rows, -1, -1).contiguous())  # (R, N)
    finally:
        model.train(was_training)
    return {p: cam.reshape(h, w).cpu() for p, cam in zip(positions, cams)}  # (h, w) each


def records_grad_cam(model: Captioner, records: list, captions: dict[int, Caption], instances: Instances,
                     kind: str = "shapes", batch_size: int = 32) -> dict[int, dict[int, torch.Tensor]]:
    """image id -> word position -> (h, w) Grad-CAM map, for the grounded words of each
    caption. The images are encoded again (the encoder has no attention to disagree with)."""
    from captioner.data.batching import image_loader

    wanted = [r for r in records if r.image_id in captions]
    out: dict[int, dict[int, torch.Tensor]] = {}
    for images, indices in filter(None, image_loader(wanted, model.transform, batch_size)):
        with torch.no_grad():
            feats, _ = model.encode(images.to(model.device))  # (B, N, D)
        for row, i in enumerate(indices.tolist()):
            image_id = wanted[i].image_id
            positions = sorted(word_regions(captions[image_id], image_id, instances, kind))
            out[image_id] = caption_grad_cam(model, feats[row], captions[image_id], positions)
    return out
