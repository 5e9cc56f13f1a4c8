"""Looking inside a caption: per-head grounding, the pointing game and Grad-CAM against attention.
Each grounded word's maps are scored (pointing: a hit when the maximum falls in the mask dilated by
`TOLERANCE` px, Zhang et al. 2016) beside exact baselines: a uniform map, a random pixel, the centre."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from captioner.evaluation.grounding import Instances, upsample, word_regions
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner

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
    for batch in image_loader(wanted, model.transform, batch_size):
        if batch is None:
            continue
        images, indices = batch
        with torch.no_grad():
            feats, _ = model.encode(images.to(model.device))  # (B, N, D)
        for row, i in enumerate(indices.tolist()):
            image_id = wanted[i].image_id
            positions = sorted(word_regions(captions[image_id], image_id, instances, kind))
            out[image_id] = caption_grad_cam(model, feats[row], captions[image_id], positions)
    return out
