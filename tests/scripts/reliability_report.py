"""Run the fault suites (tests/test_faults.py, tests/test_small_shm.py, and the probe's fault cases
in tests/test_probe.py)
several times and write results/reliability.md: every case with its outcome in each run and
how long the job took to end.

    .venv/bin/python tests/scripts/reliability_report.py [--runs 5] [-o results/reliability]

Writes ``<out>.json`` (every run's numbers) and ``<out>.md``; the Markdown ends with
``<out>-notes.md`` when it exists.
"""

import argparse
import collections
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.core.machine import describe  # noqa: E402
from plumbing.files import write_json_atomically, write_text_atomically  # noqa: E402

#: the fault cases: the whole fault suite, and the probe under load and with impossible figures
SUITES = ["tests/test_faults.py", "tests/test_small_shm.py",
          "tests/test_probe.py::test_under_load_no_link_exceeds_the_copy_bandwidth",
          "tests/test_probe.py::test_an_impossible_figure_is_measured_again_then_flagged"]


def one_run(folder, number):
    """{case: {"outcome", "seconds" (pytest's), "ends": [numbers of each job]}} of one run."""
    numbers, junit = os.path.join(folder, f"numbers{number}.jsonl"), os.path.join(folder, f"junit{number}.xml")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES, f"--junitxml={junit}"],
                   cwd=ROOT, env={**os.environ, "FAULTS_REPORT": numbers}, stdout=subprocess.DEVNULL)
    cases = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
        cases[case.get("name")] = {"outcome": outcome, "seconds": float(case.get("time")), "ends": []}
    if os.path.exists(numbers):
        with open(numbers) as f:
            for line in f:
                row = json.loads(line)
                cases.setdefault(row["case"], {"outcome": "?", "seconds": 0.0, "ends": []})["ends"].append(row)
    return cases


def markdown(data, notes):
    runs = data["runs"]
    names = list(runs[0])
    lines = ["# Reliability: faults on purpose", "",
             f"{data['date']}, commit {data['machine']['commit']}, {data['machine']['mpi']}, "
             f"{data['machine']['cpu']}, {data['machine']['cores']} cores. The fault cases "
             f"(`tests/test_faults.py`, `tests/test_small_shm.py` for a container's small `/dev/shm`, and the "
             f"probe's in `tests/test_probe.py`) run {len(runs)} times "
             "(`tests/scripts/reliability_report.py`); each case is a real `mpiexec` job.", "",
             "*End* is the time from the fault (the signal, the kill) to the last rank gone, or, where "
             "the fault is inside the job (an error, a setting, a file), the whole job from its start; "
             "*exit* is mpiexec's status (a case may run more than one job); *test* is the whole test's "
             "median time.", "",
             "| case | outcome | exit | end (s): min / median / max | test (s) |", "|---|---|---|---|---:|"]
    for name in names:
        outcomes = collections.Counter(run.get(name, {}).get("outcome", "missing") for run in runs)
        ends = [e for run in runs for e in run.get(name, {}).get("ends", [])]
        codes = ", ".join(str(c) for c in sorted({e["code"] for e in ends}))
        seconds = [e["seconds_to_end"] for e in ends]
        timing = f"{min(seconds):.2f} / {statistics.median(seconds):.2f} / {max(seconds):.2f}" if seconds else ""
        verdict = ", ".join(f"{k} {v}/{len(runs)}" for k, v in outcomes.items())
        test = statistics.median(run[name]["seconds"] for run in runs if name in run)
        lines.append(f"| `{name}` | {verdict} | {codes} | {timing} | {test:.1f} |")
    lines.append("")
    return "\n".join(lines) + ("\n" + notes if notes else "")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("-o", "--output", default=os.path.join(ROOT, "results", "reliability"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for number in range(args.runs):
            runs.append(one_run(folder, number))
            print(f"run {number + 1}/{args.runs}: "
                  f"{sum(c['outcome'] == 'passed' for c in runs[-1].values())}/{len(runs[-1])} passed", flush=True)
    data = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": describe(), "runs": runs}
    write_json_atomically(args.output + ".json", data)
    notes_path = args.output + "-notes.md"
    notes = open(notes_path).read() if os.path.exists(notes_path) else ""
    write_text_atomically(args.output + ".md", markdown(data, notes))
    print(f"wrote {args.output}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
