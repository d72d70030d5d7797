"""Draw a recorded schedule (a `Run`) as a ring: one frame per step.

Ranks stand on a circle, rank 0 at the top and the ring running clockwise. In each frame an
arrow goes from sender to receiver for every message of that step, coloured and labelled by
the piece it carries (solid: reduced into the receiver's buffer; dashed: copied), and each
rank's buffer is drawn beside it as it is after the step (dark cells hold their final values:
nothing writes to them again).

`svg` gives an animated SVG (SMIL: each frame is shown in turn) or a still of one frame;
`html` gives a page with prev / next / play buttons. Both are well-formed XML.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy

from .run import Run
from .schedule import Move

SVG_NS = "http://www.w3.org/2000/svg"
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf"]
GREY = "#555555"
NODE_RADIUS = 26
CELL_HEIGHT = 20
MAX_CELLS = 24  # longer buffers are not drawn cell by cell
SECONDS_PER_STEP = 1.6


def _colour(index: int | None) -> str:
    return GREY if index is None else COLOURS[index % len(COLOURS)]


class _Layout:
    """Where everything goes for `run`: the ring, the nodes, and each rank's buffer."""

    def __init__(self, run: Run, min_width: float) -> None:
        setup = run.setup
        self.size = setup.size
        width = max((len(_value(v)) for state in run.states for b in state for v in b),
                    default=1)
        self.cell = 8 * width + 10
        self.cells = setup.count <= MAX_CELLS  # else the buffers are not drawn
        self.row = self.cell * setup.count if self.cells else 0
        self.radius = max(130, 42 * setup.size)
        self.out = self.radius + NODE_RADIUS + 14  # distance from the centre to a buffer row
        half = self.out + self.row + 20
        self.width = max(2 * half, min_width)
        self.lines = 2 + max((len(frame) + len(divides) for frame, divides in
                              zip(run.frames, run.divides)), default=0)
        self.top = 70  # title and caption
        self.height = self.top + 2 * (self.out + CELL_HEIGHT + 10) + 16 * self.lines + 30
        self.cx, self.cy = self.width / 2, self.top + self.out + CELL_HEIGHT + 10

    def angle(self, rank: int) -> float:
        return -math.pi / 2 + 2 * math.pi * rank / self.size

    def node(self, rank: int) -> tuple[float, float]:
        a = self.angle(rank)
        return self.cx + self.radius * math.cos(a), self.cy + self.radius * math.sin(a)

    def row_origin(self, rank: int, cells: int) -> tuple[float, float]:
        """Top-left of a buffer row of `cells` cells: outside the node, leaning away from the
        ring (to the right on the right side, above at the top; diagonals lean both ways)."""
        a = self.angle(rank)
        x = self.cx + self.out * math.cos(a)
        y = self.cy + self.out * math.sin(a)
        lean_x, lean_y = (max(-1.0, min(1.0, 3 * f(a))) for f in (math.cos, math.sin))
        return (x - self.cell * cells * (1 - lean_x) / 2,
                y - CELL_HEIGHT * (1 - lean_y) / 2)


def _value(v: float) -> str:
    return "" if numpy.isnan(v) else f"{v:g}"


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    element = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v)
                                          for k, v in attrs.items()})
    if text is not None:
        element.text = text
    return element


def _arrow(group: ET.Element, layout: _Layout, run: Run, move: Move) -> None:
    """A curved arrow from sender to receiver, bowed to the left of travel: along the ring
    for neighbours, so the two directions between a pair never overlap."""
    (x1, y1), (x2, y2) = layout.node(move.src), layout.node(move.dst)
    dx, dy = x2 - x1, y2 - y1
    length = math.hypot(dx, dy)
    apart = 2 * math.pi * min((move.dst - move.src) % run.setup.size,
                              (move.src - move.dst) % run.setup.size) / run.setup.size
    bow = min(2 * layout.radius * (1 - math.cos(apart / 2)), 0.35 * length)
    cx, cy = (x1 + x2) / 2 + dy / length * bow, (y1 + y2) / 2 - dx / length * bow

    def toward_control(x: float, y: float, gap: float) -> tuple[float, float]:
        d = math.hypot(cx - x, cy - y)
        return x + (cx - x) / d * gap, y + (cy - y) / d * gap

    (sx, sy), (ex, ey) = toward_control(x1, y1, NODE_RADIUS + 3), toward_control(x2, y2,
                                                                                 NODE_RADIUS + 9)
    piece = run.piece(move) if run.lesson.piece != "buffer" else None
    colour = _colour(piece if piece is not None else move.src)
    label = run.label(move, short=True)
    g = _el(group, "g", class_="move", data_src=move.src, data_dst=move.dst, data_label=label,
            data_kind=move.kind)
    path = {"d": f"M {sx:.1f} {sy:.1f} Q {cx:.1f} {cy:.1f} {ex:.1f} {ey:.1f}", "fill": "none",
            "stroke": colour, "stroke_width": 3, "marker_end": f"url(#head-{colour[1:]})"}
    if move.kind != "reduce" and not run.lesson.boxes:
        path["stroke_dasharray"] = "7 4"
    _el(g, "path", **path)
    lx, ly = 0.25 * sx + 0.5 * cx + 0.25 * ex, 0.25 * sy + 0.5 * cy + 0.25 * ey
    _el(g, "rect", x=f"{lx - 3.6 * len(label) - 4:.1f}", y=f"{ly - 10:.1f}",
        width=f"{7.2 * len(label) + 8:.1f}", height=18, rx=4, fill="white", stroke=colour)
    _el(g, "text", label, x=f"{lx:.1f}", y=f"{ly + 4:.1f}", text_anchor="middle", fill=colour,
        font_size=12, font_weight="bold")


def _buffers(group: ET.Element, layout: _Layout, run: Run, step: int) -> None:
    """Each rank's buffer as a row of cells, tinted by piece; final values drawn dark, cells
    this step wrote to outlined."""
    if not layout.cells:
        return
    grid = run.lesson.grid(run.setup)
    writes = [run.written(k) for k in range(1, len(run.frames) + 1)]
    last = [numpy.zeros(b.size, int) for b in run.states[0]]  # the last step writing each
    for k, marks in enumerate(writes, start=1):
        for mine, written in zip(last, marks):
            mine[written] = k
    for rank, values in enumerate(run.states[step]):
        now = writes[step - 1][rank] if step else numpy.zeros(values.size, bool)
        target = run.lesson.target(rank, run.setup)
        x0, y0 = layout.row_origin(rank, values.size)
        for i, v in enumerate(values):
            if values.size == run.setup.count:
                piece = next((k for k, (lo, hi) in enumerate(grid) if lo <= i < hi), None)
            else:  # a rank's own block only (scatter's receivers)
                piece = rank
            piece = None if run.lesson.piece == "buffer" else piece
            final = step >= last[rank][i] and not numpy.isnan(target[i])
            x = x0 + i * layout.cell
            _el(group, "rect", x=f"{x:.1f}", y=f"{y0:.1f}", width=layout.cell,
                height=CELL_HEIGHT, fill="white" if numpy.isnan(v) else _colour(piece),
                fill_opacity=0.85 if final else 0.18, stroke="#999999", stroke_width=0.8)
            if now[i]:
                _el(group, "rect", x=f"{x + 1:.1f}", y=f"{y0 + 1:.1f}", width=layout.cell - 2,
                    height=CELL_HEIGHT - 2, fill="none", stroke="#111111", stroke_width=2)
            _el(group, "text", _value(v), x=f"{x + layout.cell / 2:.1f}", y=f"{y0 + 14:.1f}",
                text_anchor="middle", font_size=12, fill="white" if final else "#222222",
                class_="cell")


def _frame(svg: ET.Element, layout: _Layout, run: Run, step: int, visible: bool) -> ET.Element:
    group = _el(svg, "g", class_="frame", id=f"frame-{step}", data_step=step,
                visibility="visible" if visible else "hidden")
    steps = len(run.frames)
    if step == 0:
        caption, moves = "start: every rank holds its own data", []
    else:
        moves = run.frames[step - 1]
        phases = " + ".join(dict.fromkeys(m.phase for m in moves))
        caption = f"step {step} of {steps}: {phases}"
    _el(group, "text", caption, x=20, y=52, font_size=15)
    for move in moves:
        _arrow(group, layout, run, move)
    _buffers(group, layout, run, step)
    y = layout.height - 16 * layout.lines - 14
    lines = [f"rank {m.src} \u2192 rank {m.dst}: {run.label(m)} ({run.action(m)})" for m in moves]
    lines += [run.note(d) for d in (run.divides[step - 1] if step else [])]
    for k, line in enumerate(lines):
        _el(group, "text", line, x=20, y=y + 16 * k, font_size=12, fill="#333333")
    return group


def _picture(run: Run, frames: list[int], visible: int) -> tuple[ET.Element, _Layout]:
    """The SVG element with the ring and the given frames (only `visible` shown)."""
    s = run.setup
    title = f"{run.lesson.title}, {s.size} ranks, {s.count} elements"
    title += f", op {s.op}" if run.lesson.reduces else ""
    title += f", root {s.root}" if run.lesson.rooted else ""
    legend = "solid arrow: received and reduced  \u00b7  dashed: received and copied"
    if s.count <= MAX_CELLS:
        legend += "  \u00b7  dark cells: final values  \u00b7  outlined: written in this step"
    layout = _Layout(run, min_width=40 + max(10 * len(title), 6.3 * len(legend), 600))
    svg = ET.Element("svg", {"xmlns": SVG_NS, "width": str(int(layout.width)),
                             "height": str(int(layout.height)),
                             "viewBox": f"0 0 {int(layout.width)} {int(layout.height)}",
                             "font-family": "DejaVu Sans, Helvetica, Arial, sans-serif"})
    _el(svg, "title", title)
    defs = _el(svg, "defs")
    for colour in [*COLOURS, GREY]:
        marker = _el(defs, "marker", id=f"head-{colour[1:]}", viewBox="0 0 10 10", refX=8,
                     refY=5, markerWidth=5, markerHeight=5, orient="auto")
        _el(marker, "path", d="M 0 0 L 10 5 L 0 10 z", fill=colour)
    _el(svg, "rect", width="100%", height="100%", fill="white")
    _el(svg, "text", title, x=20, y=28, font_size=17, font_weight="bold")
    _el(svg, "circle", cx=layout.cx, cy=layout.cy, r=layout.radius, fill="none",
        stroke="#dddddd", stroke_width=10)
    for rank in range(s.size):
        x, y = layout.node(rank)
        _el(svg, "circle", cx=f"{x:.1f}", cy=f"{y:.1f}", r=NODE_RADIUS, fill="#f4f4f4",
            stroke="#333333", stroke_width=2)
        _el(svg, "text", f"rank {rank}", x=f"{x:.1f}", y=f"{y + 4:.1f}", text_anchor="middle",
            font_size=11, font_weight="bold")
    _el(svg, "text", legend, x=20, y=layout.height - 12, font_size=11, fill="#666666")
    for step in frames:
        _frame(svg, layout, run, step, step == visible)
    return svg, layout


def svg(run: Run, still: int | None = None) -> str:
    """An animated SVG of every step of `run`, looping; or, with `still`, that step alone."""
    steps = len(run.frames)
    if still is not None:
        if not 0 <= still <= steps:
            raise ValueError(f"there is no step {still}: steps run from 0 (the start) to {steps}")
        picture, _ = _picture(run, [still], still)
    else:
        picture, _ = _picture(run, list(range(steps + 1)), 0)
        total = (steps + 1) * SECONDS_PER_STEP
        for group in picture.iter("g"):
            if group.get("class") != "frame":
                continue
            k = int(group.get("data-step"))
            times = [0.0, k / (steps + 1), (k + 1) / (steps + 1), 1.0]
            _el(group, "animate", attributeName="visibility", calcMode="discrete",
                dur=f"{total:g}s", repeatCount="indefinite",
                values="hidden;visible;hidden;hidden",
                keyTimes=";".join(f"{t:.6g}" for t in times))
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(picture, "unicode") + "\n"


SCRIPT = """
var frames = document.querySelectorAll("g.frame");
var at = 0, timer = null;
function show(k) {
  at = Math.max(0, Math.min(frames.length - 1, k));
  frames.forEach(function (f, i) {
    f.setAttribute("visibility", i === at ? "visible" : "hidden");
  });
  document.getElementById("where").textContent = at === 0 ? "start" :
    "step " + at + " of " + (frames.length - 1);
}
function play() {
  if (timer !== null) { clearInterval(timer); timer = null; return; }
  timer = setInterval(function () { show(at === frames.length - 1 ? 0 : at + 1); }, 1200);
}
document.getElementById("prev").onclick = function () { show(at - 1); };
document.getElementById("next").onclick = function () { show(at + 1); };
document.getElementById("play").onclick = play;
document.addEventListener("keydown", function (e) {
  if (e.key === "ArrowLeft") { show(at - 1); }
  if (e.key === "ArrowRight") { show(at + 1); }
});
show(0);
"""


def html(run: Run) -> str:
    """A page showing the ring one step at a time: prev / next / play, or the arrow keys."""
    picture, _ = _picture(run, list(range(len(run.frames) + 1)), 0)
    page = ET.Element("html", {"xmlns": "http://www.w3.org/1999/xhtml", "lang": "en"})
    head = _el(page, "head")
    _el(head, "meta", charset="utf-8")
    _el(head, "title", picture.find("title").text)
    _el(head, "style", "body { font-family: sans-serif; margin: 1em; } "
                       "button { font-size: 1em; margin-right: 0.5em; }")
    body = _el(page, "body")
    bar = _el(body, "p")
    for name, text in (("prev", "\u25c0 prev"), ("next", "next \u25b6"), ("play", "play / stop")):
        _el(bar, "button", text, id=name, type="button")
    _el(bar, "span", "start", id="where")
    body.append(picture)
    _el(body, "script", SCRIPT)
    return "<!DOCTYPE html>\n" + ET.tostring(page, "unicode", method="xml") + "\n"
