"""Matchings against brute force, trees as spanning trees of matchings, matrix files."""

import itertools
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import (BandwidthMatrix, Tree, bottleneck, bottleneck_matching, bottleneck_matching_reference, build_tree,
                      double_binary_trees, max_weight_matching, random_heterogeneous, seed_example, tree_cost,
                      two_level, uniform)
from topology.matrix import SEED_EXAMPLE_WEIGHTS
from topology.probe import tournament


def brute_force(w):
    """(max cardinality, best minimum, best sum) over every matching of links (w > 0)."""
    w = np.asarray(w, dtype=float)
    if w.shape[0] > w.shape[1]:
        w = w.T
    best_bottleneck, best_sum = (0, 0.0), (0, 0.0)
    for choice in itertools.product(range(-1, w.shape[1]), repeat=w.shape[0]):
        cols = [c for c in choice if c >= 0]
        if len(set(cols)) != len(cols) or any(w[i, c] <= 0 for i, c in enumerate(choice) if c >= 0):
            continue
        weights = [w[i, c] for i, c in enumerate(choice) if c >= 0]
        best_bottleneck = max(best_bottleneck, (len(cols), min(weights, default=0.0)))
        best_sum = max(best_sum, (len(cols), sum(weights)))
    return best_bottleneck[0], best_bottleneck[1], best_sum[1]


def assert_matching(w, pairs):
    w = np.asarray(w, dtype=float)
    assert len({i for i, _ in pairs}) == len(pairs) == len({j for _, j in pairs}), pairs
    assert all(0 <= i < w.shape[0] and 0 <= j < w.shape[1] and w[i, j] > 0 for i, j in pairs), pairs


# small matrices with ties (few distinct values), zeros (missing links) and either side larger
small_matrices = st.integers(1, 5).flatmap(
    lambda rows: st.integers(1, 5).flatmap(
        lambda cols: st.lists(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.0, 2.0, 3.5, 7.0, -1.0]),
                                       min_size=cols, max_size=cols),
                              min_size=rows, max_size=rows)))


@settings(max_examples=400, deadline=None)
@given(small_matrices)
def test_bam_matches_brute_force(w):
    cardinality, best_min, _ = brute_force(w)
    for match in (bottleneck_matching, bottleneck_matching_reference):
        pairs = match(w)
        assert_matching(w, pairs)
        assert len(pairs) == cardinality, match.__name__
        assert bottleneck(w, pairs) == best_min, match.__name__


@settings(max_examples=300, deadline=None)
@given(small_matrices)
def test_km_matches_brute_force(w):
    cardinality, _, best_sum = brute_force(w)
    pairs = max_weight_matching(w)
    assert_matching(w, pairs)
    assert len(pairs) == cardinality
    assert sum(np.asarray(w)[i][j] for i, j in pairs) == pytest.approx(best_sum)


@pytest.mark.parametrize("shape", [(6, 9), (9, 6), (7, 7), (1, 12), (12, 1)])
def test_bam_on_random_real_weights(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        w = rng.uniform(0.5, 50, size=shape) * (rng.random(shape) > 0.3)
        fast, ref = bottleneck_matching(w), bottleneck_matching_reference(w)
        assert len(fast) == len(ref)
        assert bottleneck(w, fast) == bottleneck(w, ref)


def test_seed_example_bam_picks_scheme_1_km_picks_scheme_2():
    w = SEED_EXAMPLE_WEIGHTS
    assert sorted(bottleneck_matching(w)) == [(0, 0), (1, 1)]  # A-a, B-b: sum 9, min 4
    assert sorted(max_weight_matching(w)) == [(0, 1), (1, 0)]  # A-b, B-a: sum 10, min 3
    assert sorted(bottleneck_matching_reference(w)) == [(0, 0), (1, 1)]
    assert w[0, 0] + w[1, 1] == 9 and min(w[0, 0], w[1, 1]) == 4
    assert w[0, 1] + w[1, 0] == 10 and min(w[0, 1], w[1, 0]) == 3


def test_seed_example_inside_a_tree():
    m = seed_example()
    bam, km = build_tree(m, 0, "bam"), build_tree(m, 0, "km")
    assert bam.levels == [[(0, 1)], [(0, 2), (1, 3)]] and bam.bottlenecks == [10.0, 4.0]
    assert km.levels == [[(0, 1)], [(0, 3), (1, 2)]] and km.bottlenecks == [10.0, 3.0]
    assert tree_cost(bam) < tree_cost(km)


def assert_spanning_tree_of_matchings(tree, links):
    size = len(links)
    rebuilt = Tree.from_levels(size, tree.root, tree.levels)  # validates: spanning, each level a matching
    assert rebuilt.parent == tree.parent
    assert tree.parent[tree.root] == -1 and isinstance(tree.parent, list) and isinstance(tree.levels, list)
    inside = {tree.root}
    for level, slowest in zip(tree.levels, tree.bottlenecks):
        assert all(p in inside and c not in inside for p, c in level)
        assert slowest == min(links[p][c] for p, c in level)
        inside |= {c for _, c in level}


@pytest.mark.parametrize("size", list(range(1, 65)))
@pytest.mark.parametrize("method", ["bam", "km", "binomial"])
def test_every_tree_spans_all_ranks(size, method):
    for matrix in (random_heterogeneous(size, seed=size), two_level(1, size) if size < 4 else
                   two_level(size // 4, 4) if size % 4 == 0 else uniform(size)):
        tree = build_tree(matrix, root=size // 3, method=method)
        assert tree.root == size // 3
        assert_spanning_tree_of_matchings(tree, matrix.links())
        assert tree.depth() == math.ceil(math.log2(size))  # every link present: U doubles


@pytest.mark.parametrize("size", list(range(1, 70)))
def test_double_binary_trees(size):
    """Two binary spanning trees of depth <= ceil(log2 N); with an even rank count no rank is an
    inner node of both (so each forwards and reduces about half of the vector), with an odd one
    only rank 0. Heights and depths against a walk of the parent links."""
    trees = double_binary_trees(size)
    inner = []
    for tree in trees:
        assert tree.parent.count(-1) == 1 and tree.parent.index(-1) == tree.root and tree.size == size
        depths = []
        for rank in range(size):  # walk up: every rank reaches the root
            path, node = [rank], rank
            while tree.parent[node] >= 0:
                node = tree.parent[node]
                assert node not in path
                path.append(node)
            assert node == tree.root
            depths.append(len(path) - 1)
            assert tree.depth_of(rank) == depths[-1]
        children = [[c for c in range(size) if tree.parent[c] == r] for r in range(size)]
        assert all(len(c) <= 2 for c in children)
        assert sorted(sum((tree.children(r) for r in range(size)), [])) == sorted(set(range(size)) - {tree.root})

        def height(rank):
            return max((height(c) + 1 for c in children[rank]), default=0)

        assert tree.heights() == [height(r) for r in range(size)]
        assert max(depths) <= math.ceil(math.log2(size))
        inner.append({r for r in range(size) if children[r]})
    assert trees[0].root == 0 and trees[1].root == (size - 1 if size % 2 == 0 else 1 % size)
    assert inner[0] & inner[1] == set() if size % 2 == 0 else inner[0] & inner[1] <= {0}


@pytest.mark.parametrize("size", [3, 5, 8, 12])
def test_each_bam_level_is_the_optimum_for_its_sets(size):
    matrix = random_heterogeneous(size, seed=7)
    links = matrix.links()
    tree = build_tree(matrix, method="bam")
    inside = [tree.root]
    for level, slowest in zip(tree.levels, tree.bottlenecks):
        outside = [r for r in range(size) if r not in inside]
        w = links[np.ix_(inside, outside)]
        if w.size <= 25:
            assert slowest == brute_force(w)[1]
        else:
            assert slowest == bottleneck(w, bottleneck_matching_reference(w))
        inside += [c for _, c in level]


def test_missing_links_take_more_levels():
    # a chain 0 - 1 - 2 - 3: each level can add one rank only
    chain = np.zeros((4, 4))
    for i in range(3):
        chain[i, i + 1] = chain[i + 1, i] = 5.0
    tree = build_tree(chain, root=0, method="bam")
    assert tree.levels == [[(0, 1)], [(1, 2)], [(2, 3)]]
    assert tree.bottlenecks == [5.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="binomial tree needs the link 0-2"):
        build_tree(chain, method="binomial")


def test_unreachable_rank_is_named():
    m = np.ones((5, 5))
    m[3, :] = m[:, 3] = 0
    with pytest.raises(ValueError, match=r"rank\(s\) \[3\] cannot be reached from rank 0"):
        build_tree(m, method="bam")


def test_one_direction_missing_is_no_link():
    m = np.ones((3, 3))
    m[0, 2] = 0  # 0 -> 2 missing, 2 -> 0 present: the tree edge would be one-way
    tree = build_tree(m, method="bam")
    assert (0, 2) not in [pair for level in tree.levels for pair in level]


def test_best_root():
    m = two_level(2, 4, intra=100, inter=1)
    m.bandwidth[0, 1:] = m.bandwidth[1:, 0] = 0.5  # rank 0 is badly connected
    best = build_tree(m, root="best")
    assert best.root != 0
    assert tree_cost(best) <= min(tree_cost(build_tree(m, root=r)) for r in range(8))


def test_bad_matrices_are_named():
    with pytest.raises(ValueError, match=r"bandwidth_GBps must be a square matrix with a row per rank, got shape \(2, 3\)"):
        BandwidthMatrix(np.ones((2, 3)))
    nan = np.ones((3, 3))
    nan[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"bandwidth_GBps\[1\]\[2\] is nan, not a finite number"):
        BandwidthMatrix(nan)
    with pytest.raises(ValueError, match=r"bandwidth_GBps\[0\]\[1\] is -1, negative"):
        BandwidthMatrix([[0, -1], [1, 0]])
    with pytest.raises(ValueError, match=r"bandwidth_GBps\[0\]\[0\] is a string 'a', not a number"):
        BandwidthMatrix([["a", "b"], ["c", "d"]])
    assert BandwidthMatrix([[np.inf, 1], [1, np.nan]]).bandwidth[0, 0] == 0  # the diagonal is ignored


def test_matrix_file_round_trip_and_errors(tmp_path):
    m = two_level(2, 3, intra=50, inter=5)
    path = tmp_path / "topo.json"
    m.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["topo.json"]  # no temporary file left behind
    back = BandwidthMatrix.load(path, ranks=6)
    assert np.array_equal(back.bandwidth, m.bandwidth) and back.hosts == m.hosts
    with pytest.raises(ValueError, match="has 6 ranks, the communicator has 4"):
        BandwidthMatrix.load(path, ranks=4)
    with pytest.raises(ValueError, match="cannot read bandwidth matrix .*missing.json"):
        BandwidthMatrix.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        BandwidthMatrix.load(tmp_path / "bad.json")
    data = json.loads(path.read_text())
    data["bandwidth_GBps"][0][1] = "NaN"
    (tmp_path / "nan.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"nan.json: bandwidth_GBps\[0\]\[1\] is a string 'NaN', not a number"):
        BandwidthMatrix.load(tmp_path / "nan.json")
    data = json.loads(path.read_text())
    data["ranks"] = 7
    (tmp_path / "ranks.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'ranks' says 7 but the matrix is 6x6"):
        BandwidthMatrix.load(tmp_path / "ranks.json")
    os.chmod(path, 0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(ValueError, match="cannot read"):
            BandwidthMatrix.load(path)


def test_networkx_export():
    g = two_level(2, 2, intra=40, inter=4).to_networkx()
    assert g.number_of_nodes() == 4 and g.number_of_edges() == 12
    assert g[0][1]["bandwidth"] == 40 and g[0][2]["bandwidth"] == 4
    assert g.nodes[3]["host"] == "node1"


def test_generators():
    assert np.allclose(uniform(3, 7).links(), 7 * (1 - np.eye(3)))
    r = random_heterogeneous(6, low=2, high=3, seed=5)
    assert np.array_equal(r.bandwidth, r.bandwidth.T) and (r.links()[~np.eye(6, dtype=bool)] >= 2).all()
    assert np.array_equal(r.bandwidth, random_heterogeneous(6, low=2, high=3, seed=5).bandwidth)
    assert not np.array_equal(r.bandwidth, random_heterogeneous(6, low=2, high=3, seed=6).bandwidth)


@pytest.mark.parametrize("size", list(range(1, 18)))
def test_tournament_covers_every_pair_once_in_disjoint_rounds(size):
    rounds = tournament(size)
    assert len(rounds) == (size - 1 if size % 2 == 0 else size) if size > 1 else rounds == []
    seen = [pair for r in rounds for pair in r]
    assert sorted(seen) == [(a, b) for a in range(size) for b in range(a + 1, size)]
    for r in rounds:
        ranks = [x for pair in r for x in pair]
        assert len(ranks) == len(set(ranks))


def test_version_2_nodes_ports_and_racks_round_trip(tmp_path):
    """The node fields survive a file; a version-1 file (no nodes) is a node per rank."""
    b = np.full((4, 4), 3.0)
    m = BandwidthMatrix(b, nodes=[0, 0, 1, 1], ports={"egress": [1.0, 2.0], "ingress": [3.0, 4.0]},
                        racks=[0, 1], uplinks={"up": [0.5, 0.6], "down": [0.7, 0.8]})
    path = tmp_path / "m.json"
    m.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["nodes"] == [0, 0, 1, 1]
    back = BandwidthMatrix.load(path)
    assert back.nodes == [0, 0, 1, 1] and back.node_count == 2 and back.leaders() == [0, 2]
    assert back.ports["ingress"].tolist() == [3.0, 4.0] and back.racks == [0, 1]
    assert back.uplinks["down"].tolist() == [0.7, 0.8]
    assert back.intra_node().tolist() == [[True, True, False, False], [True, True, False, False],
                                          [False, False, True, True], [False, False, True, True]]
    assert back.node_matrix().size == 2 and back.node_matrix().ports["egress"].tolist() == [1.0, 2.0]
    old = {"format": "allreduce-bench/bandwidth-matrix", "version": 1, "ranks": 3,
           "bandwidth_GBps": [[0, 1, 2], [1, 0, 5], [2, 5, 0]]}
    v1 = BandwidthMatrix.from_json(old)
    assert v1.nodes == [0, 1, 2] and v1.ports is None
    # without ports, a node's port is its fastest link out of and into it
    assert v1.port_capacity()["egress"].tolist() == [2.0, 5.0, 5.0]


@pytest.mark.parametrize("fields,message", [
    ({"nodes": [0, 0, 1]}, "'nodes' has 3 entries for 4 ranks"),
    ({"nodes": [0, 0, 2, 2]}, "never uses 1"),
    ({"nodes": [0, 0, 1, "1"]}, r"'nodes'\[3\] is a string"),
    ({"nodes": [0, 0, 1, 1], "ports": {"egress": [1.0], "ingress": [1.0, 1.0]}}, "has 1 entries for 2 nodes"),
    ({"nodes": [0, 0, 1, 1], "ports": {"egress": [1.0, 0.0], "ingress": [1.0, 1.0]}}, r"\[1\] is 0, not a bandwidth"),
    ({"ports": {"out": [1.0] * 4}}, "must be an object with the lists 'egress' and 'ingress'"),
    ({"uplinks": {"up": [1.0], "down": [1.0]}}, "uplinks_GBps needs racks"),
])
def test_version_2_fields_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        BandwidthMatrix(np.ones((4, 4)), **fields)
