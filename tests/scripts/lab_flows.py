"""Concurrent TCP flows between the nodes of a network lab that is up, iperf-like.

    python tests/scripts/lab_flows.py --tag TAG [--seconds 2] SRC:DST [SRC:DST ...]

prints {"flows_mbit": [...], "total_mbit": ...}: each flow's goodput (Mbit/s, what the
receiver got) over the same window, all flows at once. Root only (it runs in the lab's
namespaces). Importable: :func:`measure`. The ``recv`` and ``send`` sub-commands are its
two ends, started inside the namespaces.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
WARMUP = 0.4  # s left out at the start of the window (slow start, BBR's probing)
PORT = 5301


def recv(port, seconds):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    print("ready", flush=True)
    server.settimeout(seconds + 20)
    conn, _ = server.accept()
    conn.settimeout(seconds + 20)
    buf = bytearray(1 << 20)
    total, samples, last = 0, [], 0.0
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        now = time.monotonic()
        if now - last >= 0.01:
            samples.append((now, total))
            last = now
    samples.append((time.monotonic(), total))
    print(json.dumps(samples), flush=True)


def send(address, port, start_at, seconds):
    for _ in range(100):
        try:
            sock = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"cannot connect to {address}:{port}")
    chunk = b"\0" * (256 << 10)
    time.sleep(max(0.0, start_at - time.monotonic()))
    end = start_at + seconds
    while time.monotonic() < end:
        sock.sendall(chunk)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    sock.close()


def _bytes_at(samples, t):
    """Bytes received by time t (linear between samples)."""
    prev_t, prev_b = samples[0][0], 0
    for now, total in samples:
        if now >= t:
            if now == prev_t:
                return total
            return prev_b + (total - prev_b) * (t - prev_t) / (now - prev_t)
        prev_t, prev_b = now, total
    return samples[-1][1]


def measure(lab, flows, seconds=2.0):
    """Goodput in Mbit/s of each (src node, dst node) flow of ``flows``, all at once for ``seconds``."""
    receivers = []
    try:
        for n, (src, dst) in enumerate(flows):
            proc = subprocess.Popen(["ip", "netns", "exec", lab.netns(dst), sys.executable, HERE, "recv",
                                     str(PORT + n), str(seconds)], stdout=subprocess.PIPE, text=True)
            receivers.append(proc)
        for proc in receivers:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a receiver did not start")
        start_at = time.monotonic() + 0.5
        senders = [subprocess.Popen(["ip", "netns", "exec", lab.netns(src), sys.executable, HERE, "send",
                                     lab.addresses[dst], str(PORT + n), repr(start_at), str(seconds)])
                   for n, (src, dst) in enumerate(flows)]
        for proc in senders:
            if proc.wait(timeout=seconds + 30) != 0:
                raise RuntimeError(f"a sender failed (exit {proc.returncode})")
        samples = [json.loads(proc.communicate(timeout=30)[0]) for proc in receivers]
    finally:
        for proc in receivers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    begin, end = start_at + WARMUP, start_at + seconds - 0.05
    return [(_bytes_at(s, end) - _bytes_at(s, begin)) * 8 / (end - begin) / 1e6 for s in samples]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["recv"]:
        return recv(int(argv[1]), float(argv[2]))
    if argv[:1] == ["send"]:
        return send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    from bench.lab import network

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", default=network.DEFAULT_TAG, help=f"the lab's tag (default {network.DEFAULT_TAG})")
    p.add_argument("--seconds", type=float, default=2.0, help="how long the flows run (default 2)")
    p.add_argument("flows", nargs="+", help="SRC:DST node pairs, all at once")
    args = p.parse_args(argv)
    flows = [tuple(int(x) for x in f.split(":")) for f in args.flows]
    rates = measure(network.load(args.tag), flows, args.seconds)
    print(json.dumps({"flows_mbit": [round(r, 1) for r in rates], "total_mbit": round(sum(rates), 1)}))


if __name__ == "__main__":
    main()
