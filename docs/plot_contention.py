#!/usr/bin/env python3
"""Draws docs/contention.svg from the contention runner's JSON (no dependencies).

    cargo run --release -p benches --bin contention -- --json docs/contention.json
    python3 docs/plot_contention.py docs/contention.json docs/contention.svg

Two panels per shape: median acquisitions/s (higher is better) and median p99 wait in ms
(lower is better), with min..max whiskers over the runs.
"""
import json
import sys
from html import escape

COLORS = {
    "Slate": "#2b6cb0", "SlateComb3": "#63b3ed", "SlateComb3Pipelined": "#90cdf4",
    "Rslock1": "#c53030", "Rslock3": "#fc8181", "Spin": "#718096",
}
NAMES = {
    "Slate": "slate", "SlateComb3": "slate-comb-3", "SlateComb3Pipelined": "slate-comb-3p",
    "Rslock1": "rslock-1", "Rslock3": "rslock-3", "Spin": "spin",
}


def panel(out, x0, y0, w, h, title, rows, key):
    vals = [r[key] for r in rows if r[key]]
    top = max(v["max"] for v in vals) * 1.1 if vals else 1
    out.append(f'<text x="{x0}" y="{y0 - 8}" font-size="13" font-weight="bold">{escape(title)}</text>')
    out.append(f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#333"/>')
    bw = w / max(len(rows), 1)
    for i, r in enumerate(rows):
        s = r[key]
        if not s:
            continue
        bh = h * s["median"] / top
        x = x0 + i * bw + bw * 0.15
        color = COLORS.get(r["implementation"], "#888")
        out.append(f'<rect x="{x:.1f}" y="{y0 + h - bh:.1f}" width="{bw * 0.7:.1f}" height="{bh:.1f}" fill="{color}"/>')
        cx = x + bw * 0.35
        lo, hi = y0 + h - h * s["min"] / top, y0 + h - h * s["max"] / top
        out.append(f'<line x1="{cx:.1f}" y1="{lo:.1f}" x2="{cx:.1f}" y2="{hi:.1f}" stroke="#000"/>')
        out.append(f'<text x="{cx:.1f}" y="{y0 + h - bh - 4:.1f}" font-size="10" text-anchor="middle">{s["median"]:.0f}</text>')
        name = NAMES.get(r["implementation"], r["implementation"])
        out.append(f'<text x="{cx:.1f}" y="{y0 + h + 14}" font-size="10" text-anchor="middle">{escape(name)}</text>')


def main():
    data = json.load(open(sys.argv[1]))
    rows = data["summary"]
    shapes = []
    for r in rows:
        s = f'{r["shape"]["procs"]}x{r["shape"]["tasks"]}'
        if s not in shapes:
            shapes.append(s)
    pw, ph, gap = 420, 180, 70
    width = 2 * pw + 3 * 40
    height = len(shapes) * (ph + gap) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, shape in enumerate(shapes):
        sel = [r for r in rows if f'{r["shape"]["procs"]}x{r["shape"]["tasks"]}' == shape]
        y = 40 + i * (ph + gap)
        panel(out, 40, y, pw, ph, f"{shape}: acquisitions/s (median, min..max)", sel, "acq_per_s")
        panel(out, 80 + pw, y, pw, ph, f"{shape}: p99 wait, ms (median, min..max)", sel, "wait_p99_ms")
    out.append("</svg>")
    open(sys.argv[2], "w").write("\n".join(out))


if __name__ == "__main__":
    main()
