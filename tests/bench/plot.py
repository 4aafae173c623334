#!/usr/bin/env python3
"""PNG figures of a side_by_side.py benchmark JSON (bench/runs/*.json).

For each direction (forward, and backward when the JSON has it), TFLOP/s
of flashjit beside its peers (sdpa-flash, sdpa-cudnn, flex, naive: those
that ran):
  * several sequence lengths: TFLOP/s against sequence length, one panel
    per head dim (causal and non-causal as separate lines);
  * one sequence length: grouped bars, one group per case
(--style bars or lines chooses; bars label each case with its N, B, H).

    python3 tests/bench/plot.py bench/runs/T3-bench.json --out bench/plots
    python3 tests/bench/plot.py bench/runs/T34-C/bench.json --style bars

Writes <out>/<stem>-fwd.png and <out>/<stem>-bwd.png; prints their paths.
A tests/bench/sparsity.py JSON (its "sparsity" key) gives
<out>/<stem>-sparsity.png instead: milliseconds against the layout's
density, flashjit and FlexAttention, the dense sdpa backends as lines.
Needs matplotlib (pip install matplotlib).
"""

import argparse
import json
import pathlib
import sys

COLORS = {"flashjit": "#d62728", "flashjit-py": "#ff7f0e",
          "sdpa-flash": "#1f77b4", "sdpa-cudnn": "#2ca02c", "flex": "#9467bd",
          "naive": "#7f7f7f"}
SPARE = ["#8c564b", "#e377c2", "#bcbd22", "#17becf"]


def color(impl):
    if impl not in COLORS:
        COLORS[impl] = SPARE[len(COLORS) % len(SPARE)]
    return COLORS[impl]


def series(cases, direction):
    """[(case, {impl: tflops})] of one direction; impls that were skipped
    or failed are left out."""
    out = []
    for c in cases:
        part = c if direction == "fwd" else c.get("backward")
        if not part:
            continue
        vals = {}
        fj = part.get("flashjit") or {}
        if fj.get("tflops") and fj.get("ok", True):
            vals["flashjit"] = fj["tflops"]
        for name, peer in (part.get("peers") or {}).items():
            if isinstance(peer, dict) and peer.get("tflops"):
                vals[name] = peer["tflops"]
        if vals:
            out.append((c, vals))
    return out


def label(c):
    return (f"d={c['d']}{' causal' if c['causal'] else ''}\n"
            f"N={c['N']} B={c['B']} H={c['H']}")


def impls_of(rows):
    seen = []
    for _, vals in rows:
        for k in vals:
            if k not in seen:
                seen.append(k)
    order = list(COLORS)
    return sorted(seen, key=lambda k: order.index(k) if k in order else 99)


def bars(ax, rows):
    import numpy as np

    impls = impls_of(rows)
    x = np.arange(len(rows))
    w = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ys = [vals.get(impl, 0.0) for _, vals in rows]
        pos = x + (i - (len(impls) - 1) / 2) * w
        ax.bar(pos, ys, w, label=impl, color=color(impl))
        for p, y in zip(pos, ys):
            if y:
                ax.text(p, y, f"{y:.0f}", ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([label(c) for c, _ in rows], fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)


def lines(fig, rows):
    dims = sorted({c["d"] for c, _ in rows})
    axes = fig.subplots(1, len(dims), squeeze=False)[0]
    for ax, d in zip(axes, dims):
        mine = [(c, v) for c, v in rows if c["d"] == d]
        for impl in impls_of(mine):
            for causal in (False, True):
                pts = sorted((c["N"], v[impl]) for c, v in mine
                             if c["causal"] == causal and impl in v)
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=color(impl),
                            linestyle="--" if causal else "-",
                            label=f"{impl}{' causal' if causal else ''}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"head dim {d}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def plot_sparsity(plt, data, stem, out_dir):
    """Time against density (tests/bench/sparsity.py's JSON)."""
    meta, rows = data.get("meta", {}), data["sparsity"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    drawn = False
    for impl in ("flashjit", "flex"):
        pts = sorted((r["density"], r[f"{impl}_ms"]) for r in rows
                     if r.get(f"{impl}_ms") is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=color(impl), label=impl)
            drawn = True
    for name, ms in (data.get("dense") or {}).items():
        ax.axhline(ms, color=color(name), linestyle=":", label=f"{name} (dense)")
    if not drawn:
        raise SystemExit(f"plot.py: {stem} has no timed density")
    ax.set_xlabel("density of the block layout (128 x 128 blocks)")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"block-sparse forward, bf16, d={meta.get('d')} N={meta.get('N')} "
                 f"H={meta.get('H')} ({stem})", fontsize=10)
    fig.tight_layout()
    dest = out_dir / f"{stem}-sparsity.png"
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return [dest]


def plot(path, out_dir, style="auto"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(pathlib.Path(path).read_text())
    stem = pathlib.Path(path).stem
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if "sparsity" in data:
        return plot_sparsity(plt, data, stem, out_dir)
    cases, meta = data["cases"], data.get("meta", {})
    written = []
    for direction, title in (("fwd", "forward"), ("bwd", "backward")):
        rows = series(cases, direction)
        if not rows:
            continue
        seq_lens = {c["N"] for c, _ in rows}
        if style == "bars" or (style == "auto" and len(seq_lens) == 1):
            fig = plt.figure(figsize=(max(7, 1.6 * len(rows)), 4.5))
            bars(fig.add_subplot(), rows)
            where = (f"seq_len {seq_lens.pop()}" if len(seq_lens) == 1 else
                     "per case")
        else:
            fig = plt.figure(figsize=(4.5 * len({c["d"] for c, _ in rows}),
                                      4.2))
            lines(fig, rows)
            where = "by sequence length"
        fig.suptitle(f"{title}, bf16, {where} ({meta.get('device', '?')}; "
                     f"{stem})", fontsize=10)
        fig.tight_layout()
        dest = out_dir / f"{stem}-{direction}.png"
        fig.savefig(dest, dpi=110)
        plt.close(fig)
        written.append(dest)
    if not written:
        raise SystemExit(f"plot.py: {path} has no case with TFLOP/s")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+",
                    help="side_by_side.py or sparsity.py output(s)")
    ap.add_argument("--out", default="bench/plots")
    ap.add_argument("--style", choices=("auto", "bars", "lines"),
                    default="auto",
                    help="grouped bars per case or TFLOP/s against sequence "
                    "length per head dim (auto: bars when the run has one "
                    "sequence length)")
    args = ap.parse_args(argv)
    for path in args.json:
        for dest in plot(path, args.out, args.style):
            print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
