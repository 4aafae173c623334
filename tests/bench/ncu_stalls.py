#!/usr/bin/env python3
"""Summarise one kernel's Nsight Compute report, exported as CSV pages.

    ncu_stalls.py DETAILS.csv RAW.csv SASS.csv

DETAILS.csv is `ncu -i R --csv --page details --print-units base`, RAW.csv
`--page raw`, SASS.csv `--page source --print-source sass`. Prints the
launch figures (duration, grid, block, registers, shared memory, waves,
occupancy, throughputs), the warp stall reasons by their share of the
samples, and the instructions with the most stall samples. Beside SASS.csv
it writes SASS-compact.txt: every instruction with its samples, so that
the prologue, the main loop and the epilogue can be read with their cost.
Any page may be missing or empty (an older ncu, a failed export): that page
is reported as such and the others are still summarised.
"""
import csv
import os
import sys

DETAIL_SECTIONS = ("GPU Speed Of Light Throughput", "Launch Statistics", "Occupancy",
                   "Warp State Statistics", "Memory Workload Analysis", "Scheduler Statistics")


def number(text):
    """ncu's figure (thousands separated by commas) as a float, or None."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_rows(path):
    """The CSV's rows after ncu's own "==PROF==" lines, or None."""
    if not path or not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path, newline="", errors="replace") as fh:
        lines = [ln for ln in fh if not ln.startswith("==")]
    rows = list(csv.reader(lines))
    return rows if len(rows) > 1 else None


def page(path, what):
    """read_rows(path), saying so when the page is missing or empty."""
    rows = read_rows(path)
    if rows is None:
        print(f"{what}: {path}: missing or empty")
    return rows


def details(path):
    rows = page(path, "details")
    if rows is None:
        return
    head = rows[0]
    try:
        sec, name, unit, val = (head.index(c) for c in
                                ("Section Name", "Metric Name", "Metric Unit", "Metric Value"))
    except ValueError:
        print("details: unexpected header:", head[:8])
        return
    kernel = head.index("Kernel Name") if "Kernel Name" in head else None
    if kernel is not None:
        print("kernel:", rows[1][kernel][:120])
    for section in DETAIL_SECTIONS:
        picked = [r for r in rows[1:] if len(r) > val and r[sec] == section]
        if picked:
            print(f"-- {section}")
            for r in picked:
                print(f"   {r[name]:<48} {r[val]:>16} {r[unit]}")


def raw(path):
    rows = page(path, "raw")
    if rows is None:
        return
    names, values = rows[0], rows[-1]
    metrics = dict(zip(names, values))
    stalls = []
    for k, v in metrics.items():
        if k.startswith("smsp__average_warp_latency_issue_stalled_") and k.endswith(".ratio"):
            x = number(v)
            if x:
                stalls.append((x, k[len("smsp__average_warp_latency_issue_stalled_"):-len(".ratio")]))
    if not stalls:
        for k, v in metrics.items():
            if k.startswith("smsp__pcsamp_warps_issue_stalled_") and not k.endswith("not_issued"):
                x = number(v)
                if x:
                    stalls.append((x, k[len("smsp__pcsamp_warps_issue_stalled_"):]))
    total = sum(x for x, _ in stalls) or 1.0
    print("-- warp stall reasons (cycles per issued instruction, share)")
    for x, k in sorted(stalls, reverse=True)[:14]:
        print(f"   {k:<28} {x:10.3f} {100 * x / total:5.1f}%")
    for k in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
              "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size",
              "launch__registers_per_thread", "launch__shared_mem_per_block_dynamic",
              "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
              "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct", "sm__cycles_active.avg",
              "smsp__cycles_active.avg"):
        if k in metrics:
            print(f"   {k:<72} {metrics[k]}")
    # Each pipe's share of its peak (the tensor cores against the
    # multi-function unit, xu, and the FMA and ALU pipes): which one bounds.
    # The tensor pipe's figures are printed here, with the others.
    print("-- pipes (% of peak, active cycles)")
    for k, v in sorted(metrics.items()):
        pipe = (k.startswith("sm__inst_executed_pipe_") or k.startswith("sm__pipe_")
                or k.startswith("smsp__issue_active") or k.startswith("smsp__inst_executed_pipe_"))
        x = number(v)
        if pipe and k.endswith(".avg.pct_of_peak_sustained_active") and x and x >= 1.0:
            print(f"   {k:<72} {x:8.2f}")


def sass(path):
    rows = page(path, "sass")
    if rows is None:
        return
    # The header is the first row naming a Source column.
    start = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if start is None:
        print("sass: no Source column; first row:", rows[0][:6])
        return
    head = rows[start]
    src = head.index("Source")
    addr = head.index("Address") if "Address" in head else None
    samp = next((i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All")), None)
    if samp is None:
        samp = next((i for i, c in enumerate(head) if "Sampling" in c), None)
    execd = next((i for i, c in enumerate(head) if c.startswith("Instructions Executed")), None)
    # A report of several launches repeats its page per launch: the first.
    body = []
    for r in rows[start + 1:]:
        if "Source" in r or (r and r[0] == "Kernel Name"):
            break
        if len(r) == len(head):
            body.append(r)

    def val(r, i):
        return (number(r[i]) or 0.0) if i is not None else 0.0

    total = sum(val(r, samp) for r in body) or 1.0
    out = os.path.splitext(path)[0] + "-compact.txt"
    with open(out, "w") as fh:
        for n, r in enumerate(body):
            fh.write(f"{n:5d} {r[addr] if addr is not None else '':>8} {val(r, samp):8.0f} "
                     f"{val(r, execd):10.0f}  {r[src]}\n")
    print(f"-- instructions: {len(body)}, stall samples {total:.0f} (all in {out})")
    print("   columns:", [c for c in head if "Sampling" in c or "Executed" in c][:6])
    top = sorted(range(len(body)), key=lambda n: -val(body[n], samp))[:40]
    for n in sorted(top):
        print(f"   {n:5d} {100 * val(body[n], samp) / total:5.1f}%  {body[n][src][:90]}")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    details(sys.argv[1])
    raw(sys.argv[2])
    sass(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
