"""Caption metrics: the official COCO evaluation, and a fast in-process subset for validation.

`official_scores` runs pycocoevalcap's own scorers exactly as its `COCOEvalCap` does (Java PTB
tokenizer, BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and optionally SPICE), so the numbers are the ones
papers and the COCO server report. It needs a Java runtime. `fast_scores` computes BLEU and
CIDEr-D in process with the pure-Python tokenizer of `captioner.text.vocab`, for training-time
validation where starting Java for every epoch would cost more than the scoring.

pycocoevalcap prints progress to stdout and lets its Java tools write to stderr; here that output
is captured and sent to this module's logger at DEBUG level, so callers control what is shown.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from captioner.core.errors import CaptionerError, DatasetError
from captioner.data.records import is_int, read_json
from captioner.text.vocab import tokenize

logger = logging.getLogger(__name__)

References = dict[int, list[str]]
"""Image id -> its reference (human) captions."""
Predictions = dict[int, str]
"""Image id -> the one predicted caption."""

BLEU_KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")
OFFICIAL_KEYS = (*BLEU_KEYS, "METEOR", "ROUGE_L", "CIDEr")
SPICE_KEY = "SPICE"

JAVA_MISSING = (
    "Java not found: the official COCO metrics (PTB tokenizer, METEOR, SPICE) need a Java 8+ "
    "runtime on PATH, e.g. apt-get install default-jre"
)

# SPICE's model download (pycocoevalcap.spice.get_stanford_models, about 400 MB) has no timeout of
# its own; it runs in a child process bounded by these, after a quick reachability probe so that an
# offline machine gives up in seconds rather than waiting for the whole download bound.
SPICE_PROBE_TIMEOUT_S = 20.0
SPICE_DOWNLOAD_TIMEOUT_S = 1800.0

# Java 9+ refuses the reflection that SPICE's parse cache (FST serialisation of Strings and
# ArrayLists, with FST's default class registry) relies on, and SPICE then dies with
# InaccessibleObjectException before scoring anything. Opening these packages to the unnamed
# module is the smallest set that lets the cache work on Java 17 (found by running SPICE's
# LmdbTupleDB alone); Java 8 ignores JDK_JAVA_OPTIONS.
_SPICE_JAVA_OPTIONS = " ".join(
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in ("java.lang", "java.math", "java.util", "java.util.concurrent", "java.net", "java.text")
)

# Characters that end a line for the Java PTB tokenizer (-preserveLines) besides "\n", which
# pycocoevalcap already replaces. One inside a caption would shift every later caption onto the
# wrong image, so they become spaces; captions without them are passed on unchanged.
_LINE_BREAKS = re.compile("[\r\u2028\u2029\x0b\x0c\x85]")


# --------------------------------------------------------------------------------------------
# Loading references and results
# --------------------------------------------------------------------------------------------


def load_references(path: str | os.PathLike[str]) -> References:
    """Read a COCO-format caption annotation file into image id -> reference captions.

    The file is `{"images": [...], "annotations": [{"image_id": int, "caption": str, ...}]}`;
    only "annotations" is needed (an image listed without captions cannot be scored against).
    """
    path = Path(path)
    data = read_json(path, "annotation file")
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a COCO caption annotation object, got a JSON {type(data).__name__}")
    annotations = data.get("annotations")
    if annotations is None:
        raise DatasetError(f'{path}: missing "annotations" (not a COCO caption annotation file?)')
    if not isinstance(annotations, list):
        raise DatasetError(f'{path}: "annotations" must be a list, got {type(annotations).__name__}')
    if "images" in data and not isinstance(data["images"], list):
        raise DatasetError(f'{path}: "images" must be a list, got {type(data["images"]).__name__}')
    references: References = {}
    for i, ann in enumerate(annotations):
        if not isinstance(ann, dict):
            raise DatasetError(f"{path}: annotations[{i}] is not an object")
        for field in ("image_id", "caption"):
            if field not in ann:
                raise DatasetError(f'{path}: annotations[{i}] has no "{field}"')
        if not is_int(ann["image_id"]):
            raise DatasetError(f'{path}: annotations[{i}]: "image_id" must be an integer, got {ann["image_id"]!r}')
        if not isinstance(ann["caption"], str):
            raise DatasetError(f'{path}: annotations[{i}]: "caption" must be a string, got {ann["caption"]!r}')
        references.setdefault(ann["image_id"], []).append(ann["caption"])
    if not references:
        raise DatasetError(f"{path}: no caption annotations")
    return references


def load_results(path: str | os.PathLike[str], references: Mapping[int, list[str]]) -> Predictions:
    """Read a COCO results file (`[{"image_id": int, "caption": str}, ...]`), checked against the
    annotations: every image must be annotated, appear once, and have a non-empty caption."""
    path = Path(path)
    data = read_json(path, "results file")
    expected = 'a JSON list of {"image_id": int, "caption": str} objects'
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected {expected}, got a JSON {type(data).__name__}")
    if not data:
        raise DatasetError(f"{path}: no results (empty list)")
    predictions: Predictions = {}
    first_item: dict[int, int] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DatasetError(f"{path}: item {i} is a {type(item).__name__}, expected {expected}")
        for field in ("image_id", "caption"):
            if field not in item:
                raise DatasetError(f'{path}: item {i} has no "{field}" (expected {expected})')
        image_id, caption = item["image_id"], item["caption"]
        if not is_int(image_id):
            raise DatasetError(f'{path}: item {i}: "image_id" must be an integer, got {image_id!r}')
        if not isinstance(caption, str):
            raise DatasetError(f'{path}: item {i} (image {image_id}): "caption" must be a string, got {caption!r}')
        if not caption.strip():
            raise DatasetError(f"{path}: item {i} (image {image_id}) has an empty caption")
        if image_id in first_item:
            raise DatasetError(
                f"{path}: image {image_id} has more than one caption (items {first_item[image_id]} and {i}); "
                "the COCO evaluation expects exactly one per image"
            )
        first_item[image_id] = i
        predictions[image_id] = caption
    unknown = [image_id for image_id in predictions if image_id not in references]
    if unknown:
        shown = ", ".join(str(image_id) for image_id in unknown[:5])
        more = ", ..." if len(unknown) > 5 else ""
        raise DatasetError(
            f"{path}: {len(unknown)} of {len(predictions)} image ids are not in the annotations "
            f"({shown}{more}); wrong annotation file or split?"
        )
    return predictions


def _check_predictions(references: Mapping[int, list[str]], predictions: Mapping[int, str]) -> list[int]:
    """The predicted image ids, sorted, after checking each has references."""
    if not predictions:
        raise DatasetError("no predictions to score")
    missing = [image_id for image_id in predictions if not references.get(image_id)]
    if missing:
        shown = ", ".join(str(image_id) for image_id in missing[:5])
        raise DatasetError(f"{len(missing)} predicted image ids have no reference captions ({shown})")
    # Sorted because pycocoevalcap's SPICE returns per-image scores in sorted id order while
    # COCOEvalCap pairs them with the ids in dict order; with sorted keys every scorer agrees.
    # No corpus score depends on the order.
    return sorted(predictions)


# --------------------------------------------------------------------------------------------
# Java and its noisy tools
# --------------------------------------------------------------------------------------------


def check_java() -> str:
    """Check that `java` is on PATH, runs, and is version 8 or newer; return its version line."""
    java = shutil.which("java")
    if java is None:
        raise CaptionerError(JAVA_MISSING)
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CaptionerError(
            f"Java at {java} does not run ({e}); the official COCO metrics need a Java 8+ runtime"
        ) from None
    output = (proc.stderr or "") + (proc.stdout or "")
    if proc.returncode != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        raise CaptionerError(
            f"Java at {java} fails to start ({last[0]}); the official COCO metrics need a Java 8+ runtime"
        )
    first = output.strip().splitlines()[0] if output.strip() else "unknown version"
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_242" is Java 8
            major = int(match.group(2))
        if major < 8:
            raise CaptionerError(f"Java at {java} is too old ({first}); the official COCO metrics need Java 8 or newer")
    return first


def _log_output(name: str, output: str | bytes | None) -> None:
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    for line in (output or "").splitlines():
        if line.strip():
            logger.debug("%s: %s", name, line.rstrip())


class _LoggedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """Popen that also pipes stderr (unless told otherwise) and logs it when communicate() ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stderr", subprocess.PIPE)
        super().__init__(*args, **kwargs)

    def communicate(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out, err = super().communicate(*args, **kwargs)
        _log_output("java", err)
        return out, err


def _spice_check_call(cmd: list[str], **kwargs: Any) -> int:
    """Stand-in for `subprocess.check_call` in pycocoevalcap's SPICE wrapper: same command, with
    its output captured into the log, the Java 9+ options, and a one-line error if it fails."""
    env = dict(kwargs.pop("env", None) or os.environ)
    env["JDK_JAVA_OPTIONS"] = f"{env.get('JDK_JAVA_OPTIONS', '')} {_SPICE_JAVA_OPTIONS}".strip()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, **kwargs)
    _log_output("spice", proc.stdout)
    _log_output("spice", proc.stderr)
    if proc.returncode != 0:
        # pycocoevalcap removes its temporary input/output files only on success.
        cwd = Path(kwargs.get("cwd") or ".")
        for arg in cmd:
            candidate = cwd / arg
            if candidate.parent.name == "tmp" and candidate.is_file():
                candidate.unlink(missing_ok=True)
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip() and not line.startswith("NOTE:")]
        causes = [line for line in lines if line.startswith("Caused by:")] or [
            line for line in lines if "Exception" in line or "Error" in line
        ]
        reason = (causes or lines or ["no error output"])[-1]
        raise CaptionerError(f"SPICE failed (java exit status {proc.returncode}): {reason}")
    return 0


@contextlib.contextmanager
def _quiet_pycocoevalcap() -> Iterator[io.StringIO]:
    """Capture pycocoevalcap's prints and its Java tools' stderr for the duration.

    pycocoevalcap calls `subprocess.Popen`/`check_call` through the module name `subprocess` in
    its tokenizer and SPICE modules, so swapping that name there reroutes only those calls. Not
    thread-safe: do not score from two threads at once.
    """
    from pycocoevalcap.spice import spice as spice_module
    from pycocoevalcap.tokenizer import ptbtokenizer

    quiet = types.SimpleNamespace(PIPE=subprocess.PIPE, Popen=_LoggedPopen, check_call=_spice_check_call)
    saved = ptbtokenizer.subprocess, spice_module.subprocess
    ptbtokenizer.subprocess = quiet  # type: ignore[assignment]
    spice_module.subprocess = quiet  # type: ignore[assignment]
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            yield stdout
    finally:
        ptbtokenizer.subprocess, spice_module.subprocess = saved
        _log_output("pycocoevalcap", stdout.getvalue())


# --------------------------------------------------------------------------------------------
# SPICE's Stanford CoreNLP models
# --------------------------------------------------------------------------------------------


def _spice_lib_dir() -> Path:
    """Where pycocoevalcap's SPICE jar looks for CoreNLP (its manifest's Class-Path: lib/...)."""
    from pycocoevalcap.spice import get_stanford_models as gsm

    return Path(gsm.SPICEDIR).resolve() / gsm.SPICELIB


def _spice_model_files() -> list[Path]:
    from pycocoevalcap.spice import get_stanford_models as gsm

    lib = _spice_lib_dir()
    return [lib / f"{gsm.JAR}.jar", lib / f"{gsm.JAR}-models.jar"]


def _spice_models_url() -> str:
    # The address pycocoevalcap.spice.get_stanford_models downloads from.
    from pycocoevalcap.spice import get_stanford_models as gsm

    return f"http://nlp.stanford.edu/software/{gsm.CORENLP}.zip"


def missing_spice_models() -> list[Path]:
    """The Stanford CoreNLP jars SPICE needs that are not installed (empty when SPICE can run)."""
    return [path for path in _spice_model_files() if not path.is_file()]


_PROBE = (
    "import sys, urllib.request as u; "
    "u.urlopen(u.Request(sys.argv[1], method='HEAD'), timeout=float(sys.argv[2])).close()"
)


def _probe_spice_models_url() -> str | None:
    """None if the download address answers, else why not. In a child process so that even a
    hanging name lookup is bounded."""
    url = _spice_models_url()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, url, str(SPICE_PROBE_TIMEOUT_S / 2)],
            capture_output=True, text=True, timeout=SPICE_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{url} did not answer within {SPICE_PROBE_TIMEOUT_S:.0f} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"{url} is unreachable ({last})"
    return None


def _download_spice_models() -> str | None:
    """Run pycocoevalcap's own downloader, bounded in time; None on success, else why not."""
    code = "from pycocoevalcap.spice.get_stanford_models import get_stanford_models; get_stanford_models()"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=SPICE_DOWNLOAD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"the download did not finish within {SPICE_DOWNLOAD_TIMEOUT_S:.0f} s"
    _log_output("get_stanford_models", proc.stdout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"the download failed ({last})"
    return None


def ensure_spice_models() -> bool:
    """True if SPICE's CoreNLP models are installed, downloading them (bounded) if need be.

    When they are missing and cannot be had, log one warning that says so and how to get them.
    """
    missing = missing_spice_models()
    if not missing:
        return True
    lib = _spice_lib_dir()
    if len(missing) == 1 and missing[0].name.endswith("-models.jar"):
        # pycocoevalcap's downloader checks only the code jar, so it would never fetch this one.
        reason = f"{missing[0].name} is missing (an interrupted download?)"
    else:
        logger.info("SPICE needs the Stanford CoreNLP 3.6.0 models (about 400 MB, downloaded once) in %s", lib)
        reason = _probe_spice_models_url() or _download_spice_models()
        if reason is None and not missing_spice_models():
            return True
        reason = reason or f"the download did not produce {', '.join(p.name for p in missing_spice_models())}"
    logger.warning(
        "SPICE skipped: the Stanford CoreNLP 3.6.0 models are not in %s and could not be downloaded: %s. "
        "To enable it, run `python -m pycocoevalcap.spice.get_stanford_models` with internet access, or copy "
        "%s and %s from %s into that folder",
        lib, reason, *(p.name for p in _spice_model_files()), _spice_models_url(),
    )
    return False


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------


def _one_line(caption: str) -> str:
    return _LINE_BREAKS.sub(" ", caption)


def ptb_tokenize(captions: list[str]) -> list[list[str]]:
    """Each caption's tokens as the official evaluation scores them: pycocoevalcap's Java PTB
    tokenizer and punctuation removal, run once over all of them. Needs Java."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    check_java()
    with _quiet_pycocoevalcap():
        out = PTBTokenizer().tokenize({i: [{"caption": _one_line(c)}] for i, c in enumerate(captions)})
    if len(out) != len(captions):
        raise CaptionerError("the Java PTB tokenizer returned the wrong number of captions (see the DEBUG log)")
    return [out[i][0].split() for i in range(len(captions))]


def official_scores(
    references: Mapping[int, list[str]], predictions: Mapping[int, str], spice: bool = False
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Score `predictions` with pycocoevalcap exactly as its `COCOEvalCap.evaluate` does.

    Only the predicted images are scored (as in the official demo, `params['image_id'] =
    cocoRes.getImgIds()`), each against all its references. Returns the overall scores and the
    per-image scores, keyed Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr and, when `spice` is true and
    SPICE's CoreNLP models are installed (or can be downloaded), SPICE (its "All" F-score).

    "CIDEr" is pycocoevalcap's CIDEr, which is the CIDEr-D variant (clipped n-gram counts, length
    penalty, sigma 6) that the COCO evaluation server reports, scaled like it (so 0.6, not 60).

    Needs Java 8+ on PATH (PTB tokenizer, METEOR, SPICE); raises CaptionerError without it.
    """
    ids = _check_predictions(references, predictions)
    java = check_java()
    logger.debug("java: %s", java)
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    run_spice = spice and ensure_spice_models()
    # COCOEvalCap hands the tokenizer the annotation dicts; only "caption" is read.
    gts = {i: [{"caption": _one_line(c)} for c in references[i]] for i in ids}
    res = {i: [{"caption": _one_line(predictions[i])}] for i in ids}

    overall: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in ids}
    with _quiet_pycocoevalcap():
        start = time.perf_counter()
        tokenizer = PTBTokenizer()
        gts_tok, res_tok = tokenizer.tokenize(gts), tokenizer.tokenize(res)
        for name, tokenized, source in (("references", gts_tok, gts), ("predictions", res_tok, res)):
            if [len(tokenized.get(i, ())) for i in ids] != [len(source[i]) for i in ids]:
                raise CaptionerError(f"the Java PTB tokenizer returned the wrong number of {name} (see the DEBUG log)")
        logger.info(
            "PTB tokenizer: %d images, %d references (%.1f s)",
            len(ids), sum(map(len, gts.values())), time.perf_counter() - start,
        )

        scorers: list[tuple[Any, str | tuple[str, ...]]] = [
            (Bleu(4), BLEU_KEYS), (Meteor(), "METEOR"), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")
        ]
        if run_spice:
            from pycocoevalcap.spice.spice import Spice

            scorers.append((Spice(), SPICE_KEY))
        try:
            for scorer, method in scorers:
                start = time.perf_counter()
                score, scores = scorer.compute_score(gts_tok, res_tok)
                names, values, image_values = (
                    (method, score, scores) if isinstance(method, tuple) else ((method,), [score], [scores])
                )
                for key, value, values_per_image in zip(names, values, image_values):
                    overall[key] = float(value)
                    for image_id, image_score in zip(ids, values_per_image):
                        if key == SPICE_KEY:  # per image SPICE gives every category; keep "All"
                            image_score = image_score["All"]["f"]
                        per_image[image_id][key] = float(image_score)
                logger.info(
                    "%s (%.1f s)", ", ".join(f"{k}: {overall[k]:.3f}" for k in names), time.perf_counter() - start
                )
        finally:
            for scorer, _ in scorers:
                if isinstance(scorer, Meteor):  # stop its Java process now rather than at GC
                    with contextlib.suppress(Exception):
                        scorer.meteor_p.stdin.close()
                        scorer.meteor_p.kill()
                        scorer.meteor_p.wait()
    return overall, per_image


def fast_scores(references: Mapping[int, list[str]], predictions: Mapping[int, str]) -> dict[str, float]:
    """BLEU-1..4 and CIDEr-D ("CIDEr") of `predictions`, in process and without Java.

    Tokenised with `captioner.text.tokenizer.tokenize` (which reproduces the PTB tokenizer and its
    punctuation removal) and scored by pycocoevalcap's own pure-Python Bleu and Cider, so the
    numbers match `official_scores`. For validation during training; report `official_scores` in results.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    ids = _check_predictions(references, predictions)
    gts = {i: [" ".join(tokenize(c)) for c in references[i]] for i in ids}
    res = {i: [" ".join(tokenize(predictions[i]))] for i in ids}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    scores = {key: float(value) for key, value in zip(BLEU_KEYS, bleu)}
    scores["CIDEr"] = float(cider)
    return scores


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # NaN is not JSON


def write_scores_json(
    path: str | os.PathLike[str],
    overall: Mapping[str, float],
    per_image: Mapping[int, Mapping[str, float]],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write `{**extra, "overall": {...}, "num_images": n, "per_image": [{"image_id", ...}]}`.

    Per-image entries are sorted by image id, like COCOEvalCap's `evalImgs`; non-finite scores
    become null. The file is replaced atomically.
    """
    path = Path(path)
    extra = dict(extra or {})
    clash = {"overall", "num_images", "per_image"} & extra.keys()
    if clash:
        raise ValueError(f"extra must not use the keys {sorted(clash)}")
    document = {
        **extra,
        "overall": {key: _json_number(float(value)) for key, value in overall.items()},
        "num_images": len(per_image),
        "per_image": [
            {"image_id": image_id, **{k: _json_number(float(v)) for k, v in per_image[image_id].items()}}
            for image_id in sorted(per_image)
        ],
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise CaptionerError(f"cannot write scores to {path}: {e.strerror or e}") from None


def evaluate_results_file(
    results_path: str | os.PathLike[str], annotations_path: str | os.PathLike[str], spice: bool = False
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Load a COCO results file and its annotation file and return `official_scores` of it."""
    references = load_references(annotations_path)
    predictions = load_results(results_path, references)
    return official_scores(references, predictions, spice=spice)
