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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dir", nargs="?", type=Path, help="where the runs go (default: a new temporary folder)")
    args = parser.parse_args()
    base = args.work_dir or Path(tempfile.mkdtemp())
    data = base / "shapes"
    if not data.exists():
        generate_shapes(data, 48, 4, 2, image_size=32, seed=0, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.time()
    reference = subprocess.run(command(data, base / "reference"), cwd=ROOT, env=env, capture_output=True, text=True)
    print(f"uninterrupted run: exit {reference.returncode} in {time.time() - start:.0f}s")
    run = base / "killed"
    process = subprocess.Popen(command(data, run), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while not (run / "last.pt").exists():
        time.sleep(0.01)
    victims = [process.pid, *descendants(process.pid)]  # torchrun starts its workers in sessions of their own
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    process.wait()
    saved = torch.load(run / "last.pt", weights_only=True)["train_state"]
    print(f"killed {len(victims)} processes; last.pt at epoch {saved['epoch'] + 1}, batch {saved['position']}, "
          f"step {saved['step']}, with {len(saved['rng'])} ranks' RNG states")
    resumed = subprocess.run([*command(data, run), "--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
    print(f"resumed run: exit {resumed.returncode};",
          *[line for line in resumed.stderr.splitlines() if "resumed from" in line][:1])
    expected = torch.load(base / "reference" / "last.pt", weights_only=True)["model"]
    got = torch.load(run / "last.pt", weights_only=True)["model"]
    same = all(torch.equal(expected[k], got[k]) for k in expected)
    print(f"final weights bit-identical: {same} ({len(expected)} tensors)")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
