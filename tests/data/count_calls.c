/* Counts the collectives a process makes, through MPI's profiling interface (PMPI): for each
 * collective and element count, how many calls, written to stderr at MPI_Finalize as
 * "calls RANK NAME COUNT CALLS". Preloaded (LD_PRELOAD) into a run by tests/test_mpi_loop.py,
 * it sees the calls of mpi4py and of the compiled loop alike. An all-gather is counted by its
 * receive count per rank (in place, its send count is 0). */
#include <mpi.h>
#include <stdio.h>

#define SLOTS 64
static const char *names[SLOTS];
static MPI_Count counts[SLOTS];
static long calls[SLOTS];

static void note(const char *name, MPI_Count n) {
    for (int i = 0; i < SLOTS; i++) {
        if (calls[i] && names[i] == name && counts[i] == n) { calls[i]++; return; }
        if (!calls[i]) { names[i] = name; counts[i] = n; calls[i] = 1; return; }
    }
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    note("allreduce", n);
    return PMPI_Allreduce(s, r, n, t, op, c);
}

int MPI_Allreduce_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    note("allreduce", n);
    return PMPI_Allreduce_c(s, r, n, t, op, c);
}

int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    note("reducescatter", n);
    return PMPI_Reduce_scatter_block(s, r, n, t, op, c);
}

int MPI_Reduce_scatter_block_c(const void *s, void *r, MPI_Count n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    note("reducescatter", n);
    return PMPI_Reduce_scatter_block_c(s, r, n, t, op, c);
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int n, MPI_Datatype t, MPI_Comm c) {
    note("allgather", n);
    return PMPI_Allgather(s, sn, st, r, n, t, c);
}

int MPI_Allgather_c(const void *s, MPI_Count sn, MPI_Datatype st, void *r, MPI_Count n, MPI_Datatype t, MPI_Comm c) {
    note("allgather", n);
    return PMPI_Allgather_c(s, sn, st, r, n, t, c);
}

int MPI_Finalize(void) {
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < SLOTS && calls[i]; i++)
        fprintf(stderr, "calls %d %s %lld %ld\n", rank, names[i], (long long)counts[i], calls[i]);
    return PMPI_Finalize();
}
