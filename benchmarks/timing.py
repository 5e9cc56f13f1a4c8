"""The one timing helper every benchmark uses: warm-up calls, repeated calls (alternating between
variants, so a change in load hits each alike), the median and interquartile range, a measurement
taken in a fresh process, and the line naming the environment (processor, cores, torch threads, load,
what ran `--beside`); and the benchmarks' command-line contract: a user's mistake is one line, `error: ...`, and
exit status 2 (`run_main`, `argument_parser`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser
from captioner.core.errors import CaptionerError


@dataclass(frozen=True)
class Timing:
    """Seconds of repeated runs of one action, warm-up excluded."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The first and third quartile (both the single value for one run)."""
        if len(self.seconds) < 2:
            return self.seconds[0], self.seconds[0]
        q1, _, q3 = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return q1, q3

    def ms(self) -> str:
        q1, q3 = self.quartiles
        return f"{self.median * 1e3:.2f} ms (IQR {q1 * 1e3:.2f}-{q3 * 1e3:.2f}, n={len(self.seconds)})"

    def __str__(self) -> str:
        q1, q3 = self.quartiles
        return f"{self.median:.3f} s (IQR {q1:.3f}-{q3:.3f}, n={len(self.seconds)})"


def summarise(seconds: Sequence[float]) -> Timing:
    """A Timing of seconds measured elsewhere (in worker processes, or per step of a loop)."""
    if not seconds:
        raise ValueError("no timings to summarise")
    return Timing(tuple(float(s) for s in seconds))


def measure(action: Callable[[], object], repeats: int = 5, warmup: int = 1,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Call `action` `warmup` times untimed, then `repeats` times timed."""
    return alternate({"action": action}, repeats, warmup, clock)["action"]


def alternate(actions: Mapping[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time several actions round after round, each once a round, the order reversed every other
    round, so that slow drifts in the machine's load reach every action alike. `clock` may be
    time.thread_time to count this thread's CPU time instead of the wall clock."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, not {repeats} and {warmup}")
    names = list(actions)
    for _ in range(warmup):
        for name in names:
            actions[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for name in in_turn(names, repeats):
        start = clock()
        actions[name]()
        seconds[name].append(clock() - start)
    return {name: summarise(seconds[name]) for name in names}


def in_turn(names: Sequence[str], rounds: int) -> Iterator[str]:
    """Each of `names` once a round for `rounds` rounds, the order reversed every other round."""
    for round_ in range(rounds):
        yield from names if round_ % 2 == 0 else reversed(names)


def child_json(name: str, args: Sequence[str], env: Mapping[str, str] | None = None, what: str = "",
               echo: bool = False) -> dict:
    """`python -m benchmarks NAME ARGS` in a fresh process (the repository its folder) -> the JSON object its
    last line prints; a failure stops the benchmark in one line naming `what` (default: the command). With
    `echo` the child's other lines and its stderr pass through as it runs, for a long child."""
    command = [sys.executable, "-m", "benchmarks", name, *args]
    cwd, env = Path(__file__).resolve().parents[1], dict(os.environ if env is None else env)
    if not echo:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        code, last = done.returncode, (done.stdout.splitlines() or [""])[-1]
        said = done.stderr.strip()[-500:].removeprefix("error: ")  # a refusal's line, said again inside this one
    else:
        held: str | None = None  # the latest line: shown once another follows it
        with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True) as child:
            for line in child.stdout:  # type: ignore[union-attr]
                if held is not None:
                    print(held, flush=True)
                held = line.rstrip("\n")
        code, last, said = child.returncode, held or "", "its output is above"
    what = what or f"{name} {' '.join(args)}".rstrip()
    if code != 0:
        raise SystemExit(f"{what}: exit {code}: {said}")
    try:
        numbers = json.loads(last)
    except json.JSONDecodeError:
        numbers = None
    if not isinstance(numbers, dict):  # a child run without --json, or one that printed nothing
        raise SystemExit(f"{what}: its last line is not a JSON object of its numbers: {last[-200:]!r}")
    return numbers


def json_option(parser: argparse.ArgumentParser) -> None:
    """`--json`: the benchmark ends with its numbers as one JSON object on the last line (`child_json` reads it)."""
    parser.add_argument("--json", action="store_true", help="end with the numbers as one JSON object on the last line")


def print_json(args: argparse.Namespace, numbers: Mapping[str, object]) -> None:
    """The last line of a benchmark run with `--json`."""
    if args.json:
        print(json.dumps(numbers), flush=True)


def amd_core(family: int, model: int) -> str:
    """The Zen generation of an AMD family and model number ('' for others): a virtual machine may report
    only the brand, and the generation decides which kernels run (AVX-512 from the fourth)."""
    if family == 23:
        return "Zen 2" if model >= 0x30 else "Zen or Zen+"
    if family == 25:
        return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF else "Zen 3"
    return "Zen 5" if family == 26 else ""


def processor() -> str:
    """The processor's model name with its family and model numbers (a VM often reports only the
    vendor's brand; an AMD one gets its Zen generation), and whether it multiplies bf16 natively."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break
    except OSError:
        return platform.processor() or platform.machine()
    name = fields.get("model name", platform.machine())
    bf16 = "native bf16" if "avx512_bf16" in fields.get("flags", "").split() else "no native bf16"
    if "cpu family" in fields:
        family, model = fields["cpu family"], fields.get("model", "?")
        core = amd_core(int(family), int(model)) if "AMD" in name and (family + model).isdigit() else ""
        if core and "Zen" not in name:
            name = f"{name} {core}"
        return f"{name} (family {family} model {model}, {bf16})"
    return name


def cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def kernels() -> str:
    """The instruction set of torch's kernels here, with any variable that holds them to it: 'AVX2
    (ATEN_CPU_CAPABILITY=avx2)'."""
    import torch

    from captioner.core.machine_cache import kernel_settings

    return torch.backends.cpu.get_cpu_capability() + (f" ({held})" if (held := kernel_settings()) else "")


def environment(beside: str | None) -> str:
    """One line: processor, usable cores, torch version, threads and kernels (with any variable that holds them
    to an instruction set), load average, what ran beside."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"# {processor()}; {cores()} cores; torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{kernels()} kernels; load {load:.1f}; beside: {beside or 'not said (--beside)'}")


def argument_parser(name: str, doc: str | None, malloc: str = "captioner") -> argparse.ArgumentParser:
    """The parser of `python -m benchmarks NAME`: the module's docstring as its help, `--beside`, what else
    ran on the machine, which the environment line repeats, and `--malloc` (default `malloc`). A refused
    argument is one line and exit status 2, as `captioner`'s are."""
    parser = AnyOrderParser(prog=f"python -m benchmarks {name}", description=doc,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beside", metavar="TEXT", default=None, type=line_of_text,
                        help="what else ran on the machine meanwhile ('nothing', 'the test suite', ...): "
                             "printed with the numbers")
    parser.add_argument("--malloc", choices=("captioner", "glibc"), default=malloc,
                        help="glibc malloc's thresholds: as the `captioner` command sets them (large blocks "
                             "kept for reuse), or glibc's defaults (default: %(default)s)")
    return parser


def line_of_text(text: str) -> str:
    """argparse type of a text a record keeps (`--beside`, `--label`): not empty, one line."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a text, not an empty one")
    if "\n" in text or "\r" in text:
        raise argparse.ArgumentTypeError(f"must be one line, got {text!r}")
    return text


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """A benchmark's `main(argv)` under the command-line contract: a user's mistake (a CaptionerError, a SystemExit
    with its one line) is `error: LINE` on stderr and exit status 2, never a traceback; a bug keeps its traceback."""
    try:
        return main(argv) or 0
    except CaptionerError as e:
        from captioner.apps.cli import refused

        return refused(e)
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        print(f"error: {e.code}", file=sys.stderr)
        return 2


def print_environment(args: argparse.Namespace) -> None:
    """Apply `--malloc` (here and in the servers a benchmark starts), quiet the profiler's own log lines,
    then print the environment line."""
    from captioner.core.allocator import ENV, keep_large_blocks, user_tuned

    # Kineto, torch.profiler's library, reads this at its first use: without it a CPU profile prints its
    # start and stop, and its GPU probe's failure as an ERROR line, amid the benchmark's output.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    if args.malloc == "glibc" and not os.environ.get(ENV, "").strip():
        os.environ[ENV] = "glibc"  # a `captioner` this process starts leaves them too
    if keep_large_blocks():
        allocator = "large blocks kept, as `captioner` sets"
    elif os.environ.get(ENV, "").strip() == "glibc":
        allocator = "glibc's defaults"
    elif user_tuned():
        allocator = "the environment's thresholds"
    else:
        allocator = "not glibc: as it is"
    print(f"{environment(args.beside)}; malloc: {allocator}", flush=True)
