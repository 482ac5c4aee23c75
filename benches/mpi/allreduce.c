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

/* One timed operation: the function that runs it and its arguments. */
struct op {
    const char *name;
    void (*run)(const struct op *);
    int rank, size;
    float *send, *recv, *in;
    long d, seg;
    MPI_Request *req;
};

static void report(const struct op *o, double *times, int iters) {
    if (o->rank != 0) return;
    qsort(times, iters, sizeof(double), cmp);
    printf("mpi op=%s ranks=%d d=%ld iters=%d median_ms=%.3f check=%g\n", o->name, o->size, o->d, iters,
           times[iters / 2] * 1e3, (double)o->recv[0]);
}

/* Times `a` and `b` back to back `iters` times after two warm-ups of each (each time after a
 * barrier, the slowest rank's), then rank 0 prints both medians. */
static void compare(const struct op *a, const struct op *b, int iters) {
    double *ta = malloc(sizeof(double) * iters), *tb = malloc(sizeof(double) * iters);
    if (!ta || !tb) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < 2; i++) {
        a->run(a);
        b->run(b);
    }
    for (int i = 0; i < iters; i++) {
        const struct op *ops[2] = {a, b};
        double *ts[2] = {ta, tb};
        for (int k = 0; k < 2; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            ops[k]->run(ops[k]);
            ts[k][i] = slowest(MPI_Wtime() - t0);
        }
    }
    report(a, ta, iters);
    report(b, tb, iters);
    free(ta);
    free(tb);
}

static void allreduce(const struct op *o) {
    MPI_Allreduce(o->send, o->recv, (int)o->d, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static void reduce_bcast(const struct op *o) {
    MPI_Reduce(o->send, o->recv, (int)o->d, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Bcast(o->recv, (int)o->d, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

/* One round of the bare star: gradients in to rank 0 in segments of `seg` floats (d for
 * whole messages), each summed into `recv` as it lands, then the sum out to every rank. */
static void star(const struct op *o) {
    long d = o->d, seg = o->seg, nseg = (d + seg - 1) / seg;
    int workers = o->size - 1;
    MPI_Request *req = o->req;
    float *acc = o->recv;
    if (o->rank != 0) {
        for (long s = 0; s < nseg; s++) {
            long len = (s + 1) * seg > d ? d - s * seg : seg;
            MPI_Isend(o->send + s * seg, (int)len, MPI_FLOAT, 0, (int)s, MPI_COMM_WORLD, &req[s]);
        }
        MPI_Waitall((int)nseg, req, MPI_STATUSES_IGNORE);
        MPI_Recv(acc, (int)d, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return;
    }
    int total = (int)(nseg * workers);
    for (int w = 0; w < workers; w++)
        for (long s = 0; s < nseg; s++) {
            long len = (s + 1) * seg > d ? d - s * seg : seg;
            MPI_Irecv(o->in + w * d + s * seg, (int)len, MPI_FLOAT, w + 1, (int)s, MPI_COMM_WORLD, &req[w * nseg + s]);
        }
    memset(acc, 0, sizeof(float) * d);
    for (int k = 0; k < total; k++) {
        int i;
        MPI_Waitany(total, req, &i, MPI_STATUS_IGNORE);
        long w = i / nseg, s = i % nseg;
        long len = (s + 1) * seg > d ? d - s * seg : seg;
        float *a = acc + s * seg;
        const float *g = o->in + w * d + s * seg;
        for (long j = 0; j < len; j++) a[j] += g[j];
    }
    for (int w = 0; w < workers; w++) MPI_Isend(acc, (int)d, MPI_FLOAT, w + 1, 0, MPI_COMM_WORLD, &req[w]);
    MPI_Waitall(workers, req, MPI_STATUSES_IGNORE);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long d = argc > 1 ? atol(argv[1]) : 1000000;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    int is_star = argc > 3 && strcmp(argv[3], "star") == 0;
    if (d < 1 || iters < 1 || (is_star && size < 2)) {
        if (rank == 0) fprintf(stderr, "usage: allreduce D ITERS [star] (both at least 1; star on 2+ ranks)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long nseg = (d + STAR_SEGMENT - 1) / STAR_SEGMENT;
    long nin = is_star && rank == 0 ? d * (size - 1) : 1;
    long nreq = nseg * size + size;
    float *send = malloc(sizeof(float) * d), *recv = malloc(sizeof(float) * d), *recv2 = malloc(sizeof(float) * d);
    float *in = malloc(sizeof(float) * nin);
    MPI_Request *req = is_star ? malloc(sizeof(MPI_Request) * nreq) : NULL;
    if (!send || !recv || !recv2 || !in || (is_star && !req)) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < d; i++) send[i] = 1e-3f;
    struct op a = {"allreduce", allreduce, rank, size, send, recv, in, d, d, req};
    struct op b = {"reduce_bcast", reduce_bcast, rank, size, send, recv2, in, d, d, req};
    if (is_star) {
        a = (struct op){"star", star, rank, size, send, recv, in, d, d, req};
        b = (struct op){"star_seg", star, rank, size, send, recv2, in, d, STAR_SEGMENT, req};
    }
    compare(&a, &b, iters);
    free(send);
    free(recv);
    free(recv2);
    free(in);
    free(req);
    MPI_Finalize();
    return 0;
}
