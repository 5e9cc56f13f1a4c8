"""How far each piece of work is from what the processor can do: FLOPs and bytes moved (counted op by
op as it runs), its time, the rate it reaches, and its roofline time, from the processor's peak as the
benchmark measures it with the same threads (fp32 GEMM of large squares, best of several; copy bandwidth).

    python -m benchmarks roofline [--only NAME ...] [--repeats 5] [--threads N] [--profile DIR] [--record PREFIX]

The roofline time of a piece of work sums, op by op, the longer of its FLOPs at the GEMM peak and its
bytes at the copy bandwidth (elementwise work is counted as bytes, not FLOPs): `time / roofline` is how
many times slower than that bound it runs. The LSTM step's count is checked against a hand count
(`op_counter.lstm_step_flops`). `--profile DIR` writes each one's operator table (DIR/NAME.txt) and
trace (DIR/NAME.trace.json, for chrome://tracing or Perfetto). `--record PREFIX` writes each row as record
PREFIX_NAME of docs/results/bench_roofline.json, with this run's command, commit, processor and date; with
--profile, each one's heaviest operators as record PREFIX_NAME of bench_profile.json too, beside its operator
table copied to docs/results/profiles/PREFIX_NAME.txt."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch

from captioner.apps.arguments import folder_to_write, positive_int, whole_number
from captioner.core.files import folder_problem
from captioner.core.process_settings import set_threads
from captioner.core.config_sections import thread_count
from captioner.models import products

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import workloads  # noqa: E402
from benchmarks.op_counter import OpCount, OpCounter, lstm_step_flops  # noqa: E402
from benchmarks.records import (  # noqa: E402
    RESULTS,
    add_record_options,
    check_record_option,
    command_line,
    new_record,
    save_records,
    write_text,
)
from benchmarks.timing import (  # noqa: E402
    argument_parser,
    json_option,
    measure,
    print_environment,
    print_json,
    run_main,
)


def gemm_rates(size: int, repeats: int = 5) -> dict[str, float]:
    """The best fp32 GEMM rate (FLOP/s) of size x size squares by each route: torch.mm (MKL's products where
    torch is built with it), and oneDNN's inner product where this build has it (the decoders' layers' route)."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))  # (S, S) each
    routes = {"torch.mm": lambda: torch.mm(a, b)}
    if products.onednn_enabled():
        packed = products._reorder(b)
        routes["oneDNN inner product"] = lambda: products._product(a, packed, None)
    return {name: 2 * size**3 / min(measure(run, repeats).seconds) for name, run in routes.items()}


def gemm_peak(size: int, repeats: int = 5) -> tuple[float, str]:
    """The faster route's rate of `gemm_rates` -> (rate, which)."""
    rates = gemm_rates(size, repeats)
    name = max(rates, key=rates.__getitem__)
    return rates[name], name


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """The best rate (bytes/s) of copying `megabytes` into another buffer: read plus write."""
    source = torch.ones(megabytes << 18)  # fp32: 4 bytes each
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / min(measure(lambda: target.copy_(source), repeats).seconds)


def counted(run: object) -> OpCounter:
    """The ops of one call of `run`, after a warm-up call (first calls prepare caches)."""
    run()  # type: ignore[operator]
    with OpCounter() as counter:
        run()  # type: ignore[operator]
    return counter


def op_seconds(op: OpCount, peak: float, bandwidth: float) -> float:
    """An op's bound: its FLOPs at the GEMM peak or its bytes at the copy bandwidth, whichever is longer."""
    return max(op.flops / peak, op.bytes / bandwidth)


def roofline_seconds(counter: OpCounter, peak: float, bandwidth: float) -> float:
    return sum(op_seconds(op, peak, bandwidth) for op in counter.ops)


# operators as a reader names them; one name for the in-place and out-of-place forms, the others without 'aten::'
OPERATOR_WORDS = {
    "mkldnn::_linear_pointwise": "oneDNN's products", "mkldnn::_reorder_linear_weight": "weight reorders",
    "aten::mm": "torch.mm", "aten::addmv": "addmv", "aten::addmv_": "addmv", "aten::copy_": "copies",
    "aten::add": "add", "aten::add_": "add", "aten::mul": "mul", "aten::mul_": "mul", "aten::fill_": "fill",
    "aten::sigmoid": "sigmoid", "aten::sigmoid_": "sigmoid", "aten::_log_softmax": "log-softmax",
    "aten::_log_softmax_backward_data": "log-softmax backward", "aten::_softmax": "softmax",
    "aten::_fused_adamw_": "AdamW", "aten::uniform_": "dropout masks (uniform_)",
    "aten::bernoulli_": "dropout masks (bernoulli_)", "aten::mkldnn_convolution": "convolution forward",
    "aten::convolution_backward": "convolution backward", "aten::native_batch_norm": "batch norm",
    "aten::native_batch_norm_backward": "batch norm backward", "aten::native_layer_norm": "layer norm",
    "aten::native_layer_norm_backward": "layer norm backward", "aten::clamp": "clamp (ReLU6)",
    "aten::hardtanh": "clamp (ReLU6)", "aten::threshold_backward": "ReLU backward", "aten::topk": "top-k",
    "aten::linalg_vector_norm": "vector norms",
}


def operator_shares(self_times: Mapping[str, float]) -> dict[str, float]:
    """Each operator's self time (profiler key -> any unit) -> its share of them all by OPERATOR_WORDS' names,
    the forms of one operator summed, heaviest first."""
    total = sum(self_times.values()) or 1.0
    shares: Counter[str] = Counter()
    for key, seconds in self_times.items():
        shares[OPERATOR_WORDS.get(key, key.removeprefix("aten::"))] += seconds / total
    return dict(shares.most_common())


def top_operators(shares: Mapping[str, float], most: int = 10, least: float = 0.015) -> str:
    """The heaviest operators of `operator_shares`, as the profile records write them: 'bmm 9%, add 4%'."""
    return ", ".join(f"{name} {share:.0%}" for name, share in list(shares.items())[:most] if share >= least)


def profile(work: workloads.Workload, folder: Path, repeats: int) -> tuple[list[str], dict[str, float]]:
    """The operator table and trace of `repeats` calls -> the table's top rows, and `operator_shares`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    folder.mkdir(parents=True, exist_ok=True)
    with profiler(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(repeats):
            work.run()
    averages = prof.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=25)
    (folder / f"{work.name}.txt").write_text(f"{work.about}, {repeats} calls\n{table}\n", encoding="utf-8")
    prof.export_chrome_trace(str(folder / f"{work.name}.trace.json"))
    return table.splitlines()[:12], operator_shares({event.key: event.self_cpu_time_total for event in averages})


def hand_check(counter: OpCounter) -> str:
    """The LSTM step's counted FLOPs beside the hand count of the same sizes."""
    hand = lstm_step_flops(workloads.BATCH, workloads.BATCH, workloads.WORDS, 196, workloads.FEAT_DIM,
                           512, 512, 512, workloads.VOCAB)
    return (f"hand count of the LSTM step {hand / 1e9:.2f} GFLOP, counted {counter.flops / 1e9:.2f} "
            f"({counter.flops / hand - 1:+.2%})")


PATHS = {"--profile": "DIR"}  # the options whose value is a path: written so in a record


def row_cells(counter: OpCounter, seconds: float, bound: float, peak: float) -> dict[str, str]:
    """A piece of work's cells of the table, under bench_roofline.json's column keys."""
    flops, moved = counter.flops, counter.bytes
    return {"gflop": f"{flops / 1e9:.2f}", "gb": f"{moved / 1e9:.2f}", "intensity": f"{flops / max(moved, 1):.1f}",
            "time": f"{seconds * 1e3:,.0f} ms", "rate": f"{flops / seconds / 1e9:.0f}",
            "of_peak": f"{flops / seconds / peak:.0%}", "roofline": f"{bound * 1e3:,.0f} ms",
            "ratio": f"{seconds / bound:.2f}x"}


def profile_records(base: Mapping[str, object], works: Mapping[str, Mapping[str, object]],
                    tables: Mapping[str, tuple[list[str], dict[str, float]]], folder: Path, threads: int,
                    results: Path) -> list[dict]:
    """bench_profile's records of a run, each piece of work's heaviest operators and its operator table, copied
    from `folder` to results/profiles/ beside the records that link it."""
    made = []
    for name, (_, shares) in tables.items():
        record_id = f"{base['id']}_{name}"
        write_text(results / "profiles" / f"{record_id}.txt", (folder / f"{name}.txt").read_text(encoding="utf-8"))
        made.append({**base, "id": record_id, "label": f"{works[name]['about']} ({threads} threads); "
                                                       f"{base['processor']}",
                     "numbers": {"top": top_operators(shares),
                                 "table": f"[operator table](results/profiles/{record_id}.txt)"}})
    return made


def main(argv: list[str] | None = None, results: Path = RESULTS) -> int:
    parser = argument_parser("roofline", __doc__)
    parser.add_argument("--only", nargs="+", choices=list(workloads.WORKLOADS), default=None,
                        help="these pieces of work only (default: all)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed calls of each, after a warm-up")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--peak-size", type=functools.partial(whole_number, minimum=2), default=4096,
                        help="side of the GEMM squares timed for the peak")
    parser.add_argument("--profile", type=folder_to_write, default=None, metavar="DIR",
                        help="write each one's operator table and trace into DIR")
    add_record_options(parser, "bench_roofline", "the peak and each row", prefix=True)
    json_option(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.profile is not None and args.profile.exists() and not args.profile.is_dir():
        parser.error(f"--profile {args.profile}: is a file, not a folder")
    if args.profile is not None and (problem := folder_problem(args.profile)):  # a file where a parent goes, ...
        parser.error(f"--profile {args.profile}: {problem}")
    names = args.only or list(workloads.WORKLOADS)
    check_record_option(parser, args, "bench_roofline", results, [f"{args.record}_{n}" for n in ["peak", *names]])
    if args.profile is not None:
        check_record_option(parser, args, "bench_profile", results, [f"{args.record}_{name}" for name in names])
    threads = set_threads(args.threads)
    print_environment(args)
    peak, route = max(gemm_peak(n) for n in sorted({args.peak_size // 2, args.peak_size}))
    bandwidth = copy_bandwidth()
    machine = (f"peak fp32 GEMM {peak / 1e9:.0f} GFLOP/s ({route}, {threads} threads); "
               f"copy {bandwidth / 1e9:.1f} GB/s; dense layers through "
               f"{'oneDNN' if products.route_taken() else 'F.linear'}; fp32 throughout")
    print(machine)
    print("\n| work | GFLOP | GB moved | FLOP/byte | time | GFLOP/s | of peak | roofline | time / roofline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    checks, tables, works, cells = [], {}, {}, {}
    for name in names:
        work = workloads.WORKLOADS[name]()
        counter = counted(work.run)
        seconds = measure(work.run, args.repeats).median
        bound = roofline_seconds(counter, peak, bandwidth)
        cells[name] = row_cells(counter, seconds, bound, peak)
        print(f"| {work.about} | {' | '.join(cells[name].values())} |", flush=True)
        works[name] = {"about": work.about, "gflop": counter.flops / 1e9, "gb": counter.bytes / 1e9,
                       "seconds": seconds, "roofline_seconds": bound, "ratio": seconds / bound}
        if name == "lstm_train":
            checks.append(hand_check(counter))
        if name == "lstm_beam":  # the decoder's step in beam search, the search's time over its steps
            checks.append(f"lstm_beam: a decoder step of the search {seconds / workloads.BEAM_STEPS * 1e3:.1f} ms, "
                          f"its roofline {bound / workloads.BEAM_STEPS * 1e3:.1f} ms")
        heaviest = Counter()
        for op in counter.ops:
            heaviest[op.name] += op_seconds(op, peak, bandwidth)
        checks.append(f"{name}: roofline time by op: " + ", ".join(
            f"{op} {share / bound:.0%}" for op, share in heaviest.most_common(4)))
        if args.profile is not None:
            tables[name] = profile(work, args.profile, args.repeats)
        del work, counter
    print("\n" + "\n".join(checks))
    for name, (rows, shares) in tables.items():
        print(f"\n{name} ({args.profile / (name + '.txt')}):\n" + "\n".join(rows)
              + f"\nself CPU time by operator: {top_operators(shares)}")
    if args.record:
        rows = {"peak": ("the processor's peak, measured by the benchmark", {
            "gb": f"{bandwidth / 1e9:.1f} GB/s (copy)", "rate": f"{peak / 1e9:.0f} (fp32 GEMM, {route})"})}
        rows.update({name: (works[name]["about"], row) for name, row in cells.items()})
        # the command, commit, processor and date its rows share
        base = new_record(args.record, None, {}, command_line("roofline", argv, PATHS), args.beside)
        path = save_records("bench_roofline", [
            {**base, "id": f"{args.record}_{name}", "label": f"{about} ({threads} threads); {base['processor']}",
             "numbers": row, "note": machine} for name, (about, row) in rows.items()], results)
        print(f"\nrecords {', '.join(f'{args.record}_{name}' for name in rows)} written to {path}; "
              "python scripts/render_results.py puts them in the pages", flush=True)
        if tables:
            path = save_records("bench_profile", profile_records(base, works, tables, args.profile, threads, results),
                                results)
            print(f"records {', '.join(f'{args.record}_{name}' for name in tables)} written to {path}, their operator "
                  f"tables to {results / 'profiles'}", flush=True)
    print_json(args, {"threads": threads, "peak_gflop_per_s": peak / 1e9, "copy_gb_per_s": bandwidth / 1e9,
                      "work": works})
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
