"""Fault: a full disk. The disk really fills: a small tmpfs mounted in a private mount namespace
(`unshare -rm`, no root needed; writes fail with ENOSPC) or the process's file-size limit
(RLIMIT_FSIZE with SIGXFSZ ignored; writes fail with EFBIG). Checkpoints, the feature store,
the scores file and the training curves each stop with one line naming the file and the free
space, the previous version of the file stays whole and loadable, and the store resumes once
there is space again."""

from __future__ import annotations

import json
import shutil
import subprocess
import shlex
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest
from helpers import require, subprocess_env
import warm_start
from test_resume import TINY

from captioner.data.shapes import generate_shapes

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


@cache
def can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                            "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


def on_small_disk(mount: Path, size_kb: int, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the shell `script` with a tmpfs of `size_kb` mounted on `mount`, which only it sees."""
    if not can_mount_tmpfs():
        require(False, "cannot mount a tmpfs in a user namespace here (unshare -rm)")
    mount.mkdir(parents=True, exist_ok=True)
    wrapper = f"mount -t tmpfs -o size={size_kb}k tmpfs {shlex.quote(str(mount))} || exit 99\n{script}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", wrapper], cwd=ROOT,
                          env=subprocess_env(PYTHONPATH=f"{ROOT}:{TESTS}"),
                          capture_output=True, text=True, timeout=timeout)


PRELUDE = """
import os, resource, signal

def limit_file_size(limit):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

def fill_disk(path, leave=0):
    \"\"\"Another process's file grows until the disk is full, then gives back `leave` bytes.\"\"\"
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(65536))
        except OSError:
            pass
    os.truncate(path, max(0, os.path.getsize(path) - leave))
"""


def python(tmp_path: Path, code: str, disk: Path | None = None, size_kb: int = 0) -> subprocess.CompletedProcess:
    """Run `code` (with PRELUDE's fill_disk and limit_file_size) in a fresh interpreter; with
    `disk`, a tmpfs of `size_kb` mounted there that only it sees."""
    script = tmp_path / "fault_script.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    if disk is not None:
        return on_small_disk(disk, size_kb, shlex.join([sys.executable, str(script)]))
    return warm_start.run([sys.executable, str(script)], cwd=ROOT, env=subprocess_env(PYTHONPATH=f"{ROOT}:{TESTS}"),
                          capture_output=True, text=True, timeout=600)


def one_error_line(stderr: str, file: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ") or "StorageError" in line]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert file in lines[0] and " free on " in lines[0], lines[0]
    return lines[0]


# --- checkpoints ----------------------------------------------------------------------------------

SAVE_TWICE = """
    import json, sys, torch
    from helpers import tiny_model
    from captioner.core.errors import StorageError
    from captioner.models.checkpoint import save_checkpoint
    from captioner.models.checkpoint_format import read_checkpoint
    folder = "{folder}"
    first, second = tiny_model(seed=0), tiny_model(seed=1)
    save_checkpoint(folder + "/best.pt", first, step=1)
    save_checkpoint(folder + "/last.pt", first, step=1)
    {fill}
    try:
        save_checkpoint(folder + "/last.pt", second, step=2)
        print("saved")
    except StorageError as e:
        print("error: " + str(e), file=sys.stderr)
    import os
    kept = {{}}
    for name in ("best.pt", "last.pt"):
        payload = read_checkpoint(folder + "/" + name)  # checksum verified
        kept[name] = (payload["step"] == 1
                      and all(torch.equal(v, payload["model"][k]) for k, v in first.state_dict().items()))
    print(json.dumps({{"kept": kept, "files": sorted(os.listdir(folder))}}))
"""


def test_a_checkpoint_on_a_full_disk_leaves_best_and_last_whole(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    result = python(tmp_path, SAVE_TWICE.format(folder=disk, fill="fill_disk(folder + '/filler')"), disk, 4096)
    assert result.returncode == 0, result.stderr[-3000:]
    line = one_error_line(result.stderr, f"{disk}/last.pt")
    assert "No space left on device" in line and "the previous last.pt is kept" in line
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["kept"] == {"best.pt": True, "last.pt": True}
    assert report["files"] == ["best.pt", "filler", "last.pt"]  # no temporary file left behind


def test_a_checkpoint_past_the_file_size_limit_leaves_best_and_last_whole(tmp_path: Path) -> None:
    # a checkpoint: 1 MB
    result = python(tmp_path, SAVE_TWICE.format(folder=tmp_path / "run", fill="limit_file_size(200_000)"))
    assert result.returncode == 0, result.stderr[-3000:]
    line = one_error_line(result.stderr, f"{tmp_path}/run/last.pt")
    assert "File too large" in line
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["kept"] == {"best.pt": True, "last.pt": True} and report["files"] == ["best.pt", "last.pt"]


@pytest.mark.slow
def test_training_that_fills_the_disk_stops_in_one_line_with_its_checkpoints_whole(tmp_path: Path) -> None:
    """Epoch 1's checkpoint fits (about 1.2 MB: best.pt, and last.pt a second name for its
    file); epoch 2's last.pt, a file of its own, does not."""
    shapes = tmp_path / "shapes"
    generate_shapes(shapes, 48, 4, 2, image_size=32, seed=0, progress=False)
    out = tmp_path / "run"
    train = [sys.executable, "-m", "captioner", "train", "configs/shapes_lstm.yaml", *TINY,
             "train.checkpoint_every_steps=0",
             f"data.root={shapes}", f"train.out_dir={out}"]
    check = ("import json, sys; from captioner.models.checkpoint_format import read_checkpoint; "
             f"import os; folder = {str(out)!r}; "
             "epochs = {n: read_checkpoint(folder + '/' + n)['train_state']['epoch'] for n in ('best.pt', 'last.pt')}; "
             "print(json.dumps({**epochs, 'one file': os.path.samefile(folder + '/best.pt', folder + '/last.pt')}))")
    script = (f"{shlex.join(train)}; echo \"exit $?\"; ls {shlex.quote(str(out))}; "
              f"{shlex.join([sys.executable, '-c', check])}")
    result = on_small_disk(out, 2000, script)
    assert "exit 2" in result.stdout, result.stdout + result.stderr[-3000:]
    # best.pt or last.pt, whichever epoch 2 wrote first
    assert "the previous" in one_error_line(result.stderr, str(out))
    assert "No space left on device" in result.stderr
    # epoch 1's, verified
    assert json.loads(result.stdout.splitlines()[-1]) == {"best.pt": 1, "last.pt": 1, "one file": True}
    assert ".tmp" not in result.stdout


def test_a_second_name_for_a_checkpoint_is_a_link_or_else_a_whole_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """last.pt as a second name of best.pt: a hard link where the file system has them, a copy
    where it has none; either way the next best.pt, written whole and renamed, leaves it as it was."""
    import os

    from captioner.core.files import same_file_as, write_atomically

    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    best.write_bytes(b"epoch 1")
    last.write_bytes(b"epoch 0")
    same_file_as(best, last)
    assert os.path.samefile(best, last)
    write_atomically(best, lambda tmp: tmp.write_bytes(b"epoch 2"))
    assert last.read_bytes() == b"epoch 1"

    def no_links(source: object, target: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    same_file_as(best, last)
    assert last.read_bytes() == b"epoch 2" and not os.path.samefile(best, last)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]  # no temporary file left behind


# --- the feature store ----------------------------------------------------------------------------

STORE = """
    import json, logging, subprocess, sys
    from pathlib import Path
    import numpy as np
    from captioner.core.errors import StorageError
    from captioner.data.datasets import load_split
    from captioner.data.store_extract import ensure_store, extract
    from test_feature_store import frozen_model, shapes_config

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    disk, work = Path("{disk}"), Path("{work}")
    config = shapes_config(work / "shapes", work / "run")
    records = load_split(config.data, "val")
    model = frozen_model(config)
    reference = extract(model.encoder, model.transform, work / "reference", "val", records, batch_size=5,
                        progress=False)

    class FillsTheDisk:  # the encoder, while another process fills the disk during the second batch
        def __init__(self, encoder):
            self.encoder, self.calls = encoder, 0
        def __getattr__(self, name):
            return getattr(self.encoder, name)
        def stored_part(self, images):
            self.calls += 1
            if self.calls == 3:  # the grid probe, the first batch, then the second
                # a few pages stay free: the manifest fits, the next rows do not
                fill_disk(disk / "filler", leave=16384)
            return self.encoder.stored_part(images)

    try:
        extract(FillsTheDisk(model.encoder), model.transform, disk / "store", "val", records, batch_size=5,
                progress=False)
        print("extracted")
    except StorageError as e:
        print("error: " + str(e), file=sys.stderr)
    (disk / "filler").unlink()  # space is back
    store = ensure_store(model.encoder, model.transform, disk / "store", "val", records, batch_size=5, progress=False)
    same = np.array_equal(np.load(store.array_path), np.load(reference.array_path))
    print(json.dumps({{"complete": store.complete, "same": same}}))
"""


def test_the_feature_store_stops_on_a_full_disk_and_resumes_when_space_is_back(tmp_path: Path) -> None:
    disk, work = tmp_path / "disk", tmp_path / "work"
    work.mkdir()
    result = python(tmp_path, STORE.format(disk=disk, work=work), disk, 512)  # the store: 12 rows of 10 KB
    assert result.returncode == 0, result.stderr[-3000:]
    line = one_error_line(result.stderr, f"{disk}/store/val.npy")
    assert "No space left on device" in line and "resumes" in line
    assert "val: resuming at row 5 of 12" in result.stderr  # the first batch, written before the disk filled, is kept
    assert json.loads(result.stdout.splitlines()[-1]) == {"complete": True, "same": True}


# --- results and figures --------------------------------------------------------------------------


def test_a_scores_file_past_the_file_size_limit_keeps_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "scores.json"
    code = f"""
        import sys
        from captioner.core.errors import StorageError
        from captioner.evaluation.results_files import write_scores_json
        write_scores_json("{path}", {{"CIDEr": 1.0}}, {{1: {{"CIDEr": 1.0}}}})
        limit_file_size(4096)
        try:
            write_scores_json("{path}", {{"CIDEr": 0.5}}, {{i: {{"CIDEr": 0.5}} for i in range(5000)}})
        except StorageError as e:
            print("error: " + str(e), file=sys.stderr)
    """
    result = python(tmp_path, code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "File too large" in one_error_line(result.stderr, str(path))
    assert json.loads(path.read_text())["overall"] == {"CIDEr": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault_script.py", "scores.json"]


def test_a_results_file_past_the_file_size_limit_keeps_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "results_test.json"
    code = f"""
        import sys
        from captioner.core.errors import StorageError
        from captioner.evaluation.results_files import write_results
        write_results("{path}", {{1: "a dog"}})
        limit_file_size(4096)
        try:
            write_results("{path}", {{i: "a dog runs through the grass" for i in range(5000)}})
        except StorageError as e:
            print("error: " + str(e), file=sys.stderr)
    """
    result = python(tmp_path, code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "File too large" in one_error_line(result.stderr, str(path))
    assert json.loads(path.read_text()) == [{"image_id": 1, "caption": "a dog"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault_script.py", "results_test.json"]


def test_training_curves_past_the_file_size_limit_keep_the_previous_figure(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("epoch,step,train_loss,val_Bleu_4\n1,10,2.0,0.1\n2,20,1.5,0.2\n")
    code = f"""
        import sys
        from captioner.core.errors import StorageError
        from captioner.viz.curves import plot_run
        plot_run("{tmp_path}", "Bleu_4")
        before = open("{tmp_path}/training_curves.png", "rb").read()
        limit_file_size(2000)
        try:
            plot_run("{tmp_path}", "Bleu_4", beam_size=3)  # another title: another image
        except StorageError as e:
            print("error: " + str(e), file=sys.stderr)
        print(before == open("{tmp_path}/training_curves.png", "rb").read())
    """
    result = python(tmp_path, code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "File too large" in one_error_line(result.stderr, f"{tmp_path}/training_curves.png")
    assert result.stdout.split()[-1] == "True"


def test_an_export_past_the_file_size_limit_keeps_the_previous_export(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    code = f"""
        import sys, torch
        from helpers import tiny_model
        from captioner.core.errors import StorageError
        from captioner.models.captioner import Captioner
        from captioner.models.export_format import write_exported
        first, second = tiny_model(seed=0), tiny_model(seed=1)
        write_exported("{folder}", first.state_dict(), first.spec(first.grid_size()), {{}})
        limit_file_size(100_000)  # the weights are about 300 KB
        try:
            write_exported("{folder}", second.state_dict(), second.spec(second.grid_size()), {{}})
        except StorageError as e:
            print("error: " + str(e), file=sys.stderr)
        loaded = Captioner.from_pretrained("{folder}", "cpu")  # checksums verified
        print(all(torch.equal(v, loaded.state_dict()[k]) for k, v in first.state_dict().items()))
    """
    result = python(tmp_path, code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "File too large" in one_error_line(result.stderr, f"{folder}/model.safetensors")
    assert result.stdout.split()[-1] == "True"


def test_caption_heatmaps_past_the_file_size_limit_are_one_line_and_no_partial_figure(tmp_path: Path) -> None:
    figures = tmp_path / "figures"
    code = f"""
        import sys
        import numpy as np
        from PIL import Image
        from helpers import tiny_model
        from captioner.apps.cli import main
        from captioner.models.checkpoint import save_checkpoint
        save_checkpoint("{tmp_path}/model.pt", tiny_model("decode.max_length=4"))
        Image.fromarray(np.full((40, 48, 3), 90, dtype=np.uint8)).save("{tmp_path}/photo.png")
        limit_file_size(5000)  # the checkpoint is written; the figure (about 30 KB) is not
        sys.exit(main(["caption", "{tmp_path}/model.pt", "{tmp_path}/photo.png", "--heatmaps", "{figures}",
                       "--device", "cpu"]))
    """
    result = python(tmp_path, code)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "File too large" in one_error_line(result.stderr, f"{figures}/photo_attention.png")
    assert list(figures.iterdir()) == []  # no half-written figure
