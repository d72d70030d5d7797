"""Bus bandwidth against message size from the harness's JSON files.

    python -m benchmarks.plot results.json [more.json ...] -o plot.png

One line per implementation (and per rank count, collective, dtype or op where the files
differ in them), log axes, and the memory-copy bandwidth of the plotting machine as a dashed
ceiling: a large NumPy copy, measured when the plot is drawn.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy

COPY_BYTES = 256 << 20
LABEL_KEYS = ("collective", "ranks", "dtype", "op", "registered")  # named where files differ
STYLES = ["-", "-.", ":"]  # "--" is the ceiling's


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """GB/s of the fastest of `repeats` copies of `nbytes` with NumPy (bytes copied / time)."""
    src = numpy.ones(nbytes // 8)
    dst = numpy.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def load_rows(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """(rows, metas) of every file."""
    rows, metas = [], []
    for path in paths:
        with open(path) as source:
            result = json.load(source)
        rows += [{"registered": False, **row} for row in result["rows"]]
        metas.append(result["meta"])
    return rows, metas


def series(rows: list[dict]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(bytes, busbw) points by (implementation, what else tells the line apart), in file
    order; zero bandwidths (one rank) are left out of the log axes."""
    varying = [key for key in LABEL_KEYS if len({row.get(key) for row in rows}) > 1]
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        if row["busbw_GBps"] <= 0:
            continue
        rest = ", ".join(f"{row[key]} ranks" if key == "ranks" else
                         ("registered" if row.get(key) else "ordinary") if key == "registered"
                         else str(row[key]) for key in varying)
        lines.setdefault((row["impl"], rest), []).append((row["bytes"], row["busbw_GBps"]))
    return lines


def size_label(nbytes: float, _position: object = None) -> str:
    """8, 1K, 64M: the harness's own spelling of sizes."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit:
            return f"{nbytes / unit:g}{suffix}"
    return f"{nbytes:g}"


def plot(paths: list[str], output: str) -> None:
    """Draw busbw against size for the files and save the figure to `output`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows, metas = load_rows(paths)
    figure, axes = plt.subplots(figsize=(9, 5.5))
    # One colour per implementation, one line style per rank count (or dtype, ...).
    lines = series(rows)
    colours = {impl: f"C{k % 10}" for k, impl in enumerate(dict.fromkeys(i for i, _ in lines))}
    styles = dict(zip(dict.fromkeys(rest for _, rest in lines), itertools.cycle(STYLES)))
    for (impl, rest), points in lines.items():
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                  color=colours[impl], linestyle=styles[rest],
                  label=f"{impl}, {rest}" if rest else impl)
    ceiling = copy_bandwidth()
    axes.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                 label=f"memory copy {ceiling:.1f} GB/s (NumPy, {COPY_BYTES >> 20} MiB, "
                       "measured at plot time)")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(size_label))
    axes.set_yscale("log")
    axes.set_xlabel("message size (bytes)")
    axes.set_ylabel("bus bandwidth (GB/s)")
    names = sorted({meta["collective"] for meta in metas})
    hosts = sorted({meta["host"] for meta in metas})
    ranks = sorted({meta["ranks"] for meta in metas})
    axes.set_title(f"{', '.join(names)} on {', '.join(hosts)}, "
                   f"{', '.join(map(str, ranks))} ranks")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__.split(
        "\n")[0])
    parser.add_argument("results", nargs="+", help="JSON files written by --json")
    parser.add_argument("-o", "--output", default="plot.png", help="image file (plot.png)")
    args = parser.parse_args(argv)
    plot(args.results, args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
