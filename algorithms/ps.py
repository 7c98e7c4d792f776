"""Parameter server (seed 000 section 2): every rank sends its vector to the root,
the root reduces the N-1 vectors it receives and sends the result back to each.

The root moves 2(N-1)M bytes, so T ~ 2(N-1)(alpha + M/beta).
"""

ROOT = 0


def allreduce(coll, sendbuf, recvbuf):
    if coll.rank != ROOT:
        coll.send(sendbuf, ROOT)
        coll.recv(recvbuf, ROOT)
        return
    coll.start_in(sendbuf, recvbuf)
    incoming = coll.scratch(recvbuf.dtype, recvbuf.size, "ps-in")
    workers = [rank for rank in range(coll.size) if rank != ROOT]
    for source in workers:
        coll.recv(incoming, source)
        coll.combine(recvbuf, incoming)
    for dest in workers:
        coll.send(recvbuf, dest)
