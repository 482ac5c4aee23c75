/*
 * One server and four workers in one process train a least-squares model through the C
 * API of syncopate (BSP by default; any protocol number as the first argument), passing
 * the wire-encoded messages between them by hand as a transport would. Exits 0 when the
 * model is within 1e-3 of the solution, 1 otherwise.
 *
 * Worker i holds rows A_i (ROWS x DIM) and targets b_i = A_i w*; its gradient at w is
 * A_i^T (A_i w - b_i) / ROWS, so the mean gradient vanishes at w*.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncopate.h"

#define WORKERS 4
#define DIM 8
#define ROWS 32
#define MAX_TICKS 20000

static float data_a[WORKERS][ROWS][DIM];
static float data_b[WORKERS][ROWS];
static float w_star[DIM];

/* A fixed-seed generator so every run trains on the same data. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void check(SyncopateStatus status, const char *what) {
    if (status != SYNCOPATE_OK) {
        char message[256];
        syncopate_last_error_message(message, sizeof message);
        fprintf(stderr, "least_squares: %s failed: %s\n", what, message);
        exit(1);
    }
}

static void gradient(int worker, const float *w, float *grad) {
    memset(grad, 0, DIM * sizeof(float));
    for (int r = 0; r < ROWS; r++) {
        float residual = -data_b[worker][r];
        for (int j = 0; j < DIM; j++) residual += data_a[worker][r][j] * w[j];
        for (int j = 0; j < DIM; j++) grad[j] += data_a[worker][r][j] * residual / ROWS;
    }
}

/* Caller-provided memory for the handles: sized by the library's queries. */
static void *block(size_t size, size_t align) {
    size_t rounded = (size + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded);
    if (p == NULL) {
        fprintf(stderr, "least_squares: out of memory\n");
        exit(1);
    }
    return p;
}

/* Delivers every pending server output to its workers. */
static void drain_server(SyncopateServer *server, SyncopateWorker *const *workers, uint64_t now, uint8_t *buf,
                         size_t max_len) {
    SyncopateServerOutput out;
    for (;;) {
        check(syncopate_server_poll_output(server, &out, buf, max_len), "syncopate_server_poll_output");
        if (out.kind == SYNCOPATE_OUTPUT_NONE) break;
        if (out.kind != SYNCOPATE_OUTPUT_SEND) continue;
        for (uint32_t i = 0; i < WORKERS; i++) {
            if (!out.to_all && out.to_worker != i) continue;
            SyncopateStatus s = syncopate_worker_handle(workers[i], now, buf, out.message_len);
            if (s != SYNCOPATE_OK && s != SYNCOPATE_ERR_REJECTED) check(s, "syncopate_worker_handle");
        }
    }
}

int main(int argc, char **argv) {
    uint32_t protocol = argc > 1 ? (uint32_t)atoi(argv[1]) : SYNCOPATE_PROTOCOL_BSP;
    for (int j = 0; j < DIM; j++) w_star[j] = uniform();
    for (int i = 0; i < WORKERS; i++)
        for (int r = 0; r < ROWS; r++) {
            data_b[i][r] = 0.0f;
            for (int j = 0; j < DIM; j++) {
                data_a[i][r][j] = uniform();
                data_b[i][r] += data_a[i][r][j] * w_star[j];
            }
        }

    SyncopateConfig config;
    check(syncopate_config_default(&config, protocol, WORKERS, 0.5), "syncopate_config_default");
    config.staleness = 2; /* SSP, BAP */
    config.backup_workers = 1; /* BACKUP */

    size_t max_len, server_size, worker_size;
    check(syncopate_max_message_len(DIM, &max_len), "syncopate_max_message_len");
    check(syncopate_server_size(&config, DIM, &server_size), "syncopate_server_size");
    check(syncopate_worker_size(&config, DIM, &worker_size), "syncopate_worker_size");

    float model[DIM] = {0};
    SyncopateServer *server;
    void *server_mem = block(server_size, syncopate_server_align());
    check(syncopate_server_init(server_mem, server_size, &config, model, DIM, &server), "syncopate_server_init");

    float worker_params[WORKERS][DIM];
    void *worker_mem[WORKERS];
    SyncopateWorker *workers[WORKERS];
    for (uint32_t i = 0; i < WORKERS; i++) {
        SyncopateWorkerSetup setup = {.id = i, .epoch = 0, .rejoin_after_ns = 0};
        worker_mem[i] = block(worker_size, syncopate_worker_align());
        check(syncopate_worker_init(worker_mem[i], worker_size, &config, &setup, worker_params[i], DIM, &workers[i]),
              "syncopate_worker_init");
    }

    uint8_t *buf = malloc(max_len);
    uint8_t *server_buf = malloc(max_len);
    float grad[DIM];
    uint64_t now = 0;
    int stopped = 0;
    for (int tick = 0; tick < MAX_TICKS && stopped < WORKERS; tick++, now += 1000) {
        /* Workers: send what they have, compute what they are asked for. */
        for (uint32_t i = 0; i < WORKERS; i++) {
            SyncopateWorkerOutput out;
            for (;;) {
                check(syncopate_worker_poll_output(workers[i], &out, buf, max_len), "syncopate_worker_poll_output");
                if (out.kind == SYNCOPATE_OUTPUT_NONE) break;
                if (out.kind == SYNCOPATE_OUTPUT_SEND) {
                    /* The driving contract: drain the server after every input. */
                    SyncopateStatus s = syncopate_server_handle(server, now, i, buf, out.message_len);
                    if (s != SYNCOPATE_OK && s != SYNCOPATE_ERR_REJECTED) check(s, "syncopate_server_handle");
                    drain_server(server, workers, now, server_buf, max_len);
                    break; /* one message per worker and tick: the answer may start its next job */
                } else if (out.kind == SYNCOPATE_OUTPUT_COMPUTE) {
                    gradient((int)i, out.params, grad);
                    /* Refused only when a newer model arrived meanwhile (the job was abandoned). */
                    SyncopateStatus s = syncopate_worker_handle_gradient(workers[i], now, out.compute_id, grad, DIM);
                    if (s != SYNCOPATE_OK && s != SYNCOPATE_ERR_REJECTED) check(s, "syncopate_worker_handle_gradient");
                }
            }
        }
        SyncopateServerStats stats;
        check(syncopate_server_stats(server, &stats), "syncopate_server_stats");
        if (stats.version >= 400 && tick > 0) {
            check(syncopate_server_stop(server), "syncopate_server_stop");
            drain_server(server, workers, now, server_buf, max_len);
        }
        stopped = 0;
        for (uint32_t i = 0; i < WORKERS; i++) {
            uint32_t done;
            check(syncopate_worker_is_stopped(workers[i], &done), "syncopate_worker_is_stopped");
            stopped += (int)done;
        }
    }

    SyncopateServerStats stats;
    check(syncopate_server_stats(server, &stats), "syncopate_server_stats");
    double err = 0.0;
    for (int j = 0; j < DIM; j++) err += (model[j] - w_star[j]) * (model[j] - w_star[j]);
    err = sqrt(err);
    printf("least_squares: protocol %u, %llu updates, %llu gradients applied, %d/%d workers stopped, |w - w*| = %.2e\n",
           protocol, (unsigned long long)stats.version, (unsigned long long)stats.applied, stopped, WORKERS, err);

    for (uint32_t i = 0; i < WORKERS; i++) {
        check(syncopate_worker_fini(workers[i]), "syncopate_worker_fini");
        free(worker_mem[i]);
    }
    check(syncopate_server_fini(server), "syncopate_server_fini");
    free(server_mem);
    free(buf);
    free(server_buf);
    if (!(err < 1e-3) || stopped != WORKERS) {
        fprintf(stderr, "least_squares: FAILED (expected |w - w*| < 1e-3 and every worker stopped)\n");
        return 1;
    }
    return 0;
}
