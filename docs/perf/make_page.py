#!/usr/bin/env python3
"""Builds docs/performance.md and one SVG plot per collective from nccl_bench results.

    python3 docs/perf/make_page.py [--out-dir DOCS] [--date TEXT] [--command TEXT] INPUT...

Each INPUT is either a CSV file that `nccl_bench --csv FILE` wrote, or the bench's text output
(the nccl-tests style table, with NVIDIA NCCL's columns beside ours when it ran with
--baseline), such as results/h200x4-hunks-final-bench-all.txt. Several inputs are merged (a
row measured twice keeps the later input's figures).

Writes DOCS/perf/<collective>.svg (busbw against size, out-of-place, nccl-rs and NVIDIA NCCL)
and DOCS/performance.md (a header saying what ran where, then per collective a table and its
plot). DOCS defaults to the docs folder holding this script. Python 3 standard library only.

A text log records no date and no command line: --date and --command supply them; without
them the date is the log's git commit date (when it is tracked) and the command is rebuilt
from the log's header lines (said so on the page).
"""

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The bench's collective names and their nccl-tests test names (the -C argument).
TEST_NAMES = {
    "AllReduce": "all_reduce",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "SendRecv": "sendrecv",
}

# ------------------------------------------------------------------------------------------
# Reading results
# ------------------------------------------------------------------------------------------


class Source:
    """One input file: what ran, where, and its rows."""

    def __init__(self, path):
        self.path = path
        self.kind = ""  # "csv" or "text"
        self.backend = ""
        self.gpu = ""
        self.ngpus = 0
        self.nccl_rs_version = ""
        self.nccl_version = ""
        self.nccl_path = ""
        self.hostname = ""
        self.date = ""
        self.date_note = ""
        self.command = ""
        self.command_note = ""
        self.commit = ""
        self.warmup = None
        self.iters = None
        self.rows = []


def number(s):
    """A float from a field, or None for an empty or n/a one."""
    s = (s or "").strip()
    if s in ("", "n/a", "N/A", "-"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def read_csv(path):
    src = Source(path)
    src.kind = "csv"
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records:
        sys.exit(f"make_page: {path}: no rows")
    first = records[0]
    src.backend = first.get("backend", "")
    src.gpu = first.get("gpu", "")
    src.nccl_rs_version = first.get("nccl_rs_version", "")
    src.nccl_version = first.get("nccl_version", "")
    src.hostname = first.get("hostname", "")
    src.date = first.get("date_utc", "")
    src.command = first.get("command", "")
    src.warmup = first.get("warmup_iters") or None
    src.iters = first.get("iters") or None
    for r in records:
        src.ngpus = max(src.ngpus, int(r["nranks"]))
        src.rows.append(
            {
                "collective": r["collective"],
                "placement": r["placement"],
                "size": int(r["size_bytes"]),
                "count": int(r["count"]),
                "type": r["type"],
                "redop": r["redop"],
                "time": number(r["time_us"]),
                "busbw": number(r["busbw_gbps"]),
                "nccl_time": number(r.get("nccl_time_us")),
                "nccl_busbw": number(r.get("nccl_busbw_gbps")),
                "ratio": number(r.get("ratio")),
                "tuned": r.get("algo_proto_channels", ""),
            }
        )
    return src


def size_arg(n):
    """A byte count as the bench's size argument (64K, 512M, 1G where exact)."""
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def read_text(path):
    """The bench's text output: header lines, then a table per collective."""
    src = Source(path)
    src.kind = "text"
    header = {}
    collectives = []
    baseline_cols = False
    coll = None
    gpus = []
    types, ops = set(), set()
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    for line in lines:
        words = line.split()
        if line.startswith("# Collective test starting:"):
            inside = line[line.find("(") + 1 : line.rfind(")")]
            collectives = [c.strip() for c in inside.split(",") if c.strip()]
        elif line.startswith("# nThread"):
            # "# nThread 1 nGpus 4 minBytes 8 maxBytes 536870912 step: 4(factor) warmup iters: 5
            #  iters: 20 validation: 1"
            w = words
            header["nthread"] = int(w[w.index("nThread") + 1])
            header["ngpus"] = int(w[w.index("nGpus") + 1])
            header["min"] = int(w[w.index("minBytes") + 1])
            header["max"] = int(w[w.index("maxBytes") + 1])
            header["factor"] = int(w[w.index("step:") + 1].split("(")[0])
            header["warmup"] = int(w[w.index("warmup") + 2])
            header["iters"] = int(w[len(w) - 1 - w[::-1].index("iters:") + 1])
            header["check"] = int(w[w.index("validation:") + 1])
        elif line.startswith("# backend:"):
            src.backend = "sim" if "simulator" in line else "cuda"
        elif line.startswith("# nccl-rs ") and words[2][:1].isdigit():
            src.nccl_rs_version = words[2]
        elif line.startswith("# baseline: NVIDIA NCCL"):
            src.nccl_version = words[4]
            if "(" in line:
                src.nccl_path = line[line.find("(") + 1 : line.rfind(")")]
        elif line.startswith("#  Rank") and "device" in line and "]" in line:
            gpus.append(line[line.rfind("]") + 1 :].strip())
            src.hostname = words[words.index("on") + 1]
        elif line.startswith("# Collective:"):
            coll = words[2]
        elif line.startswith("#") and "nccl_time" in line:
            baseline_cols = True
        elif coll and words and not line.startswith("#"):
            row = parse_text_row(coll, words, baseline_cols)
            if row is None:
                print(f"make_page: {path}: skipped a line: {line.strip()}", file=sys.stderr)
                continue
            src.rows.extend(row)
            types.add(words[2])
            if words[3] != "none":
                ops.add(words[3])
    names = sorted(set(gpus), key=gpus.index)
    src.gpu = ", ".join(names)
    src.ngpus = len(gpus)
    src.warmup = header.get("warmup")
    src.iters = header.get("iters")
    if header:
        args = []
        if header["nthread"] > 1:
            args += ["-t", "threads", "-g", str(header["nthread"])]
        else:
            args += ["-g", str(header["ngpus"])]
        if collectives:
            if sorted(collectives) == sorted(TEST_NAMES):
                args += ["-C", "all"]
            else:
                args += ["-C", ",".join(TEST_NAMES.get(c, c) for c in collectives)]
        args += ["-b", size_arg(header["min"]), "-e", size_arg(header["max"])]
        args += ["-f", str(header["factor"]), "-w", str(header["warmup"])]
        args += ["-n", str(header["iters"])]
        if types and types != {"float"}:
            args += ["-d", ",".join(sorted(types))]
        if ops and ops != {"sum"}:
            args += ["-o", ",".join(sorted(ops))]
        if header["check"] != 1:
            args += ["-c", str(header["check"])]
        if src.nccl_version:
            args += ["--baseline", src.nccl_path or "PATH/libnccl.so.2"]
        src.command = shlex.join(["cargo", "bench", "--bench", "nccl_bench", "--"] + args)
        src.command_note = "rebuilt from the log's header lines; the log does not record it"
    return src


def parse_text_row(coll, words, baseline):
    """A table line: size count type redop root, then per placement time algbw busbw #wrong
    (and nccl_time nccl_busbw ratio with a baseline), then algo/proto/channels."""
    per = 7 if baseline else 4
    if len(words) != 5 + 2 * per + 1:
        return None
    try:
        size, count = int(words[0]), int(words[1])
    except ValueError:
        return None
    rows = []
    for i, placement in enumerate(("out-of-place", "in-place")):
        f = words[5 + i * per : 5 + (i + 1) * per]
        if f[0] == "n/a":
            continue
        rows.append(
            {
                "collective": coll,
                "placement": placement,
                "size": size,
                "count": count,
                "type": words[2],
                "redop": words[3],
                "time": number(f[0]),
                "busbw": number(f[2]),
                "nccl_time": number(f[4]) if baseline else None,
                "nccl_busbw": number(f[5]) if baseline else None,
                "ratio": number(f[6]) if baseline else None,
                "tuned": words[-1],
            }
        )
    return rows


def read_source(path):
    with open(path, errors="replace") as f:
        first = f.readline()
    src = read_csv(path) if first.startswith("collective,") else read_text(path)
    if not src.rows:
        sys.exit(f"make_page: {path}: no measured rows found")
    return src


def git_commit(path):
    """(author date, short hash) of the last commit that touched `path`; ('', '') if none."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ad %h", "--date=short", "--", os.path.abspath(path)],
            cwd=os.path.dirname(os.path.abspath(path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return "", ""
    words = out.stdout.split()
    return (words[0], words[1]) if len(words) == 2 else ("", "")


# ------------------------------------------------------------------------------------------
# Formatting
# ------------------------------------------------------------------------------------------


def fmt_size(n):
    """8 B, 32 B, 2 KiB, 512 MiB, 1 GiB."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:g} {unit}"
    return f"{n} B"


def fmt_time(us):
    """As the bench prints it."""
    if us is None:
        return "–"
    if us >= 10000:
        return f"{us:.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt2(x):
    return "–" if x is None else f"{x:.2f}"


def axis_label(exp):
    """2^exp as the axis shows it: 8B, 512B, 1K, 64K, 1M, 1G."""
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if exp >= shift:
            return f"{1 << (exp - shift)}{suffix}"
    return f"{1 << exp}B"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def nice_step(span, target=6):
    """A 1, 2 or 5 × 10^k step giving about `target` intervals over `span`."""
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


# ------------------------------------------------------------------------------------------
# The plot
# ------------------------------------------------------------------------------------------

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def svg_plot(title, series):
    """series: [(label, color, dashed, [(size, busbw)...])]. Sizes above 0 only (log axis)."""
    W, H = 760, 440
    left, right, top, bottom = 72, 24, 44, 62
    pw, ph = W - left - right, H - top - bottom
    pts = [(s, b) for _, _, _, p in series for s, b in p if s > 0 and b is not None]
    if not pts:
        return None
    emin = math.floor(math.log2(min(s for s, _ in pts)))
    emax = math.ceil(math.log2(max(s for s, _ in pts)))
    if emax == emin:
        emax += 1
    ymax_data = max(b for _, b in pts)
    step = nice_step(ymax_data if ymax_data > 0 else 1)
    ymax = step * math.ceil(ymax_data / step) if ymax_data > 0 else step
    if ymax_data > 0 and ymax - ymax_data < 0.02 * ymax:
        ymax += step

    pad = 0.4  # of a power of two, so that the end markers stay inside the frame

    def x(size):
        return left + (math.log2(size) - emin + pad) / (emax - emin + 2 * pad) * pw

    def y(v):
        return top + ph - v / ymax * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2:.1f}" y="24" text-anchor="middle" font-size="15" '
        f'font-weight="bold">{esc(title)}</text>',
    ]
    # Vertical gridlines and size labels: at most 16, every `xs` powers of two.
    xs = next(s for s in (1, 2, 3, 4, 5, 10) if (emax - emin) // s + 1 <= 16)
    for e in range(emin, emax + 1):
        if (e - emin) % xs:
            continue
        px = x(2**e)
        out.append(
            f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + ph}" '
            f'stroke="#e0e0e0" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{px:.1f}" y="{top + ph + 18}" text-anchor="middle" '
            f'font-size="11">{axis_label(e)}</text>'
        )
    # Horizontal gridlines and busbw labels.
    v = 0.0
    while v <= ymax + 1e-9:
        py = y(v)
        out.append(
            f'<line x1="{left}" y1="{py:.1f}" x2="{left + pw}" y2="{py:.1f}" '
            f'stroke="#e0e0e0" stroke-width="1"/>'
        )
        label = f"{v:g}"
        out.append(
            f'<text x="{left - 8}" y="{py + 4:.1f}" text-anchor="end" font-size="11">{label}</text>'
        )
        v += step
    # Axes.
    out.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
        f'stroke="#404040" stroke-width="1"/>'
    )
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{H - 16}" text-anchor="middle" font-size="12">'
        f"size (bytes, log scale)</text>"
    )
    out.append(
        f'<text x="18" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 18 {top + ph / 2:.1f})">busbw (GB/s)</text>'
    )
    # The series: a line and a marker per point.
    for label, color, dashed, points in series:
        p = sorted((s, b) for s, b in points if s > 0 and b is not None)
        if not p:
            continue
        d = " ".join(f"{x(s):.1f},{y(b):.1f}" for s, b in p)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(
            f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        for s, b in p:
            if dashed:
                out.append(
                    f'<rect x="{x(s) - 3:.1f}" y="{y(b) - 3:.1f}" width="6" height="6" '
                    f'fill="white" stroke="{color}" stroke-width="1.5"/>'
                )
            else:
                out.append(f'<circle cx="{x(s):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"/>')
    # The legend, top left (small sizes have small busbw, so that corner is empty).
    lx, ly = left + 14, top + 14
    shown = [s for s in series if any(sz > 0 and b is not None for sz, b in s[3])]
    legend_w = 56 + 7 * max(len(s[0]) for s in shown)
    out.append(
        f'<rect x="{lx - 8}" y="{ly - 10}" width="{legend_w}" height="{len(shown) * 20 + 6}" '
        f'fill="white" fill-opacity="0.9" stroke="#c0c0c0"/>'
    )
    for i, (label, color, dashed, _) in enumerate(shown):
        yy = ly + i * 20 + 4
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(
            f'<line x1="{lx}" y1="{yy}" x2="{lx + 30}" y2="{yy}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 38}" y="{yy + 4}" font-size="12">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def rel(path, start):
    """`path` relative to `start` when it lies inside the repository, else absolute."""
    path = os.path.abspath(path)
    if os.path.commonpath([path, ROOT]) != ROOT:
        return path
    return os.path.relpath(path, os.path.abspath(start))


def regenerate_command(argv):
    """The command that rebuilt this page, from the repository root."""
    out = ["python3", rel(__file__, ROOT)]
    for a in argv:
        out.append(rel(a, ROOT) if os.path.exists(a) and not a.startswith("-") else a)
    return shlex.join(out)


def main():
    ap = argparse.ArgumentParser(
        description="Build docs/performance.md and its SVG plots from nccl_bench results."
    )
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="nccl_bench --csv files or text logs")
    ap.add_argument("--out-dir", default=os.path.dirname(HERE), help="the docs folder [%(default)s]")
    ap.add_argument("--date", help="the date of the run (text logs record none)")
    ap.add_argument("--command", help="the benchmark's command line (text logs record none)")
    args = ap.parse_args()

    sources = [read_source(p) for p in args.inputs]
    for s in sources:
        day, s.commit = git_commit(s.path)
        if args.date:
            s.date, s.date_note = args.date, ""
        elif not s.date:
            s.date = day or "not recorded"
            s.date_note = "the day the log was committed; the text log records no date" if day else ""
        if args.command:
            s.command, s.command_note = args.command, ""

    # Rows merged over the inputs: (collective, type, redop, placement, size) -> row.
    # Within one input, sizes too small for one element per rank all read 0 B: the last is kept.
    merged, origin, order = {}, {}, []
    for s in sources:
        for r in s.rows:
            key = (r["collective"], r["type"], r["redop"], r["placement"], r["size"])
            if key in merged and origin[key] is not s:
                print(f"make_page: {s.path} measures {key} again; its figures are kept", file=sys.stderr)
            merged[key], origin[key] = r, s
            if r["collective"] not in order:
                order.append(r["collective"])

    docs = args.out_dir
    perf = os.path.join(docs, "perf")
    os.makedirs(perf, exist_ok=True)
    page_path = os.path.join(docs, "performance.md")

    lines = ["# Performance", ""]
    lines.append(
        "Generated by `docs/perf/make_page.py` from the benchmark's output; do not edit by hand. "
        "Regenerate with:"
    )
    lines += ["", "```sh", regenerate_command(sys.argv[1:]), "```", ""]
    for s in sources:
        if len(sources) > 1:
            lines += [f"## Run: `{rel(s.path, ROOT)}`", ""]
        else:
            lines += ["## The run", ""]
        if s.backend == "sim":
            lines.append(
                f"- GPUs: none: {s.ngpus} ranks on the CPU simulator (its times say nothing "
                "about GPU performance)"
            )
        else:
            lines.append(f"- GPUs: {s.ngpus} × {s.gpu}" if s.gpu else f"- Ranks: {s.ngpus}")
        lines.append(f"- NVIDIA NCCL (baseline): {s.nccl_version or 'not run'}")
        if s.nccl_rs_version:
            lines.append(f"- nccl-rs: {s.nccl_rs_version} (the NCCL version it implements)")
        lines.append(f"- Date: {s.date}" + (f" ({s.date_note})" if s.date_note else ""))
        if s.hostname:
            lines.append(f"- Host: {s.hostname}")
        committed = f" (committed in {s.commit})" if s.commit else ""
        lines.append(f"- Results: `{rel(s.path, ROOT)}`{committed}")
        cmd = "- Benchmark command" + (f" ({s.command_note})" if s.command_note else "") + ":"
        lines += [cmd, "", "  ```sh", f"  {s.command or 'not recorded'}", "  ```", ""]
    it = sources[0]
    timing = ""
    if it.iters:
        timing = (
            f" Times are the median of {it.iters} timed iterations, each the slowest GPU's "
            f"time, after {it.warmup} untimed warm-up iteration(s)."
        )
    lines += [
        "How to read it: the size is the largest buffer a rank touches (as nccl-tests counts it); "
        "busbw is nccl-tests' bus bandwidth (algbw = size / time, times a factor per collective: "
        "2(n-1)/n for AllReduce, (n-1)/n for AllGather and ReduceScatter, 1 for the others); "
        "ratio is our busbw over NVIDIA NCCL's (above 1: nccl-rs is faster). The tables and "
        "plots are the out-of-place rows; the results file has the in-place ones too."
        + timing
        + " The last column is the algorithm, protocol and channel count nccl-rs's tuner chose.",
        "",
    ]

    for coll in order:
        keys = [k for k in merged if k[0] == coll and k[3] == "out-of-place"]
        combos = []
        for k in keys:
            if (k[1], k[2]) not in combos:
                combos.append((k[1], k[2]))
        lines += [f"## {coll}", ""]
        series = []
        zero = False
        for ci, (dt, op) in enumerate(combos):
            rows = sorted(
                (merged[k] for k in keys if (k[1], k[2]) == (dt, op)), key=lambda r: r["size"]
            )
            what = dt if op == "none" else f"{dt} {op}"
            if len(combos) > 1:
                lines += [f"### {what}", ""]
            lines.append(
                "| size | ours time (µs) | ours busbw (GB/s) | NCCL time (µs) | NCCL busbw (GB/s) "
                "| ratio | algo/proto/channels |"
            )
            lines.append("|---:|---:|---:|---:|---:|---:|:---|")
            for r in rows:
                ratio = r["ratio"]
                if ratio is None and r["nccl_busbw"] and r["busbw"] is not None:
                    ratio = r["busbw"] / r["nccl_busbw"]
                zero |= r["size"] == 0
                lines.append(
                    f"| {fmt_size(r['size'])} | {fmt_time(r['time'])} | {fmt2(r['busbw'])} "
                    f"| {fmt_time(r['nccl_time'])} | {fmt2(r['nccl_busbw'])} | {fmt2(ratio)} "
                    f"| {r['tuned']} |"
                )
            lines.append("")
            suffix = f" ({what})" if len(combos) > 1 else ""
            color = COLORS[(2 * ci) % len(COLORS)]
            series.append(("nccl-rs" + suffix, color, False, [(r["size"], r["busbw"]) for r in rows]))
            if any(r["nccl_busbw"] is not None for r in rows):
                ncolor = COLORS[(2 * ci + 1) % len(COLORS)]
                series.append(
                    ("NVIDIA NCCL" + suffix, ncolor, True, [(r["size"], r["nccl_busbw"]) for r in rows])
                )
        if zero:
            lines += [
                "A 0 B row is a call of count 0: the smallest size, divided among the ranks, "
                "holds no whole element.",
                "",
            ]
        src = sources[0]
        who = f"{src.ngpus} × {src.gpu}" if src.gpu else f"{src.ngpus} ranks"
        what = ""
        if len(combos) == 1:
            dt, op = combos[0]
            what = dt if op == "none" else f"{dt} {op}"
            what += ", "
        title = f"{coll} busbw, {who} ({what}out-of-place)"
        svg = svg_plot(title, series)
        if svg is None:
            continue
        name = TEST_NAMES.get(coll, coll.lower()) + ".svg"
        with open(os.path.join(perf, name), "w") as f:
            f.write(svg)
        link = rel(os.path.join(perf, name), docs).replace(os.sep, "/")
        lines += [f"![{coll}: busbw against size, nccl-rs and NVIDIA NCCL]({link})", ""]

    with open(page_path, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    print(f"make_page: wrote {rel(page_path, os.getcwd())} and {len(order)} plot(s) in {rel(perf, os.getcwd())}")


if __name__ == "__main__":
    main()
