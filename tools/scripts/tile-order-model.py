#!/usr/bin/env python3
"""A model of the persistent forward's causal tile orders (runs HERE).

Each program of a persistent grid takes the tiles w = blockIdx.x,
blockIdx.x + gridDim.x, ... of an order of (Q block, batch * head) tiles
(compiler/Conversion/TileToGPUPersistent.cpp). Causal, Q block m (0-based)
visits m + 1 KV blocks; a tile's cost here is its KV blocks plus a fixed
part (--fixed, in KV blocks). Prints each order's makespan (the busiest
program's cost) over the ideal (the total over the programs), statically
assigned (round robin, and with every other round reversed: "snake") and,
for comparison, dynamically (each program takes the next tile when free,
as the hardware does with one tile per program). Balance only: no L2, no
memory traffic.

The last row, "schedule", is kernels/TileSchedule.h's (T32): heads in
groups of at most --group-heads (as even as possible; default 0: as the
launcher's l2GroupHeads, K and V of N = blocks x 128 keys at d = 128 in
25 MiB), a group's heaviest Q blocks first, each tile to the
least-loaded program, taken as a static list per program (what the
scheduled kernel reads).

Usage: tile-order-model.py [--programs 132] [--fixed 0.5] [--group-heads 0]
       [--shape BLOCKS:HEADS ...]   (default: N 16K, N 1024 B 16, N 4096 B 4
                                     at Br 128, 16 heads)
"""
import argparse
import heapq


def order(kind, blocks, heads, group):
    """The tiles (head, Q block) in the order `kind`."""
    if kind == "levels":  # today's: the heaviest Q blocks of all heads first
        return [(h, m) for m in reversed(range(blocks)) for h in range(heads)]
    if kind == "heads":  # one tile per program's: heads outer, heavy first
        return [(h, m) for h in range(heads) for m in reversed(range(blocks))]
    # "grouped": heads in groups of `group`, levels order within each
    return [(h, m) for g in range(0, heads, group)
            for m in reversed(range(blocks))
            for h in range(g, min(heads, g + group))]


def even_groups(heads, group):
    """TileSchedule.h's groups: ceil(heads / group) of them, sizes as even
    as possible."""
    n = -(-heads // group)
    base, extra = divmod(heads, n)
    out, first = [], 0
    for g in range(n):
        size = base + (1 if g < extra else 0)
        out.append(range(first, first + size))
        first += size
    return out


def schedule(blocks, heads, group):
    """The schedule's order over the tiles (the least-loaded program takes
    each: dynamic() over this order is what its lists hold)."""
    return [(h, m) for g in even_groups(heads, group)
            for m in reversed(range(blocks)) for h in g]


def static(tiles, programs, fixed, snake):
    load = [0.0] * programs
    for i, (_, m) in enumerate(tiles):
        r, p = divmod(i, programs)
        if snake and r % 2:
            p = min(programs, len(tiles) - r * programs) - 1 - p
        load[p] += m + 1 + fixed
    return max(load)


def dynamic(tiles, programs, fixed):
    free = [(0.0, p) for p in range(programs)]
    for _, m in tiles:
        t, p = heapq.heappop(free)
        heapq.heappush(free, (t + m + 1 + fixed, p))
    return max(t for t, _ in free)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=132)
    ap.add_argument("--fixed", type=float, default=0.5)
    ap.add_argument("--group-heads", type=int, default=0)
    ap.add_argument("--shape", nargs="*",
                    default=["128:16", "8:256", "32:64"])
    a = ap.parse_args()
    for shape in a.shape:
        blocks, heads = map(int, shape.split(":"))
        ideal = sum(m + 1 + a.fixed for m in range(blocks)) * heads / a.programs
        print(f"{blocks} Q blocks x {heads} heads: makespan / ideal")
        rows = [("levels", 0), ("heads", 0)] + [
            ("grouped", g) for g in (2, 4, 8, 16, 32) if g < heads]
        for kind, group in rows:
            t = order(kind, blocks, heads, group)
            name = kind + (f" {group}" if group else "")
            print(f"  {name:11} static {static(t, a.programs, a.fixed, False) / ideal:.3f}"
                  f"  snake {static(t, a.programs, a.fixed, True) / ideal:.3f}"
                  f"  dynamic {dynamic(t, a.programs, a.fixed) / ideal:.3f}")
        group = a.group_heads or max(1, (25 << 20) // (blocks * 128 * 256 * 2))
        t = schedule(blocks, heads, group)
        print(f"  schedule {group:<3}(lists)              "
              f"{dynamic(t, a.programs, a.fixed) / ideal:.3f}")


if __name__ == "__main__":
    main()
