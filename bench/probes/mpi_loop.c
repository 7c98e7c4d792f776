/* The mpi baseline's timed loop (bench/baselines/mpi_loop.py loads it with ctypes): the MPI
 * library's own collective called back to back from C, timed with MPI_Wtime, so that a row
 * holds the library's time and not Python's cost of a call.
 *
 * The communicator, datatype and op come as Fortran handles (mpi4py's py2f()), which every
 * MPI converts back (MPI_Comm_f2c ...): the same code runs with MPICH and Open MPI. Built by
 * the MPI's own mpicc as a shared library: mpicc -O2 -shared -fPIC -o LIB mpi_loop.c
 */

#include <limits.h>
#include <stddef.h>

#include <mpi.h>

enum { ALLREDUCE = 0, REDUCE_SCATTER = 1, ALLGATHER = 2 };

/* One call of collective `kind`; `count` is MPI's count argument (the whole vector for the
 * all-reduce, one rank's chunk for the other two). */
static int one_call(int kind, const void *send, void *recv, long long count, MPI_Datatype type, MPI_Op op,
                    MPI_Comm comm)
{
    int in_place = send == MPI_IN_PLACE;
#if MPI_VERSION >= 4
    if (count > INT_MAX) { /* MPI 4's large-count calls, only where an int cannot hold the count */
        MPI_Count n = (MPI_Count)count;
        switch (kind) {
        case ALLREDUCE: return MPI_Allreduce_c(send, recv, n, type, op, comm);
        case REDUCE_SCATTER: return MPI_Reduce_scatter_block_c(send, recv, n, type, op, comm);
        default: return MPI_Allgather_c(send, in_place ? 0 : n, in_place ? MPI_DATATYPE_NULL : type, recv, n, type,
                                        comm);
        }
    }
#endif
    if (count > INT_MAX || count < 0)
        return MPI_ERR_COUNT;
    int n = (int)count;
    switch (kind) {
    case ALLREDUCE: return MPI_Allreduce(send, recv, n, type, op, comm);
    case REDUCE_SCATTER: return MPI_Reduce_scatter_block(send, recv, n, type, op, comm);
    default: return MPI_Allgather(send, in_place ? 0 : n, in_place ? MPI_DATATYPE_NULL : type, recv, n, type, comm);
    }
}

/* `iters` iterations of `agg` calls each, as bench/core/timing.py's time_calls times them:
 * with `blocking` a barrier after every iteration, inside the time; each iteration's time per
 * call into `per_iteration` (iters doubles) unless it is NULL. seconds[0] receives the whole
 * time, seconds[1] the time to issue the calls (without the barriers). Returns MPI_SUCCESS or
 * the first call's error code. */
int mpi_loop(int kind, MPI_Fint comm_handle, MPI_Fint type_handle, MPI_Fint op_handle, const void *send, void *recv,
             long long count, int in_place, int iters, int agg, int blocking, double *per_iteration, double *seconds)
{
    MPI_Comm comm = MPI_Comm_f2c(comm_handle);
    MPI_Datatype type = MPI_Type_f2c(type_handle);
    MPI_Op op = MPI_Op_f2c(op_handle);
    const void *source = in_place ? MPI_IN_PLACE : send;
    double total = 0.0, host = 0.0;
    int err = MPI_SUCCESS;
    if (!blocking && per_iteration == NULL) {
        long long calls = (long long)iters * agg;
        double start = MPI_Wtime();
        for (long long i = 0; i < calls && err == MPI_SUCCESS; i++)
            err = one_call(kind, source, recv, count, type, op, comm);
        total = host = MPI_Wtime() - start;
    } else {
        for (int i = 0; i < iters && err == MPI_SUCCESS; i++) {
            double start = MPI_Wtime();
            for (int j = 0; j < agg && err == MPI_SUCCESS; j++)
                err = one_call(kind, source, recv, count, type, op, comm);
            double issued = MPI_Wtime();
            if (blocking && err == MPI_SUCCESS)
                err = MPI_Barrier(comm);
            double elapsed = MPI_Wtime() - start;
            host += issued - start;
            total += elapsed;
            if (per_iteration != NULL)
                per_iteration[i] = elapsed / agg;
        }
    }
    seconds[0] = total;
    seconds[1] = host;
    return err;
}
