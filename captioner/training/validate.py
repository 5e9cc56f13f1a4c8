"""Validation on the model's own captions, scored with the fast BLEU/CIDEr-D.

best.pt is chosen by this, never by a teacher-forced loss.
"""

from __future__ import annotations

import torch

from captioner.data.records import ImageRecord
from captioner.data.store_reader import StoreRows
from captioner.evaluation.evaluate import caption_records, references_for
from captioner.evaluation.metrics import fast_scores
from captioner.models.captioner import Captioner
from captioner.training.distributed import Distributed


def validate(
    model: Captioner,
    ctx: Distributed,
    records: list[ImageRecord],
    features: torch.Tensor | StoreRows | None,
    grid: tuple[int, int] | None,
    num_workers: int,
    beam_size: int = 1,
) -> tuple[dict[str, float], str]:
    """Greedy (or beam) captions of the val images, each rank its share, scored on the gathered
    whole (every rank gets the same scores); returns the scores and one example caption."""
    mine = ctx.shard(list(range(len(records))))
    captions = caption_records(
        model, [records[i] for i in mine], beam_size=beam_size, features=None if features is None else features[mine],
        grid=grid, num_workers=num_workers, progress=False,
    )
    texts = {image_id: c.text for image_id, c in captions.items()}
    merged = {k: v for part in ctx.all_gather(texts) for k, v in part.items()}
    return fast_scores(references_for(records, merged), merged), next(iter(merged.values()), "")
