"""Captioning the requests that arrive together in one batch: one encoder pass, one beam search.
While a batch decodes, arriving images wait; then one waiting thread decodes all of the same model and options
(up to `max_batch`): a few large batches instead of many single images fighting over the cores."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from captioner.apps.demo.decoding import Decoder, LocalDecoder
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner
from captioner.models.model_origin import introduce

MAX_BATCH = 8  # past this, on two cores, a batch adds latency more than throughput (benchmarks demo_load)


@dataclass(eq=False)  # jobs are told apart by identity
class Job:
    """One image to caption, and where its caption (or the error decoding raised) goes."""

    model: Captioner
    image: Image.Image
    options: dict[str, Any]
    key: tuple = field(init=False)  # jobs with equal keys can share a batch
    result: Caption | BaseException | None = None
    done: bool = False

    def __post_init__(self) -> None:
        self.key = (id(self.model), tuple(sorted(self.options.items())))


class CaptionBatcher:
    """Batches the images of concurrent callers; `caption` returns each caller's own caption. `decoder` decodes each
    batch (default: in the thread that formed it)."""

    def __init__(self, max_batch: int = MAX_BATCH, decoder: Decoder | None = None) -> None:
        self.max_batch = max_batch
        self.decoder = decoder or LocalDecoder([])
        self.batch_sizes: Counter[int] = Counter()  # how many batches of each size ran
        self._pending: list[Job] = []
        self._decoding = False
        self._changed = threading.Condition()

    def caption(self, model: Captioner, image: Image.Image, **options: Any) -> Caption:
        """`model.caption(image, **options)`, decoded with the images other threads ask for meanwhile."""
        introduce(model.origins, image)
        job = Job(model, image, options)
        with self._changed:
            self._pending.append(job)
        while True:
            with self._changed:
                while not job.done and self._decoding:
                    self._changed.wait()
                if job.done:
                    break
                # Nothing decodes: this thread decodes the oldest batch of its key, which may leave this job
                # out (more than max_batch waiting): loop until a batch has served it.
                self._decoding = True
                batch = [pending for pending in self._pending if pending.key == job.key][: self.max_batch]
                self._pending = [pending for pending in self._pending if pending not in batch]
            try:
                self.run(batch)
            finally:
                with self._changed:
                    self._decoding = False
                    self._changed.notify_all()
        if isinstance(job.result, BaseException):
            raise job.result
        assert job.result is not None
        return job.result

    def run(self, batch: list[Job]) -> None:
        """Decode `batch` (one model, one set of options) in one call: each job gets its caption, or all the error."""
        first = batch[0]
        try:
            captions: list[Caption | BaseException] = list(self.decoder.caption(first.model,
                                                                                [job.image for job in batch],
                                                                                **first.options))
        except Exception as e:  # noqa: BLE001 - handed to every caller, who raises it
            captions = [e] * len(batch)
        with self._changed:
            self.batch_sizes[len(batch)] += 1
            for job, caption in zip(batch, captions):
                job.result, job.done = caption, True
