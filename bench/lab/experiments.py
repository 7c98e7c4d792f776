"""The lab's experiments: probe accuracy, the trees on uneven links, and nodes with NICs and
racks, each algorithm measured beside the port-aware model.

For each shape: bring the lab up, probe it with ``python -m topology probe`` inside it (the
HTB byte counters must show the probe's bytes in every shaped class), compare each measured
link and port with its configured rate x GOODPUT, write the health report of the probe
(``python -m topology report``), run ``python -m bench`` on trees built from the *probed*
matrix, and set each measured time beside the model's prediction from the same probe
(``bench.tools.model``; the racks' uplinks, which no probe between pairs sees, come from the lab's
configuration). The lab comes down after each shape, failure or not. Writes
``<out>/<shape>.json``, ``<out>/<shape>-heatmap.png``, ``<out>/summary.md`` and
``<out>/busbw.png``.

Two kinds of shape: one rank per namespace with a rate per ordered pair and no NIC
(``seed4``, ``het8``), and nodes of several ranks sharing memory, each node with a NIC that
caps its total egress and ingress, optionally in racks behind shaped uplinks (``nodes``,
``racks``, ``slownic``).
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from algorithms.costs import cost_model
from algorithms.settings import setting
from topology import BandwidthMatrix, build_tree, random_heterogeneous, seed_example
from plumbing.files import save_figure_atomically, write_json_atomically, write_text_atomically
from topology.probe import PERCENTILE
from topology.report import findings, heatmap, not_judged_text, oversubscribed
from topology.rings import ring_bottleneck

from ..core.machine import describe
from ..formats.results import read_results
from ..formats.tables import size_label
from . import network

MIB = 1 << 20
PROBE_BYTES = 8 * MIB
PROBE_REPS, PROBE_WARMUP = 5, 1
PROBE_TOLERANCE = 0.10
ITERS, WARMUP = 3, 1  # bench -n, -w
MODEL_TOLERANCE = 0.20
PAIR_ALGOS = ("bamtree", "kmtree", "tree", "ring", "bamring", "dring", "ps")
NODE_ALGOS = ("hier", "ring", "bamring", "tree", "dbtree", "bamtree", "kmtree", "ps")
HALVING = ("rabenseifner", "rd")  # beside the ring at 8 ranks: log2 N steps against 2(N-1)
HIER_BAM = "hier-bamtree"  # hier with its all-reduce across the nodes on the BAM tree of the node matrix
#: MPICH's own halving-doubling (a run of its own: MPICH reads its algorithm at MPI_Init), modelled
#: as rabenseifner at radix 2, the same exchanges
MPICH_RSAG = "mpi:reduce_scatter_allgather"

# The 2x2 example of the bottleneck-aware matching (topology.seed_example) with ranks ordered A, a, B, b and 1 GB/s = 50 Mbit/s: from
# root A the first level takes B (500), then the 2x2 example: BAM picks A-a, B-b (250, 200),
# KM picks A-b, B-a (350 + 150, the larger sum), and the binomial tree's fixed pairs (A-a, then
# A-B and a-b) run over the 50 Mbit/s link. (At 100 Mbit/s per GB/s, the 700 and 1000 Mbit/s
# links measured up to 14% low: four busy-polling ranks on two cores starve the TCP stack.)
_SEED = seed_example().bandwidth[np.ix_([0, 2, 1, 3], [0, 2, 1, 3])] * 50

LAB_INTRA_GBPS = 2.0  # two ranks of one namespace over MPICH's shared memory, where no probe says otherwise
NETWORK_PROBE_BYTES = 64 << 10  # the probe `network` runs for the latencies: short messages, a few seconds
NIC_MBIT = 200.0  # every node's NIC in the node shapes; links between nodes as fast


def _full(k, mbit):
    return np.full((k, k), float(mbit))


def shapes():
    """name -> the shape: description, K x K node rates (Mbit/s), ranks per node, NICs, racks,
    uplinks, sizes (bytes) and the algorithms run."""
    degraded = [NIC_MBIT] * 4
    degraded[2] = NIC_MBIT / 4
    return {
        "seed4": dict(description="the 2x2 example of bottleneck matching embedded in the second level (K = 4)",
                      rates=_SEED, sizes=[8 * MIB], algos=PAIR_ALGOS),
        "het8": dict(description="random heterogeneous links, 100-400 Mbit/s, seed 199 (K = 8)",
                     rates=random_heterogeneous(8, 100, 400, seed=199).bandwidth, sizes=[8 * MIB], algos=PAIR_ALGOS + HALVING,
                     mpich=True),
        "twonodes": dict(description=f"2 nodes x 2 ranks, every NIC and link {NIC_MBIT:g} Mbit/s (the test suite's shape)",
                         rates=_full(2, NIC_MBIT), ranks_per_node=2, nic_mbit=NIC_MBIT, sizes=[8 * MIB],
                         algos=("hier", "ring", "tree", "ps")),
        "nodes": dict(description=f"4 nodes x 2 ranks, every NIC and link {NIC_MBIT:g} Mbit/s",
                      rates=_full(4, NIC_MBIT), ranks_per_node=2, nic_mbit=NIC_MBIT,
                      sizes=[8 * MIB], algos=NODE_ALGOS + HALVING + ("dring",), mpich=True),
        "racks": dict(description=f"2 racks of 2 nodes x 2 ranks, NICs {NIC_MBIT:g} Mbit/s, "
                                  f"each rack's uplink {NIC_MBIT:g} Mbit/s (2:1)",
                      rates=_full(4, NIC_MBIT), ranks_per_node=2, nic_mbit=NIC_MBIT, racks=[0, 0, 1, 1],
                      uplink_mbit=2 * NIC_MBIT / 2, sizes=[8 * MIB], algos=NODE_ALGOS,
                      probe_mode="each"),  # pairs alone: two at once across racks would share an uplink
        "slownic": dict(description=f"4 nodes x 2 ranks, NICs {NIC_MBIT:g} Mbit/s but node 2's {NIC_MBIT / 4:g}",
                        rates=_full(4, NIC_MBIT), ranks_per_node=2, nic_mbit=degraded, degraded_nic=2,
                        sizes=[8 * MIB], algos=NODE_ALGOS),
    }


def topologies():
    """The names of the shapes, for ``--only``."""
    return shapes()


def mpiexec_path():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def _in_lab(lab, argv, timeout, env=None):
    """Run ``argv`` (python arguments) on every rank of ``lab`` as one MPI job."""
    command = network.mpmd_command(lab, mpiexec_path(), [sys.executable, *argv])
    env = {**os.environ, **network.mpi_environment(lab), **(env or {})}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise network.LabError(f"{' '.join(argv[:3])} in the lab failed (exit {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout)[-1500:]}")
    return proc


def expected_rates(shape):
    """The configured node -> node rate a lone transfer reaches (Mbit/s): its link, its NICs
    and, between racks, both uplinks; and each node's NIC (egress, ingress)."""
    rates = np.asarray(shape["rates"], dtype=float)
    k = len(rates)
    nic = _per_node(shape.get("nic_mbit"), k)
    lone = rates.copy()
    if nic is not None:
        lone = np.minimum(lone, np.minimum.outer(nic, nic))
    racks, uplink = shape.get("racks"), shape.get("uplink_mbit")
    if racks is not None and uplink is not None:
        cross = np.not_equal.outer(racks, racks)
        lone = np.where(cross, np.minimum(lone, uplink), lone)
    return lone, nic


def configured_matrix(shape, alpha_us=None, intra_GBps=LAB_INTRA_GBPS, probed=None):
    """The network a lab is configured as (``lab.shape()``), as a rank-level
    :class:`topology.BandwidthMatrix`: between nodes each link's rate x GOODPUT, each NIC a port
    (none: the node's fastest link), racks behind their uplinks. What the configuration cannot say
    comes from ``probed``, a probe of the lab's ranks (:func:`network_matrix`): every latency, the
    links within a node, and the probe's C-timed latencies and copy rates (``measured["floor"]``,
    which the lower bound takes); or, without a probe, ``alpha_us`` for every message's start-up
    (the lab adds no delay) and ``intra_GBps`` within a node."""
    k, r = shape["nodes"], shape["ranks_per_node"]
    node = np.repeat(np.arange(k), r)
    same = node[:, None] == node[None, :]
    gbps = np.asarray(shape["rates_mbit"], dtype=float) * network.GOODPUT / 8000
    measured = {"configured": "python -m bench.lab network", "goodput_factor": network.GOODPUT}
    if probed is not None:
        if probed.size != len(node) or list(probed.nodes) != node.tolist():
            raise network.LabError(f"the probe has {probed.size} ranks on nodes {probed.nodes}; the lab "
                                   f"{len(node)} on {node.tolist()}")
        within, latency = probed.bandwidth, probed.latency
        measured.update({"measured": f"latencies and the links within a node: python -m topology probe in the "
                                     f"lab ({probed.measured.get('bytes')} B messages)",
                         "floor": probed.measured.get("floor"), "machines": probed.measured.get("machines")})
    elif alpha_us is None:
        raise ValueError("a lab's network needs its probe or a start-up time (alpha_us)")
    else:
        within, latency = np.full(same.shape, float(intra_GBps)), np.full(same.shape, float(alpha_us))
    bandwidth = np.where(same, within, gbps[np.ix_(node, node)])
    nic = shape["nic_mbit"]
    ports = None
    if nic is not None:
        fastest = gbps.max(axis=1, initial=0.0), gbps.max(axis=0, initial=0.0)
        ports = {way: [fastest[w][i] if nic[i][w] is None else nic[i][w] * network.GOODPUT / 8000 for i in range(k)]
                 for w, way in enumerate(("egress", "ingress"))}
    uplinks = None
    if shape["racks"] is not None and shape["uplink_mbit"] is not None:
        uplinks = {way: [pair[w] * network.GOODPUT / 8000 for pair in shape["uplink_mbit"]]
                   for w, way in enumerate(("up", "down"))}
    return BandwidthMatrix(bandwidth, latency, [shape["hostnames"][i] for i in node], measured,
                           node.tolist(), ports, shape["racks"] if uplinks else None, uplinks)


def network_matrix(lab, alpha_us=None):
    """``python -m bench.lab network``'s matrix of the lab that is up: :func:`configured_matrix`,
    with the latencies and the links within a node measured by a probe of its ranks in the lab
    (:data:`NETWORK_PROBE_BYTES` messages), or with ``alpha_us`` for every start-up instead."""
    shape = lab.shape()
    if alpha_us is not None:
        return configured_matrix(shape, alpha_us)
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "probe.json")
        _in_lab(lab, ["-m", "topology", "probe", "-o", path, "-b", str(NETWORK_PROBE_BYTES), "--reps", str(PROBE_REPS),
                      "--warmup", str(PROBE_WARMUP)], timeout=600)
        probed = BandwidthMatrix.load(path, ranks=lab.ranks)
    return configured_matrix(shape, probed=probed)


def _per_node(value, k):
    if value is None:
        return None
    return np.asarray(value if np.ndim(value) else [value] * k, dtype=float)


def probe_accuracy(shape, probed):
    """Each directed link between nodes (their first ranks): configured Mbit/s, expected
    goodput, measured, relative error; then each NIC's measured egress and ingress."""
    lone, nic = expected_rates(shape)
    between = probed.node_matrix()
    links = []
    for i in range(len(lone)):
        for j in range(len(lone)):
            if i != j:
                expected = lone[i, j] * network.GOODPUT
                measured = between.bandwidth[i, j] * 8000  # GB/s -> Mbit/s
                links.append({"from": i, "to": j, "configured_mbit": float(lone[i, j]),
                              "expected_mbit": round(expected, 2), "measured_mbit": round(float(measured), 2),
                              "error": round(float(measured / expected - 1), 4)})
    ports = []
    if nic is not None and probed.ports is not None:
        for k in range(len(nic)):
            for way in ("egress", "ingress"):
                expected = nic[k] * network.GOODPUT
                measured = float(probed.ports[way][k]) * 8000
                ports.append({"node": k, "way": way, "configured_mbit": float(nic[k]),
                              "expected_mbit": round(expected, 2), "measured_mbit": round(measured, 2),
                              "error": round(measured / expected - 1, 4)})
    return links, ports


def htb_check(lab, sent, minimum):
    """Did every shaped class carry at least ``minimum`` bytes (the probe's own traffic)?"""
    short = [(i, j, int(sent[i, j])) for i in range(lab.k) for j in range(lab.k) if i != j and sent[i, j] < minimum]
    return {"bytes_per_class": sent.tolist(), "minimum_expected": minimum, "classes_short": short, "ok": not short}


def tree_summary(matrix, algos):
    """Each tree method's tree from the probed matrix: levels and per-level bottlenecks (GB/s);
    for ``hier-bamtree`` the BAM tree of the node matrix."""
    trees = {}
    methods = [(a, m, matrix) for a, m in (("bamtree", "bam"), ("kmtree", "km"), ("tree", "binomial")) if a in algos]
    if HIER_BAM in algos:
        methods.append((HIER_BAM, "bam", matrix.node_matrix()))
    for algo, method, source in methods:
        t = build_tree(source, root=0, method=method)
        trees[algo] = {"levels": [[list(pair) for pair in level] for level in t.levels],
                       "bottlenecks_GBps": [round(float(b), 4) for b in t.bottlenecks],
                       "bottleneck_GBps": round(float(min(t.bottlenecks)), 4)}
    return trees


def with_uplinks(probed, shape):
    """The probed matrix with the configured racks and uplinks (GB/s of goodput) added: a probe
    of lone pairs cannot see what crossing transfers share."""
    racks, uplink = shape.get("racks"), shape.get("uplink_mbit")
    if racks is None or uplink is None:
        return probed
    count = max(racks) + 1
    gbps = [uplink * network.GOODPUT / 8000] * count
    return BandwidthMatrix(probed.bandwidth, probed.latency, probed.hosts, probed.measured, probed.nodes,
                           probed.ports, list(racks), {"up": gbps, "down": gbps})


def _bench(lab, algos, sizes, probe_file, results_file, env=None, iters=ITERS):
    """Each call timed alone (``-z 1``: a barrier after it, inside the time), as the model
    takes it: back to back, a call's last transfers overlap the next call's first (the
    parameter server's answers and the next uploads use the two directions of the root's NIC)."""
    _in_lab(lab, ["-m", "bench", "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "2", "-n", str(iters),
                  "-w", str(WARMUP), "-z", "1", "-c", "1", "--algo", ",".join(algos), "--topology", probe_file,
                  "-J", results_file, "--log", "none", "--quiet"], timeout=900, env=env)
    return read_results(results_file)


def run_topology(name, shape, workdir, out, tag, owner=None, sizes=None, probe_bytes=PROBE_BYTES, iters=None):
    """One shape, lab up to lab down: the record written to ``<name>.json``."""
    sizes = sizes or shape["sizes"]
    algos = list(shape["algos"])
    lab = network.up(shape["rates"], tag=tag, owner=owner, ranks_per_node=shape.get("ranks_per_node", 1),
                     nic_mbit=shape.get("nic_mbit"), racks=shape.get("racks"), uplink_mbit=shape.get("uplink_mbit"))
    try:
        probe_file = os.path.join(workdir, f"{name}-probe.json")
        before = lab.class_bytes()
        _in_lab(lab, ["-m", "topology", "probe", "-o", probe_file, "-b", str(probe_bytes), "--reps", str(PROBE_REPS),
                      "--warmup", str(PROBE_WARMUP), "--mode", shape.get("probe_mode", "rounds")], timeout=600)
        htb = htb_check(lab, lab.class_bytes() - before, (PROBE_REPS + PROBE_WARMUP) * probe_bytes)
        probed = BandwidthMatrix.load(probe_file, ranks=lab.ranks)
        iters = iters or shape.get("iters", ITERS)
        rows = _bench(lab, algos, sizes, probe_file, os.path.join(workdir, f"{name}-bench.json"), iters=iters)
        if "hier" in algos:
            algos.append(HIER_BAM)
            for row in _bench(lab, ["hier"], sizes, probe_file, os.path.join(workdir, f"{name}-hierbam.json"),
                              env={"ALLREDUCE_HIER_ACROSS": "bamtree"}, iters=iters):
                rows.append({**row, "algorithm": HIER_BAM})
        if shape.get("mpich"):
            algos.append(MPICH_RSAG)
            rows += _bench(lab, [MPICH_RSAG], sizes, probe_file, os.path.join(workdir, f"{name}-mpich.json"),
                           iters=iters)
    finally:
        network.down(tag, owner)
    model = cost_model(with_uplinks(probed, shape))
    runs, bounds = [], {}
    for row in rows:
        algo, size = row["algorithm"], row["size"]
        predicted = model_time(model, algo, size) * 1e6
        measured = row["out_of_place"]["time"]
        bound = model.lower_bound(size)
        bounds[size] = {"bytes": size, "time_us": round(bound.seconds * 1e6, 1), "kind": bound.kind,
                        "detail": bound.detail}
        runs.append({"algorithm": algo, "bytes": size, "time_us": measured,
                     "busbw_GBps": row["out_of_place"]["bus_bw"], "in_place_time_us": row["in_place"]["time"],
                     "predicted_us": round(predicted, 1), "model_error": round(predicted / measured - 1, 4),
                     "x_bound": round(measured / (bound.seconds * 1e6), 3),
                     "limit": model_limit(model, algo, size), "wrong": row["out_of_place"]["nwrong"] or 0})
    links, ports = probe_accuracy(shape, probed)
    trees = tree_summary(probed, algos)
    found = findings(probed)
    heatmap(probed, os.path.join(out, f"{name}-heatmap.png"), f"{name}: probed bandwidth (GB/s)")
    record = {"name": name, "description": shape["description"], "ranks": lab.ranks, "nodes": lab.k,
              "shape": lab.shape(), "goodput_factor": network.GOODPUT,
              "probe": {"bytes": probe_bytes, "reps": PROBE_REPS, "warmup": PROBE_WARMUP, "matrix": probed.to_json()},
              "links": links, "ports": ports, "htb": htb, "trees": trees, "ring": ring_summary(model, algos),
              "lower_bound": list(bounds.values()), "report": found, "not_judged": oversubscribed(probed),
              "runs": runs}
    record["targets"] = targets(shape, record)
    return record


def ring_summary(model, algos):
    """bamring's order from the probed matrix, its slowest link and the ranks' own order's (Mbit/s)."""
    if "bamring" not in algos:
        return None
    order = [int(r) for r in model.bottleneck_ring().order]
    w = model.matrix.bandwidth
    return {"order": order, "bottleneck_mbit": round(ring_bottleneck(w, order) * 8000, 1),
            "own_order_bottleneck_mbit": round(ring_bottleneck(w, range(model.n)) * 8000, 1)}


def model_time(model, algo, size):
    if algo == HIER_BAM:
        return model.time("hier", size, across="bamtree")
    return model.time(modelled_as(algo), size)


def modelled_as(algo):
    """The schedule an entry is modelled by: MPICH's halving-doubling by rabenseifner's at radix 2."""
    if algo == MPICH_RSAG:
        if setting("ALLREDUCE_RADIX") != 2:
            raise ValueError(f"{MPICH_RSAG} is modelled as rabenseifner at radix 2: unset ALLREDUCE_RADIX")
        return "rabenseifner"
    return algo


def model_limit(model, algo, size):
    """What binds in the model, in words (e.g. "port: ingress port of node 0")."""
    limit = model.limit("hier", size, across="bamtree") if algo == HIER_BAM else model.limit(modelled_as(algo), size)
    detail = getattr(limit, "detail", "")
    return f"{limit}: {detail}" if detail and detail != str(limit) else str(limit)


def targets(shape, record):
    """The lab's targets for one shape, each with its number and whether it holds."""
    links, ports, trees, runs = record["links"], record["ports"], record["trees"], record["runs"]
    worst_link = max(links, key=lambda l: abs(l["error"]))
    checks = [{"target": f"probe error <= {PROBE_TOLERANCE:.0%} on every link between nodes",
               "measured": f"worst {worst_link['error']:+.1%} ({worst_link['from']}->{worst_link['to']})",
               "holds": abs(worst_link["error"]) <= PROBE_TOLERANCE}]
    if ports:
        worst = max(ports, key=lambda p: abs(p["error"]))
        checks.append({"target": f"probe error <= {PROBE_TOLERANCE:.0%} on every NIC",
                       "measured": f"worst {worst['error']:+.1%} (node {worst['node']} {worst['way']})",
                       "holds": abs(worst["error"]) <= PROBE_TOLERANCE})
    by = {(r["algorithm"], r["bytes"]): r for r in runs}
    sizes = sorted({r["bytes"] for r in runs})
    pair_trees = all(a in trees for a in ("bamtree", "kmtree", "tree"))
    bam_wins_on_paper = pair_trees and shape.get("nic_mbit") is None and \
        trees["bamtree"]["bottleneck_GBps"] > trees["kmtree"]["bottleneck_GBps"]
    for size in sizes:
        label = size_label(size)
        if bam_wins_on_paper and all((a, size) in by for a in ("bamtree", "kmtree", "tree")):
            bam, km, binomial = (by[(a, size)]["time_us"] for a in ("bamtree", "kmtree", "tree"))
            checks.append({"target": f"bamtree faster than kmtree and tree at {label}",
                           "measured": f"bamtree {bam / 1e3:.0f} ms, kmtree {km / 1e3:.0f} ms, tree {binomial / 1e3:.0f} ms",
                           "holds": bam < km and bam < binomial})
        for rival in ("bamring", "rabenseifner"):  # where the model puts it 10% ahead of the ring
            if (rival, size) in by and ("ring", size) in by and \
                    by[(rival, size)]["predicted_us"] < 0.9 * by[("ring", size)]["predicted_us"]:
                ours, ring = by[(rival, size)], by[("ring", size)]
                checks.append({"target": f"{rival} faster than ring at {label}, as the model says",
                               "measured": f"{rival} {ours['time_us'] / 1e3:.0f} ms, ring {ring['time_us'] / 1e3:.0f} "
                                           f"ms (model {ours['predicted_us'] / 1e3:.0f}, {ring['predicted_us'] / 1e3:.0f})",
                               "holds": ours["time_us"] < ring["time_us"]})
        if ("dring", size) in by and ("ring", size) in by:
            checks.append(dring_check(shape, by[("dring", size)], by[("ring", size)], label))
        if shape.get("ranks_per_node", 1) > 1 and "degraded_nic" not in shape and ("hier", size) in by:
            hier, ring = by[("hier", size)], by[("ring", size)]
            measured, modelled = ring["time_us"] / hier["time_us"], ring["predicted_us"] / hier["predicted_us"]
            checks.append({"target": f"hier beats ring by the model's margin at {label} (within 10%)",
                           "measured": f"ring/hier {measured:.2f}, model {modelled:.2f}",
                           "holds": measured > 1 and abs(measured / modelled - 1) <= 0.10})
        for r in (r for r in runs if r["bytes"] == size):
            checks.append({"target": f"model within {MODEL_TOLERANCE:.0%}: {r['algorithm']} {label}",
                           "measured": f"{r['model_error']:+.1%}", "holds": abs(r["model_error"]) <= MODEL_TOLERANCE})
    if "degraded_nic" in shape:
        checks += degraded_checks(shape["degraded_nic"], record, by, sizes)
    elif shape.get("ranks_per_node", 1) > 1:
        found = record["report"]
        checks.append({"target": "the health report flags nothing on a healthy shape",
                       "measured": "; ".join(f["text"] for f in found) or "nothing flagged",
                       "holds": not found})
    checks.append({"target": "every result correct (#wrong 0)", "measured": str(sum(r["wrong"] for r in runs)),
                   "holds": all(r["wrong"] == 0 for r in runs)})
    return [{**c, "holds": bool(c["holds"])} for c in checks]


def dring_check(shape, dring, ring, label):
    """The double ring against the ring: on links of their own per pair, each direction its own
    capacity, at least 1.7x its busbw (the model's 2x less the steps' start-ups); where every
    transfer crosses a node's NIC, which both rings share, within 10% of it."""
    ratio = dring["busbw_GBps"] / ring["busbw_GBps"]
    measured = (f"dring {dring['busbw_GBps'] * 1e3:.1f} MB/s, ring {ring['busbw_GBps'] * 1e3:.1f}: {ratio:.2f}x "
                f"(model {ring['predicted_us'] / dring['predicted_us']:.2f}x)")
    if shape.get("nic_mbit") is None:
        return {"target": f"dring at least 1.7x the ring's busbw at {label} (links of their own per pair)",
                "measured": measured, "holds": ratio >= 1.7}
    return {"target": f"dring within 10% of the ring at {label} (both rings share each node's NIC)",
            "measured": measured, "holds": abs(ratio - 1) <= 0.10}


def degraded_checks(node, record, by, sizes):
    """On a degraded NIC: the report names it (and nothing else); the BAM tree of the node
    matrix keeps it a leaf; where the model says that tree pays against the ring and hier's
    ring, the measurement agrees."""
    found = record["report"]
    named = [f for f in found if f.get("node") == node]
    checks = [{"target": f"the health report names node {node}'s NIC and nothing else",
               "measured": "; ".join(f["text"] for f in found) or "nothing flagged",
               "holds": any(f["kind"] == "slow_nic" for f in named) and len(named) == len(found)}]
    tree = record["trees"].get(HIER_BAM)
    if tree:
        edges = [pair for level in tree["levels"] for pair in level if node in pair]
        checks.append({"target": f"the BAM tree of the nodes keeps node {node} a leaf (one edge)",
                       "measured": f"edges of node {node}: {edges}", "holds": len(edges) == 1 and edges[0][1] == node})
    for size in sizes:
        if (HIER_BAM, size) not in by:
            continue
        bam = by[(HIER_BAM, size)]
        for other in ("ring", "hier"):
            if (other, size) not in by:
                continue
            r = by[(other, size)]
            if bam["predicted_us"] < r["predicted_us"]:
                checks.append({"target": f"{HIER_BAM} faster than {other} at {size_label(size)}, as the model says",
                               "measured": f"{HIER_BAM} {bam['time_us'] / 1e3:.0f} ms, {other} {r['time_us'] / 1e3:.0f} ms "
                                           f"(model {bam['predicted_us'] / 1e3:.0f}, {r['predicted_us'] / 1e3:.0f})",
                               "holds": bam["time_us"] < r["time_us"]})
    return checks


def summary_markdown(records, machine, seconds):
    lines = ["# Heterogeneous network lab", "",
             f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, commit "
             f"{machine['commit']}, {machine['mpi']}, {machine['cores']} cores; {seconds:.0f} s in all. "
             f"Links: veth pairs on bridges, HTB per ordered pair of namespaces (goodput {network.GOODPUT:.3f} x rate), "
             "NICs as HTB parents over them (egress) and on the bridge side (ingress), racks on bridges of "
             "their own joined by shaped uplinks; MPICH over libfabric tcp between namespaces, shared memory "
             "within one. Each call timed alone (`-z 1`: a barrier after every call, inside the time). "
             "Model: the port-aware model (bench model) from the probe; limit = what binds "
             "in it. Plot: [busbw.png](busbw.png), measured beside modelled at each shape's largest size; "
             "what misses and why: [notes.md](notes.md).", ""]
    for rec in records:
        errors = [abs(l["error"]) for l in rec["links"]]
        lines += [f"## {rec['name']}: {rec['description']}", ""]
        if rec.get("machine", {}).get("commit") != machine["commit"]:
            lines += [f"From an earlier run{' (' + rec['run_at'] + ')' if rec.get('run_at') else ''}, commit "
                      f"{rec.get('machine', {}).get('commit', 'unknown')}.", ""]
        lines += [
                  f"Probe ({size_label(rec['probe']['bytes'])}, {PERCENTILE}th percentile of {rec['probe']['reps']}): "
                  f"{len(errors)} directed links between nodes, mean |error| {np.mean(errors):.1%}, worst {max(errors):.1%}"
                  + (f"; NICs: worst {max(abs(p['error']) for p in rec['ports']):.1%}" if rec["ports"] else "")
                  + f". HTB counters: {'every shaped class carried the probe' if rec['htb']['ok'] else 'classes short: ' + str(rec['htb']['classes_short'])}.",
                  "", "Health report (`python -m topology report`): "
                  + ("; ".join(f["text"] for f in rec["report"]) if rec["report"] else "no findings")
                  + "".join(f"; {not_judged_text(m)}" for m in rec.get("not_judged", [])) + "."
                  + f" Heatmap: [{rec['name']}-heatmap.png]({rec['name']}-heatmap.png).", ""]
        if rec["trees"]:
            lines += ["| tree (from the probe) | levels | per-level bottleneck (Mbit/s) |", "|---|---|---|"]
            for algo, t in rec["trees"].items():
                lines.append(f"| {algo} | {t['levels']} | {', '.join(f'{b * 8000:.0f}' for b in t['bottlenecks_GBps'])} |")
            lines.append("")
        if rec.get("ring"):
            ring = rec["ring"]
            lines += [f"bamring's order (from the probe): {' '.join(map(str, ring['order']))}, slowest link "
                      f"{ring['bottleneck_mbit']:.0f} Mbit/s (the ranks' own order: {ring['own_order_bottleneck_mbit']:.0f}).", ""]
        for b in rec.get("lower_bound", []):
            lines += [f"Lower bound at {size_label(b['bytes'])} (any all-reduce on the probed links, ports and uplinks): "
                      f"{b['time_us'] / 1e3:.1f} ms, {b['kind']}: {b['detail']}.", ""]
        lines += ["| algorithm | bytes | measured (ms) | model (ms) | model error | x bound | limit (model) | busbw (MB/s) |",
                  "|---|---:|---:|---:|---:|---:|---|---:|"]
        for r in sorted(rec["runs"], key=lambda r: (r["bytes"], r["time_us"])):
            lines.append(f"| {r['algorithm']} | {r['bytes']} | {r['time_us'] / 1e3:.1f} | {r['predicted_us'] / 1e3:.1f} | "
                         f"{r['model_error']:+.1%} | {r['x_bound']:.2f}x | {r['limit']} | {r['busbw_GBps'] * 1e3:.1f} |")
        lines += ["", "| target | measured | holds |", "|---|---|---|"]
        for t in rec["targets"]:
            lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['holds'] else '**no**'} |")
        lines.append("")
    return "\n".join(lines)


def plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(records), 3)
    rows = -(-len(records) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(records):]:
        ax.set_visible(False)
    for ax, rec in zip(axes.flat, records):
        size = max(r["bytes"] for r in rec["runs"])
        runs = sorted((r for r in rec["runs"] if r["bytes"] == size), key=lambda r: r["time_us"])
        x = np.arange(len(runs))
        ax.bar(x - 0.2, [r["time_us"] / 1e3 for r in runs], 0.4, label="measured")
        ax.bar(x + 0.2, [r["predicted_us"] / 1e3 for r in runs], 0.4, label="port-aware model")
        bound = [b for b in rec.get("lower_bound", []) if b["bytes"] == size]
        if bound:
            ax.axhline(bound[0]["time_us"] / 1e3, color="black", linestyle="--", linewidth=1,
                       label="lower bound (any all-reduce)")
        ax.set_xticks(x, [r["algorithm"] for r in runs], rotation=30, ha="right")
        ax.set_ylabel(f"time for {size_label(size)} (ms)")
        ax.set_title(f"{rec['name']}: {rec['ranks']} ranks on {rec['nodes']} namespaces")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure_atomically(fig, path, dpi=100)
    plt.close(fig)


def run_all(out, tag, only=None, sizes=None, owner=None, probe_bytes=PROBE_BYTES, iters=None):
    """Every shape (or ``only`` those): write the JSON per shape, the summary and the plot. The
    summary and the plot also show the shapes not run this time whose record ``out`` holds
    (each section says its own run's date and commit)."""
    started = datetime.datetime.now()
    machine = describe()
    records = []
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lab-") as workdir:
        for name, shape in shapes().items():
            kept = os.path.join(out, f"{name}.json")
            if only and name not in only:
                if os.path.exists(kept):
                    with open(kept) as f:
                        records.append(json.load(f))
                continue
            print(f"# lab: {name} ({len(shape['rates'])} namespaces)", file=sys.stderr, flush=True)
            record = run_topology(name, shape, workdir, out, tag, owner, sizes, probe_bytes, iters)
            record["machine"] = machine
            record["run_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            write_json_atomically(kept, record)
            records.append(record)
    seconds = (datetime.datetime.now() - started).total_seconds()
    write_text_atomically(os.path.join(out, "summary.md"), summary_markdown(records, machine, seconds))
    plot(records, os.path.join(out, "busbw.png"))
    return records
