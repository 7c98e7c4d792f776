"""Tree all-reduce: reduce up a tree to its root, then broadcast back down, pipelined.

The tree is data (:class:`topology.Tree`): the binomial tree for ``"tree"``,
the bottleneck-matched tree for ``"bamtree"``, the Kuhn-Munkres tree for
``"kmtree"``, or any tree the caller passes.

The vector moves in segments (:func:`layout.segment_offsets`). For segment k a
rank reduces what its children send in a fixed order (latest level first),
starts sending it to its parent, then receives segment k-1's result from the parent and starts
forwarding it to its children. So segments flow up and down
the tree at once, and T ~ sum over levels 2 alpha_level + (S + depth - 1)
segment times instead of sum over levels 2(alpha + M/beta_level) unpipelined
(S segments; a matched tree's slowest level sets the segment time).
A leaf sends straight from the send buffer, so nothing is copied first. A child's
segment that comes through shared memory is reduced as it arrives, straight from the
shared slot or from the child's registered vector (:meth:`Collective.recv_combine`);
one that comes through MPI (from another node, or a large plain one) is received into
scratch, posted while segment k-1 is being reduced.
"""

from .layout import segment_offsets

WINDOW = 3  # results a rank may await from its parent at once


def allreduce(coll, sendbuf, recvbuf, tree):
    parent = tree.parent[coll.rank]
    children = tree.children(coll.rank)
    if parent < 0 and not children:  # a one-rank tree
        coll.start_in(sendbuf, recvbuf)
        return
    cuts = segment_offsets(recvbuf.size, recvbuf.itemsize)
    segments = len(cuts) - 1
    order = children[::-1]  # latest level first: the order of the reduction
    # a child's segment that comes through shared memory is reduced as it arrives (no prefetch
    # into scratch); one through MPI is received into scratch while the one before is reduced
    largest = cuts[1] * recvbuf.itemsize
    direct = children and all(coll.reduces_on_arrival(child, largest) for child in children)
    if children and not direct:  # two sets of one-segment buffers, one per child: k+1 arrives while k is reduced
        slots = [[coll.scratch(recvbuf.dtype, cuts[1], f"tree-in-{b}-{i}") for i in range(len(order))]
                 for b in (0, 1)]
        arriving = _receive(coll, order, slots[0], cuts[1] - cuts[0])
    going_up = going_down = None
    coming_down = []  # (segment, request): results from the parent not yet forwarded
    for k in range(segments):
        lo, hi = cuts[k], cuts[k + 1]
        partial = recvbuf[lo:hi]
        if children:
            arrived = None
            if not direct:
                for request in arriving:
                    request.Wait()
                if k + 1 < segments:
                    arriving = _receive(coll, order, slots[(k + 1) % 2], cuts[k + 2] - hi)
                arrived = slots[k % 2]
            own = sendbuf[lo:hi]
            for i, child in enumerate(order):
                if direct:
                    coll.recv_combine(own, child, partial)
                else:
                    coll.combine(own, arrived[i][: hi - lo], out=partial)
                own = partial
        else:
            partial = sendbuf[lo:hi]
        if parent < 0:
            going_down = _forward(coll, partial, children, going_down)
            continue
        sent = coll.isend(partial, parent)
        if going_up is not None:  # segment k goes up before k-1 is awaited from above
            going_up.Wait()  # its buffer may now receive the result
            coming_down.append((k - 1, coll.irecv(recvbuf[cuts[k - 1]:lo], parent)))
        going_up = sent
        # forward what has come down; wait only when WINDOW results are in flight, so that
        # sending segment k up never waits for the round trip of segment k-1
        while coming_down and (len(coming_down) > WINDOW or coming_down[0][1].Test()):
            going_down = _forward_arrived(coll, recvbuf, cuts, children, coming_down.pop(0), going_down)
    if parent >= 0:
        going_up.Wait()
        coming_down.append((segments - 1, coll.irecv(recvbuf[cuts[-2]:cuts[-1]], parent)))
        for pending in coming_down:
            going_down = _forward_arrived(coll, recvbuf, cuts, children, pending, going_down)
    for request in going_down or ():
        request.Wait()


def _receive(coll, order, buffers, count):
    """Start receiving one segment of ``count`` elements from each child, all at once."""
    return [coll.irecv(buf[:count], child) for child, buf in zip(order, buffers)]


def _forward_arrived(coll, recvbuf, cuts, children, pending, going_down):
    """Wait for a segment's result from the parent, then start forwarding it to the children."""
    k, request = pending
    request.Wait()
    return _forward(coll, recvbuf[cuts[k]:cuts[k + 1]], children, going_down)


def _forward(coll, result, children, going_down):
    """Start sending ``result`` to every child, after the previous segment reached them."""
    for request in going_down or ():
        request.Wait()
    return [coll.isend(result, child) for child in children] if children else None


def built_by(method):
    """The tree all-reduce, registered with the ``topology.build_tree`` method that builds its
    tree: ``"binomial"``, ``"bam"`` (bottleneck-matched) or ``"km"`` (Kuhn-Munkres)."""
    def run(coll, sendbuf, recvbuf, tree):
        allreduce(coll, sendbuf, recvbuf, tree)

    run.tree_method = method
    return run
