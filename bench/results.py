"""Where numbers go: nccl-tests' JSON document (``-J``) and an append-only JSON-lines log.

The ``-J`` document has nccl-tests' keys (``version``, ``start_time``, ``args``,
``config`` with its devices, ``results[]`` with ``out_of_place``/``in_place``
and, with ``-I 1``, the ``*_per_iter`` objects; ``out_of_bounds``,
``average_bus_bandwidth``, ``end_time``), so nccl-tests' own
``tools/analyze_perf_json.py`` reads it, plus ours under ``allreduce_bench``
and in each result (``algorithm``, ``collective``). It is written atomically
at the end. The log gets one self-contained JSON object per finished row,
flushed to disk at once, so a run killed half-way leaves every finished size
readable.
"""

import datetime
import json
import os

from topology.files import write_json_atomically

JSON_VERSION = 3  # nccl-tests' JSON_FILE_VERSION


def now():
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def bool_text(value):
    """nccl-tests writes booleans as the strings "true" and "false"."""
    return "true" if value else "false"


class ResultsWriter:
    """Collects rows on rank 0; appends each to the log at once; writes ``-J`` at the end."""

    def __init__(self, json_path, log_path, argv, config, run_info):
        self.json_path = json_path
        self.log_path = log_path
        self.rows = []
        self.document = {
            "version": JSON_VERSION,
            "start_time": now(),
            "args": list(argv),
            "config": config,
            "allreduce_bench": run_info,
        }
        self.run_info = run_info
        if log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            self._log = open(log_path, "a")

    def add(self, record):
        self.rows.append(record)
        if self.log_path:
            line = {**self.run_info, "start_time": self.document["start_time"], **record}
            self._log.write(json.dumps(line) + "\n")
            self._log.flush()
            os.fsync(self._log.fileno())

    def finish(self, wrong, average_busbw, summaries):
        if self.log_path:
            self._log.close()
        if not self.json_path:
            return
        document = {
            **self.document,
            "results": self.rows,
            "out_of_bounds": {"count": int(wrong), "okay": bool_text(wrong == 0)},
            "average_bus_bandwidth": {"bandwidth": average_busbw, "okay": "unchecked"},
            "summaries": summaries,
            "end_time": now(),
        }
        write_json_atomically(self.json_path, document)


def read_results(path):
    """Rows of ours from a ``-J`` document or a JSON-lines log: dicts with at least
    algorithm, collective, size, count, type, redop, out_of_place and in_place."""
    with open(path) as f:
        text = f.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    if isinstance(document, dict) and "results" in document:
        run = document.get("allreduce_bench", {})
        return [{**run, **row} for row in document["results"]]
    return [json.loads(line) for line in text.splitlines() if line.strip()]
