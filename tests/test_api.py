"""The library API: `Captioner.from_pretrained`, `model.caption` on paths, bytes and pictures,
the lazy `import captioner`, and docs/library.md's code, run as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import subprocess_env, tiny_model
import warm_start
from PIL import Image

from captioner.core.errors import ConfigError, ImageLoadError
from captioner.data.shapes import generate_shapes
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("gradio", "matplotlib", "pycocotools", "pycocoevalcap", "nltk", "tensorboard")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as after the quickstart: a run with a (tiny, untrained) best.pt and
    the synthetic test images."""
    root = tmp_path_factory.mktemp("project")
    generate_shapes(root / "data" / "shapes", 0, 0, 3, image_size=32, progress=False)
    save_checkpoint(root / "runs" / "shapes_lstm" / "best.pt", tiny_model("decode.batch_size=2", "decode.max_length=6"))
    return root


@pytest.fixture(scope="module")
def model(project: Path) -> Captioner:
    return Captioner.from_pretrained(project / "runs" / "shapes_lstm", device="cpu")


def images_of(project: Path) -> list[Path]:
    return sorted((project / "data" / "shapes" / "test").glob("*.jpg"))


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_library_page_runs_as_written(project: Path) -> None:
    """Every python block of docs/library.md, in order, in a folder laid out as it says."""
    page = (ROOT / "docs" / "library.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 4
    # Forked from the warm interpreter (tests/warm_start.py): the page's code runs as a script
    # would, without a cold torch import; the tests below that look at imports start cold.
    result = warm_start.run([sys.executable, "-c", "\n".join(blocks)], cwd=project, capture_output=True, text=True,
                            timeout=300, env=subprocess_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "caption: image 2 of 2: missing.jpg: no such file" in result.stdout  # the error the page shows


def test_captioning_loads_no_ui_plotting_metric_or_logging_stack(project: Path) -> None:
    """Nor torchvision or torch's compiler (dynamo), about a second each of every command's start (a caption's
    resize is Pillow's, and nothing compiles), nor torch.onnx (nothing exports). The packaged model too (an
    EfficientNet-Lite encoder)."""
    image = images_of(project)[0]
    code = (
        "import json, sys\n"
        "from captioner import Captioner, default_model\n"
        "model = Captioner.from_pretrained('runs/shapes_lstm')\n"
        f"print(model.caption({str(image)!r}).text)\n"
        f"print(default_model().caption({str(image)!r}).text)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = run_python(code, project)
    assert result.returncode == 0, result.stderr[-3000:]
    modules = set(json.loads(result.stdout.splitlines()[-1]))
    loaded = {m.split(".")[0] for m in modules}
    assert "torch" in loaded and "captioner.models.decoding.beam" in modules  # the check can see what was imported
    assert not loaded & {*HEAVY, "torchvision"}
    assert not modules & {"torch._dynamo", "torch.onnx"}


def test_import_captioner_is_lazy() -> None:
    code = (
        "import sys, captioner\n"
        "assert 'torch' not in sys.modules, 'torch imported by import captioner'\n"
        "from captioner import Caption, Captioner, DecodeOptions, default_model, load_captioner\n"
        "assert 'torch' in sys.modules\n"
        "assert Captioner.__module__ == 'captioner.models.captioner' and callable(load_captioner) and "
        "callable(default_model)\n"
        "assert sorted(captioner.__all__) == ['Caption', 'Captioner', 'DecodeOptions', 'default_model', "
        "'load_captioner']\n"
        "try:\n    captioner.Capshuner\nexcept AttributeError as e:\n    print(e)\n"
    )
    result = run_python(code, ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "module 'captioner' has no attribute 'Capshuner'"


def test_one_image_gives_a_caption_and_a_list_gives_a_list(model: Captioner, project: Path) -> None:
    path = images_of(project)[0]
    one = model.caption(path)
    assert isinstance(one, Caption) and one.heatmaps().shape[0] == len(one.words)
    listed = model.caption([path])
    assert isinstance(listed, list) and len(listed) == 1 and listed[0].tokens == one.tokens
    assert model.caption([]) == []


def test_paths_bytes_and_pictures_caption_alike_and_as_the_cli_does(model: Captioner, project: Path) -> None:
    paths = images_of(project)
    as_bytes = [p.read_bytes() for p in paths]
    as_pictures = [Image.open(p) for p in paths]
    expected = [c.tokens for c in model.caption(paths)]  # what `captioner caption` prints
    for inputs in (paths, [str(p) for p in paths], as_bytes, as_pictures):
        assert [c.tokens for c in model.caption(inputs)] == expected
    short = [c.tokens for c in model.caption(paths, beam_size=1, max_length=3)]
    # the CLI's way
    assert short == [c.tokens for c in model.caption(paths, errors="return", beam_size=1, max_length=3)]
    assert all(len(tokens) <= 3 for tokens in short)  # options reach the search


def test_a_transparent_picture_is_captioned_like_its_file(model: Captioner, tmp_path: Path) -> None:
    """A PIL image in any mode goes through the loader's conversion (RGBA over white), as a file does."""
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[8:30, 10:34] = (200, 30, 30, 255)  # an opaque red patch on a transparent ground
    picture = Image.fromarray(rgba, mode="RGBA")
    picture.save(tmp_path / "patch.png")
    assert model.caption(picture).tokens == model.caption(tmp_path / "patch.png").tokens
    caption = model.caption(picture)
    assert caption.attn.shape[0] == len(caption.words)


def test_lists_are_decoded_in_batches_of_the_config(model: Captioner, project: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    original = Captioner._caption_batch
    monkeypatch.setattr(Captioner, "_caption_batch", lambda self, x, *a: seen.append(len(x)) or original(self, x, *a))
    paths = images_of(project)
    model.caption(paths)
    assert seen == [2, 1]  # decode.batch_size=2 from the checkpoint
    seen.clear()
    model.caption(paths, batch_size=3)
    assert seen == [3]


def test_a_bad_image_in_a_list_is_named_in_one_line(model: Captioner, project: Path, tmp_path: Path) -> None:
    good = images_of(project)[0]
    (tmp_path / "broken.jpg").write_bytes(b"not a picture")
    with pytest.raises(ImageLoadError, match=r"^caption: image 2 of 3: .*broken.jpg: not an image file"):
        model.caption([good, tmp_path / "broken.jpg", good])
    with pytest.raises(ImageLoadError, match=r"^.*missing.jpg: no such file$"):
        model.caption(tmp_path / "missing.jpg")  # one path: the loader's own line
    with pytest.raises(ImageLoadError, match=r"^caption: image 1 of 1: <upload>: empty file \(0 bytes\)$"):
        model.caption([b""])
    with pytest.raises(ImageLoadError,
                       match=r"^caption: the image: expected a path, bytes or a PIL image, got Tensor$"):
        model.caption(torch.zeros(3, 8, 8))  # type: ignore[call-overload]


def test_caption_refuses_n_best_and_unknown_options(model: Captioner, project: Path) -> None:
    path = images_of(project)[0]
    with pytest.raises(ConfigError, match="^caption: n_best gives several captions per image"):
        model.caption(path, n_best=2)
    with pytest.raises(ConfigError, match=r"^decode: unknown option 'beam' \(did you mean 'beam_size'\?\)$"):
        model.caption(path, beam=3)


def test_from_pretrained_gives_an_eval_model_with_the_checkpoints_settings(model: Captioner, project: Path) -> None:
    assert not model.training and model.device == torch.device("cpu")
    assert model.decode_config.batch_size == 2 and model.decode_config.max_length == 6
    assert all(len(c.tokens) <= 6 for c in model.caption(images_of(project)))
