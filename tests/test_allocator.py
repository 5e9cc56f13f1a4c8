"""glibc malloc's thresholds (`captioner.core.allocator`): set by the command line so that a step's large freed
blocks are reused rather than mapped and zero-filled anew, left alone where the environment chooses, and
changing where tensors live, never what a training step computes."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from helpers import REPO, subprocess_env

from captioner.core import allocator
from captioner.core.errors import ConfigError

# A fresh process per allocator, the two at once. First two quickstart training steps (32 images at 128 px, five
# captions each; the second in the first's freed blocks) and a digest of the weights they give. Then a block of
# 64 MB, over the most glibc's own threshold rises to (32 MB on 64 bits), made, filled and freed eight times:
# for each, the bytes glibc holds in mapped blocks while it lives (mallinfo2's hblkhd) and the minor page faults
# it costs. By default glibc maps it afresh every time and the kernel zero-fills its pages again; kept, it comes
# from the heap, which grows for the first few (an aligned block asks a little more than a freed one holds) and
# then serves the rest. (The training step's own faults are not compared: glibc's dynamic threshold moves its
# smaller blocks into the heap after some steps and not others, so they vary from run to run, from 300 to
# 15,000. Nor are the default's faults: with transparent huge pages always on, the kernel faults a mapped block
# in 2 MB at a time.)
PROBE = """
import ctypes, hashlib, json, resource, sys, torch
from captioner.core.allocator import keep_large_blocks
kept = keep_large_blocks()
from benchmarks import workloads
torch.manual_seed(0)
step = workloads.quickstart_step()
for _ in range(2):
    step.run()
weights = b"".join(p.detach().numpy().tobytes() for p in step.model.parameters())
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Mallinfo2
mapped, faults = [], []
for _ in range(8):
    before, outside = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallinfo2().hblkhd
    block = torch.empty(int(sys.argv[1]) // 4).fill_(1.0)  # float32
    mapped.append(mallinfo2().hblkhd - outside)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "mapped": mapped, "faults": faults, "weights": hashlib.sha256(weights).hexdigest()}))
"""
BLOCK = 64 << 20
PAGES = BLOCK // 4096


def probes(*choices: str) -> list[dict]:
    """PROBE under each CAPTIONER_MALLOC of `choices`, the processes at once."""
    running = [subprocess.Popen([sys.executable, "-c", PROBE, str(BLOCK)], cwd=REPO,
                                env=subprocess_env(CAPTIONER_MALLOC=choice), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for choice in choices]
    results = []
    for process in running:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out.splitlines()[-1]))
    return results


@pytest.mark.skipif(allocator._mallopt() is None, reason="not glibc: nothing to set")
def test_large_blocks_are_reused_and_the_weights_stay_the_same():
    kept, default = probes("", "glibc")
    assert kept["kept"] and not default["kept"]
    # By default every block is mapped afresh; kept, none is, and the last four reuse pages already in.
    assert all(mapped >= BLOCK for mapped in default["mapped"]), default["mapped"]
    assert kept["mapped"] == [0] * len(kept["mapped"]), kept["mapped"]
    assert all(faults < PAGES * 0.1 for faults in kept["faults"][-4:]), kept["faults"]
    assert kept["weights"] == default["weights"]


# A fresh interpreter (the lookup is cached for a process's life) that records every process started while
# the command line's malloc settings are applied.
STARTS_NOTHING = """
import json, sys
started = []
sys.addaudithook(lambda event, args: started.append(event) if event.startswith(("subprocess", "os.posix_spawn",
                                                                                  "os.fork", "os.exec")) else None)
from captioner.core.allocator import keep_large_blocks, limit_arenas
print(json.dumps({"kept": keep_large_blocks(), "arenas": limit_arenas(), "started": started}))
"""


def test_applying_the_settings_starts_no_process():
    """`ctypes.util.find_library("c")` ran `/sbin/ldconfig -p` in every command, a model's evaluation included."""
    env = {name: value for name, value in subprocess_env().items()
           if name not in allocator.CHOOSING}  # nothing chosen
    result = subprocess.run([sys.executable, "-c", STARTS_NOTHING], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert seen["started"] == []
    if platform.libc_ver()[0] == "glibc":  # found without a lookup
        assert seen["kept"] and seen["arenas"]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return 1


@pytest.fixture
def mallopt(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(allocator, "_mallopt", lambda: recorder)
    for name in allocator.CHOOSING:
        monkeypatch.delenv(name, raising=False)
    return recorder


def test_both_thresholds_are_raised(mallopt: Recorder):
    assert allocator.keep_large_blocks()
    assert mallopt.calls == [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD),
                             (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD)]


@pytest.mark.parametrize("name, value", [
    ("CAPTIONER_MALLOC", "glibc"),
    ("MALLOC_TRIM_THRESHOLD_", "1048576"),
    ("MALLOC_MMAP_THRESHOLD_", "65536"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536"),
])
def test_the_environment_s_choice_holds(mallopt: Recorder, monkeypatch: pytest.MonkeyPatch, name: str, value: str):
    monkeypatch.setenv(name, value)
    assert not allocator.keep_large_blocks()
    assert mallopt.calls == []


def test_an_unknown_choice_is_one_line_naming_the_variable(mallopt: Recorder, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(allocator.ENV, "jemalloc")
    with pytest.raises(ConfigError, match=r"^CAPTIONER_MALLOC='jemalloc': expected 'glibc'"):
        allocator.keep_large_blocks()
    assert mallopt.calls == []


def test_the_command_line_sets_them_before_its_command(mallopt: Recorder, capsys: pytest.CaptureFixture):
    from captioner.apps.cli import main

    assert main(["config", "show"]) == 0
    assert (allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD) in mallopt.calls


def test_the_command_line_refuses_an_unknown_choice_in_one_line(mallopt: Recorder, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture):
    from captioner.apps.cli import main

    monkeypatch.setenv(allocator.ENV, "tcmalloc")
    assert main(["config", "show"]) == 2
    assert capsys.readouterr().err == "error: CAPTIONER_MALLOC='tcmalloc': expected 'glibc' (glibc's own malloc " \
        "thresholds) or nothing\n"


def test_the_demo_keeps_glibc_s_thresholds_but_refuses_an_unknown_choice(mallopt: Recorder,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture):
    pytest.importorskip("gradio")
    from captioner.apps import cli
    from captioner.apps.demo import server

    served = []
    monkeypatch.setattr(server, "serve", lambda *args, **kwargs: served.append(True))
    cli.main(["demo"])
    assert served and mallopt.calls == []  # its batches gain nothing from them (benchmarks demo_load)
    monkeypatch.setenv(allocator.ENV, "tcmalloc")
    assert cli.main(["demo"]) == 2 and len(served) == 1
    assert "CAPTIONER_MALLOC='tcmalloc'" in capsys.readouterr().err


def test_without_glibc_nothing_is_set(monkeypatch: pytest.MonkeyPatch):
    """Another C library (musl, macOS's): no mallopt to call, and the command line goes on as it is."""
    monkeypatch.setattr(allocator, "_mallopt", lambda: None)
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert not allocator.keep_large_blocks() and not allocator.limit_arenas()
