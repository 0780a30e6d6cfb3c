"""``python -m synkhronos timeline t.json``: where a timeline's time went.

Reads a file that ``SYNK_TIMELINE``, ``fork(timeline=...)`` or :func:`synkhronos.timeline`
wrote (:mod:`synkhronos.transport.trace`), prints one row per phase (a span's name) with
each rank's count, mean and total, and the slowest rank by mean, then the bytes each rank
moved; and writes a PNG: a Gantt chart of the last few commands of every rank, and per
rank a stacked bar of the activities' shares of its time. A share counts a span's own
time, without the spans nested in it, so the shares of a rank add up to the time its
spans cover.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

COLORS = {  # one per activity (a span's cat), the same in every picture
    "rank 0": "#4c72b0",
    "command": "#8c8c8c",
    "rows": "#dd8452",
    "compute": "#55a868",
    "collective": "#c44e52",
    "wait": "#e5e5e5",
    "reply": "#8172b3",
    "outputs": "#937860",
    "updates": "#da8bc3",
    "compile": "#ccb974",
    "checkpoint": "#64b5cd",
    "routine": "#2f4f4f",
}


@dataclass
class Span:
    """One span of a timeline, with its depth on its rank and its own time."""

    rank: int
    name: str
    cat: str
    start: float  # microseconds
    dur: float
    depth: int = 0
    own: float = 0.0  # dur less the spans nested in it


@dataclass
class Timeline:
    """A timeline file's spans, by rank, and each rank's bytes moved."""

    spans: dict[int, list[Span]] = field(default_factory=dict)
    moved: dict[int, dict[str, int]] = field(default_factory=dict)


def nest(spans: list[Span]) -> None:
    """Give each of one rank's spans its depth and own time; ``ValueError`` if two spans
    overlap without one containing the other (the spans of one rank must nest)."""
    spans.sort(key=lambda s: (s.start, -s.dur))
    open_spans: list[Span] = []
    for span in spans:
        while open_spans and span.start >= open_spans[-1].start + open_spans[-1].dur:
            open_spans.pop()
        span.own = span.dur
        if open_spans:
            parent = open_spans[-1]
            # Rounding to nanoseconds in microsecond floats: a hair of slack.
            if span.start + span.dur > parent.start + parent.dur + 1e-3:
                raise ValueError(
                    f"rank {span.rank}: span {span.name!r} at {span.start} us overlaps "
                    f"{parent.name!r} without nesting in it"
                )
            parent.own -= span.dur
        span.depth = len(open_spans)
        open_spans.append(span)


def read(path: str | os.PathLike) -> Timeline:
    """The spans (nested: :func:`nest`) and byte counters of a timeline file."""
    with open(path) as file:
        events: list[dict[str, Any]] = json.load(file)["traceEvents"]
    timeline = Timeline()
    for event in events:
        rank = int(event["pid"])
        if event["ph"] == "X":
            span = Span(rank, event["name"], event.get("cat", ""), event["ts"], event["dur"])
            timeline.spans.setdefault(rank, []).append(span)
        elif event["ph"] == "C":
            timeline.moved[rank] = event["args"]  # cumulative: the last one counts
    for spans in timeline.spans.values():
        nest(spans)
    return timeline


def table(timeline: Timeline, within: list[tuple[float, float]] | None = None) -> str:
    """The per-phase summary, a Markdown table: per rank the count, mean and total (ms) of
    each phase, the slowest rank by mean, and each phase's share of its ranks' own time;
    of the spans ``within`` the time ranges (:func:`steps_of`) where given."""
    ranks = sorted(timeline.spans)
    durations: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    own: dict[tuple[str, str], float] = defaultdict(float)
    for rank in ranks:
        for span in timeline.spans[rank]:
            if not _inside(span, within):
                continue
            durations[(span.cat, span.name)][rank].append(span.dur / 1000)
            own[(span.cat, span.name)] += span.own / 1000
    covered = sum(own.values()) or 1.0
    head = ["phase", "activity", *(f"rank {r}: n, mean, total ms" for r in ranks)]
    rows = [[*head, "slowest rank", "own share"]]
    for key in sorted(durations, key=lambda k: -own[k]):
        per_rank = durations[key]
        means = {r: sum(d) / len(d) for r, d in per_rank.items()}
        cells = [
            f"{len(per_rank[r])}, {means[r]:.3f}, {sum(per_rank[r]):.2f}" if r in per_rank else ""
            for r in ranks
        ]
        slowest = max(means, key=lambda r: means[r]) if len(means) > 1 else ""
        rows.append([key[1], key[0], *cells, str(slowest), f"{own[key] / covered:.1%}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def bytes_table(timeline: Timeline) -> str:
    """The bytes each rank moved, by kind, as a Markdown table."""
    kinds = sorted({k for moved in timeline.moved.values() for k in moved})
    lines = ["| rank | " + " | ".join(f"{k} bytes" for k in kinds) + " |"]
    lines.append("|---" * (len(kinds) + 1) + "|")
    for rank in sorted(timeline.moved):
        moved = timeline.moved[rank]
        lines.append(f"| {rank} | " + " | ".join(str(moved.get(k, 0)) for k in kinds) + " |")
    return "\n".join(lines)


def steps_of(timeline: Timeline, steps: int) -> list[tuple[float, float]]:
    """The time ranges of rank 0's last ``steps`` steps, a step being a command of the kind
    rank 0 sent most often (a training loop's), each from the end of the command before
    it, so that rank 0's planning of the step is in (and other commands between steps,
    an evaluation, are out)."""
    ranks = sorted(timeline.spans)
    commands = [s for s in timeline.spans[ranks[0]] if s.depth == 0] if ranks else []
    commands = [s for s in commands if s.cat == "command"] or commands
    if not commands:
        raise ValueError("the timeline has no spans")
    names = [s.name for s in commands]
    step = max(set(names), key=names.count)
    chosen = [i for i, name in enumerate(names) if name == step][-steps:]
    return [
        (commands[i - 1].start + commands[i - 1].dur if i else commands[i].start, end)
        for i in chosen
        for end in [commands[i].start + commands[i].dur]
    ]


def _inside(span: Span, ranges: list[tuple[float, float]] | None) -> bool:
    """Whether ``span`` ends within one of ``ranges`` (sorted, apart): a worker's wait for
    a step's command began before it; every span does without ``ranges``."""
    if ranges is None:
        return True
    end = span.start + span.dur
    i = bisect.bisect_left(ranges, (end,)) - 1  # the last range starting before the end
    return i >= 0 and ranges[i][0] < end <= ranges[i][1]


def plot(
    timeline: Timeline,
    path: str | os.PathLike,
    steps: int = 3,
    within: list[tuple[float, float]] | None = None,
) -> None:
    """Write the PNG: a Gantt chart of rank 0's last ``steps`` steps (:func:`steps_of`) on
    every rank, and per rank the activities' shares of the time of its spans (those
    ``within`` the time ranges where given) as stacked bars."""
    from matplotlib.figure import Figure  # optional (the demo and test extras): only here
    from matplotlib.patches import Patch

    ranges = steps_of(timeline, steps)
    start, end = ranges[0][0], ranges[-1][1]
    ranks = sorted(timeline.spans)
    figure = Figure(figsize=(8, 1.2 + 0.9 * len(ranks)), dpi=80)
    gantt, shares = figure.subplots(
        1, 2, gridspec_kw={"width_ratios": [4, 1.3]}, sharey=True, squeeze=True
    )
    for rank in ranks:
        shown = [s for s in timeline.spans[rank] if s.start + s.dur >= start and s.start <= end]
        height = 0.8 / (1 + max((s.depth for s in shown), default=0))  # one lane per depth
        for span in shown:
            gantt.barh(
                rank - 0.4 + height * (span.depth + 0.5),
                span.dur / 1000,
                left=(span.start - start) / 1000,
                height=height,
                color=COLORS.get(span.cat, "#000000"),
                edgecolor="white",
                linewidth=0.3,
            )
    gantt.set_xlim(0, (end - start) / 1000)
    gantt.set_xlabel(f"ms (rank 0's last {steps} steps)")
    gantt.set_yticks(ranks, [f"rank {r}" for r in ranks])
    gantt.invert_yaxis()
    used = []
    for rank in ranks:
        per_cat: dict[str, float] = defaultdict(float)
        for span in timeline.spans[rank]:
            if _inside(span, within):
                per_cat[span.cat] += span.own
        total = sum(per_cat.values()) or 1.0
        left = 0.0
        for cat, color in COLORS.items():
            if per_cat.get(cat):
                shares.barh(rank, per_cat[cat] / total * 100, left=left, color=color, height=0.6)
                left += per_cat[cat] / total * 100
                used.append(cat)
    shares.set_xlim(0, 100)
    shares.set_xlabel("% of the time" + ("" if within is None else " (--last)"))
    figure.legend(
        handles=[Patch(color=COLORS[c], label=c) for c in COLORS if c in used],
        loc="upper center",
        ncol=6,
        fontsize="small",
        frameon=False,
    )
    inch = 1 / figure.get_figheight()  # margins in inches: the legend's two lines, the labels
    figure.subplots_adjust(
        top=1 - 0.55 * inch, bottom=0.5 * inch, left=0.09, right=0.98, wspace=0.05
    )
    figure.savefig(path)


def main(argv: list[str]) -> int:
    """``python -m synkhronos timeline t.json [--png t.png] [--steps 3]``; returns the exit
    status."""
    parser = argparse.ArgumentParser(
        prog="python -m synkhronos timeline",
        description="where a synkhronos timeline's time went: a table per phase and a PNG",
    )
    parser.add_argument("path", help="a timeline file (SYNK_TIMELINE, synk.timeline)")
    parser.add_argument("--png", help="the picture's path (default: the file's, .png)")
    parser.add_argument("--steps", type=int, default=3, help="steps in the Gantt chart")
    parser.add_argument(
        "--last", type=int, help="summarise rank 0's last LAST steps only (default: all)"
    )
    args = parser.parse_args(argv)
    timeline = read(args.path)
    png = args.png or os.path.splitext(args.path)[0] + ".png"
    within = steps_of(timeline, args.last) if args.last else None
    plot(timeline, png, args.steps, within)
    # The command's output, not the library's: stdout, as machine_check's report.
    sys.stdout.write(f"{table(timeline, within)}\n\n{bytes_table(timeline)}\n\nwrote {png}\n")
    return 0
