"""The text side of side_by_side.py: the final table of a results dict
(also `side_by_side.py --print-table FILE`) and the summary of ncu CSV
exports (`--ncu-summary`, gpu-run.sh's ncu step). No torch here.
"""
from side_by_side_flashjit import short

# The peers side_by_side.py measures, in the table's column order.
PEERS = ("sdpa-flash", "sdpa-cudnn", "flex", "naive", "flashjit-py")


def fmt_t(m, terr=None):
    if not m:
        return "-"
    if m.get("tflops") is not None:
        return f"{m['tflops']:.0f}"
    if "skipped" in m:
        return "skip"
    if "error" in m:
        return "n/a" if terr and m["error"] == terr else "err"
    return "-"


def table(data):
    """The final table: a "fwd" row per case and, when measured, a "bwd" row
    (flashjit, sdpa-flash, sdpa-cudnn backward; the other peers "-")."""
    rows = []
    meta = data.get("meta", {})
    terr = meta.get("torch_error")
    hdr = ("d", "N", "causal", "pass", "flashjit", "sdpa-flash", "sdpa-cudnn", "flex", "naive",
           "fj-in-proc", "ratio")
    notes = []
    for r in data.get("cases", []):
        tag = f"d={r['d']} N={r['N']} {'causal' if r['causal'] else 'non-causal'}"
        passes = [("fwd", r)]
        if "backward" in r:
            passes.append(("bwd", r["backward"]))
        for name, part in passes:
            fj = part.get("flashjit", {})
            if fj.get("tflops") is not None:
                f = f"{fj['tflops']:.0f}" + ("" if fj.get("ok") else "!")
            else:
                f = "err"
            pr = part.get("peers", {})
            ratio = part.get("ratio_flashjit_over_sdpa_flash")
            rows.append((str(r["d"]), str(r["N"]), "y" if r["causal"] else "n", name, f,
                         *(fmt_t(pr.get(p), terr) for p in PEERS), f"{ratio:.2f}" if ratio else "-"))
            who = "flashjit" if name == "fwd" else "flashjit backward"
            if fj.get("error"):
                notes.append((who, tag, fj["error"]))
            elif fj.get("tflops") is not None and not fj.get("ok"):
                notes.append((who, tag, "ok is not true (! in table)"))
            if fj.get("note"):
                notes.append((who, tag, fj["note"]))
            if fj.get("contract_warning"):
                notes.append((who, tag, f"contract: {fj['contract_warning']}"))
            for p, m in pr.items():
                if m.get("error") and m["error"] != terr:
                    notes.append((p if name == "fwd" else f"{p} backward", tag, m["error"]))
    w = [max(len(h), *(len(x[i]) for x in rows)) if rows else len(h) for i, h in enumerate(hdr)]
    out = []
    out.append(f"side-by-side forward and backward, bf16, TFLOP/s = 4BHN^2d/t (causal /2; bwd: 2.5x "
               f"the forward's FLOPs); flashjit & sdpa-flash: median of {meta.get('rounds', '?')} "
               f"interleaved rounds; {meta.get('device') or 'no GPU'}")
    out.append("  ".join(h.rjust(w[i]) for i, h in enumerate(hdr)))
    for x in rows:
        out.append("  ".join(v.rjust(w[i]) for i, v in enumerate(x)))
    if terr:
        notes.insert(0, ("peers not measured", "", terr))
    # one line per distinct message: "flashjit (3 cases): rc=2, ..."
    grouped = {}
    for who, tag, msg in notes:
        grouped.setdefault((who, msg), []).append(tag)
    for (who, msg), tags in list(grouped.items())[:12]:
        where = tags[0] if len(tags) == 1 else f"{len(tags)} cases"
        out.append(f"  note: {who} {where}: {msg}" if where else f"  note: {who}: {msg}")
    return "\n".join(out)


# ------------------------------------------------------------- ncu helpers --
# gpu-run.sh's optional ncu step (FLASHJIT_NCU=1): the DRAM bytes of one
# forward of flashjit vs the naive three-kernel attention (and sdpa-flash);
# side_by_side.py's ncu_target runs the profiled forward.

def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(path):
    """Per-kernel metrics from `ncu -i REP --csv --page raw|details` output:
    [{'kernel': name, metric: value, ...}]. Handles the wide (one column per
    metric) and the long (Metric Name / Metric Value) layouts."""
    import csv
    with open(path, errors="replace") as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    hdr = rows[0]
    kernels = {}
    if "Metric Name" in hdr:
        iid, ik, im, iv = (hdr.index("ID"), hdr.index("Kernel Name"), hdr.index("Metric Name"),
                           hdr.index("Metric Value"))
        iu = hdr.index("Metric Unit") if "Metric Unit" in hdr else None
        for r in rows[1:]:
            if len(r) <= max(iid, ik, im, iv):
                continue
            rec = kernels.setdefault(r[iid], {"kernel": r[ik]})
            val = _num(r[iv])
            unit = r[iu].lower() if iu is not None else ""
            mult = {"kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
            rec[r[im]] = val * mult if val is not None else None
    else:
        ik = next((hdr.index(h) for h in ("Kernel Name", "Function Name") if h in hdr), None)
        for r in rows[1:]:
            if not r or not r[0].strip() or not r[0].strip().isdigit():
                continue  # the units row
            rec = {"kernel": r[ik] if ik is not None else "?"}
            for h, x in zip(hdr, r):
                if "__" in h:
                    rec[h] = _num(x)
            kernels[r[0]] = rec
    return list(kernels.values())


def ncu_summary(files, c):
    """Text summary: DRAM bytes per implementation against the fewest bytes a
    forward must move (Q, K, V read once, O written once)."""
    B, H, N, d = c["B"], c["H"], c["N"], c["d"]
    min_bytes = 4 * B * H * N * d * 2
    out = [f"ncu DRAM traffic of one forward, bf16 B={B} H={H} N={N} d={d} "
           f"{'causal' if c['causal'] else 'non-causal'}; fewest bytes (Q,K,V read + O written once) "
           f"= {min_bytes / 1e6:.1f} MB; scores alone (B*H*N^2 bf16) = {B * H * N * N * 2 / 1e6:.0f} MB"]
    out.append(f"{'impl':<12} {'kernels':>7} {'read MB':>10} {'write MB':>10} {'total MB':>10} {'x fewest':>9} "
               f"{'gpu ms':>8}")
    for name, path in files:
        try:
            ks = parse_ncu_csv(path)
        except Exception as e:  # noqa: BLE001
            out.append(f"{name:<12} could not parse {path}: {short(e)}")
            continue
        if not ks:
            out.append(f"{name:<12} no kernels profiled (see the ncu log)")
            continue
        rd = sum(k.get("dram__bytes_read.sum") or 0 for k in ks)
        wr = sum(k.get("dram__bytes_write.sum") or 0 for k in ks)
        ns = sum(k.get("gpu__time_duration.sum") or 0 for k in ks)
        out.append(f"{name:<12} {len(ks):>7} {rd / 1e6:>10.1f} {wr / 1e6:>10.1f} {(rd + wr) / 1e6:>10.1f} "
                   f"{(rd + wr) / min_bytes:>9.2f} {ns / 1e6:>8.3f}")
        for k in ks:
            out.append(f"    {(k.get('dram__bytes_read.sum') or 0) / 1e6:>9.1f} R {(k.get('dram__bytes_write.sum') or 0) / 1e6:>9.1f} W"
                       f"  {k['kernel'][:90]}")
    return "\n".join(out)
