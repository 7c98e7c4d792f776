"""Check 5, measured against expected: a short probe of the job's links (:func:`topology.probe.probe`),
then the ring all-reduce at a few sizes in interleaved rounds, its busbw set against what the
cost model gives the probed links (``topology.model``) and the lower bound no all-reduce
beats there; and the probe's health report (slow NICs, nodes and links,
:func:`topology.report.findings`) between nodes as findings of their own. Within a node the
short probe's figures move with what the cores do (on a 2-core VM a clean run found the
two directions of one pair 1.6x apart), so its findings there are left to a full probe
(``python -m topology probe``, then ``report``).

The ring is a finding where the interval of its busbw over the model's lies below
:data:`EXPECTED` at a size whose modelled time is bound by links, ports or uplinks of a job of
several nodes: there the model holds within 20% (the network lab's links, docs/lab.md). Within
one node the model prices the probed links, not the memory traffic of the reductions, so
there the rows are shown and not judged. Sizes
whose modelled call takes more than :data:`MOST_SECONDS` are left out, so that a slow network
keeps the check short.
"""

import numpy as np

import algorithms
from algorithms.costs import cost_model
from topology.machine import crowding
from topology.probe import probe
from topology.report import findings as health

from ..core.timing import timed
from ..formats.stats import median_interval
from .finding import Finding, Unchecked

CHECK = "measured"
PROBE_BYTES = 1 << 20
SIZES = (16 << 10, 256 << 10, 4 << 20)
MOST_SECONDS = 0.05
ROUNDS, ITERS, WARMUP = 6, 3, 1
EXPECTED = 0.5
JUDGED = ("link", "port", "uplink")  # what binds a modelled time that is judged
TITLES = {"slow_nic": "slow NIC", "slow_node": "slow node", "slow_link": "slow link",
          "asymmetric_link": "asymmetric link"}
FIXES = {"slow_nic": "look at the NIC's link (ethtool IFACE: speed, errors), its cable and its switch port",
         "slow_node": "look at the node's NIC, its binding and what else runs there",
         "slow_link": "look at the switch ports and cables between the two",
         "asymmetric_link": "look at the link's two directions: a duplex mismatch, a congested uplink"}


def measure(comm):
    """The probe's matrix and the ring's times per size on every rank (collective), or the
    reason it was not measured."""
    if comm.Get_size() < 2:
        return "one rank: no link to measure"
    matrix = probe(comm, nbytes=PROBE_BYTES, reps=3, warmup=1)
    model = cost_model(matrix)
    crowded = crowding(comm, 1)
    if crowded:  # the links between nodes are still probed (a network's pace is not the cores')
        return {"matrix": matrix, "model": model, "times": {}, "crowded": f"{crowded[0]} ranks on {crowded[1]} CPUs "
                f"of {crowded[2]}: the ring's timings would measure the scheduler"}
    sizes = [s for s in SIZES if s == SIZES[0] or model.time("ring", s) <= MOST_SECONDS]
    calls = {}
    for size in sizes:
        x, y = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
        calls[size] = lambda x=x, y=y: algorithms.allreduce(x, y, algorithm="ring", comm=comm)
    return {"matrix": matrix, "model": model, "times": timed(comm, calls, ITERS, WARMUP, ROUNDS)}


def _busbw(nbytes, seconds, n):
    return nbytes / seconds / 1e9 * 2 * (n - 1) / n


def rows(measured):
    """Per size: the ring's busbw (GB/s) median and interval, the model's and the bound's."""
    model, n = measured["model"], measured["matrix"].size
    found = []
    for size, times in measured["times"].items():
        predicted = model.time("ring", size)
        bound = model.lower_bound(size)
        busbw = median_interval([_busbw(size, t, n) for t in times])
        share = median_interval([predicted / t for t in times])
        found.append({"bytes": size, "busbw_GBps": busbw.as_dict(), "model_GBps": _busbw(size, predicted, n),
                      "bound_GBps": None if bound.missing or bound.seconds <= 0 else _busbw(size, bound.seconds, n),
                      "bound": f"{bound.kind}: {bound.detail}", "of_model": share.as_dict(), "_share": share,
                      "_busbw": busbw, "limit": str(model.limit("ring", size)),
                      "judged": measured["matrix"].node_count > 1 and str(model.limit("ring", size)) in JUDGED})
    return found


def check(job, measured):
    """Check 5's findings, what it could not check, and the table's rows (JSON-ready)."""
    if isinstance(measured, str):
        return [], [Unchecked(CHECK, "busbw against the probed links", measured)], []
    found, table = [], rows(measured)
    everyone = list(range(len(job.ranks)))
    for row in table:
        share, busbw = row.pop("_share"), row.pop("_busbw")
        if row["judged"] and share.high < EXPECTED:
            bound = (f"; no all-reduce beats {row['bound_GBps']:.3g} GB/s there ({row['bound']})"
                     if row["bound_GBps"] else "")
            found.append(Finding(
                CHECK, f"the ring reaches {share.median:.0%} of what the probed links allow at {row['bytes']} B",
                "high" if share.high < EXPECTED / 2 else "medium", everyone,
                f"ring all-reduce of {row['bytes']} B: busbw {busbw.text()} GB/s, {share.text(unit='x')} of the "
                f"model's {row['model_GBps']:.3g} GB/s on the links the probe measured{bound}",
                f"{1 / share.median:.1f}x the time the links allow",
                "the findings above may explain it; else compare the algorithms and MPI's own "
                "(python -m bench --algo ring,mpi) and the model (python -m bench model --topology FILE)",
                job.hosts(everyone), 1 / share.median))
    unchecked = [] if any(row["judged"] for row in table) else [Unchecked(
        CHECK, "busbw against the probed links", measured.get("crowded") or
        ("within one node the model prices the links, not the reductions' memory traffic (busbw shown, not judged)"
         if measured["matrix"].node_count < 2 else "no size is bound by the links between nodes"))]
    if measured["matrix"].node_count < measured["matrix"].size:
        unchecked.append(Unchecked(CHECK, "the links within a node", "the short probe's figures there move with "
                                   "what the cores do: python -m topology probe, then report, judges them"))
    for f in health(measured["matrix"]):
        if f["scope"] != "inter-node":
            continue
        ranks = sorted({r for r in np.ravel(f.get("ranks", [])).tolist()})
        found.append(Finding(CHECK, TITLES.get(f["kind"], f["kind"]), "medium", ranks, f["text"],
                             f"{1 / f['ratio']:.1f}x slower than its peers; a ring or tree through it runs at its pace"
                             if f.get("ratio") else "a ring or tree through it runs at its pace",
                             FIXES.get(f["kind"], "look at the hardware between them"), job.hosts(ranks),
                             1 / f["ratio"] if f.get("ratio") else None))
    return found, unchecked, table
