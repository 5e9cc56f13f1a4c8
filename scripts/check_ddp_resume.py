"""Exact resume under torchrun: 2 gloo ranks trained without a stop, and the same run SIGKILLed
(the launcher and both workers) after its first mid-epoch checkpoint, then resumed with --resume.
Prints whether the final weights are bit-identical. CPU, about 2 minutes."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_resume import TINY  # noqa: E402  the settings of the single-process test

from captioner.apps.arguments import AnyOrderParser, folder_to_write  # noqa: E402
from captioner.apps.cli import refused  # noqa: E402
from captioner.core.errors import CaptionerError  # noqa: E402
from captioner.core.files import check_writable_folder  # noqa: E402
from captioner.data.shapes import generate_shapes  # noqa: E402


def command(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "captioner",
            "train", "configs/shapes_lstm.yaml", *TINY, "data.batch_size=2", f"data.root={data}",
            f"train.out_dir={out}", *extra]


def descendants(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == pid:
                children += [int(entry), *descendants(int(entry))]
    return children


def what_it_said(stderr: str) -> str:
    """A failed run's reason: captioner's `error:` line (before torchrun's report), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("error: ")), lines[-1] if lines else "nothing on stderr")
    return said.removeprefix("error: ")


def killed_after_its_checkpoint(data: Path, run: Path, env: dict[str, str]) -> int:
    """Start the run, SIGKILL the launcher and its workers once its first last.pt is written; how many were
    killed. A run that ends before it writes one is one CaptionerError, not a wait without end."""
    process = subprocess.Popen(command(data, run), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    while not (run / "last.pt").exists():
        if process.poll() is not None:
            raise CaptionerError(f"{run}: the run to be killed ended (exit {process.returncode}) before its first "
                                 f"checkpoint: {what_it_said(process.stderr.read())}")
        time.sleep(0.01)
    victims = [process.pid, *descendants(process.pid)]  # torchrun starts its workers in sessions of their own
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    return len(victims)


def check(base: Path) -> bool:
    """Train without a stop and with a kill and --resume under `base`; whether the final weights are the same."""
    base = base.resolve()  # absolute: the runs start in the repository, not in the caller's folder
    data = base / "shapes"
    if not data.exists():
        generate_shapes(data, 48, 4, 2, image_size=32, seed=0, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.time()
    reference = subprocess.run(command(data, base / "reference"), cwd=ROOT, env=env, capture_output=True, text=True)
    print(f"uninterrupted run: exit {reference.returncode} in {time.time() - start:.0f}s")
    if reference.returncode != 0:
        raise CaptionerError(f"{base / 'reference'}: the uninterrupted run failed: {what_it_said(reference.stderr)}")
    run = base / "killed"
    killed = killed_after_its_checkpoint(data, run, env)
    saved = torch.load(run / "last.pt", weights_only=True)["train_state"]
    print(f"killed {killed} processes; last.pt at epoch {saved['epoch'] + 1}, batch {saved['position']}, "
          f"step {saved['step']}, with {len(saved['rng'])} ranks' RNG states")
    resumed = subprocess.run([*command(data, run), "--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
    print(f"resumed run: exit {resumed.returncode};",
          *[line for line in resumed.stderr.splitlines() if "resumed from" in line][:1])
    expected = torch.load(base / "reference" / "last.pt", weights_only=True)["model"]
    got = torch.load(run / "last.pt", weights_only=True)["model"]
    same = all(torch.equal(expected[k], got[k]) for k in expected)
    print(f"final weights bit-identical: {same} ({len(expected)} tensors)")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dir", nargs="?", type=folder_to_write,
                        help="where the runs go (default: a new temporary folder)")
    args = parser.parse_args(argv)
    try:
        if args.work_dir is not None:
            check_writable_folder(args.work_dir)
        return 0 if check(args.work_dir or Path(tempfile.mkdtemp())) else 1
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2


if __name__ == "__main__":
    sys.exit(main())
