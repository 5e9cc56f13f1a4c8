"""`captioner data stats`: images, captions, caption lengths and vocabulary size of a dataset."""

from __future__ import annotations

from collections import Counter

import numpy as np

from captioner.data.records import ImageRecord
from captioner.text.vocab import tokenize


def dataset_stats(records: list[ImageRecord], min_count: int = 5) -> dict[str, float]:
    """Each caption is tokenised once (the tokenizer is most of the time: 200,000 COCO captions)."""
    tokens = [tokenize(c) for r in records for c in r.captions]
    lengths = np.array([len(t) for t in tokens])
    counts = Counter(word for caption in tokens for word in caption)
    stats: dict[str, float] = {
        "images": len(records),
        "captions": int(lengths.size),
        "captions per image": lengths.size / max(1, len(records)),
        "words (all)": len(counts),
        # the words Vocabulary.build keeps, without <pad> <bos> <eos> <unk>
        f"vocabulary (min count {min_count})": sum(c >= min_count for c in counts.values()),
    }
    if lengths.size:
        for p in (5, 25, 50, 75, 95, 99):
            stats[f"caption length p{p}"] = float(np.percentile(lengths, p))
        stats["caption length max"] = int(lengths.max())
    return stats


def format_table(rows: dict[str, float], title: str) -> str:
    width = max(len(k) for k in rows)
    lines = [title, "-" * (width + 14)]
    for key, value in rows.items():
        text = f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
        lines.append(f"{key:<{width}}  {text:>12}")
    return "\n".join(lines)
