"""The GPU check's report: its parts (:mod:`bench.tools.gpu_check`) and compute-sanitizer's logs
merged into one JSON document and one Markdown page, each busbw beside the bound one device's
memory sets (:mod:`topology.model.one_device`)."""

import json
import re
from pathlib import Path

import algorithms
from algorithms.settings import size_text
from plumbing.files import write_json_atomically, write_text_atomically
from topology.model import one_device

from ..core.machine import results_header

SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")


def sanitizer_findings(folder):
    """{tool: {"errors": total over the ranks' logs, "summaries": each log's summary line}} of
    the ``sanitize-TOOL-*.log`` files compute-sanitizer wrote in ``folder``."""
    found = {}
    for log in sorted(Path(folder).glob("sanitize-*-*.log")):
        tool = log.name.split("-")[1]
        text = log.read_text(errors="replace")
        entry = found.setdefault(tool, {"errors": 0, "summaries": []})
        summaries = SUMMARY.findall(text)
        entry["errors"] += sum(int(n) for n in summaries)
        entry["summaries"].append(next((line.strip() for line in text.splitlines() if "ERROR SUMMARY" in line),
                                       f"{log.name}: no summary (cut off?)"))
    return found


def add_bounds(rows, n, copy_rate):
    """Each busbw row's one-device bound (GB/s), from the fastest copy's ``copy_rate`` (GB/s) and
    the algorithm's received bytes where known; NCCL's, the bound of any all-reduce."""
    factor = 2 * (n - 1) / n if n > 1 else 0.0
    for row in rows:
        declared = algorithms.ALGORITHMS.get(row["algorithm"])
        received = declared.received(n, row["bytes"]) if declared and declared.received else None
        seconds = one_device.seconds(n, row["bytes"], copy_rate * 1e9, received)
        row["bound_busbw_GBps"] = factor * row["bytes"] / seconds / 1e9 if seconds else None


def merge(folder, prefix):
    """Write ``PREFIX.json`` and ``PREFIX.md`` from the parts in ``folder``; exit status 1 when an
    element was wrong or the sanitizer found errors, else 0 (parts cut by their time limit are said,
    not failed: they size their work from it)."""
    parts = [{**json.loads(path.read_text()), "file": path.name} for path in sorted(Path(folder).glob("*.json"))]
    if not parts:
        print(f"python -m bench.gpu_check: no parts in {folder}")
        return 1
    copy = next((p for p in parts if p["part"] == "copy"), None)
    copy_rate = max((row["d2d_GBps"] for row in copy["rows"]), default=None) if copy else None
    for part in parts:
        for rows, n in _sweeps(part):
            if copy_rate:
                add_bounds(rows, n, copy_rate)
    ran = next((p for p in parts if "device_name" in p), {"device_name": "(no part ran)", "timing": "(none)"})
    data = {**results_header("gpu_check", None, argv=["gpu-check", "--merge", str(folder), "-o", prefix],
                             ranks=max(p["ranks"] for p in parts)),
            "device_name": ran["device_name"], "timing": ran["timing"], "copy_GBps": copy_rate,
            "parts": parts, "sanitizer": sanitizer_findings(folder)}
    data["total_wrong"] = sum(sum(run["wrong"].values()) if isinstance(run["wrong"], dict) else run["wrong"]
                              for p in parts if p["part"] in ("check", "sanitize") for run in p.get("runs", []))
    data["incomplete"] = [f"{p['part']} at {p['ranks']} ranks: {p['cut'] or 'did not finish'}"
                          for p in parts if not p["complete"]]
    write_json_atomically(prefix + ".json", data)
    write_text_atomically(prefix + ".md", markdown(data))
    errors = sum(entry["errors"] for entry in data["sanitizer"].values())
    print(f"wrote {prefix}.json and .md; wrong elements in all: {data['total_wrong']}; sanitizer errors: {errors}")
    return 1 if data["total_wrong"] or errors else 0


def _sweeps(part):
    """(rows, ranks) of every busbw table in a part."""
    if part["part"] == "busbw":
        return [(run["rows"], part["ranks"]) for run in part.get("runs", [])]
    if part["part"] == "nccl" and "rows" in part:
        return [(part["rows"], part["ranks"])]
    return []


def markdown(data):
    m = data["machine"]
    lines = [f"# GPU check: {data['device_name']}", "",
             f"{data['date']}, commit {m['commit']}, {m['mpi'].split()[0]} {m['mpi'].split()[-1]}, {m['machine']} "
             f"{m['cpu']}. Sizes in bytes, times in us, busbw in GB/s; timing: {data['timing']}.", ""]
    lines += _copy_lines(data)  # the copy part's page, first: the reference of the rest
    for part in sorted((p for p in data["parts"] if p["part"] in PAGES), key=lambda p: (list(PAGES).index(p["part"]),
                                                                                       p["ranks"])):
        lines += PAGES[part["part"]](part, data)
    if data["incomplete"]:
        lines += ["", "Parts cut short: " + "; ".join(data["incomplete"]) + "."]
    lines += ["", f"Wrong elements in all: {data['total_wrong']}."]
    return "\n".join(lines) + "\n"


def _copy_lines(data):
    copy = next((p for p in data["parts"] if p["part"] == "copy"), None)
    if copy is None:
        return ["No copy rates: the copy part did not run.", ""]
    lines = ["## Copy rates (one rank alone; the one-GPU bound's reference)", "",
             "| bytes | device->device GB/s | device->host GB/s | host->device GB/s |", "|---:|---:|---:|---:|"]
    for row in copy["rows"]:
        lines.append(f"| {row['bytes']} | {row['d2d_GBps']:.1f} | {_number(row.get('d2h_GBps'))} | "
                     f"{_number(row.get('h2d_GBps'))} |")
    lines += ["", f"The bound below takes the fastest device copy, {_number(data['copy_GBps'])} GB/s, as "
                  "the memory's rate (docs/gpu.md, \"The bound on one GPU\")."]
    if copy["device"] != "gpu":
        lines += ["On host memory the same arithmetic is a dry run of the report, not a bound of the host path: "
                  "oneshot and twoshot read the node's boxes there, which their received bytes do not describe."]
    return lines


def _check_page(part, data):
    lines = ["", f"## Correctness, {part['ranks']} ranks on {_where(part)}", "",
             f"Tiers, in order: {', '.join(part.get('tiers', []))}; "
             + (part["cut"] if part["cut"] else "every case checked") + ".", ""]
    runs = part.get("runs", [])
    algos = list(runs[0]["wrong"]) if runs else []
    lines += ["| transport | how | " + " | ".join(algos) + " |", "|---|---|" + "---:|" * len(algos)]
    for run in runs:
        lines.append(f"| {run['transport']} | {run['description']} | "
                     + " | ".join(f"{run['wrong'][a]} / {run['checked'][a]}" for a in algos) + " |")
    lines += ["", "Each cell: wrong elements / cases checked."]
    for failure in (f for run in runs for f in run["failures"]):
        lines.append(f"- wrong: {failure}")
    return lines


def _sanitize_page(part, data):
    tool = part["file"].removeprefix("sanitize-").removesuffix(".json")
    if "note" in part:
        return ["", f"## compute-sanitizer: {part['note']}"]
    lines = ["", f"## compute-sanitizer --tool {tool}, {part['ranks']} ranks: {', '.join(SANITIZED_TEXT)}", ""]
    found = data["sanitizer"].get(tool)
    lines.append(f"- {found['errors']} errors ({'; '.join(found['summaries'])})" if found else
                 "- no log: the sanitizer did not start, or wrote nothing")
    wrong = sum(run["wrong"] for run in part.get("runs", []))
    return lines + [f"- results under it: {wrong} wrong elements, in {len(part.get('runs', []))} of 4 cases "
                    f"({'; '.join(sorted({run['description'] for run in part.get('runs', [])}))})"]


SANITIZED_TEXT = ("ring and tree", "CUDA IPC and staged", "4099 float32, in and out of place")


def _sweep_lines(rows, title):
    sizes = sorted({r["bytes"] for r in rows})
    if not sizes:
        return ["", f"{title}: no size fitted the time limit."]
    lines = ["", f"{title}: busbw, the median of the rounds (its 95% interval), and in brackets the bound "
                 "the device's memory allows.", "",
             "| algorithm | " + " | ".join(size_text(b) for b in sizes) + " | best share of the bound |",
             "|---|" + "---:|" * (len(sizes) + 1)]
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        mine = {r["bytes"]: r for r in rows if r["algorithm"] == algo}
        shares = [r["busbw_GBps"] / r["bound_busbw_GBps"] for r in mine.values() if r.get("bound_busbw_GBps")]
        cells = [_cell(mine[b]) if b in mine else "" for b in sizes]
        lines.append(f"| {algo} | " + " | ".join(cells) + (f" | {max(shares):.2f} |" if shares else " | |"))
    return lines


def _cell(row):
    low, high = row["busbw_ci_GBps"]
    return f"{row['busbw_GBps']:.2f} ({low:.2f}-{high:.2f}) [{_number(row.get('bound_busbw_GBps'))}]"


def _busbw_page(part, data):
    lines = ["", f"## busbw, {part['ranks']} ranks on {_where(part)}, {part['rounds']} rounds a size"]
    for run in part.get("runs", []):
        lines += _sweep_lines(run["rows"], f"{run['transport']} ({run['description']})")
    if part["cut"]:
        lines += ["", f"The sweep was {part['cut']}."]
    return lines


def _nccl_page(part, data):
    if "unavailable" in part:
        return ["", f"## NCCL, {part['ranks']} ranks", "", f"Not run: {part['unavailable']}."]
    return ["", f"## NCCL, {part['ranks']} ranks, one GPU each"] + _sweep_lines(part.get("rows", []), "NCCL and ours")


#: the page of each part but the copy part's, in the order they print
PAGES = {"check": _check_page, "sanitize": _sanitize_page, "busbw": _busbw_page, "nccl": _nccl_page}


def _where(part):
    return f"{part['gpus_per_node']} GPU(s)" if part["device"] == "gpu" else "host memory (a dry run of the check)"


def _number(value):
    return "n/a" if value is None else f"{value:.1f}"
