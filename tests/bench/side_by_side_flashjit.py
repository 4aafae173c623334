"""The flashjit side of side_by_side.py: `flashjit bench ... --json` as a
subprocess under its JSON contract (side_by_side.py's docstring), the
summary of its interleaved rounds, and the small helpers side_by_side.py
shares (short, tflops_of). No torch here.
"""
import json
import shlex
import statistics
import subprocess
import time


def short(e, n=240):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:n]


def tflops_of(ms, fl):
    return fl / ms / 1e9 if ms and ms > 0 else None


# ---------------------------------------------------------------- flashjit --

def flashjit_cmd(exe, c, extra, backward=False):
    cmd = [exe, "bench", "--head-dim", str(c["d"]), "--seq-len", str(c["N"]),
           "--batch", str(c["B"]), "--heads", str(c["H"])]
    if c["causal"]:
        cmd.append("--causal")
    if backward:
        cmd.append("--backward")
    return cmd + ["--json"] + extra


def run_flashjit(exe, c, extra, timeout, backward=False):
    """One flashjit bench run. Returns a dict; 'time_ms' is set on success."""
    cmd = flashjit_cmd(exe, c, extra, backward)
    rec = dict(cmd=" ".join(shlex.quote(x) for x in cmd))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        rec.update(error=f"not found: {short(e)}", wall_s=round(time.time() - t0, 2))
        return rec
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        rec.update(error=f"timed out after {timeout}s", stderr_tail=err[-1500:],
                   wall_s=round(time.time() - t0, 2))
        return rec
    except Exception as e:  # noqa: BLE001 - record anything and go on
        rec.update(error=f"could not run: {short(e)}", wall_s=round(time.time() - t0, 2))
        return rec
    rec.update(rc=p.returncode, wall_s=round(time.time() - t0, 2))
    errl = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    last_err = f" (stderr: {errl[-1][:200]})" if errl else ""
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    obj = None
    for ln in reversed(lines):
        try:
            cand = json.loads(ln)
        except ValueError:
            continue
        if isinstance(cand, dict):
            obj = cand
            break
    if obj is not None and len(lines) != 1:
        rec["contract_warning"] = f"stdout had {len(lines)} non-empty lines, want exactly 1 JSON line"
    if obj is None:
        rec.update(error=f"rc={p.returncode}, no JSON object on stdout{last_err}",
                   stdout_tail=p.stdout[-800:], stderr_tail=p.stderr[-1500:])
        return rec
    rec["json"] = obj
    missing = [k for k in ("time_ms", "tflops", "config", "ok") if k not in obj]
    if missing:
        rec["contract_warning"] = (rec.get("contract_warning", "") + f"; missing fields {missing}").lstrip("; ")
    tm = obj.get("time_ms")
    if p.returncode != 0 or not isinstance(tm, (int, float)) or not tm > 0:
        rec.update(error=f"rc={p.returncode}, time_ms={tm!r}" +
                   (f", error={obj.get('error')!r}" if obj.get("error") else last_err),
                   stderr_tail=p.stderr[-1500:])
        return rec
    rec["time_ms"] = float(tm)
    rec["ok"] = obj.get("ok")
    if obj.get("ok") is not True:
        rec["stderr_tail"] = p.stderr[-1500:]
    return rec


def summarise_flashjit(fj, fl):
    """Median time and TFLOP/s of the rounds that ran, ok, config, the first
    error and contract warning, into fj."""
    ran = [x for x in fj["rounds"] if "time_ms" in x]
    if ran:
        fj["median_ms"] = statistics.median(x["time_ms"] for x in ran)
        fj["tflops"] = tflops_of(fj["median_ms"], fl)
        fj["ok"] = all(x.get("ok") is True for x in ran)
        rep = [x["json"].get("tflops") for x in ran]
        rep = [x for x in rep if isinstance(x, (int, float))]
        if rep:
            fj["tflops_reported_median"] = statistics.median(rep)
            if abs(fj["tflops_reported_median"] / fj["tflops"] - 1) > 0.02:
                fj["note"] = "flashjit's own tflops differs >2% from this script's FLOP count (causal convention?)"
        fj["config"] = ran[0]["json"].get("config")
    errs = [x["error"] for x in fj["rounds"] if "error" in x]
    if errs:
        fj["error"] = errs[0]
    warns = [x["contract_warning"] for x in fj["rounds"] if "contract_warning" in x]
    if warns:
        fj["contract_warning"] = warns[0]
