"""Installs by role (docs/install.md): `pip install captioner` captions with PyTorch; the train,
demo and onnx extras add what their commands need; runtime/ (captioner-runtime) captions an ONNX
export with no torch and no --no-deps.

What each role resolves to is asked of pip itself (a dry run from the package index, as a fresh
venv would install it); that the core captions without the extras runs the CLI with their
packages hidden; the runtime is installed for real in a fresh venv and captions there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import numpy as np
from PIL import Image

from helpers import REPO, require, require_module, subprocess_env

pytestmark = pytest.mark.xdist_group("install_roles")  # one worker resolves the roles once (run_tests.sh: --dist loadgroup)

TRAIN = {"pycocoevalcap", "pycocotools", "nltk", "tensorboard"}
DEMO = {"gradio"}
ONNX = {"onnx", "onnxscript", "onnxruntime"}
# role: (what pip is given, packages it must bring, packages it must not)
ROLES = {
    "core": (".", {"torch", "torchvision", "matplotlib", "safetensors"}, TRAIN | DEMO | ONNX),
    "train": (".[train]", {"torch"} | TRAIN, DEMO | ONNX),
    "demo": (".[demo]", {"torch"} | DEMO, TRAIN | ONNX),
    "onnx": (".[onnx]", {"torch"} | ONNX, TRAIN | DEMO),
    "all": (".[all]", {"torch"} | TRAIN | DEMO | ONNX, set()),  # extras that name the package's own extras
    "runtime": ("./runtime", {"onnxruntime", "numpy", "pillow"}, {"torch", "torchvision", "matplotlib", "pyyaml"} | TRAIN | DEMO),
}


def resolve(target: str, report: Path) -> set[str] | str:
    """The distributions pip would install for `target` into an empty environment, or pip's error."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), target]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"pip exited {done.returncode}"
    return {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str] | str]:
    """Every role at once: pip's resolutions run side by side (mostly waiting on the index)."""
    folder = tmp_path_factory.mktemp("pip_reports")
    with ThreadPoolExecutor(len(ROLES)) as pool:
        futures = {role: pool.submit(resolve, target, folder / f"{role}.json") for role, (target, _, _) in ROLES.items()}
        return {role: future.result() for role, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_each_role_installs_what_it_needs_and_nothing_it_does_not(resolved: dict, role: str) -> None:
    names = resolved[role]
    require(isinstance(names, set), f"pip could not reach the package index to resolve {role}: {names}")
    _, brings, leaves_out = ROLES[role]
    normal = {n.replace("_", "-") for n in brings}
    assert normal <= names, f"{role}: missing {sorted(normal - names)}"
    assert not ({n.replace("_", "-") for n in leaves_out} & names), f"{role}: should not install {sorted(leaves_out & names)}"


def outside_checkout() -> dict[str, str]:
    """The environment without this checkout on the path: the venv's own install is what runs."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


HIDE_EXTRAS = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed
sys.argv = ["captioner", *sys.argv[2:]]
from captioner.apps.cli import main
sys.exit(main())
"""


def cli_without(packages: set[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_EXTRAS, ",".join(sorted(packages)), *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=300)


def test_the_core_install_captions_and_names_the_extra_a_command_needs(shapes_lstm, tmp_path: Path) -> None:
    image = str(shapes_lstm.test_images[0])
    done = cli_without(TRAIN | DEMO | ONNX, "caption", str(shapes_lstm.checkpoint), image, "--heatmaps", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(image) and list(tmp_path.glob("*.png"))
    done = cli_without(TRAIN, "evaluate", str(shapes_lstm.checkpoint), "--split", "test", "--limit", "2", "--out", str(tmp_path))
    assert done.returncode == 2 and re.fullmatch(  # the shapes annotations are COCO's format: pycocotools comes first
        r"error: (pycocotools|pycocoevalcap) is not installed: it comes with the 'train' extra "
        r"\(pip install 'captioner\[train\]', or -e '\.\[train\]' in a checkout\)",
        done.stderr.strip().splitlines()[-1],
    )
    done = cli_without(DEMO, "demo", str(shapes_lstm.checkpoint), "--port", "0")
    assert done.returncode == 2 and "Gradio is not installed" in done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_runtime_installs_in_a_fresh_venv_and_captions_without_torch(tmp_path: Path) -> None:
    require_module("onnxruntime", "the runtime test exports with onnxruntime (pip install -e .[onnx])")
    from test_onnx import briefly_trained

    from captioner.models.onnx_export import export_onnx

    model = briefly_trained("lstm", seed=1)
    export_onnx(model, tmp_path / "export")
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(image)
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(REPO / "runtime")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *map(str, wheels.glob("*.whl"))],
                               capture_output=True, text=True, timeout=600)
    require(installed.returncode == 0, f"pip could not install the runtime's dependencies: {installed.stderr.strip()[-300:]}")
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, cwd=tmp_path, env=outside_checkout())
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    captioned = subprocess.run([str(env_dir / "bin" / "captioner-onnx"), str(tmp_path / "export"), str(image), "--beam", "2", "--max-length", "9"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path, env=outside_checkout())
    assert captioned.returncode == 0, captioned.stderr
    assert captioned.stdout.splitlines() == [f"{image}\t{model.caption(image, beam_size=2, max_length=9).text}"]
