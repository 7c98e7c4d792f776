"""The health of a bandwidth matrix: slow NICs, slow nodes, slow and asymmetric links, and a heatmap.

``python -m topology report FILE`` (see :mod:`topology.__main__`). Pure data (NumPy), except
:func:`heatmap`, which draws with matplotlib. The rules, ``threshold`` t (default
:data:`THRESHOLD`) and ``asymmetry`` f (default :data:`ASYMMETRY`):

* Links between nodes are compared with links between nodes only, links within a node with
  links within a node only (shared memory against a network would make every network link
  "slow"). A node's link to another node is the median of its rank pairs' figures (the probe
  stores one figure for all of them). In a file without ``nodes`` every rank is a node.
* **slow NIC**: a node's port (``ports_GBps``, egress and ingress apart) below t times the
  median of the other nodes' ports in that direction.
* **slow node**: the median of a node's links out (or in) below t times the median of the
  links between the other nodes (three nodes at least: between two nodes a slow link cannot
  be told from a slow node); likewise a node whose links within it are below t times the
  median of the other nodes' links within them. This is how a slow NIC shows in the pair
  matrix.
* **slow link**: a link below t times the median link of its kind, unless a slow node or
  slow NIC at either end explains it (its sender's way out, its receiver's way in): a node's
  links are that node's finding, not one finding each. One finding per pair of nodes (or ranks
  within a node), naming the slow directions.
* **asymmetric link**: a -> b and b -> a more than f apart, unless a slow node or NIC at
  either end explains the slower direction, or it is a slow link already.
* **not judged**: the links within a node whose machine had more ranks than cores when it was
  probed (``measured["machines"]``, written by the probe): shared memory moves at the speed of
  the cores, so those figures measure how the cores were shared, not the links.

:func:`findings` returns them as dicts, worst first within each kind; :func:`summary` the
figures they were measured against; :func:`lines` the text ``report`` prints.
"""

import os

import numpy as np

from plumbing.files import save_figure_atomically
from .matrix import as_matrix

THRESHOLD = 0.7  # a link, node or port below this share of its median is slow
ASYMMETRY = 1.5  # a link whose two directions differ by more than this factor is asymmetric
KINDS = ("slow_nic", "slow_node", "slow_link", "asymmetric_link")


def _median(values):
    values = np.asarray(values, dtype=float)
    return float(np.median(values)) if values.size else None


def _ratio(value, reference):
    return float(value / reference) if reference else None


def node_links(matrix):
    """K x K: the bandwidth from node a to node b (the median of its rank pairs'), zero diagonal."""
    groups = _groups(matrix)
    count = len(groups)
    links = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            if a != b:
                links[a, b] = np.median(matrix.bandwidth[np.ix_(groups[a], groups[b])])
    return links


def _groups(matrix):
    found = [[] for _ in range(matrix.node_count)]
    for rank, node in enumerate(matrix.nodes):
        found[node].append(rank)
    return found


def _off_diagonal(square):
    return square[~np.eye(len(square), dtype=bool)]


def _intra_values(matrix, groups):
    """The bandwidths of every ordered pair of ranks within a node, all nodes together."""
    return np.concatenate([_off_diagonal(matrix.bandwidth[np.ix_(g, g)]) for g in groups if len(g) > 1] or [[]])


def summary(matrix):
    """The figures the findings are measured against: ranks, nodes, the median link between
    nodes and within them (GB/s, None where there are none), the median ports (None without)."""
    matrix = as_matrix(matrix)
    groups = _groups(matrix)
    links = node_links(matrix)
    ports = matrix.ports
    return {
        "ranks": matrix.size,
        "nodes": matrix.node_count,
        "node_layout": matrix.node_count < matrix.size,
        "median_inter_node_GBps": _median(_off_diagonal(links)) if len(links) > 1 else None,
        "median_intra_node_GBps": _median(_intra_values(matrix, groups)),
        "median_port_GBps": None if ports is None else {d: _median(ports[d]) for d in ("egress", "ingress")},
    }


def oversubscribed(matrix):
    """The nodes whose links within are not judged: ``[{"nodes", "ranks", "cores", "hosts"}]``,
    one per machine of ``measured["machines"]`` with more ranks than cores and a node of
    several ranks on it (entries that do not name this matrix's ranks are ignored)."""
    matrix = as_matrix(matrix)
    sizes = [len(g) for g in _groups(matrix)]
    found = []
    for machine in matrix.measured.get("machines") or []:
        try:
            ranks, cores = [int(r) for r in machine["ranks"]], int(machine["cores"])
        except (TypeError, KeyError, ValueError):
            continue
        if not ranks or min(ranks) < 0 or max(ranks) >= matrix.size or len(ranks) <= cores:
            continue
        nodes = sorted({matrix.nodes[r] for r in ranks if sizes[matrix.nodes[r]] > 1})
        if nodes:
            found.append({"nodes": nodes, "ranks": len(ranks), "cores": cores,
                          "hosts": [str(h) for h in machine.get("hosts") or []]})
    return found


def findings(matrix, threshold=THRESHOLD, asymmetry=ASYMMETRY):
    """The health findings of ``matrix`` (a :class:`BandwidthMatrix`, an array or a file path),
    by the rules in the module's docstring: a list of dicts, each with ``kind`` (one of
    :data:`KINDS`), ``scope`` ("inter-node" or "intra-node"), ``node`` (slow NIC or node) or
    ``nodes`` and ``ranks`` (links), ``value_GBps`` (the slow figure), ``median_GBps`` (what it
    was compared with) and ``ratio`` (their quotient), and a ``text`` line."""
    if not 0 < threshold <= 1:
        raise ValueError(f"the threshold must be in (0, 1], got {threshold!r}")
    if not asymmetry > 1:
        raise ValueError(f"the asymmetry factor must be above 1, got {asymmetry!r}")
    matrix = as_matrix(matrix)
    groups = _groups(matrix)
    count = len(groups)
    label = _Labels(matrix, groups)
    found = []
    slow_out, slow_in = np.zeros(count, bool), np.zeros(count, bool)  # explains links out of / into a node

    # slow NICs: each port against the other nodes' ports in its direction
    if matrix.ports is not None and count > 1:
        for direction, explains in (("egress", slow_out), ("ingress", slow_in)):
            ports = np.asarray(matrix.ports[direction], dtype=float)
            for k in range(count):
                reference = _median(np.delete(ports, k))
                if reference and ports[k] < threshold * reference:
                    explains[k] = True
                    found.append({"kind": "slow_nic", "scope": "inter-node", "node": k, "host": label.host(k),
                                  "ranks": groups[k], "direction": direction, "value_GBps": float(ports[k]),
                                  "median_GBps": reference, "ratio": _ratio(ports[k], reference),
                                  "text": f"slow NIC: {label.node(k)}: {direction} {ports[k]:.3f} GB/s, "
                                          f"{ports[k] / reference:.2f}x the median port {reference:.3f} GB/s "
                                          "(of the other nodes)"})

    # slow nodes: a node's links out and in against the links between the other nodes
    links = node_links(matrix)
    if count >= 3:
        for k in range(count):
            others = np.delete(np.delete(links, k, axis=0), k, axis=1)
            reference = _median(_off_diagonal(others))
            out, into = _median(np.delete(links[k], k)), _median(np.delete(links[:, k], k))
            directions = [d for d, v in (("out", out), ("in", into)) if reference and v < threshold * reference]
            if directions:
                slow_out[k] |= "out" in directions
                slow_in[k] |= "in" in directions
                value = min(v for d, v in (("out", out), ("in", into)) if d in directions)
                found.append({"kind": "slow_node", "scope": "inter-node", "node": k, "host": label.host(k),
                              "ranks": groups[k], "directions": directions, "out_GBps": out, "in_GBps": into,
                              "value_GBps": value, "median_GBps": reference, "ratio": _ratio(value, reference),
                              "text": f"slow node: {label.node(k)}: its links to other nodes {out:.3f} GB/s out, "
                                      f"{into:.3f} GB/s in (medians), {value / reference:.2f}x the median link "
                                      f"{reference:.3f} GB/s between the other nodes"})

    # slow nodes within: a node's own links against the other nodes' own links
    slow_inside = np.zeros(count, bool)
    unjudged = {k for machine in oversubscribed(matrix) for k in machine["nodes"]}
    multi = [k for k in range(count) if len(groups[k]) > 1 and k not in unjudged]
    if len(multi) >= 2:
        for k in multi:
            mine = _off_diagonal(matrix.bandwidth[np.ix_(groups[k], groups[k])])
            reference = _median(_intra_values(matrix, [groups[j] for j in multi if j != k]))
            value = _median(mine)
            if reference and value < threshold * reference:
                slow_inside[k] = True
                found.append({"kind": "slow_node", "scope": "intra-node", "node": k, "host": label.host(k),
                              "ranks": groups[k], "directions": ["within"], "value_GBps": value,
                              "median_GBps": reference, "ratio": _ratio(value, reference),
                              "text": f"slow node: {label.node(k)}: its links within it {value:.3f} GB/s "
                                      f"(median), {value / reference:.2f}x the median link {reference:.3f} GB/s "
                                      "within the other nodes"})

    # links between nodes: against the median of the links no slow node or NIC explains
    if count >= 2:
        explained = slow_out[:, None] | slow_in[None, :]
        np.fill_diagonal(explained, True)
        reference = _median(links[~explained]) if (~explained).any() else None
        found += _links(links, explained, reference, threshold, asymmetry, "inter-node",
                        lambda a, b: (a, b, groups[a][0], groups[b][0]), label)

    # links within a node: among all the links within nodes (but not those of a slow node within)
    reference = _median(_intra_values(matrix, [groups[k] for k in multi if not slow_inside[k]]))
    for k in multi:
        if slow_inside[k]:
            continue
        g = groups[k]
        block = matrix.bandwidth[np.ix_(g, g)]
        explained = np.eye(len(g), dtype=bool)
        found += _links(block, explained, reference, threshold, asymmetry, "intra-node",
                        lambda a, b, g=g, k=k: (k, k, g[a], g[b]), label)
    order = {kind: i for i, kind in enumerate(KINDS)}
    found.sort(key=lambda f: (order[f["kind"]], f["ratio"] if f["ratio"] is not None else 0.0))
    return found


def _links(links, explained, reference, threshold, asymmetry, scope, who, label):
    """Slow and asymmetric links of one square block (``who(a, b)``: node a, node b, rank a, rank b)."""
    found = []
    size = len(links)
    for a in range(size):
        for b in range(a + 1, size):
            ab, ba = float(links[a, b]), float(links[b, a])
            na, nb, ra, rb = who(a, b)
            ends = (ra, rb) if scope == "intra-node" else (na, nb)
            there, back = label.end(scope, na, ra), label.end(scope, nb, rb)
            base = {"scope": scope, "nodes": [na, nb], "ranks": [ra, rb], "bandwidth_GBps": [ab, ba]}
            both = f"{there} -> {back} {ab:.3f} GB/s, {back} -> {there} {ba:.3f} GB/s"
            candidates = ((f"{ends[0]}->{ends[1]}", ab, explained[a, b]),
                          (f"{ends[1]}->{ends[0]}", ba, explained[b, a]))
            slow = [(d, v) for d, v, gone in candidates if not gone and reference and v < threshold * reference]
            where = f"{label.pair(scope, na, nb, ra, rb)}{label.within(scope, na)}"
            if slow:
                value = min(v for _, v in slow)
                found.append({"kind": "slow_link", **base, "directions": [d for d, _ in slow], "value_GBps": value,
                              "median_GBps": reference, "ratio": _ratio(value, reference),
                              "text": f"slow link: {where}: {both} ({'both ways' if len(slow) == 2 else 'one way'}), "
                                      f"{value / reference:.2f}x the median {scope} link {reference:.3f} GB/s"})
                continue
            low, high = min(ab, ba), max(ab, ba)
            slower_explained = explained[a, b] if ab <= ba else explained[b, a]
            if slower_explained or not high > asymmetry * low:
                continue
            factor = high / low if low > 0 else None  # None: one way missing (JSON has no infinity)
            found.append({"kind": "asymmetric_link", **base, "value_GBps": low, "factor": factor,
                          "median_GBps": reference, "ratio": _ratio(low, reference),
                          "text": f"asymmetric link: {where}: {both}, "
                                  f"{f'{factor:.2f}x apart' if factor else 'one way missing'}"})
    return found


class _Labels:
    """How findings name nodes and ranks: "node 2 (host h, ranks 4-5)"; a link between two
    nodes of one rank each (every rank a node) by its ranks."""

    def __init__(self, matrix, groups):
        self.matrix, self.groups = matrix, groups
        self.by_rank = matrix.node_count == matrix.size

    def host(self, k):
        return self.matrix.hosts[self.groups[k][0]]

    def node(self, k):
        ranks = self.groups[k]
        span = f"rank {ranks[0]}" if len(ranks) == 1 else \
            f"ranks {ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else \
            "ranks " + ",".join(map(str, ranks))
        return f"node {k} (host {self.host(k)}, {span})"

    def pair(self, scope, na, nb, ra, rb):
        if scope == "intra-node" or self.by_rank:
            return f"rank {ra} <-> rank {rb}"
        return f"node {na} <-> node {nb} (hosts {self.host(na)}, {self.host(nb)}; leaders {ra}, {rb})"

    def end(self, scope, k, rank):
        return f"rank {rank}" if scope == "intra-node" or self.by_rank else f"node {k}"

    def within(self, scope, k):
        return f" (within node {k}, host {self.host(k)})" if scope == "intra-node" else ""


def not_judged_text(machine):
    """The line that says which nodes' links within were not judged, and why."""
    nodes = machine["nodes"]
    which = f"node {nodes[0]}" if len(nodes) == 1 else "nodes " + ", ".join(map(str, nodes))
    return (f"not judged: the links within {which}: {machine['ranks']} ranks shared {machine['cores']} "
            f"core{'s' if machine['cores'] != 1 else ''} of one machine when probed, so their shared-memory "
            "figures measure how the cores were shared, not the links")


def lines(matrix, found, name="matrix", threshold=THRESHOLD, asymmetry=ASYMMETRY):
    """The text of ``report``: a header line, then one line per finding, or one saying there are none."""
    figures = summary(matrix)
    inter, intra, ports = (figures["median_inter_node_GBps"], figures["median_intra_node_GBps"],
                           figures["median_port_GBps"])
    layout = f"{figures['nodes']} node{'s' if figures['nodes'] != 1 else ''}" + \
        ("" if figures["node_layout"] else " of one rank each")
    parts = [f"{name}: {figures['ranks']} ranks on {layout}"]
    parts.append(f"median inter-node link {inter:.3f} GB/s" if inter is not None else "no inter-node links")
    if intra is not None:
        parts.append(f"median intra-node link {intra:.3f} GB/s")
    parts.append(f"median port egress {ports['egress']:.3f}, ingress {ports['ingress']:.3f} GB/s"
                 if ports else "no ports in the file")
    out = ["; ".join(parts)]
    out += [f["text"] for f in found]
    unjudged = oversubscribed(matrix)
    out += [not_judged_text(machine) for machine in unjudged]
    if not found:
        ports_too = ", every port within it of the median port" if ports else ""
        judged = "every other" if unjudged else "every"
        out.append(f"no findings: {judged} link within {threshold:g}x of the median of its kind{ports_too}, "
                   f"none more than {asymmetry:g}x asymmetric")
    return out


def heatmap(matrix, path, title=None):
    """Write a PNG of the bandwidth matrix to ``path`` (atomically) and return ``path``: the
    ranks in node order, white lines between nodes, a colour bar in GB/s (a log scale where
    the links span over 20x), the figures in the cells of a small matrix. A file with nodes of
    several ranks gets a second panel, the links between the nodes on their own colour scale
    (with the ports in the labels), where a slow node or NIC shows that shared memory's far
    faster links would drown in the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = as_matrix(matrix)
    groups = _groups(matrix)
    size, count = matrix.size, matrix.node_count
    order = [r for g in groups for r in g]
    two = 1 < count < size
    side = min(11.0, max(5.0, 0.4 * size + 2.5))
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=((2 * side + 2) if two else side + 1.6, side), dpi=110,
                             squeeze=False)
    values = matrix.bandwidth[np.ix_(order, order)]
    _panel(fig, axes[0][0], values, [str(r) for r in order], "rank", plt)
    if two:
        ax = axes[0][0]
        edge = 0
        for g in groups[:-1]:
            edge += len(g)
            ax.axvline(edge - 0.5, color="white", linewidth=2)
            ax.axhline(edge - 0.5, color="white", linewidth=2)
        if count <= 32:
            starts = np.cumsum([0] + [len(g) for g in groups])
            top = ax.secondary_xaxis("top")
            top.set_xticks([(starts[k] + starts[k + 1] - 1) / 2 for k in range(count)],
                           [f"node {k}" for k in range(count)], fontsize=8 if count > 8 else 10)
            top.tick_params(length=0)
        ax.set_title("every pair of ranks", fontsize=11)
        ports = matrix.ports
        names = [f"node {k}" for k in range(count)]
        rows, cols = names, names
        if ports is not None and count <= 16:
            rows = [f"{n}\negress {ports['egress'][k]:.3g}" for k, n in enumerate(names)]
            cols = [f"{n}\ningress\n{ports['ingress'][k]:.3g}" for k, n in enumerate(names)]
        _panel(fig, axes[0][1], node_links(matrix), rows, "node", plt, cols)
        axes[0][1].set_title("between nodes" + (" (ports in GB/s under the names)" if rows is not names else ""),
                             fontsize=11)
    fig.suptitle(title or f"bandwidth, {size} ranks on {count} node{'s' if count != 1 else ''}")
    fig.tight_layout()
    save_figure_atomically(fig, path, bbox_inches="tight")
    plt.close(fig)
    return path


def _panel(fig, ax, values, labels, what, plt, columns=None):
    """One heatmap: ``values`` (zero diagonal, not drawn), ticks named ``labels`` (rows) and
    ``columns`` (default the same), its colour bar."""
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.ticker import FuncFormatter

    size = len(values)
    shown = ~np.eye(size, dtype=bool)
    positive = values[shown & (values > 0)]
    log = positive.size > 0 and positive.max() > 20 * positive.min()
    image = np.where(shown, values, np.nan)
    if log:
        image = np.where(image > 0, image, np.nan)  # a log scale has no 0: a missing link shows blank
        norm = LogNorm(vmin=positive.min(), vmax=positive.max())
    else:
        norm = Normalize(vmin=0, vmax=positive.max() if positive.size else 1.0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    drawn = ax.imshow(image, cmap=cmap, norm=norm, interpolation="nearest")
    bar = fig.colorbar(drawn, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("bandwidth, GB/s" + (" (log scale)" if log else ""))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if log:  # label the minor ticks 2 and 5 of each decade where the bar spans few decades
        bar.ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if _few_decades(norm) and f"{v:.0e}"[0] in "25" else ""))
    step = max(1, int(np.ceil(size / 32)))
    ticks = list(range(0, size, step))
    small = 8 if size > 16 else 10
    ax.set_xticks(ticks, [(columns or labels)[i] for i in ticks], fontsize=small)
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=small)
    ax.set_xlabel(f"to {what}")
    ax.set_ylabel(f"from {what}")
    if size <= 16:
        for i in range(size):
            for j in range(size):
                if shown[i, j]:
                    v = values[i, j]
                    dark = v <= 0 or norm(v) < 0.6
                    ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7 if size > 6 else 10,
                            color="white" if dark else "black")


def _few_decades(norm):
    """Whether a log colour bar spans under two decades (minor ticks labelled then)."""
    return norm.vmax < 100 * norm.vmin



def default_heatmap_path(path):
    """FILE.json -> FILE.png beside it (FILE.png for a name without .json)."""
    path = os.fspath(path)
    return (path[:-len(".json")] if path.endswith(".json") else path) + ".png"
