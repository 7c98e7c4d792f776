"""Tree all-reduce: reduce up a tree to its root, then broadcast back down.

The tree is data (:class:`topology.Tree`): the binomial tree for ``"tree"``,
the bottleneck-matched tree for ``"bamtree"``, the Kuhn-Munkres tree for
``"kmtree"``, or any tree the caller passes. Each rank
receives from its children (latest level first) and reduces, sends to its
parent, receives the result from it and forwards it to its children (earliest
level first). Binomial: T ~ 2 ceil(log2 N)(alpha + M/beta); a matched tree:
sum over levels of 2(alpha + M/beta_level).
"""



def allreduce(coll, sendbuf, recvbuf, tree):
    parent = tree.parent[coll.rank]
    children = tree.children(coll.rank)
    coll.start_in(sendbuf, recvbuf)
    if children:
        incoming = coll.scratch(recvbuf.dtype, recvbuf.size, "tree-in")
    for child in reversed(children):
        coll.recv(incoming, child)
        coll.combine(recvbuf, incoming)
    if parent >= 0:
        coll.send(recvbuf, parent)
        coll.recv(recvbuf, parent)
    for child in children:
        coll.send(recvbuf, child)


def built_by(method):
    """The tree all-reduce, registered with the ``topology.build_tree`` method that builds its
    tree: ``"binomial"``, ``"bam"`` (bottleneck-matched) or ``"km"`` (Kuhn-Munkres)."""
    def run(coll, sendbuf, recvbuf, tree):
        allreduce(coll, sendbuf, recvbuf, tree)

    run.tree_method = method
    return run
