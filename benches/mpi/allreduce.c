/* The peer baseline for the BSP round bench: MPI_Allreduce(MPI_SUM) of d floats across all
 * ranks, timed over a number of iterations after a warm-up. Rank 0 prints one line:
 *   mpi ranks=<n> d=<d> iters=<k> median_ms=<t>
 * Build: mpicc -O2 -o allreduce allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -np 2 ./allreduce 1000000 20 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long d = argc > 1 ? atol(argv[1]) : 1000000;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    float *send = malloc(sizeof(float) * d), *recv = malloc(sizeof(float) * d);
    double *times = malloc(sizeof(double) * iters);
    for (long i = 0; i < d; i++) send[i] = 1e-3f;
    for (int i = 0; i < 2; i++) MPI_Allreduce(send, recv, (int)d, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(send, recv, (int)d, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        times[i] = tmax;
    }
    if (rank == 0) {
        qsort(times, iters, sizeof(double), cmp);
        printf("mpi ranks=%d d=%ld iters=%d median_ms=%.3f check=%g\n", size, d, iters, times[iters / 2] * 1e3,
               (double)recv[0]);
    }
    free(send);
    free(recv);
    free(times);
    MPI_Finalize();
    return 0;
}
