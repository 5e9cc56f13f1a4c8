"""Installed as `sitecustomize` in the workers of the torchrun tests (never imported by the package).

With CAPTIONER_TEST_AUDIT=DIR, every rank records the files it creates, writes, renames or
removes under CAPTIONER_TEST_WATCH (Python's audit events) and leaves the list in
DIR/rank{RANK}.txt when it exits. With CAPTIONER_TEST_FAIL_RANK=R, rank R raises a dataset
error at its third training step, while the other ranks wait for it in a collective.
"""

import os
import sys

RANK = os.environ.get("RANK")

if RANK is not None and os.environ.get("CAPTIONER_TEST_AUDIT"):
    import atexit

    watched = os.path.realpath(os.environ["CAPTIONER_TEST_WATCH"])
    written: list[str] = []

    def _audit(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if not writing or not isinstance(path, (str, bytes, os.PathLike)):
                return
            paths = [path]
        elif event in ("os.rename", "os.replace", "os.remove", "os.unlink", "os.mkdir", "os.rmdir", "shutil.rmtree"):
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        else:
            return
        for p in paths:
            full = os.path.realpath(os.fsdecode(p))
            if full.startswith(watched):
                written.append(f"{event} {full}")

    sys.addaudithook(_audit)

    def _report() -> None:
        out = os.path.join(os.environ["CAPTIONER_TEST_AUDIT"], f"rank{RANK}.txt")
        with open(out, "w") as f:
            f.write("\n".join(written))

    atexit.register(_report)

if RANK is not None and os.environ.get("CAPTIONER_TEST_FAIL_RANK") == RANK:
    import captioner.training.run_setup
    from captioner.core.errors import DatasetError

    _loss = captioner.training.run_setup.caption_loss
    _calls = [0]

    def _failing_loss(*args, **kwargs):
        _calls[0] += 1
        if _calls[0] == 3:
            raise DatasetError(f"injected failure: a file only rank {RANK} reads is unreadable")
        return _loss(*args, **kwargs)

    captioner.training.run_setup.caption_loss = _failing_loss
