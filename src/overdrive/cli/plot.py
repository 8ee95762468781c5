"""``overdrive plot RUN_DIR``: the curves of a run's ``metrics.jsonl`` as a PNG, and a summary table.

RUN_DIR is the folder the JSONL tracker wrote (``<project_dir>/<project_name>``), a project dir holding
exactly one such run, or the ``metrics.jsonl`` file itself. Needs matplotlib for the PNG
(``pip install matplotlib``); ``--no-png`` prints the summary alone.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from overdrive.cli import Parser
from overdrive.tracking.jsonl import find_metrics_file, metric_series, read_metrics


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="overdrive plot", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder, project folder or metrics.jsonl file")
    parser.add_argument("-o", "--output", help="PNG to write (default: RUN_DIR/metrics.png)")
    parser.add_argument("-m", "--metrics", nargs="+", metavar="NAME",
                        help="metrics to plot (default: every numeric metric)")
    parser.add_argument("--no-png", action="store_true", help="print the summary only")
    return parser


def summary_table(series: dict[str, tuple[list[float], list[float]]]) -> str:
    """One row per metric: points, first, last, min and max."""
    header = ("metric", "points", "first", "last", "min", "max")
    rows = [header] + [(name, str(len(values)), *(_fmt(v) for v in (values[0], values[-1], min(values),
                                                                      max(values))))
                       for name, (_, values) in series.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def plot_png(series: dict[str, tuple[list[float], list[float]]], output: str, title: str) -> None:
    """One subplot per metric, value against step, written to ``output``."""
    try:
        import matplotlib  # lazy: optional dependency
    except ImportError as exc:
        raise ImportError("overdrive plot needs the 'matplotlib' package for the PNG: pip install matplotlib "
                          "(or pass --no-png for the summary alone)") from exc
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt  # lazy: optional dependency

    count = len(series)
    cols = 1 if count == 1 else 2 if count <= 4 else 3
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.6 * rows), squeeze=False)
    first = min(steps[0] for steps, _ in series.values())
    last = max(steps[-1] for steps, _ in series.values())
    margin = (last - first) * 0.03 or 0.5
    for ax, (name, (steps, values)) in zip(axes.flat, series.items()):
        ax.plot(steps, values, marker="o" if len(values) <= 30 else None, markersize=3, linewidth=1.4)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_xlim(first - margin, last + margin)  # one step axis for all, so curves line up
        ax.grid(True, alpha=0.3)
        if "lr" in name.lower() or "learning_rate" in name.lower():
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)


def plot_main(argv: Sequence[str] | None = None) -> int:
    """Run ``overdrive plot`` with ``argv`` (the arguments after ``plot``); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        path = find_metrics_file(args.run_dir)
        series = metric_series(read_metrics(path))
    except (FileNotFoundError, ValueError) as exc:
        print(f"overdrive plot: {exc}", file=sys.stderr)
        return 1
    if args.metrics:
        unknown = [m for m in args.metrics if m not in series]
        if unknown:
            print(f"overdrive plot: no numeric metric called {unknown} in {path}; logged metrics: "
                  f"{sorted(series)}", file=sys.stderr)
            return 1
        series = {m: series[m] for m in args.metrics}
    if not series:
        print(f"overdrive plot: {path} has no numeric metrics to plot", file=sys.stderr)
        return 1
    print(f"{path}")
    print(summary_table(series))
    if args.no_png:
        return 0
    output = args.output or os.path.join(os.path.dirname(path), "metrics.png")
    try:
        plot_png(series, output, title=os.path.basename(os.path.dirname(os.path.abspath(path))))
    except ImportError as exc:
        print(f"overdrive plot: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(plot_main())
