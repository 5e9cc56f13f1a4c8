"""Installs by role (docs/install.md): `pip install captioner` captions with PyTorch; the train,
demo, onnx and data extras add what their commands need; runtime/ (captioner-runtime) captions an
ONNX export with no torch and no --no-deps.

What each role resolves to is asked of a resolver from the package index, as a fresh venv would
install it: `uv pip compile`, which reads the same metadata as pip and gives the same set as
`pip install --dry-run --ignore-installed` (89 distributions for the demo role, the package
itself included) for 0.7 CPU s a role instead of 12.5. A role the resolver finds no install for
fails; only an index it cannot reach (no network) skips, and fails under CI=true. That the core
captions without the extras runs the CLI with their packages hidden (forked from the warm
interpreter of tests/warm_start.py, which has imported none of them); the runtime is installed
for real, by uv from the same index, in a fresh venv and captions there."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import numpy as np
from PIL import Image

from helpers import REPO, require, require_module, shared_folder, subprocess_env
import warm_start

# One worker runs the whole module: its fixtures build wheels and resolve every role (about 15 s,
# mostly waiting on the index; under pytest-xdist the controller has done it meanwhile), and a second
# worker that reached one of its tests meanwhile sat that long on the fixtures' lock, its core idle.
pytestmark = pytest.mark.xdist_group("install_roles")

TRAIN = {"pycocoevalcap", "pycocotools", "nltk", "tensorboard"}
DEMO = {"gradio"}
ONNX = {"onnx", "onnxscript", "onnxruntime"}
DATA = {"datasets", "pyarrow", "webdataset"}  # pyarrow comes with datasets
# role: (the distribution and extras pip is given, packages it must bring, packages it must not)
ROLES = {
    "core": ("captioner", {"torch", "torchvision", "matplotlib", "safetensors"}, TRAIN | DEMO | ONNX | DATA),
    "train": ("captioner[train]", {"torch"} | TRAIN, DEMO | ONNX | DATA),
    "demo": ("captioner[demo]", {"torch"} | DEMO, TRAIN | ONNX | DATA),
    "onnx": ("captioner[onnx]", {"torch"} | ONNX, TRAIN | DEMO | DATA),
    "data": ("captioner[data]", {"torch"} | DATA, TRAIN | DEMO | ONNX),
    # extras that name the package's own extras
    "all": ("captioner[all]", {"torch"} | TRAIN | DEMO | ONNX | DATA, set()),
    "runtime": ("captioner-runtime", {"onnxruntime", "numpy", "pillow"},
                {"torch", "torchvision", "matplotlib", "pyyaml"} | TRAIN | DEMO | DATA),
}


def build_wheels(folder: Path) -> dict[str, Path]:
    """This checkout's two distributions as wheels (built once: pip would rebuild a source tree
    for every resolution), with this environment's setuptools rather than one installed for each build."""
    for source in (REPO, REPO / "runtime"):
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                   "-w", str(folder), str(source)]
        built = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
    return {"captioner": next(folder.glob("captioner-*.whl")),
            "captioner-runtime": next(folder.glob("captioner_runtime-*.whl"))}


# What uv says when it cannot reach the index (a refused connection, no DNS, no route), not when
# the index answers that the requirements cannot be met ("No solution found when resolving").
UNREACHABLE = re.compile(r"Failed to fetch|error sending request|client error \(Connect\)|dns error|"
                         r"Connection refused|Network is unreachable|operation timed out", re.I)


def resolve(requirement: str) -> list[str] | str:
    """The distributions an install of `requirement` into an empty environment brings (the package
    itself included), or the resolver's error, whole."""
    command = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--no-annotate", "-"]
    done = subprocess.run(command, cwd=REPO, input=requirement, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return done.stderr.strip() or f"uv exited {done.returncode} and said nothing"
    pins = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return sorted({re.split(r"==| @ ", pin)[0].lower().replace("_", "-") for pin in pins})


def shared_wheels(shared: Path) -> dict[str, Path]:
    """The wheels in the run's folder `shared`, built there by the first process to need them (a lock). A build
    that fails leaves no folder: the next process to need them builds again and reports its failure itself."""
    from filelock import FileLock

    folder = shared / "captioner_wheels"
    with FileLock(str(folder) + ".lock"):
        if not folder.is_dir():
            building = folder.with_name(folder.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            build_wheels(building)
            building.rename(folder)
    return {"captioner": next(folder.glob("captioner-*.whl")),
            "captioner-runtime": next(folder.glob("captioner_runtime-*.whl"))}


def shared_resolutions(shared: Path) -> dict[str, list[str] | str]:
    """Every role resolved once per test run, into the run's folder `shared` (the resolutions side by side, mostly
    waiting on the index): the distributions of each, or the resolver's error."""
    from filelock import FileLock

    wheels = shared_wheels(shared)
    file = shared / "captioner_pip_roles.json"
    with FileLock(str(file) + ".lock"):
        if not file.is_file():
            with ThreadPoolExecutor(len(ROLES)) as pool:
                futures = {}
                for role, (requirement, _, _) in ROLES.items():
                    name, _, extras = requirement.partition("[")
                    target = f"{name}{'[' + extras if extras else ''} @ {wheels[name].as_uri()}"
                    futures[role] = pool.submit(resolve, target)
                file.write_text(json.dumps({role: future.result() for role, future in futures.items()}))
    return json.loads(file.read_text())


def resolve_beside_the_workers(shared: Path) -> threading.Thread | None:
    """Start `shared_resolutions` in a thread of pytest-xdist's controller, which waits while the workers run: the
    worker that reaches this module then reads the roles instead of waiting 10 s on the index with its core idle
    (conftest.py's pytest_sessionstart, when this module is to be collected)."""
    if importlib.util.find_spec("uv") is None or importlib.util.find_spec("filelock") is None:
        return None

    def run() -> None:
        with contextlib.suppress(Exception):  # whatever fails here fails again, and is reported, in the fixtures
            shared_resolutions(shared)

    thread = threading.Thread(target=run, name="install roles", daemon=True)
    thread.start()
    return thread


def test_a_failed_wheel_build_leaves_nothing_the_next_process_would_take_for_wheels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller builds in a thread whose failure is reported by the fixture that builds again: a folder left
    half built would have been taken as built, and the fixture would fail on a missing wheel instead."""
    def broken(folder: Path) -> None:
        (folder / "captioner-0.1.0-py3-none-any.whl").write_bytes(b"")
        raise AssertionError("pip wheel failed")

    monkeypatch.setattr(sys.modules[__name__], "build_wheels", broken)
    with pytest.raises(AssertionError, match="pip wheel failed"):
        shared_wheels(tmp_path)
    assert not (tmp_path / "captioner_wheels").exists()

    def built(folder: Path) -> None:
        for name in ("captioner-0.1.0-py3-none-any.whl", "captioner_runtime-0.1.0-py3-none-any.whl"):
            (folder / name).write_bytes(b"")

    monkeypatch.setattr(sys.modules[__name__], "build_wheels", built)
    assert shared_wheels(tmp_path) == {"captioner": tmp_path / "captioner_wheels/captioner-0.1.0-py3-none-any.whl",
                                       "captioner-runtime":
                                           tmp_path / "captioner_wheels/captioner_runtime-0.1.0-py3-none-any.whl"}


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Built once per test run, whatever the number of pytest workers (a lock in the run's folder)."""
    return shared_wheels(shared_folder(tmp_path_factory))


@pytest.fixture(scope="session")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str] | str]:
    """Every role, resolved once per test run (by the controller meanwhile, where it is pytest-xdist's)."""
    require_module("uv", "uv, the resolver, is not installed (pip install -e '.[test]')")
    return {role: set(names) if isinstance(names, list) else names for role,
            names in shared_resolutions(shared_folder(tmp_path_factory)).items()}


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_each_role_installs_what_it_needs_and_nothing_it_does_not(resolved: dict, role: str) -> None:
    names = resolved[role]
    requirement, brings, leaves_out = ROLES[role]
    if isinstance(names, str):
        lines = names.splitlines()
        require(not UNREACHABLE.search(names),
                f"the resolver could not reach the package index to resolve {role}: {lines[0]} ... {lines[-1].strip()}")
        pytest.fail(f"{role}: the resolver finds no install of {requirement}:\n{names}", pytrace=False)
    normal = {n.replace("_", "-") for n in brings}
    assert normal <= names, f"{role}: missing {sorted(normal - names)}"
    assert not (
        {n.replace("_", "-") for n in leaves_out} & names), f"{role}: should not install {sorted(leaves_out & names)}"


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


def cli_without(packages: set[str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`captioner ARGS` in a child process where `packages` cannot be imported (forked warm: the
    server has imported torch and torchvision, none of the extras)."""
    command = [sys.executable, "-c", HIDE_EXTRAS, ",".join(sorted(packages)), *args]
    return warm_start.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300, cwd=cwd)


def test_the_core_install_captions_and_names_the_extra_a_command_needs(shapes_lstm, tmp_path: Path) -> None:
    image = str(shapes_lstm.test_images[0])
    done = cli_without(TRAIN | DEMO | ONNX, "caption", str(shapes_lstm.checkpoint), image, "--heatmaps", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(image) and list(tmp_path.glob("*.png"))
    done = cli_without(TRAIN, "evaluate", str(shapes_lstm.checkpoint), "--split", "test", "--limit", "2", "--out",
                       str(tmp_path))
    assert done.returncode == 2 and re.fullmatch(  # the shapes annotations are COCO's format: pycocotools comes first
        r"error: (pycocotools|pycocoevalcap) is not installed: it comes with the 'train' extra "
        r"\(pip install 'captioner\[train\]', or -e '\.\[train\]' in a checkout\)",
        done.stderr.strip().splitlines()[-1],
    )
    done = cli_without(DEMO, "demo", str(shapes_lstm.checkpoint), "--port", "0")
    assert done.returncode == 2 and "Gradio is not installed" in done.stderr.strip().splitlines()[-1]
    # No model named, from a folder with no runs/: the model packaged with captioner answers, offline.
    from captioner.models.model_paths import installed_model

    packaged = installed_model()
    assert packaged is not None, "no model is packaged with captioner (captioner/pretrained/)"
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(photo)
    done = cli_without(TRAIN | DEMO | ONNX, "caption", str(photo), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (done.stdout.startswith(f"{photo}\t")
            and f"captioning with {packaged.name} (packaged with captioner)" in done.stderr)


@pytest.mark.slow
def test_the_runtime_installs_in_a_fresh_venv_and_captions_without_torch(wheels: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    require_module("onnxruntime", "the runtime test exports with onnxruntime (pip install -e .[onnx])")
    require_module("uv", "uv, the installer, is not installed (pip install -e '.[test]')")
    from test_onnx import briefly_trained

    from captioner.models.onnx_export import export_onnx

    model = briefly_trained("lstm", seed=1)
    export_onnx(model, tmp_path / "export")
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(image)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # uv installs into it: the same resolution as pip's, without pip's 10 CPU s
    python = env_dir / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", str(python),
                                str(wheels["captioner-runtime"])], capture_output=True, text=True, timeout=600)
    require(installed.returncode == 0,
            f"uv could not install the runtime's dependencies: {installed.stderr.strip()[-300:]}")
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, cwd=tmp_path,
                              env=outside_checkout())
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    captioned = subprocess.run([str(env_dir / "bin" / "captioner-onnx"), str(tmp_path / "export"), str(image), "--beam",
                                "2", "--max-length", "9"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path, env=outside_checkout())
    assert captioned.returncode == 0, captioned.stderr
    assert captioned.stdout.splitlines() == [f"{image}\t{model.caption(image, beam_size=2, max_length=9).text}"]


def test_an_extra_package_missing_its_own_dependency_names_the_extra_too() -> None:
    """nltk installed without `regex` fails on import with ModuleNotFoundError('regex'): a line naming
    the extra, not a traceback."""
    from captioner.core.errors import missing_extra

    assert missing_extra(ModuleNotFoundError("No module named 'regex'", name="regex")) == (
        ("regex is not installed: it comes with the 'train' extra (pip install 'captioner[train]', or -e '.[train]' in "
         "a checkout)")
    )
    # a bug keeps its traceback
    assert missing_extra(ModuleNotFoundError("No module named 'captioner_typo'", name="captioner_typo")) is None


@pytest.mark.parametrize("blocked, package", [("torch", "torch"), ("PIL", "PIL")])
def test_a_python_without_captioners_packages_is_one_line(blocked: str, package: str) -> None:
    """`python -m captioner` from a checkout whose environment is not active (here: torch or Pillow made unimportable):
    one line naming the package and how to install, exit 2, no traceback."""
    script = (f"import sys; sys.modules[{blocked!r}] = None; from captioner.apps.cli import main; "
              "sys.exit(main(['caption', 'photo.jpg']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=subprocess_env())
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (f"error: {package} is not installed in {sys.executable}: captioner needs it (pip install "
                           "captioner; in a checkout, bash scripts/setup.sh, then source .venv/bin/activate)\n")
