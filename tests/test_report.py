"""``python -m topology report``: the findings on synthetic matrices, the heatmap, the CLI."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from topology import BandwidthMatrix, two_level
from topology.report import ASYMMETRY, THRESHOLD, findings, heatmap, lines, summary

EXAMPLE = ROOT / "tests" / "data" / "topology" / "slow-nic-4x2.json"


def cluster(nodes=4, ranks=2, noise=0.1, seed=0, intra=100.0, inter=10.0, port=12.0):
    """A healthy ``nodes`` x ``ranks`` matrix with ports, every figure within ``noise`` of its
    kind's (each pair of nodes one figure, as the probe stores it)."""
    rng = np.random.default_rng(seed)
    base = two_level(nodes, ranks, intra=intra, inter=inter)
    node = np.asarray(base.nodes)
    between = rng.uniform(1 - noise, 1 + noise, (nodes, nodes))
    within = rng.uniform(1 - noise, 1 + noise, base.bandwidth.shape)
    same = node[:, None] == node[None, :]
    bandwidth = np.where(same, intra * within, inter * between[np.ix_(node, node)])
    ports = {d: port * rng.uniform(1 - noise, 1 + noise, nodes) for d in ("egress", "ingress")}
    return BandwidthMatrix(bandwidth, base.latency, base.hosts, {}, base.nodes, ports)


def node_block(matrix, a, b):
    node = np.asarray(matrix.nodes)
    return np.ix_(np.flatnonzero(node == a), np.flatnonzero(node == b))


def kinds(found):
    return [f["kind"] for f in found]


def test_a_healthy_cluster_has_no_findings():
    for seed in range(5):
        matrix = cluster(seed=seed)
        assert findings(matrix) == []
        text = lines(matrix, [], "healthy.json")
        assert text[0].startswith("healthy.json: 8 ranks on 4 nodes; median inter-node link ")
        assert "median port egress" in text[0]
        assert text[1].startswith("no findings: every link within 0.7x of the median")


def test_a_slow_nic_names_its_node_and_nothing_else():
    matrix = cluster()
    for other in (0, 1, 3):
        matrix.bandwidth[node_block(matrix, 2, other)] *= 0.4
        matrix.bandwidth[node_block(matrix, other, 2)] *= 0.4
    matrix.ports["egress"][2] *= 0.35
    matrix.ports["ingress"][2] *= 0.35
    found = findings(matrix)
    assert sorted(kinds(found)) == ["slow_nic", "slow_nic", "slow_node"]
    assert {f["node"] for f in found} == {2} and all("nodes" not in f for f in found)
    nic = [f for f in found if f["kind"] == "slow_nic"]
    assert sorted(f["direction"] for f in nic) == ["egress", "ingress"]
    assert all(f["ratio"] == pytest.approx(0.35, rel=0.25) and f["ranks"] == [4, 5] for f in nic)
    node = next(f for f in found if f["kind"] == "slow_node")
    assert node["directions"] == ["out", "in"] and node["ratio"] < THRESHOLD
    assert node["value_GBps"] == pytest.approx(4.0, rel=0.15)
    assert found[0]["text"].startswith("slow NIC: node 2 (host node2, ranks 4-5): ")


def test_a_slow_egress_alone_is_the_nodes_and_its_lopsided_links_are_not_listed():
    matrix = cluster()
    for other in (0, 2, 3):
        matrix.bandwidth[node_block(matrix, 1, other)] *= 0.3  # out of node 1 only
    matrix.ports["egress"][1] *= 0.3
    found = findings(matrix)
    assert sorted(kinds(found)) == ["slow_nic", "slow_node"], [f["text"] for f in found]
    assert {f["node"] for f in found} == {1}
    assert next(f for f in found if f["kind"] == "slow_node")["directions"] == ["out"]
    assert next(f for f in found if f["kind"] == "slow_nic")["direction"] == "egress"


def test_a_slow_pair_of_nodes_is_one_slow_link_and_no_node_is_blamed():
    matrix = cluster()
    matrix.bandwidth[node_block(matrix, 1, 3)] = 3.0
    matrix.bandwidth[node_block(matrix, 3, 1)] = 3.2
    found = findings(matrix)
    assert kinds(found) == ["slow_link"], [f["text"] for f in found]
    link = found[0]
    assert link["nodes"] == [1, 3] and link["ranks"] == [2, 6] and link["scope"] == "inter-node"
    assert link["directions"] == ["1->3", "3->1"] and link["value_GBps"] == 3.0
    assert link["ratio"] == pytest.approx(0.3, rel=0.15)
    assert link["text"].startswith("slow link: node 1 <-> node 3 (hosts node1, node3; leaders 2, 6): ")
    assert "(both ways)" in link["text"]


def test_a_link_slow_one_way_is_a_slow_link_not_also_an_asymmetric_one():
    matrix = cluster()
    matrix.bandwidth[node_block(matrix, 0, 2)] = 5.0
    found = findings(matrix)
    assert kinds(found) == ["slow_link"] and found[0]["directions"] == ["0->2"]
    assert "(one way)" in found[0]["text"]


def test_an_asymmetric_link_is_named():
    matrix = cluster(noise=0.02)
    matrix.bandwidth[node_block(matrix, 0, 3)] = 16.5  # the other way stays about 10
    found = findings(matrix)
    assert kinds(found) == ["asymmetric_link"], [f["text"] for f in found]
    assert found[0]["nodes"] == [0, 3] and found[0]["factor"] == pytest.approx(1.65, rel=0.05)
    assert findings(matrix, asymmetry=2.0) == []
    assert ASYMMETRY == 1.5


def test_links_within_nodes_are_compared_among_themselves():
    """Shared memory 10x the network is no finding; a slow pair within a node, or a node whose
    own links are all slow, is, and its pairs are not listed one by one."""
    matrix = cluster(ranks=3)
    assert findings(matrix) == []
    slow_pair = cluster(ranks=3)
    slow_pair.bandwidth[0, 1] = slow_pair.bandwidth[1, 0] = 20.0
    found = findings(slow_pair)
    assert kinds(found) == ["slow_link"] and found[0]["scope"] == "intra-node" and found[0]["ranks"] == [0, 1]
    assert "(within node 0, host node0)" in found[0]["text"]
    slow_node = cluster(ranks=3)
    slow_node.bandwidth[node_block(slow_node, 3, 3)] *= 0.3
    found = findings(slow_node)
    assert kinds(found) == ["slow_node"] and found[0]["scope"] == "intra-node" and found[0]["node"] == 3


def test_links_within_an_oversubscribed_machine_are_not_judged():
    """The probe's ``machines``: where ranks outnumbered their machine's cores, the links within
    its nodes are not judged (and the report says so); other machines' still are, and links
    between nodes always are."""
    noisy = cluster(ranks=3)
    noisy.bandwidth[0, 1] = 20.0  # slow one way within node 0
    noisy.bandwidth[7, 6] = 30.0  # within node 2
    noisy.bandwidth[node_block(noisy, 1, 3)] = 3.0  # a slow pair of nodes
    assert kinds(findings(noisy)) == ["slow_link", "slow_link", "slow_link"]
    shared = BandwidthMatrix(noisy.bandwidth, noisy.latency, noisy.hosts,
                             {"machines": [{"ranks": list(range(12)), "hosts": noisy.hosts, "cores": 2}]},
                             noisy.nodes, noisy.ports)
    found = findings(shared)
    assert [(f["kind"], f["scope"], f["nodes"]) for f in found] == [("slow_link", "inter-node", [1, 3])]
    text = lines(shared, found, "shared.json")
    assert text[-1] == ("not judged: the links within nodes 0, 1, 2, 3: 12 ranks shared 2 cores of one machine "
                        "when probed, so their shared-memory figures measure how the cores were shared, not the links")
    # two machines: the first (nodes 0 and 1) had a core per rank, the second did not
    split = BandwidthMatrix(noisy.bandwidth, noisy.latency, noisy.hosts,
                            {"machines": [{"ranks": list(range(6)), "cores": 8},
                                          {"ranks": list(range(6, 12)), "cores": 4}]},
                            noisy.nodes, noisy.ports)
    found = findings(split)
    assert sorted((f["scope"], f["ranks"][0]) for f in found) == [("inter-node", 3), ("intra-node", 0)]
    assert lines(split, found)[-1].startswith("not judged: the links within nodes 2, 3: 6 ranks shared 4 cores")
    healthy = BandwidthMatrix(cluster().bandwidth, cluster().latency, cluster().hosts,
                              {"machines": [{"ranks": list(range(8)), "cores": 2}]}, cluster().nodes, cluster().ports)
    assert lines(healthy, [])[-1].startswith("no findings: every other link within 0.7x")
    # a file whose machines do not name its ranks is judged in full
    wrong = BandwidthMatrix(noisy.bandwidth, noisy.latency, noisy.hosts,
                            {"machines": [{"ranks": [0, 99], "cores": 1}, {"ranks": "all", "cores": 1}]},
                            noisy.nodes, noisy.ports)
    assert len(findings(wrong)) == 3


def test_two_nodes_blame_a_link_not_a_node():
    matrix = cluster(nodes=2)
    matrix.bandwidth[node_block(matrix, 0, 1)] = 3.0
    found = findings(matrix)
    assert kinds(found) == ["slow_link"]


def test_a_version_1_file_is_a_node_per_rank(tmp_path):
    bandwidth = np.full((5, 5), 10.0)
    bandwidth[3, :] = bandwidth[:, 3] = 4.0  # rank 3's links, both ways
    bandwidth[0, 1] = 16.0
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"format": "allreduce-bench/bandwidth-matrix", "version": 1, "ranks": 5,
                                "hosts": ["h"] * 5, "bandwidth_GBps": bandwidth.tolist()}))
    matrix = BandwidthMatrix.load(path)
    found = findings(matrix)
    assert kinds(found) == ["slow_node", "asymmetric_link"], [f["text"] for f in found]
    assert found[0]["node"] == 3 and found[0]["text"].startswith("slow node: node 3 (host h, rank 3): ")
    assert found[1]["ranks"] == [0, 1]
    assert summary(matrix)["median_port_GBps"] is None
    assert lines(matrix, found, "v1.json")[0] == ("v1.json: 5 ranks on 5 nodes of one rank each; median inter-node "
                                                 "link 10.000 GB/s; no ports in the file")


def test_a_version_2_file_keeps_its_nodes_and_ports(tmp_path):
    matrix = cluster()
    matrix.save(tmp_path / "v2.json")
    data = json.loads((tmp_path / "v2.json").read_text())
    assert data["version"] == 2 and data["nodes"] == [0, 0, 1, 1, 2, 2, 3, 3] and len(data["ports_GBps"]["egress"]) == 4
    again = BandwidthMatrix.load(tmp_path / "v2.json")
    assert again.nodes == matrix.nodes and np.allclose(again.ports["ingress"], matrix.ports["ingress"])
    assert findings(again) == findings(matrix) == []


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        findings(cluster(), threshold=1.5)
    with pytest.raises(ValueError, match="asymmetry"):
        findings(cluster(), asymmetry=1.0)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_heatmap_writes_a_png(tmp_path):
    for matrix, name in ((cluster(), "nodes.png"), (two_level(1, 3), "one.png"),
                         (BandwidthMatrix(np.full((40, 40), 3.0)), "v1.png")):
        path = heatmap(matrix, tmp_path / name, name)
        width, height = png_size(path)
        assert 400 < width < 4000 and 400 < height < 2000, (name, width, height)
    assert not list(tmp_path.glob(".tmp-*"))


def report(*args):
    return subprocess.run([sys.executable, "-m", "topology", "report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_cli_prints_the_findings_and_writes_the_heatmap(tmp_path):
    data = tmp_path / "slow-nic.json"
    data.write_text(EXAMPLE.read_text())
    proc = report(data)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith(f"{data}: 8 ranks on 4 nodes; median inter-node link ")
    assert [line.split(":")[0] for line in out[1:]] == ["slow NIC", "slow NIC", "slow node"]
    assert all("node 2 (host " in line for line in out[1:])
    assert png_size(tmp_path / "slow-nic.png")[0] > 400 and proc.stderr == f"wrote {tmp_path / 'slow-nic.png'}\n"

    proc = report(data, "--json", "--heatmap", tmp_path / "sub" / "map.png")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["nodes"] == 4 and document["threshold"] == 0.7 and document["heatmap"].endswith("map.png")
    assert [(f["kind"], f["node"]) for f in document["findings"]] == [("slow_nic", 2)] * 2 + [("slow_node", 2)]
    assert (tmp_path / "sub" / "map.png").exists()

    healthy = tmp_path / "healthy"
    cluster().save(healthy)  # no .json: the heatmap is healthy.png
    proc = report(healthy, "--threshold", "0.5")
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].startswith("no findings: every link within 0.5x")
    assert (tmp_path / "healthy.png").exists()
    proc = report(healthy, "--no-heatmap", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["findings"] == [] and proc.stderr == ""


def test_the_cli_exits_2_with_one_line_on_a_bad_file_or_option(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"bandwidth_GBps": [[0, "5"], [5, 0]]}')
    for args, message in (((bad,), "bandwidth_GBps[0][1] is a string '5', not a number"),
                          ((tmp_path / "none.json",), "cannot read bandwidth matrix"),
                          ((EXAMPLE, "--threshold", "2"), "--threshold must be in (0, 1]"),
                          ((EXAMPLE, "--asymmetry", "1"), "--asymmetry must be above 1")):
        proc = report(*args)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.png"))
    proc = report(EXAMPLE, "--heatmap", bad / "x.png")  # a file as its folder
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "--heatmap" in proc.stderr
