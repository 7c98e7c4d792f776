"""The port-aware cost model (topology.model, its schedules in algorithms/ through algorithms.costs): max-min fair sharing on hand-computed cases,
each algorithm's closed form on uniform links, ports and uplinks, hier, and the tools' "limited by"."""

import json
import math
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import ROOT

from topology import binomial_tree

ALPHA, BETA = 10e-6, 400e9  # uniform(n, 400, 10): s and B/s


def tool(*args):
    return subprocess.run([sys.executable, "-m", "bench", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def rows_of(text):
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip() and line[0] != "#"]


def segments(m):
    from algorithms.runtime.layout import SEGMENT_BYTES

    return max(1, math.ceil(m / SEGMENT_BYTES))


def matrix(bandwidth, latency=0.0, nodes=None, ports=None, racks=None, uplinks=None):
    from topology import BandwidthMatrix

    bandwidth = np.asarray(bandwidth, dtype=float)
    return BandwidthMatrix(bandwidth, np.full(bandwidth.shape, float(latency)), nodes=nodes, ports=ports,
                           racks=racks, uplinks=uplinks)


def phase(m, src, dst, concurrent=True):
    from topology.model import Network, Phase

    return Phase(Network.from_matrix(m), src, dst, concurrent)


# ---------------------------------------------------------------- max-min fair sharing

def test_two_flows_through_one_egress_port_get_half_each():
    m = matrix(np.full((3, 3), 100.0), ports={"egress": [10.0] * 3, "ingress": [10.0] * 3})
    p = phase(m, [0, 0], [1, 2])
    assert p.rates == pytest.approx([5e9, 5e9])
    t = p.time(1e9)
    assert t.seconds == pytest.approx(0.2) and t.resource == ("egress", 0)
    assert t.describe() == "egress port of node 0"


def test_a_flow_held_by_its_own_link_leaves_the_rest_of_the_port_to_the_other():
    b = np.full((3, 3), 100.0)
    b[0, 1] = 2.0
    p = phase(matrix(b, ports={"egress": [10.0] * 3, "ingress": [10.0] * 3}), [0, 0], [1, 2])
    assert p.rates == pytest.approx([2e9, 8e9])
    assert [p.binding(i) for i in range(2)] == [("link", (0, 1)), ("egress", 0)]
    assert p.time(8e9).seconds == pytest.approx(4.0) and p.time(8e9).resource == ("link", (0, 1))


def test_max_min_on_a_hand_computed_chain_and_its_bottleneck_property():
    from topology.model.phases import MaxMin, max_min_rates

    # A uses r0 (1), B uses r0 and r1 (2), C uses r1: A = B = 1/2 on r0, C takes the rest of r1
    rates, binding = max_min_rates([[0, -1], [0, 1], [1, -1]], [1.0, 2.0])
    assert rates == pytest.approx([0.5, 0.5, 1.5]) and binding.tolist() == [0, 0, 1]
    rng = np.random.default_rng(7)
    flows, kinds = 400, 60
    column = [rng.integers(0, 20, flows), rng.integers(19, 40, flows), rng.integers(39, 60, flows)]
    resources = np.stack([column[0], np.where(column[1] < 20, -1, column[1]),
                          np.where(column[2] < 40, -1, column[2])], axis=1)  # a link, maybe ports
    capacity = rng.uniform(1.0, 50.0, kinds)
    rates, binding = max_min_rates(resources, capacity)
    slow = MaxMin(resources, capacity)
    slow.ROUNDS = 10 ** 6  # whole-array rounds only, no heap
    slow.finish = slow.advance
    while not slow.complete:
        slow.advance()
    assert slow.rates == pytest.approx(rates, rel=1e-9)
    load = np.zeros(kinds)
    for f, row in enumerate(resources):
        for r in set(row[row >= 0]):
            load[r] += rates[f]
    assert (load <= capacity * (1 + 1e-9)).all()
    for f, row in enumerate(resources):  # max-min: every flow crosses a full resource where it is the largest
        r = binding[f]
        assert r in row and load[r] == pytest.approx(capacity[r])
        assert rates[f] == pytest.approx(max(rates[g] for g in range(flows) if r in resources[g]))


def test_transfers_within_a_node_use_no_port():
    b = np.array([[0, 100, 10], [100, 0, 10], [10, 10, 0]], dtype=float)
    m = matrix(b, nodes=[0, 0, 1], ports={"egress": [10.0, 10.0], "ingress": [10.0, 10.0]})
    p = phase(m, [0, 1, 0], [1, 0, 2])
    assert p.rates == pytest.approx([100e9, 100e9, 10e9])
    p = phase(m, [0, 1], [2, 2])  # both ranks of node 0 into node 1: its ingress port, shared
    assert p.rates == pytest.approx([5e9, 5e9]) and p.binding(0)[0] in ("egress", "ingress")


def test_rack_uplinks_are_shared_by_the_transfers_between_racks():
    b = np.full((4, 4), 100.0)
    m = matrix(b, ports={"egress": [100.0] * 4, "ingress": [100.0] * 4}, racks=[0, 0, 1, 1],
               uplinks={"up": [10.0, 10.0], "down": [40.0, 40.0]})
    p = phase(m, [0, 1, 0], [2, 3, 1])  # two leave rack 0, one stays in it
    assert p.rates == pytest.approx([5e9, 5e9, 95e9])
    assert p.time(1e9).resource == ("up", 0) and p.time(1e9).describe() == "up-link of rack 0"
    p = phase(m, [0, 1, 2], [3, 3, 0])
    assert p.rates[2] == pytest.approx(10e9)  # rack 1's up-link alone
    from algorithms.costs import cost_model

    assert cost_model(m).limit("ring", 1 << 30).kind == "uplink"


def test_a_sequential_phase_adds_up_its_transfers():
    m = matrix(np.full((3, 3), 10.0), latency=5.0)
    t = phase(m, [0, 0], [1, 2], concurrent=False).time(1e9)
    assert t.seconds == pytest.approx(2 * (5e-6 + 0.1)) and t.latency == pytest.approx(10e-6)


# ---------------------------------------------------------------- closed forms on uniform links

RANKS = [2, 3, 4, 5, 7, 8, 12, 16, 33, 64]
SIZES = [8, 1e5, 3e6, 14e9]


@pytest.fixture(scope="module")
def models():
    from algorithms.costs import cost_model
    from topology import uniform
    from topology.model import Network

    return {n: (cost_model(uniform(n, 400, 10)), cost_model(Network.uniform(n, 400, 10))) for n in RANKS}


def scheduled_tree(tree, m):
    """A pipelined tree on uniform links, every rank a node whose port is BETA, step by step as
    algorithms.catalog.tree runs it (a rank of height h sends segment i - h up at step i, a parent at
    depth d segment i - H - d down): each step alpha + (the most transfers through one port) s/beta."""
    count = segments(m)
    s = m / count
    heights = tree.heights()
    top = heights[tree.root]
    transfers = []  # (src, dst, first step)
    for child in range(tree.size):
        parent = tree.parent[child]
        if parent >= 0:
            transfers += [(child, parent, heights[child]), (parent, child, top + tree.depth_of(parent))]
    total = 0.0
    for step in range(max(f for _, _, f in transfers) + count):
        active = [(a, b) for a, b, f in transfers if f <= step < f + count]
        if active:
            load = max(max(Counter(a for a, _ in active).values()), max(Counter(b for _, b in active).values()))
            total += ALPHA + load * s / BETA
    return total


@pytest.mark.parametrize("n", RANKS)
def test_ring_ps_rd_and_binomial_tree_closed_forms(models, n):
    """Every rank a node whose port is its link: ring 2(N-1)(alpha + M/(N beta)); ps's workers
    share the root's ingress port; the binomial tree's period moves L segments through the root."""
    levels = math.ceil(math.log2(n))
    p = 1 << (n.bit_length() - 1)
    for m in SIZES:
        s_count = segments(m)
        s = m / s_count
        expected = {
            "ring": 2 * (n - 1) / n * m / BETA + 2 * (n - 1) * ALPHA,
            "ps": s_count * ALPHA + (n - 1) * m / BETA + (n - 1) * (ALPHA + m / BETA),
            "tree": scheduled_tree(binomial_tree(n), m),
            "rd": (int(math.log2(p)) + 2 * (n > p)) * (ALPHA + m / BETA),
            "rabenseifner": 2 * (math.log2(p) * ALPHA + (p - 1) / p * m / BETA) + 2 * (n > p) * (ALPHA + m / BETA),
            "hier": 2 * (n - 1) / n * m / BETA + 2 * (n - 1) * ALPHA,  # one rank a node: the ring
        }
        for model in models[n]:
            for algorithm, t in expected.items():
                assert model.time(algorithm, m) == pytest.approx(t, rel=1e-9), (algorithm, n, m)


@pytest.mark.parametrize("k,n", [(3, 9), (3, 27), (4, 16), (3, 11), (5, 7)])
def test_rabenseifner_with_a_radix(monkeypatch, k, n):
    """Radix k on uniform links, each rank a node whose port is its link: every step's k-1
    messages of M/k^(s+1) share the port, so 2(log_k p alpha + (p-1)/p M/beta), p = k^m <= N,
    plus the fold in and out where N > p (the largest group, ceil(N/p) ranks, shares its
    core's port in (N/p - 1 members at once) and out)."""
    from algorithms.costs import cost_model
    from topology import uniform

    monkeypatch.setenv("ALLREDUCE_RADIX", str(k))
    model = cost_model(uniform(n, 400, 10))
    steps = int(round(math.log(n, k)))
    while k ** (steps + 1) <= n:
        steps += 1
    while k ** steps > n:
        steps -= 1
    p = k ** steps
    most = -(-n // p) - 1  # members of the largest group
    for m in SIZES:
        fold = 2 * (ALPHA + most * m / BETA) if n > p else 0.0
        expected = 2 * (steps * ALPHA + (p - 1) / p * m / BETA) + fold
        assert model.time("rabenseifner", m) == pytest.approx(expected, rel=1e-9), (k, n, m)


@pytest.mark.parametrize("n", RANKS)
def test_the_uniform_network_agrees_with_the_matrix(models, n):
    full, light = models[n]
    for algorithm in ("ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier"):
        for m in SIZES:
            assert light.time(algorithm, m) == pytest.approx(full.time(algorithm, m), rel=1e-12)
            assert str(light.limit(algorithm, m)) == str(full.limit(algorithm, m))


def test_no_tree_beats_its_ports():
    from algorithms.costs import cost_model
    from topology import uniform

    for n in list(range(2, 40)) + [64, 100, 128]:
        model = cost_model(uniform(n, 400, 10))
        for algorithm in ("tree", "bamtree", "kmtree", "dbtree"):
            for m in (1e5, 4 << 20, 64 << 20, 1 << 30, 14e9):
                assert model.busbw(algorithm, m) <= 400 * (1 + 1e-9), (n, algorithm, m)


def test_the_binomial_period_carries_the_root_s_children_through_its_port():
    from algorithms.costs import cost_model
    from topology import uniform

    for n in (5, 8, 16, 100, 256):
        model = cost_model(uniform(n, 10, 5))
        children = len(model.tree("binomial").children(0))
        assert children == math.ceil(math.log2(n))
        for m in (64 << 20, 1 << 30):
            s = m / segments(m)
            period = model.estimate("tree", m).part("period")
            assert period.transfer >= children * s / 10e9 * (1 - 1e-12)
            assert period.resource[0] in ("egress", "ingress")
            assert str(model.limit("tree", m)) == "port"


def test_ports_much_slower_than_the_links_set_the_time():
    """Links 100x the ports: the port closed forms (the same as links equal to the ports)."""
    from algorithms.costs import cost_model
    from topology import uniform

    for n in (4, 8, 9):
        fast = matrix(np.full((n, n), 1000.0), latency=10.0, ports={"egress": [10.0] * n, "ingress": [10.0] * n})
        model, equal = cost_model(fast), cost_model(uniform(n, 10, 10))
        beta = 10e9
        for m in (1e5, 64 << 20, 1 << 30):
            assert model.time("ring", m) == pytest.approx(2 * (n - 1) * (ALPHA + m / n / beta))
            assert model.time("ps", m) == pytest.approx(segments(m) * ALPHA + (n - 1) * m / beta
                                                        + (n - 1) * (ALPHA + m / beta))
            for algorithm in ("ring", "ps", "tree", "dbtree", "rd"):
                assert model.time(algorithm, m) == pytest.approx(equal.time(algorithm, m))
                assert str(model.limit(algorithm, m)) in ("port", "latency")


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (4, 8), (3, 4), (8, 1), (1, 4)])
def test_hier_on_nodes_of_ranks_sharing_a_port(nodes, per_node):
    """Fast links within a node, port beta: 2(R-1)(alpha_i + M/(R beta_i)) + 2(K-1)(alpha + M/(K beta));
    across the nodes the R rings share each port, 2(K-1)/K M/beta, as one ring of the nodes."""
    from algorithms.costs import cost_model
    from topology import two_level
    from topology.model import Network

    k, r = nodes, per_node
    two = two_level(k, r, intra=1000, inter=10, intra_latency=1, inter_latency=5)
    for model in (cost_model(two), cost_model(Network.uniform(k * r, 10, 5, r, 1000, 1))):
        for m in (1e6, 1 << 30):
            inter = 2 * (k - 1) * (5e-6 + m / k / 10e9)
            intra = 2 * (r - 1) * (1e-6 + m / r / 1000e9)
            estimate = model.estimate("hier", m)
            assert estimate.seconds == pytest.approx(inter + intra)
            if k > 1:
                across = estimate.part("across nodes")
                assert 2 * (k - 1) * across.transfer == pytest.approx(2 * (k - 1) / k * m / 10e9)
                if r > 1:
                    assert across.resource[0] in ("egress", "ingress")
            tree = model.time("hier", m, across="bamtree")
            assert tree >= intra + 2 * (k - 1) / k * m / 10e9 * (1 - 1e-9)  # a tree no faster than the ports
            if k > 1 and r > 1 and m > 1e6:
                assert model.time("hier", m) < model.time("ring", m)
    assert cost_model(two, across="bamtree").time("hier", 1e6) == pytest.approx(cost_model(two).time("hier", 1e6, "bamtree"))
    with pytest.raises(ValueError, match="across"):
        cost_model(two, across="star")


def test_hier_on_nodes_of_unequal_sizes():
    """Nodes of 4 and 2 ranks (rank 5 first on the small one's numbering): L = 4 pieces of M/4;
    the big node's ring takes 2 x 3 steps of a piece, the small one 2 rounds of 2 x 1; the
    pieces cross in 2 waves of 2, two rings through each port: 2 x 2 steps of M/8 at beta/2."""
    from algorithms.costs import cost_model

    nodes = [1, 1, 1, 1, 0, 0]
    same = np.equal.outer(nodes, nodes)
    m = matrix(np.where(same, 1000.0, 10.0), nodes=nodes, ports={"egress": [10.0, 10.0], "ingress": [10.0, 10.0]})
    m.latency = np.where(same, 1.0, 5.0)
    model = cost_model(m)
    for size in (1e6, 1 << 30):
        within = 6 * (1e-6 + size / 4 / 1000e9)
        across = 2 * 2 * (5e-6 + size / 8 / 5e9)
        estimate = model.estimate("hier", size)
        assert estimate.seconds == pytest.approx(within + across)
        assert [label for _, label, _ in estimate.parts] == ["within nodes", "across nodes", "across nodes, wave 2"]
        assert model.time("hier", size, across="bamtree") >= within + across * (1 - 1e-9)  # 2 nodes: one edge


def test_version_1_files_and_matrices_without_nodes(tmp_path):
    """Each rank a node, its ports its fastest link out and in: receiving from two ranks at
    once shares the faster one's rate."""
    from algorithms.costs import cost_model
    from topology import BandwidthMatrix, random_heterogeneous

    het = random_heterogeneous(6, seed=3)
    data = het.to_json()
    data["version"] = 1
    for key in ("nodes", "ports_GBps", "racks", "uplinks_GBps"):
        data.pop(key, None)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    loaded = BandwidthMatrix.load(path)
    assert loaded.nodes == list(range(6)) and loaded.ports is None
    model, direct = cost_model(loaded), cost_model(het)
    for algorithm in ("ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "hier"):
        assert model.time(algorithm, 1 << 24) == pytest.approx(direct.time(algorithm, 1 << 24))
    b = np.array([[0, 4, 6], [4, 0, 1], [6, 1, 0]], dtype=float)
    p = phase(matrix(b), [1, 2], [0, 0])  # rank 0's ingress port: 6 GB/s, its fastest link in
    assert p.rates.sum() == pytest.approx(6e9) and p.rates == pytest.approx([3e9, 3e9])
    unlimited = cost_model(matrix(b), ports="file")
    assert unlimited.time("ps", 1e9) < cost_model(matrix(b)).time("ps", 1e9)


# ---------------------------------------------------------------- the tools

def test_1024_ranks_on_10_GBps_ports():
    """The binomial tree cannot beat its port, and the ring overtakes it."""
    from algorithms.costs import cost_model
    from topology.model import Network

    model = cost_model(Network.uniform(1024, 10, 5))
    for m in (1 << 10, 64 << 10, 4 << 20, 256 << 20, 1 << 30):
        assert model.busbw("tree", m) <= 10
    # the root's port moves L = log2 N segments per period: busbw at most 2(N-1)/N beta / L, and at
    # least that over the S + 2H steps of the pipeline (fill and drain included), H = L here
    m = 256 << 20
    count, levels = segments(m), 10
    slowest = (count + 2 * levels) * (5e-6 + levels * m / count / 10e9)
    assert m / slowest * 2 * 1023 / 1024 / 1e9 <= model.busbw("tree", m) <= 2 * 1023 / 1024 * 10 / levels
    cross = model.crossover("ring", "tree")
    assert cross is not None and 1 << 20 < cross < 64 << 20
    proc = tool("model", "--ranks", "1024", "--beta-GBps", "10", "-b", "1K", "-e", "1G", "-f", "64")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 120
    header, *rows = rows_of(proc.stdout)
    assert header == ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound"]
    cells = {(row[0], row[1]): row for row in rows}
    assert float(cells["256 MiB", "tree"][3]) <= 10 and cells["256 MiB", "tree"][4] == "port"
    assert cells["256 MiB", "ring"][4] == "link" and cells["1 KiB", "ring"][4] == "latency"
    assert float(cells["256 MiB", "ring"][3]) > float(cells["256 MiB", "tree"][3])
    assert re.search(r"# ring overtakes the binomial tree from \d+(\.\d)? MiB\n", proc.stdout)
    assert "# every rank its own node; each node's port 10 GB/s out and in" in proc.stdout
    # the bound, 2(N-1)/N M/beta on 10 GB/s ports: the ring's time at 256 MiB over it is 1.00x and more
    bound = 2 * 1023 / 1024 * (256 << 20) / 10e9 * 1e6 + 5  # and the last byte's latency, 5 us
    assert "# lower bound at 256 MiB: " + f"{bound:.0f} us, traffic" in proc.stdout
    assert float(cells["256 MiB", "ring"][5][:-1]) >= 1.0 and float(cells["256 MiB", "tree"][5][:-1]) > 4


def test_model_ranks_per_node_and_hier_across():
    proc = tool("model", "--ranks", "16", "--ranks-per-node", "4", "--beta-GBps", "10", "--intra-GBps", "200",
                "-b", "1M", "-e", "1G", "-f", "1024", "--algo", "ring,tree,hier", "--hier-across", "bamtree")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace("\n#   ", " ")
    assert "4 nodes of 4 ranks, links within a node 200 GB/s" in text and "hier across nodes: bamtree" in text
    rows = {(r[0], r[1]): r for r in rows_of(proc.stdout)[1:]}
    assert rows["1 GiB", "hier"][4] == "port"  # 4 trees at once through each node's port
    assert float(rows["1 GiB", "hier"][2]) > 2 * (1 << 30) / 10e9 * 1e6  # its root node: 2 children, 2M/beta
    ring = tool("model", "--ranks", "16", "--ranks-per-node", "4", "--beta-GBps", "10", "--intra-GBps", "200",
                "-b", "1G", "-e", "1G", "--algo", "ring,hier")
    assert ring.returncode == 0, ring.stderr
    rows = {r[1]: r for r in rows_of(ring.stdout)[1:]}
    assert "hier across nodes: ring" in ring.stdout.replace("\n#   ", " ")
    assert float(rows["hier"][2]) < float(rows["ring"][2])  # 2(K-1)/K M/beta against 2(N-1)/N M/beta


def test_scaling_says_what_limits_each_algorithm():
    proc = tool("scaling", "--params", "7e9", "--compute-time", "1", "--ranks", "8,1024,16384",
                "--algo", "ps,ring,tree")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 120
    lines = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert lines[0][-2:] == ["limited", "by"]
    table = {(row[0], int(row[1])): row for row in lines[1:]}
    assert table["ring", 8][2] == "0.0614" and table["ring", 8][-1] == "link"
    assert table["tree", 16384][-1] == "port" and table["ps", 8][-1] == "port"
    assert table["ring", 16384][-1] == "latency"
    for n in (8, 1024, 16384):  # the tree's ports: busbw at most 2(N-1)/N beta / ceil(log2 N)
        busbw = 14e9 / float(table["tree", n][2]) * 2 * (n - 1) / n / 1e9
        assert busbw <= 400 / math.ceil(math.log2(n)) * 2 * (n - 1) / n * 1.001
        assert float(table["tree", n][4].rstrip("%")) < float(table["ring", n][4].rstrip("%"))
    hier = tool("scaling", "--params", "7e9", "--compute-time", "1", "--ranks", "64", "--ranks-per-node", "8",
                "--algo", "ring,hier")
    assert hier.returncode == 0, hier.stderr
    assert "8 ranks a node, linked at 4000 GB/s within it" in hier.stdout
    t = {row[0]: float(row[2]) for row in (line.split() for line in hier.stdout.splitlines())
         if row[0] in ("ring", "hier")}
    assert t["hier"] < t["ring"]
