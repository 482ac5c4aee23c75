/* The peer baselines for the BSP round bench, on d floats across all ranks:
 *   allreduce:    MPI_Allreduce(MPI_SUM), the target;
 *   reduce_bcast: MPI_Reduce(MPI_SUM) to rank 0, then MPI_Bcast of the result from rank 0:
 *                 the same gather/broadcast pattern a parameter server has (everything goes
 *                 through one rank), so the fairer peer for a star.
 * Each iteration times both, back to back, so both see the same machine noise; each time is
 * the slowest rank's. After a warm-up, rank 0 prints one line per operation:
 *   mpi op=<allreduce|reduce_bcast> ranks=<n> d=<d> iters=<k> median_ms=<t> check=<x>
 * Build: mpicc -O2 -o allreduce allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -np 2 ./allreduce 1000000 20 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The slowest rank's time, on rank 0. */
static double slowest(double t) {
    double tmax = t;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return tmax;
}

static void reduce_bcast(const float *send, float *recv, long d) {
    MPI_Reduce(send, recv, (int)d, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Bcast(recv, (int)d, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

static void report(int rank, const char *op, int size, long d, double *times, int iters, float check) {
    if (rank != 0) return;
    qsort(times, iters, sizeof(double), cmp);
    printf("mpi op=%s ranks=%d d=%ld iters=%d median_ms=%.3f check=%g\n", op, size, d, iters, times[iters / 2] * 1e3,
           (double)check);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long d = argc > 1 ? atol(argv[1]) : 1000000;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    if (d < 1 || iters < 1) {
        if (rank == 0) fprintf(stderr, "usage: allreduce D ITERS (both at least 1)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *send = malloc(sizeof(float) * d), *recv = malloc(sizeof(float) * d), *recv2 = malloc(sizeof(float) * d);
    double *t_all = malloc(sizeof(double) * iters), *t_rb = malloc(sizeof(double) * iters);
    if (!send || !recv || !recv2 || !t_all || !t_rb) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < d; i++) send[i] = 1e-3f;
    for (int i = 0; i < 2; i++) {
        MPI_Allreduce(send, recv, (int)d, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        reduce_bcast(send, recv2, d);
    }
    for (int i = 0; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(send, recv, (int)d, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t_all[i] = slowest(MPI_Wtime() - t0);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        reduce_bcast(send, recv2, d);
        t_rb[i] = slowest(MPI_Wtime() - t0);
    }
    report(rank, "allreduce", size, d, t_all, iters, recv[0]);
    report(rank, "reduce_bcast", size, d, t_rb, iters, recv2[0]);
    free(send);
    free(recv);
    free(recv2);
    free(t_all);
    free(t_rb);
    MPI_Finalize();
    return 0;
}
