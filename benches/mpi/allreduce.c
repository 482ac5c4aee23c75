/* The peer baselines for the BSP round bench, on d floats across all ranks:
 *   allreduce:    MPI_Allreduce(MPI_SUM), the target;
 *   reduce_bcast: MPI_Reduce(MPI_SUM) to rank 0, then MPI_Bcast of the result from rank 0:
 *                 the same gather/broadcast pattern a parameter server has (everything goes
 *                 through one rank), so the fairer peer for a star.
 * Each iteration times both, back to back, so both see the same machine noise; each time is
 * the slowest rank's. After a warm-up, rank 0 prints one line per operation:
 *   mpi op=<allreduce|reduce_bcast> ranks=<n> d=<d> iters=<k> median_ms=<t> check=<x>
 * With a third argument `star` it times instead, on n+1 ranks, the bare point-to-point star
 * a parameter server moves: ranks 1..n each MPI_Isend d floats to rank 0, which sums each
 * as it lands (MPI_Waitany) and MPI_Isends the sum back to every rank; no protocol, no
 * codec. `star` sends each gradient whole (op=star), then the same in segments of
 * STAR_SEGMENT floats summed as each lands (op=star_seg): the lower bound of any
 * star-shaped parameter server over MPI point-to-point on this machine.
 * Build: mpicc -O2 -o allreduce allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -np 2 ./allreduce 1000000 20
 *        mpirun --allow-run-as-root --oversubscribe -np 3 ./allreduce 1000000 20 star */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Floats per segment of op=star_seg (256 KiB). */
#define STAR_SEGMENT 65536L

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

/* One round of the bare star: gradients in to rank 0 in segments of `seg` floats (d for
 * whole messages), each summed into `acc` as it lands, then the sum out to every rank. */
static void star(int rank, int size, float *send, float *acc, float *in, long d, long seg, MPI_Request *req) {
    long nseg = (d + seg - 1) / seg;
    int workers = size - 1;
    if (rank != 0) {
        for (long s = 0; s < nseg; s++) {
            long len = (s + 1) * seg > d ? d - s * seg : seg;
            MPI_Isend(send + s * seg, (int)len, MPI_FLOAT, 0, (int)s, MPI_COMM_WORLD, &req[s]);
        }
        MPI_Waitall((int)nseg, req, MPI_STATUSES_IGNORE);
        MPI_Recv(acc, (int)d, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return;
    }
    int total = (int)(nseg * workers);
    for (int w = 0; w < workers; w++)
        for (long s = 0; s < nseg; s++) {
            long len = (s + 1) * seg > d ? d - s * seg : seg;
            MPI_Irecv(in + w * d + s * seg, (int)len, MPI_FLOAT, w + 1, (int)s, MPI_COMM_WORLD, &req[w * nseg + s]);
        }
    memset(acc, 0, sizeof(float) * d);
    for (int k = 0; k < total; k++) {
        int i;
        MPI_Waitany(total, req, &i, MPI_STATUS_IGNORE);
        long w = i / nseg, s = i % nseg;
        long len = (s + 1) * seg > d ? d - s * seg : seg;
        float *a = acc + s * seg;
        const float *g = in + w * d + s * seg;
        for (long j = 0; j < len; j++) a[j] += g[j];
    }
    for (int w = 0; w < workers; w++) MPI_Isend(acc, (int)d, MPI_FLOAT, w + 1, 0, MPI_COMM_WORLD, &req[w]);
    MPI_Waitall(workers, req, MPI_STATUSES_IGNORE);
}

static int run_star(int rank, int size, long d, int iters) {
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "star needs at least 2 ranks\n");
        return 2;
    }
    long nseg = (d + STAR_SEGMENT - 1) / STAR_SEGMENT;
    long nin = rank == 0 ? d * (size - 1) : 1;
    long nreq = nseg * (size - 1) > size ? nseg * (size - 1) : size;
    float *send = malloc(sizeof(float) * d), *acc = malloc(sizeof(float) * d), *in = malloc(sizeof(float) * nin);
    MPI_Request *req = malloc(sizeof(MPI_Request) * nreq);
    double *t_whole = malloc(sizeof(double) * iters), *t_seg = malloc(sizeof(double) * iters);
    if (!send || !acc || !in || !req || !t_whole || !t_seg) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < d; i++) send[i] = 1e-3f;
    for (int i = 0; i < 2; i++) {
        star(rank, size, send, acc, in, d, d, req);
        star(rank, size, send, acc, in, d, STAR_SEGMENT, req);
    }
    for (int i = 0; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        star(rank, size, send, acc, in, d, d, req);
        t_whole[i] = slowest(MPI_Wtime() - t0);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        star(rank, size, send, acc, in, d, STAR_SEGMENT, req);
        t_seg[i] = slowest(MPI_Wtime() - t0);
    }
    report(rank, "star", size, d, t_whole, iters, acc[0]);
    report(rank, "star_seg", size, d, t_seg, iters, acc[0]);
    free(send);
    free(acc);
    free(in);
    free(req);
    free(t_whole);
    free(t_seg);
    return 0;
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
    if (argc > 3 && strcmp(argv[3], "star") == 0) {
        int rc = run_star(rank, size, d, iters);
        if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
        MPI_Finalize();
        return 0;
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
