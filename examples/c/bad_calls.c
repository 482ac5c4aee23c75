/*
 * Bad calls from C get an error code and a one-line description, never a crash: a null
 * handle, a short buffer, a wrong length, misaligned or short handle memory, a gradient
 * inside the worker's own model, a finished handle, an unknown protocol. Exits 0 when every call is refused with the expected code.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncopate.h"

#define DIM 4

static int failures = 0;

static void expect(SyncopateStatus got, SyncopateStatus want, const char *what) {
    char message[256];
    syncopate_last_error_message(message, sizeof message);
    if (got != want) {
        fprintf(stderr, "bad_calls: %s returned %d, expected %d\n", what, got, want);
        failures++;
    } else if (want != SYNCOPATE_OK) {
        printf("bad_calls: %-34s -> %d (%s)\n", what, got, message);
    }
}

int main(void) {
    SyncopateConfig config;
    expect(syncopate_config_default(&config, SYNCOPATE_PROTOCOL_BSP, 2, 0.1), SYNCOPATE_OK, "config_default");
    expect(syncopate_config_default(NULL, SYNCOPATE_PROTOCOL_BSP, 2, 0.1), SYNCOPATE_ERR_NULL_POINTER, "config_default(NULL)");
    expect(syncopate_config_default(&config, 99, 2, 0.1), SYNCOPATE_ERR_CONFIG, "config_default(protocol 99)");
    expect(syncopate_config_default(&config, SYNCOPATE_PROTOCOL_BSP, 2, 0.1), SYNCOPATE_OK, "config_default");

    size_t size, max_len;
    expect(syncopate_server_size(&config, DIM, &size), SYNCOPATE_OK, "server_size");
    expect(syncopate_max_message_len(DIM, &max_len), SYNCOPATE_OK, "max_message_len");
    size_t align = syncopate_server_align();
    uint8_t *mem = aligned_alloc(align, (size + 2 * align) / align * align);
    float params[DIM] = {0};
    SyncopateServer *server = NULL;

    expect(syncopate_server_init(mem + 1, size, &config, params, DIM, &server), SYNCOPATE_ERR_MISALIGNED,
           "server_init(misaligned mem)");
    expect(syncopate_server_init(mem, size - 1, &config, params, DIM, &server), SYNCOPATE_ERR_BUFFER_TOO_SHORT,
           "server_init(short mem)");
    expect(syncopate_server_init(mem, size, &config, NULL, DIM, &server), SYNCOPATE_ERR_NULL_POINTER,
           "server_init(NULL params)");
    expect(syncopate_server_init(mem, size, &config, params, 0, &server), SYNCOPATE_ERR_WRONG_LENGTH,
           "server_init(dim 0)");
    config.learning_rate = -1.0;
    expect(syncopate_server_init(mem, size, &config, params, DIM, &server), SYNCOPATE_ERR_CONFIG,
           "server_init(negative learning rate)");
    config.learning_rate = 0.1;
    expect(syncopate_server_init(mem, size, &config, params, DIM, &server), SYNCOPATE_OK, "server_init");

    SyncopateServerOutput out;
    uint8_t *buf = malloc(max_len);
    expect(syncopate_server_poll_output(NULL, &out, buf, max_len), SYNCOPATE_ERR_NULL_POINTER,
           "server_poll_output(NULL handle)");
    expect(syncopate_server_poll_output(server, &out, buf, max_len - 1), SYNCOPATE_ERR_BUFFER_TOO_SHORT,
           "server_poll_output(short buffer)");
    expect(syncopate_server_handle(server, 0, 0, NULL, 10), SYNCOPATE_ERR_NULL_POINTER, "server_handle(NULL bytes)");
    uint8_t garbage[16] = {1, 2, 3};
    expect(syncopate_server_handle(server, 0, 0, garbage, sizeof garbage), SYNCOPATE_ERR_DECODE,
           "server_handle(garbage)");
    uint64_t not_a_handle[4] = {0};
    expect(syncopate_server_handle((SyncopateServer *)(void *)not_a_handle, 0, 0, garbage, 3), SYNCOPATE_ERR_BAD_HANDLE,
           "server_handle(not a handle)");

    /* A gradient of the wrong length, encoded and fed to the server. */
    float short_grad[DIM - 1] = {1, 2, 3};
    SyncopateMessage msg;
    memset(&msg, 0, sizeof msg);
    msg.kind = SYNCOPATE_MSG_GRAD;
    msg.values = short_grad;
    msg.values_len = DIM - 1;
    size_t written;
    expect(syncopate_wire_encode(&msg, buf, 4, &written), SYNCOPATE_ERR_BUFFER_TOO_SHORT, "wire_encode(short buffer)");
    expect(syncopate_wire_encode(&msg, buf, max_len, &written), SYNCOPATE_OK, "wire_encode");
    expect(syncopate_server_handle(server, 0, 0, buf, written), SYNCOPATE_ERR_WRONG_LENGTH,
           "server_handle(gradient of 3, dim 4)");
    msg.kind = 0x42;
    expect(syncopate_wire_encode(&msg, buf, max_len, &written), SYNCOPATE_ERR_ENCODE, "wire_encode(unknown kind)");

    /* A worker handed a gradient of the wrong length. */
    size_t wsize;
    expect(syncopate_worker_size(&config, DIM, &wsize), SYNCOPATE_OK, "worker_size");
    size_t walign = syncopate_worker_align();
    void *wmem = aligned_alloc(walign, (wsize + walign) / walign * walign);
    float wparams[DIM] = {0};
    SyncopateWorkerSetup setup = {.id = 0, .epoch = 0, .rejoin_after_ns = 0};
    SyncopateWorker *worker = NULL;
    expect(syncopate_worker_init(wmem, wsize, &config, &setup, wparams, DIM, &worker), SYNCOPATE_OK, "worker_init");
    expect(syncopate_worker_handle_gradient(worker, 0, 0, short_grad, DIM - 1), SYNCOPATE_ERR_WRONG_LENGTH,
           "worker_handle_gradient(3 of 4)");
    float grad[DIM] = {0};
    expect(syncopate_worker_handle_gradient(worker, 0, 12345, grad, DIM), SYNCOPATE_ERR_REJECTED,
           "worker_handle_gradient(unknown job)");
    /* The worker's own model as the gradient: read while the worker writes it. */
    expect(syncopate_worker_handle_gradient(worker, 0, 0, wparams, DIM), SYNCOPATE_ERR_OVERLAP,
           "worker_handle_gradient(its model)");
    expect(syncopate_worker_handle_gradient_loss(worker, 0, 0, wparams, DIM, 0.5f), SYNCOPATE_ERR_OVERLAP,
           "worker_handle_gradient_loss(its model)");

    expect(syncopate_server_fini(server), SYNCOPATE_OK, "server_fini");
    expect(syncopate_server_stop(server), SYNCOPATE_ERR_BAD_HANDLE, "server_stop(finished handle)");
    expect(syncopate_worker_fini(worker), SYNCOPATE_OK, "worker_fini");
    free(wmem);
    free(mem);
    free(buf);
    if (failures) {
        fprintf(stderr, "bad_calls: %d FAILED\n", failures);
        return 1;
    }
    printf("bad_calls: every bad call was refused with its error code\n");
    return 0;
}
