"""``bench scaling --train``: a measured compute profile projected to N ranks of a network.

The compute profile is a ``bench train -J`` file's noop runs (one per dtype and bucket size:
T_c, T_b, each bucket's bytes and ready time; :class:`bench.train.predict.Profile`); the
network is a uniform cluster (``--beta-GBps``, ``--alpha-us``, ``--ranks-per-node``), or a
matrix file (``--topology``: a probe's, or the lab's configured network from ``python -m
bench.lab network``), or a probe of one node extended by nodes (:func:`extended`). Each
bucket's all-reduce comes from the cost model on that network, and the step from
:func:`bench.train.predict.predict`, synchronous and overlapped.

Per-rank compute does not change with N on a cluster (a fixed batch per rank). Where every
rank shares one machine's P cores (``--cores P``, as the lab's namespaces do), N ranks of t
torch threads each compute max(1, N t / P) / max(1, N0 t / P) times slower than the N0 ranks
the profile was measured on (:func:`compute_factor`), and an overlapped all-reduce that polls
has no core of its own (:func:`bench.train.predict.processor_share`).
"""

import json
import sys
from dataclasses import dataclass, replace

import numpy as np

from algorithms.costs import SCHEDULES, cost_model
from topology import BandwidthMatrix
from topology.model import Network

from ..core.cli import algos_in
from ..formats import stats
from ..formats.tables import comment
from .predict import Profile, predict, processor_share

GLOO = "gloo"  # DDP's own ring all-reduce: modelled as the ring, waiting asleep


@dataclass(frozen=True)
class Measured:
    """One noop run of a ``bench train -J`` file: its dtype, bucket cap (MB) and profile."""

    dtype: str
    bucket_mb: float
    profile: Profile


def read_profiles(path):
    """(document, [:class:`Measured`]) of a ``bench train -J`` file, one per noop run;
    ``ValueError`` when it holds none."""
    try:
        with open(path) as f:
            document = json.load(f)
        found = [Measured(run["dtype"], float(run["bucket_mb"]),
                          Profile.of_noop(run["compute_ms"], run["backward_ms"],
                                          sorted(run["buckets"], key=lambda b: b["ready_ms"])))
                 for run in document["runs"] if run["algorithm"] == "noop"]
        int(document["ranks"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"--train {path}: not JSON: {exc}") from None
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"--train {path}: not a bench train -J file") from None
    if not found:
        raise ValueError(f"--train {path}: not a bench train -J file with a noop run")
    return document, found


def compute_factor(ranks, measured_ranks, threads, cores):
    """How much slower N ranks of ``threads`` torch threads compute than the ``measured_ranks``
    of the profile where all share ``cores`` cores: max(1, N t / P) / max(1, N0 t / P); 1 where
    ``cores`` is None (a cluster: each rank its own cores)."""
    if cores is None:
        return 1.0
    return max(1.0, ranks * threads / cores) / max(1.0, measured_ranks * threads / cores)


def scaled(profile, factor):
    """``profile`` with its compute, backward pass and ready times ``factor`` times longer."""
    return replace(profile, compute_s=profile.compute_s * factor, backward_s=profile.backward_s * factor,
                   buckets=tuple((nbytes, when * factor) for nbytes, when in profile.buckets))


def extended(matrix, ranks, beta_GBps, alpha_us):
    """A probe of one node extended by nodes: ``ranks`` / its size copies of ``matrix``, each a
    node, joined by links of ``beta_GBps`` and ``alpha_us`` through ports of ``beta_GBps``."""
    size = matrix.size
    if matrix.node_count != 1:
        raise ValueError(f"--topology has {matrix.node_count} nodes; only a probe of one node is extended "
                         f"by nodes (ask for at most its {size} ranks)")
    if ranks % size:
        raise ValueError(f"--ranks {ranks} is not a multiple of the {size} ranks of --topology's node")
    copies = ranks // size
    node = np.repeat(np.arange(copies), size)
    same = node[:, None] == node[None, :]
    bandwidth = np.where(same, np.tile(matrix.bandwidth, (copies, copies)), beta_GBps)
    latency = np.where(same, np.tile(matrix.latency, (copies, copies)), alpha_us)
    return BandwidthMatrix(bandwidth, latency, [f"node{k}" for k in node], {"extended": matrix.measured},
                           node.tolist(), {"egress": [beta_GBps] * copies, "ingress": [beta_GBps] * copies})


def network_for(ranks, topology, beta_GBps, alpha_us, ranks_per_node, intra_GBps):
    """The :class:`topology.model.Network` of ``ranks`` ranks: the first ``ranks`` of the
    matrix ``topology`` (a :class:`topology.BandwidthMatrix`), that matrix extended by nodes
    where it has fewer, or else a uniform cluster."""
    if topology is None:
        return Network.uniform(ranks, beta_GBps, alpha_us, ranks_per_node, intra_GBps)
    if ranks > topology.size:
        return Network.from_matrix(extended(topology, ranks, beta_GBps, alpha_us))
    if ranks < topology.size:
        keep = list(range(ranks))
        nodes = np.asarray(topology.nodes)[keep]
        _, renumbered = np.unique(nodes, return_inverse=True)
        used = sorted(set(nodes.tolist()))
        ports = None if topology.ports is None else {k: np.asarray(v)[used].tolist() for k, v in topology.ports.items()}
        racks = uplinks = None
        if topology.racks is not None and topology.uplinks is not None:
            kept, racks = np.unique(np.asarray(topology.racks)[used], return_inverse=True)
            racks, uplinks = racks.tolist(), {k: np.asarray(v)[kept].tolist() for k, v in topology.uplinks.items()}
        topology = BandwidthMatrix(topology.bandwidth[np.ix_(keep, keep)], topology.latency[np.ix_(keep, keep)],
                                   topology.hosts[:ranks], topology.measured, renumbered.tolist(), ports,
                                   racks, uplinks)
    return Network.from_matrix(topology)


@dataclass
class Row:
    """One projected configuration: the algorithm, synchronous or overlapped, the profile's dtype
    and bucket cap, the rank count, T_m (every bucket's all-reduce), the exposed part, the step
    and E = T_c / (T_c + exposed)."""

    algorithm: str
    overlapped: bool
    dtype: str
    bucket_mb: float
    ranks: int
    allreduce_s: float
    exposed_s: float
    step_s: float
    efficiency: float


def project(measured, algorithms, ranks, network, factor, shared):
    """The :class:`Row` of each algorithm (of the cost model's schedules, or ``gloo``),
    synchronous and overlapped (gloo: overlapped only, as DDP runs it), on ``network`` of
    ``ranks`` ranks, the profile's compute ``factor`` times longer; ``shared``: no core to
    spare for an overlapped all-reduce."""
    model = cost_model(network)
    profile = scaled(measured.profile, factor)
    rows = []
    for algorithm in algorithms:
        name = "ring" if algorithm == GLOO else algorithm
        share = processor_share(network.node_count == 1, polls=algorithm != GLOO)
        for overlapped in ((True,) if algorithm == GLOO else (False, True)):
            made = predict(profile, lambda nbytes: model.time(name, nbytes) if ranks > 1 else 0.0, overlapped,
                           shared, share)
            rows.append(Row(algorithm, overlapped, measured.dtype, measured.bucket_mb, ranks, sum(made.allreduce_s),
                            made.exposed_s, made.step_s, made.efficiency))
    return rows


#: the names ``--train`` projects: the cost model's algorithms and gloo
KNOWN = (*SCHEDULES, GLOO)


def measured_step(document, row):
    """The step a ``bench train -J`` document measured for ``row``'s configuration: its median
    and interval (seconds), or None where the document has no such run."""
    for run in document["runs"]:
        if (run["algorithm"] == row.algorithm and run["dtype"] == row.dtype
                and float(run["bucket_mb"]) == row.bucket_mb
                and (row.algorithm == GLOO or bool(run["overlap"]) == row.overlapped)):
            step = run["step"]
            return stats.Interval(step["median"] / 1e3, step["ci_low"] / 1e3, step["ci_high"] / 1e3,
                                  step["rounds"], step["coverage"]) if isinstance(step, dict) else None
    return None


def _network_text(args, topology):
    if topology is None:
        return (f"a uniform network: alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s per link and port, "
                f"{args.ranks_per_node} rank{'s' if args.ranks_per_node != 1 else ''} a node")
    text = f"{args.topology}: {topology.size} ranks on {topology.node_count} node{'s' if topology.node_count != 1 else ''}"
    if topology.node_count == 1:
        text += f", extended by nodes joined at {args.beta_GBps:g} GB/s and {args.alpha_us:g} us where more ranks"
    return text


def train_main(args):
    """``bench scaling --train FILE``: the table of each projected configuration (module
    docstring); ``args`` as ``bench scaling`` parsed them."""
    try:
        document, found = read_profiles(args.train)
        topology = BandwidthMatrix.load(args.topology) if args.topology else None
        ranks = [int(r) for r in args.ranks.split(",")]
        algorithms = algos_in(args.algo, dict(zip(KNOWN, KNOWN)))
        if min(ranks) < 1 or (args.cores is not None and args.cores < 1) or args.ranks_per_node < 1:
            raise ValueError("--ranks, --ranks-per-node and --cores must be positive")
        checked = read_profiles(args.check)[0] if args.check else None
        intra = args.intra_GBps if args.intra_GBps is not None else 10 * args.beta_GBps
        networks = {n: network_for(n, topology, args.beta_GBps, args.alpha_us, args.ranks_per_node, intra)
                    for n in ranks}
    except (TypeError, ValueError, OSError) as exc:
        print(f"python -m bench scaling: {exc}", file=sys.stderr)
        return 2
    measured_ranks, threads = int(document["ranks"]), int(document.get("threads", 1))
    print(comment(f"compute profiles from {args.train}: {measured_ranks} rank{'s' if measured_ranks != 1 else ''}, "
                  f"{threads} torch thread{'s' if threads != 1 else ''} each; T_c, T_b of each noop run: "
                  + ", ".join(f"{m.dtype} {m.bucket_mb:g} MB {m.profile.compute_s:.4g}, {m.profile.backward_s:.4g} s "
                              f"({len(m.profile.buckets)} buckets)" for m in found)))
    print(comment("network: " + _network_text(args, topology)))
    print(comment("cores: each rank its own, with one to spare for an overlapped all-reduce" if args.cores is None else
                  f"cores: all ranks share {args.cores}; compute x max(1, N x {threads} / {args.cores}) / "
                  f"max(1, {measured_ranks} x {threads} / {args.cores})"))
    head = (f"{'algorithm':>10}  {'mode':>7}  {'dtype':>5}  {'bucket (MB)':>11}  {'ranks':>5}  {'T_m (s)':>8}  "
            f"{'exposed (s)':>11}  {'step (s)':>8}  {'efficiency':>10}  {'speed-up':>8}")
    print(head + ("  measured step (s) [95% interval]  error" if checked else ""))
    for n in ranks:
        factor = compute_factor(n, measured_ranks, threads, args.cores)
        shared = args.cores is not None and n * (threads + 1) > args.cores
        for measured in found:
            for row in project(measured, algorithms, n, networks[n], factor, shared):
                line = (f"{row.algorithm:>10}  {'overlap' if row.overlapped else 'sync':>7}  {row.dtype:>5}  "
                        f"{row.bucket_mb:11g}  {n:5d}  {row.allreduce_s:8.4f}  {row.exposed_s:11.4f}  {row.step_s:8.4f}  "
                        f"{row.efficiency * 100:9.1f}%  {n * row.efficiency:8.2f}")
                if checked is not None and int(checked["ranks"]) == n:
                    step = measured_step(checked, row)
                    if step is not None:
                        error = row.step_s / step.median - 1
                        line += (f"  {step.median:8.4f} [{step.low:.4f}, {step.high:.4f}]  {error * 100:+5.0f}%"
                                 + (" in" if step.holds(row.step_s) else ""))
                print(line)
    return 0
