/*
 * submit.c - a user-mode submission loop in C, the way a Mesa driver drives its hardware
 * queues, against a doorbell daemon (`doorbell serve`) through libdoorbell.
 *
 *   ./submit [SOCKET]     (default: $DOORBELL_SOCKET, else the daemon's default socket)
 *
 * It opens a device as a client of the daemon, creates a compute context and a user-mode
 * queue, builds and submits command buffers (WRITE_DATA, FILL, COPY, TIMESTAMP), waits on
 * their progress values, makes a copy queue wait on a native fence the CPU signals and
 * signal another one from the GPU, waits for the engine to go idle (its doorbell then reads
 * DISCONNECTED_RETRY), reconnects and submits again, and checks every result in memory. It
 * prints what differed and exits non-zero on any mismatch or error; 0 when all is well.
 *
 * The daemon should run with a short idle period (idle_period_ms = 5 in its TOML) so that
 * the doorbell disconnects quickly; examples/c/run.sh starts one so.
 *
 * Build by hand, from the repository root (examples/c/run.sh does this, and more):
 *   cargo build --release -p doorbell-c
 *   cc -std=c11 -Wall -Wextra -Werror -I crates/capi/include examples/c/submit.c \
 *      -L target/release -ldoorbell -Wl,-rpath,"$PWD/target/release" -o submit
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <doorbell.h>

#define WAIT_NS (20ull * 1000 * 1000 * 1000) /* generous: a loaded machine is slow, not wrong */
#define BATCHES 8

/* Everything the program opened, so that one function can close it all. */
struct app {
   db_device *dev;
   db_context *compute_ctx, *copy_ctx;
   db_queue *queue, *copy_queue, *kernel_queue;
   db_buffer *buf;
   uint64_t va;
   db_cmdbuf *cb;
   db_fence *gate, *done;
   unsigned checks, failures;
};

/* Runs a libdoorbell call; on an error, says which call, its status and message, and jumps
 * to the caller's `fail` label. */
#define CHECK(call)                                                                           \
   do {                                                                                       \
      int32_t check_status_ = (call);                                                         \
      if (check_status_ != DB_OK) {                                                           \
         fprintf(stderr, "submit: %s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,    \
                 db_status_name(check_status_), db_last_error());                            \
         goto fail;                                                                           \
      }                                                                                       \
   } while (0)

/* Compares a value read back from memory with what the GPU should have written. */
static void
expect_u64(struct app *app, const char *what, uint64_t got, uint64_t want)
{
   app->checks++;
   if (got != want) {
      app->failures++;
      fprintf(stderr, "submit: MISMATCH %s: got 0x%" PRIx64 ", expected 0x%" PRIx64 "\n", what, got,
              want);
   }
}

static void
expect_true(struct app *app, const char *what, bool ok)
{
   app->checks++;
   if (!ok) {
      app->failures++;
      fprintf(stderr, "submit: MISMATCH %s\n", what);
   }
}

static uint64_t
now_ns(void)
{
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *
doorbell_status_name(uint32_t status)
{
   switch (status) {
   case DB_DOORBELL_CONNECTED: return "CONNECTED";
   case DB_DOORBELL_CONNECTED_NOTIFY: return "CONNECTED_NOTIFY";
   case DB_DOORBELL_DISCONNECTED_RETRY: return "DISCONNECTED_RETRY";
   case DB_DOORBELL_DISCONNECTED_ABORT: return "DISCONNECTED_ABORT";
   default: return "?";
   }
}

/* Polls the queue's doorbell status (a memory read, no kernel call) until it reads `want`,
 * for at most 20 s. Returns 0 once it does, -1 on timeout or error. */
static int
wait_doorbell_status(db_queue *queue, uint32_t want)
{
   const uint64_t deadline = now_ns() + WAIT_NS;
   const struct timespec ms = {0, 1000000};
   uint32_t status = 0;
   for (;;) {
      CHECK(db_queue_doorbell_status(queue, &status));
      if (status == want)
         return 0;
      if (now_ns() > deadline) {
         fprintf(stderr, "submit: doorbell still %s after 20 s, waiting for %s\n",
                 doorbell_status_name(status), doorbell_status_name(want));
         return -1;
      }
      nanosleep(&ms, NULL);
   }
fail:
   return -1;
}

/* Opens the device and everything the loop uses. */
static int
app_init(struct app *app, const char *socket)
{
   db_queue_options opts;

   CHECK(db_device_connect(socket, &app->dev));
   CHECK(db_context_create(app->dev, DB_ENGINE_COMPUTE, &app->compute_ctx));
   CHECK(db_context_create(app->dev, DB_ENGINE_COPY, &app->copy_ctx));

   CHECK(db_queue_options_default(&opts));
   opts.mode = DB_QUEUE_USER_MODE;
   opts.ring_bytes = 16 * 1024;
   CHECK(db_queue_create(app->compute_ctx, &opts, &app->queue));
   CHECK(db_queue_create(app->copy_ctx, NULL, &app->copy_queue));
   opts.mode = DB_QUEUE_KERNEL_MODE;
   CHECK(db_queue_create(app->compute_ctx, &opts, &app->kernel_queue));

   CHECK(db_buffer_create(app->dev, 64 * 1024, &app->buf));
   CHECK(db_buffer_va(app->buf, &app->va));
   CHECK(db_cmdbuf_create(&app->cb));
   CHECK(db_fence_create(app->dev, 0, DB_FENCE_DEFAULT, 0, &app->gate));
   CHECK(db_fence_create(app->dev, 0, DB_FENCE_DEFAULT, 0, &app->done));
   return 0;
fail:
   return -1;
}

/* Destroys what app_init opened, in reverse (any order would do; NULL handles are no-ops). */
static void
app_fini(struct app *app)
{
   db_fence_destroy(app->done);
   db_fence_destroy(app->gate);
   db_cmdbuf_destroy(app->cb);
   db_buffer_destroy(app->buf);
   db_queue_destroy(app->kernel_queue);
   db_queue_destroy(app->copy_queue);
   db_queue_destroy(app->queue);
   db_context_destroy(app->copy_ctx);
   db_context_destroy(app->compute_ctx);
   db_device_destroy(app->dev);
}

/* Layout of the buffer. */
#define DATA_OFF 0x0000u    /* BATCHES words written by WRITE_DATA */
#define STAMP_OFF 0x0100u   /* BATCHES timestamps */
#define FILL_OFF 0x1000u    /* FILLed, then COPYed to COPY_OFF */
#define COPY_OFF 0x2000u
#define FILL_BYTES 512u
#define FENCE_OFF 0x3000u   /* written by the copy queue between the fences */
#define KERNEL_OFF 0x3100u  /* written through the kernel-mode queue */
#define RETRY_OFF 0x3200u   /* written after each reconnect */

/* Step 1: BATCHES command buffers on the user-mode queue, then one wait on the last. */
static int
batches(struct app *app)
{
   uint64_t values[BATCHES];

   for (unsigned i = 0; i < BATCHES; i++) {
      CHECK(db_cmdbuf_reset(app->cb));
      CHECK(db_cmdbuf_write_u32(app->cb, app->va + DATA_OFF + 4 * i, 0x1111u * (i + 1)));
      CHECK(db_cmdbuf_timestamp(app->cb, app->va + STAMP_OFF + 8 * i));
      if (i == BATCHES - 1) {
         CHECK(db_cmdbuf_fill(app->cb, app->va + FILL_OFF, FILL_BYTES, 0xa5a55a5au));
         CHECK(db_cmdbuf_copy(app->cb, app->va + FILL_OFF, app->va + COPY_OFF, FILL_BYTES));
      }
      CHECK(db_queue_submit(app->queue, app->cb, &values[i]));
   }
   /* The engine runs a queue's work in order: the last value covers every batch. */
   CHECK(db_queue_wait(app->queue, values[BATCHES - 1], WAIT_NS));

   for (unsigned i = 0; i < BATCHES; i++) {
      char what[64];
      uint32_t word = 0;
      uint64_t stamp = 0, prev = 0;
      snprintf(what, sizeof(what), "progress value of batch %u", i);
      expect_u64(app, what, values[i], (uint64_t)i + 1);
      CHECK(db_buffer_read_u32(app->buf, DATA_OFF + 4 * i, &word));
      snprintf(what, sizeof(what), "WRITE_DATA of batch %u", i);
      expect_u64(app, what, word, 0x1111u * (i + 1));
      CHECK(db_buffer_read_u64(app->buf, STAMP_OFF + 8 * i, &stamp));
      if (i > 0)
         CHECK(db_buffer_read_u64(app->buf, STAMP_OFF + 8 * (i - 1), &prev));
      snprintf(what, sizeof(what), "TIMESTAMP of batch %u is set and not before batch %u's", i,
               i ? i - 1 : 0);
      expect_true(app, what, stamp != 0 && stamp >= prev);
   }
   {
      uint8_t copied[FILL_BYTES];
      bool same = true;
      CHECK(db_buffer_read(app->buf, COPY_OFF, copied, sizeof(copied)));
      for (unsigned i = 0; i < FILL_BYTES; i += 4) {
         uint32_t w;
         memcpy(&w, copied + i, 4);
         same = same && w == 0xa5a55a5au;
      }
      expect_true(app, "FILL then COPY: the copy holds the pattern", same);
   }
   {
      uint64_t completed = 0;
      CHECK(db_queue_completed(app->queue, &completed));
      expect_u64(app, "completed progress value", completed, BATCHES);
   }
   printf("submit: %u command buffers on the user-mode queue: results checked\n", BATCHES);
   return 0;
fail:
   return -1;
}

/* Step 2: native fences. The copy queue waits (on the GPU) for `gate`, which the CPU signals,
 * writes a word, then signals `done` from the GPU; the CPU waits for `done`. */
static int
fences(struct app *app)
{
   uint64_t value = 0, v = 0;
   uint32_t word = 1;

   CHECK(db_cmdbuf_reset(app->cb));
   CHECK(db_cmdbuf_wait_fence(app->cb, app->gate, 1));
   CHECK(db_cmdbuf_write_u32(app->cb, app->va + FENCE_OFF, 0xf00du));
   CHECK(db_cmdbuf_signal_fence(app->cb, app->done, 2));
   CHECK(db_queue_submit(app->copy_queue, app->cb, &v));

   /* The queue is stopped at its WAIT: nothing after it can have run. */
   CHECK(db_buffer_read_u32(app->buf, FENCE_OFF, &word));
   expect_u64(app, "word after the WAIT before the gate opens", word, 0);
   CHECK(db_fence_value(app->done, &value));
   expect_u64(app, "done fence before the gate opens", value, 0);

   CHECK(db_fence_signal(app->gate, 1));
   CHECK(db_fence_wait(app->done, 2, WAIT_NS));
   CHECK(db_fence_value(app->done, &value));
   expect_u64(app, "done fence signalled by the GPU", value, 2);
   CHECK(db_buffer_read_u32(app->buf, FENCE_OFF, &word));
   expect_u64(app, "word written between the fences", word, 0xf00du);
   CHECK(db_queue_wait(app->copy_queue, v, WAIT_NS));
   printf("submit: native fences: CPU signal -> GPU wait, GPU signal -> CPU wait: checked\n");
   return 0;
fail:
   return -1;
}

/* Step 3: the same packet through the kernel-mode queue, and a call it refuses. */
static int
kernel_mode(struct app *app)
{
   uint64_t v = 0;
   uint32_t word = 0;
   int32_t status;

   CHECK(db_cmdbuf_reset(app->cb));
   CHECK(db_cmdbuf_write_u32(app->cb, app->va + KERNEL_OFF, 0x4b4du));
   CHECK(db_queue_submit(app->kernel_queue, app->cb, &v));
   CHECK(db_queue_wait(app->kernel_queue, v, WAIT_NS));
   CHECK(db_buffer_read_u32(app->buf, KERNEL_OFF, &word));
   expect_u64(app, "WRITE_DATA through the kernel-mode queue", word, 0x4b4du);

   /* A kernel-mode queue has no doorbell to reconnect: refused, with a message. */
   status = db_queue_reconnect(app->kernel_queue);
   expect_u64(app, "reconnect of a kernel-mode queue is refused", (uint64_t)(int64_t)status,
              (uint64_t)(int64_t)DB_WRONG_QUEUE_MODE);
   printf("submit: kernel-mode queue checked; its reconnect refused as expected: %s: %s\n",
          db_status_name(status), db_last_error());
   return 0;
fail:
   return -1;
}

/* Submits one WRITE_DATA of `value` at RETRY_OFF and waits for it. */
static int
write_and_wait(struct app *app, uint32_t value)
{
   uint64_t v = 0;
   uint32_t word = 0;
   CHECK(db_cmdbuf_reset(app->cb));
   CHECK(db_cmdbuf_write_u32(app->cb, app->va + RETRY_OFF, value));
   CHECK(db_queue_submit(app->queue, app->cb, &v));
   CHECK(db_queue_wait(app->queue, v, WAIT_NS));
   CHECK(db_buffer_read_u32(app->buf, RETRY_OFF, &word));
   expect_u64(app, "WRITE_DATA after a reconnect", word, value);
   return 0;
fail:
   return -1;
}

/* Step 4: the engine idles, the kernel disconnects the doorbell (DISCONNECTED_RETRY). The
 * driver reconnects by hand, then lets db_queue_submit meet the next disconnect itself. */
static int
reconnect(struct app *app)
{
   uint32_t status = 0;
   uint64_t before = 0, after = 0;
   db_queue_status qs;

   if (wait_doorbell_status(app->queue, DB_DOORBELL_DISCONNECTED_RETRY))
      goto fail;
   printf("submit: the engine went idle: doorbell reads DISCONNECTED_RETRY\n");
   CHECK(db_queue_reconnects(app->queue, &before));
   CHECK(db_queue_reconnect(app->queue));
   CHECK(db_queue_doorbell_status(app->queue, &status));
   expect_true(app, "doorbell connected after db_queue_reconnect",
               status == DB_DOORBELL_CONNECTED || status == DB_DOORBELL_CONNECTED_NOTIFY);
   if (write_and_wait(app, 0x5e7))
      goto fail;
   printf("submit: reconnected by hand (%s) and submitted again: checked\n",
          doorbell_status_name(status));

   if (wait_doorbell_status(app->queue, DB_DOORBELL_DISCONNECTED_RETRY))
      goto fail;
   if (write_and_wait(app, 0x5e8))
      goto fail;
   CHECK(db_queue_reconnects(app->queue, &after));
   expect_true(app, "db_queue_submit reconnected by itself after the second disconnect",
               after >= before + 2);
   printf("submit: disconnected again; db_queue_submit reconnected by itself "
          "(%" PRIu64 " reconnects in all): checked\n", after);

   CHECK(db_queue_query_status(app->queue, &qs));
   expect_true(app, "queue not faulted", !qs.faulted);
   expect_u64(app, "queue status: completed == last queued", qs.completed, qs.last_queued);
   return 0;
fail:
   return -1;
}

int
main(int argc, char **argv)
{
   struct app app;
   const char *socket = argc > 1 ? argv[1] : NULL;
   int ok;

   memset(&app, 0, sizeof(app));
   if (argc > 2) {
      fprintf(stderr, "usage: %s [SOCKET]\n", argv[0]);
      return 2;
   }
   ok = app_init(&app, socket) == 0;
   if (ok)
      printf("submit: connected to %s\n", socket ? socket : "the default socket");
   ok = ok && batches(&app) == 0;
   ok = ok && fences(&app) == 0;
   ok = ok && kernel_mode(&app) == 0;
   ok = ok && reconnect(&app) == 0;
   app_fini(&app);

   if (!ok || app.failures) {
      fprintf(stderr, "submit: FAILED: %u of %u checks failed%s\n", app.failures, app.checks,
              ok ? "" : ", and a call failed (above)");
      return 1;
   }
   printf("submit: ok: %u checks passed\n", app.checks);
   return 0;
}
