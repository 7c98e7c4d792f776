"""Where numbers go: nccl-tests' JSON document (``-J``) and an append-only JSON-lines log.

The ``-J`` document has nccl-tests' keys (``version``, ``start_time``, ``args``,
``config`` with its devices, ``results[]`` with ``out_of_place``/``in_place``
and, with ``-I 1``, the ``*_per_iter`` objects; ``out_of_bounds``,
``average_bus_bandwidth``, ``end_time``), so nccl-tests' own
``tools/analyze_perf_json.py`` reads it, plus ours: ``summary_by_size`` (:mod:`.summary`),
``allreduce_bench``
(``complete``: false until the sweep ends) and in each result (``algorithm``,
``transport``: the header's ``# Transport:`` text, ``collective``). It is written atomically when the run starts (so a bad path fails
before the first size, and a killed run never leaves the previous run's file) and again
after every finished size (every algorithm's row of it). Each placement of a row carries,
besides nccl-tests' ``time`` (the median of the rounds), ``time_ci`` (that median's 95%
confidence interval, :meth:`.stats.Interval.as_dict`, in us) and ``round_times_us``; the row
carries ``rounds`` and ``round_positions`` (its algorithm's place in each round, from 0). The
log gets one self-contained JSON object per finished row,
flushed to disk at once, so a run killed half-way leaves every finished size readable; an
append starts on a fresh line, and a row the disk had no room for is taken back whole.
"""

import contextlib
import datetime
import json
import os

from plumbing.files import cannot_write, write_json_atomically

from . import summary

JSON_VERSION = 3  # nccl-tests' JSON_FILE_VERSION


def now():
    """The date and time in the one style of every results file the suite writes: ISO 8601, UTC,
    to the second (``2026-12-05T06:01:02+00:00``)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def nccl_time():
    """The local time as nccl-tests writes its JSON's ``start_time`` and ``end_time``
    (``2026-12-05 06:01:02``), which its parsers read; the ``-J`` document keeps it there."""
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def bool_text(value):
    """nccl-tests writes booleans as the strings "true" and "false"."""
    return "true" if value else "false"


class ResultsWriter:
    """Collects rows on rank 0; appends each to the log and rewrites ``-J`` at once.

    A ``ValueError`` from the constructor says which path cannot be written (or that both
    name one file): nothing was measured yet."""

    def __init__(self, json_path, log_path, argv, config, run_info):
        if json_path and log_path and os.path.realpath(json_path) == os.path.realpath(log_path):
            raise ValueError(f"-J and --log both name {json_path}; the JSON document would overwrite the log")
        self.json_path = json_path
        self.log_path = log_path
        self.rows = []
        self.document = {
            "version": JSON_VERSION,
            "start_time": nccl_time(),
            "args": list(argv),
            "config": config,
            "allreduce_bench": {**run_info, "complete": False},
        }
        self.run_info = run_info
        self._log = None
        if log_path:
            try:
                self._log = _open_log(log_path)
            except OSError as exc:
                raise ValueError(f"--log {cannot_write(log_path, exc)}") from None
        if json_path:
            try:
                self._write_json()
            except OSError as exc:
                self.close()
                raise ValueError(f"-J {cannot_write(json_path, exc)}") from None

    def add(self, *records):
        """Log ``records`` (one finished size, a row per algorithm), a line each, and rewrite
        ``-J`` once with them; ``OSError`` naming the file that could not take it."""
        for record in records:
            self.rows.append(record)
            if self._log:
                with _naming(self.log_path):
                    line = {**self.run_info, "start_time": self.document["start_time"], **record}
                    _append_line(self._log, json.dumps(line) + "\n")
        if self.json_path:
            with _naming(self.json_path):
                self._write_json()

    def finish(self):
        """The last ``-J``, ``complete``; the log closed."""
        self.close()
        if self.json_path:
            self._write_json(complete=True)

    def close(self):
        if self._log:
            self._log.close()
            self._log = None

    def _write_json(self, complete=False):
        wrong, busbw, summaries = 0, [], {}
        for row in self.rows:
            here = [row[p] for p in ("out_of_place", "in_place") if p in row]
            row_wrong = sum(int(p["nwrong"] or 0) for p in here)
            wrong += row_wrong
            busbw += [p["bus_bw"] for p in here]
            totals = summaries.setdefault(row.get("algorithm", "?"), {"out_of_bounds": 0, "busbw": []})
            totals["out_of_bounds"] += row_wrong
            totals["busbw"] += [p["bus_bw"] for p in here]
        document = {
            **self.document,
            "allreduce_bench": {**self.document["allreduce_bench"], "complete": complete},
            "results": self.rows,
            "out_of_bounds": {"count": int(wrong), "okay": bool_text(wrong == 0)},
            "average_bus_bandwidth": {"bandwidth": _mean(busbw), "okay": "unchecked"},
            "summaries": {name: {"out_of_bounds": s["out_of_bounds"], "average_bus_bandwidth": _mean(s["busbw"])}
                          for name, s in summaries.items()},
            "summary_by_size": summary.by_size(self.rows),
            "end_time": nccl_time(),
        }
        write_json_atomically(self.json_path, document)


@contextlib.contextmanager
def _naming(path):
    """Re-raise an ``OSError`` with ``path`` as its file name."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None


def _mean(values):
    return sum(values) / len(values) if values else 0.0


def _open_log(path):
    """``path`` open for appending (created, folders too), positioned on a fresh line."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    log = open(path, "ab")
    try:
        if log.tell() > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
            if cut:  # the last run was cut mid-row: that fragment keeps a line of its own
                _append_line(log, "\n")
    except BaseException:
        log.close()
        raise
    return log


def _append_line(log, text):
    """Append ``text`` and push it to the disk; on failure (no room, say) take back what got
    written of it, so the log never holds a partial row, and raise."""
    start = log.tell()
    try:
        log.write(text.encode())
        log.flush()
        os.fsync(log.fileno())
    except OSError:
        try:
            log.truncate(start)
            log.seek(start)
        except OSError:
            pass
        raise


def placement_time(cell):
    """A placement's time in us: ``time``, or ``cpu_time`` in a run with ``-C 1`` (the host's
    time to issue the calls: the same for CPU buffers)."""
    return cell["time"] if "time" in cell else cell["cpu_time"]


def read_results(path):
    """Rows of ours from a ``-J`` document or a JSON-lines log: dicts with at least
    algorithm, collective, size, count, type, redop, out_of_place and in_place. A log line
    that does not parse (a row cut by a killed run) is skipped."""
    with open(path) as f:
        text = f.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    if isinstance(document, dict) and "results" in document:
        run = document.get("allreduce_bench", {})
        return [{**run, **row} for row in document["results"]]
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
