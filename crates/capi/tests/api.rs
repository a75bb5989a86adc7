//! The C API called from Rust the way C calls it: raw pointers, status codes, output
//! pointers, `db_last_error`. Against embedded devices on the live driver (and, in one test, a
//! daemon in this process). Live tests wait on events (a progress value, a doorbell status)
//! with generous deadlines; nothing sleeps and hopes.

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use doorbell::*;

/// A generous timeout for waits that must succeed (a loaded machine is slow, not wrong).
const WAIT_NS: u64 = 20_000_000_000;

fn last_error() -> String {
    // SAFETY: db_last_error returns a NUL-terminated string that lives until the next db_
    // call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(db_last_error()) }.to_string_lossy().into_owned()
}

fn status_name(status: i32) -> String {
    // SAFETY: db_status_name returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(db_status_name(status)) }.to_string_lossy().into_owned()
}

/// Asserts a call succeeded, showing its status and message if not.
#[track_caller]
fn ok(status: i32) {
    assert_eq!(status, 0, "{}: {}", status_name(status), last_error());
}

/// Asserts a call failed with `want`, and that its message holds every one of `says`.
#[track_caller]
fn fails(status: i32, want: db_status, says: &[&str]) -> String {
    let msg = last_error();
    assert_eq!(status, want as i32, "expected {want:?}, got {} ({msg})", status_name(status));
    for s in says {
        assert!(msg.contains(s), "message {msg:?} does not say {s:?}");
    }
    msg
}

/// Waits (polling, with a deadline) until `cond` holds.
#[track_caller]
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An embedded device with `idle_period_ms` (0: the default).
fn embedded(idle_period_ms: u32) -> *mut db_device {
    let config = db_device_config { engines: null(), engine_count: 0, hw_slots: 0, idle_period_ms };
    let mut d = null_mut();
    // SAFETY: a readable config and a writable output.
    ok(unsafe { db_device_open_embedded(&config, &mut d) });
    assert!(!d.is_null());
    d
}

/// Every command-buffer function encodes what its `umd::CommandBuffer` method encodes, dword
/// for dword.
#[test]
fn every_packet_function_encodes_the_bytes_of_the_rust_command_buffer() {
    // SAFETY (whole test): every pointer passed is a handle created here and not yet
    // destroyed, or a local.
    unsafe {
        let d = embedded(0);
        let mut f = null_mut();
        ok(db_fence_create(d, 0, db_fence_type::DB_FENCE_DEFAULT as u32, 0, &mut f));
        let nf = (*f).native_fence();
        let kick = db_gpu_kick {
            wptr_va: 0x1000,
            doorbell_va: 0x2000,
            aggregated_va: 0x3000,
            wptr: 0x40,
            value: 9,
            has_aggregated: 1,
        };
        let kick_rs =
            umd::GpuKick { wptr_va: 0x1000, doorbell_va: 0x2000, aggregated_va: Some(0x3000), wptr: 0x40, value: 9 };
        let kick_plain = db_gpu_kick { has_aggregated: 0, ..kick };
        let kick_plain_rs = umd::GpuKick { aggregated_va: None, ..kick_rs };
        let points = [db_wait_point { va: 0x5000, value: 1 }, db_wait_point { va: 0x5008, value: u64::MAX }];
        let points_rs =
            [abi::port::WaitPoint { va: 0x5000, value: 1 }, abi::port::WaitPoint { va: 0x5008, value: u64::MAX }];
        let raw = [0xdead_beef_u32, 0, 7];
        let va = 0x1234_5678_9000_u64;

        type C = Box<dyn Fn(*mut db_cmdbuf) -> i32>;
        type R = Box<dyn Fn(&mut umd::CommandBuffer)>;
        let cases: Vec<(&str, C, R)> = vec![
            (
                "nop",
                Box::new(|c| db_cmdbuf_nop(c, 5)),
                Box::new(|r| {
                    r.nop(5);
                }),
            ),
            (
                "nop 0",
                Box::new(|c| db_cmdbuf_nop(c, 0)),
                Box::new(|r| {
                    r.nop(0);
                }),
            ),
            (
                "nop max",
                Box::new(|c| db_cmdbuf_nop(c, 65535)),
                Box::new(|r| {
                    r.nop(65535);
                }),
            ),
            (
                "write_u32",
                Box::new(move |c| db_cmdbuf_write_u32(c, va, 0xc0ffee)),
                Box::new(move |r| {
                    r.write_u32(va, 0xc0ffee);
                }),
            ),
            (
                "write_u64",
                Box::new(move |c| db_cmdbuf_write_u64(c, va, u64::MAX - 1)),
                Box::new(move |r| {
                    r.write_u64(va, u64::MAX - 1);
                }),
            ),
            (
                "copy",
                Box::new(move |c| db_cmdbuf_copy(c, va, va + 64, 4096)),
                Box::new(move |r| {
                    r.copy(va, va + 64, 4096);
                }),
            ),
            (
                "fill",
                Box::new(move |c| db_cmdbuf_fill(c, va, 256, 0xa5a5_5a5a)),
                Box::new(move |r| {
                    r.fill(va, 256, 0xa5a5_5a5a);
                }),
            ),
            (
                "timestamp",
                Box::new(move |c| db_cmdbuf_timestamp(c, va)),
                Box::new(move |r| {
                    r.timestamp(va);
                }),
            ),
            (
                "indirect",
                Box::new(move |c| db_cmdbuf_indirect(c, va, 40)),
                Box::new(move |r| {
                    r.indirect(va, 40);
                }),
            ),
            (
                "signal",
                Box::new(move |c| db_cmdbuf_signal(c, va, 3)),
                Box::new(move |r| {
                    r.signal(va, 3);
                }),
            ),
            (
                "wait",
                Box::new(move |c| db_cmdbuf_wait(c, va, 4)),
                Box::new(move |r| {
                    r.wait(va, 4);
                }),
            ),
            (
                "signal_fence",
                Box::new(move |c| db_cmdbuf_signal_fence(c, f, 5)),
                Box::new(move |r| {
                    r.signal_fence(nf, 5);
                }),
            ),
            (
                "wait_fence",
                Box::new(move |c| db_cmdbuf_wait_fence(c, f, 6)),
                Box::new(move |r| {
                    r.wait_fence(nf, 6);
                }),
            ),
            (
                "signal_fence_logged",
                Box::new(move |c| db_cmdbuf_signal_fence_logged(c, f, 7)),
                Box::new(move |r| {
                    r.signal_fence_logged(nf, 7);
                }),
            ),
            (
                "wait_fence_logged",
                Box::new(move |c| db_cmdbuf_wait_fence_logged(c, f, 8)),
                Box::new(move |r| {
                    r.wait_fence_logged(nf, 8);
                }),
            ),
            (
                "dispatch",
                Box::new(move |c| db_cmdbuf_dispatch(c, va, 1, 2, 3, 32, 4, 1, va + 0x100)),
                Box::new(move |r| {
                    r.dispatch(va, [1, 2, 3], [32, 4, 1], va + 0x100);
                }),
            ),
            (
                "interrupt",
                Box::new(|c| db_cmdbuf_interrupt(c, 42)),
                Box::new(|r| {
                    r.interrupt(42);
                }),
            ),
            (
                "synthetic",
                Box::new(|c| db_cmdbuf_synthetic(c, 1_000_000)),
                Box::new(|r| {
                    r.synthetic(1_000_000);
                }),
            ),
            (
                "kick",
                Box::new(move |c| db_cmdbuf_kick(c, &kick)),
                Box::new(move |r| {
                    r.kick(&kick_rs);
                }),
            ),
            (
                "kick without aggregated",
                Box::new(move |c| db_cmdbuf_kick(c, &kick_plain)),
                Box::new(move |r| {
                    r.kick(&kick_plain_rs);
                }),
            ),
            (
                "wait_points",
                Box::new(move |c| db_cmdbuf_wait_points(c, points.as_ptr(), points.len())),
                Box::new(move |r| {
                    r.wait_points(&points_rs);
                }),
            ),
            (
                "wait_points empty",
                Box::new(|c| db_cmdbuf_wait_points(c, null(), 0)),
                Box::new(|r| {
                    r.wait_points(&[]);
                }),
            ),
            (
                "raw",
                Box::new(move |c| db_cmdbuf_raw(c, raw.as_ptr(), raw.len())),
                Box::new(move |r| {
                    r.raw(&raw);
                }),
            ),
        ];

        let mut all = null_mut();
        ok(db_cmdbuf_create(&mut all));
        let mut all_rs = umd::CommandBuffer::new();
        for (name, c, r) in &cases {
            let mut one = null_mut();
            ok(db_cmdbuf_create(&mut one));
            ok(c(one));
            let mut rs = umd::CommandBuffer::new();
            r(&mut rs);
            assert_eq!(words(one), rs.words(), "{name}");
            assert!(!rs.words().is_empty() || *name == "wait_points empty", "{name} encodes something");
            ok(db_cmdbuf_destroy(one));
            // And all of them back to back in one buffer.
            ok(c(all));
            r(&mut all_rs);
        }
        assert_eq!(words(all), all_rs.words(), "every packet, back to back");
        // Reset empties it, and it encodes afresh.
        ok(db_cmdbuf_reset(all));
        assert_eq!(words(all), Vec::<u32>::new());
        ok(db_cmdbuf_interrupt(all, 1));
        assert_eq!(words(all), umd::CommandBuffer::new().interrupt(1).words());
        ok(db_cmdbuf_destroy(all));
        ok(db_fence_destroy(f));
        ok(db_device_destroy(d));
    }
}

/// The dwords of a command buffer, through `db_cmdbuf_words` (count, then copy).
fn words(cb: *const db_cmdbuf) -> Vec<u32> {
    let mut n = 0usize;
    // SAFETY: a live command buffer and a writable count.
    ok(unsafe { db_cmdbuf_words(cb, null_mut(), 0, &mut n) });
    let mut v = vec![0u32; n];
    let mut m = 0usize;
    // SAFETY: `v` holds `n` writable dwords.
    ok(unsafe { db_cmdbuf_words(cb, v.as_mut_ptr(), v.len(), &mut m) });
    assert_eq!(m, n);
    v
}

/// Every required pointer argument, passed NULL, is refused with `DB_NULL_ARGUMENT` and a
/// message naming it; nothing crashes.
#[test]
fn a_null_pointer_is_refused_with_the_argument_named() {
    // SAFETY (whole test): every pointer is NULL on purpose, a live handle created here, or a
    // local.
    unsafe {
        let d = embedded(0);
        let (mut ctx, mut q, mut b, mut cb, mut f) = (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COMPUTE as u32, &mut ctx));
        ok(db_queue_create(ctx, null(), &mut q));
        ok(db_buffer_create(d, 4096, &mut b));
        ok(db_cmdbuf_create(&mut cb));
        ok(db_fence_create(d, 0, 0, 0, &mut f));
        let (mut u64v, mut u32v, mut usz) = (0u64, 0u32, 0usize);
        let mut opts = std::mem::zeroed::<db_queue_options>();
        let mut st = std::mem::zeroed::<db_queue_status>();
        let mut kick = std::mem::zeroed::<db_gpu_kick>();
        let mut byte = [0u8; 4];
        let kick_in = db_gpu_kick { has_aggregated: 0, ..kick };
        let fences = [f.cast_const()];
        let values = [0u64];

        // Each call, then its message at once (a later call replaces it).
        macro_rules! null_arg {
            ($call:expr, $arg:literal) => {
                fails($call, db_status::DB_NULL_ARGUMENT, &[concat!("argument `", $arg, "` is null")])
            };
        }
        null_arg!(db_device_open_embedded(null(), null_mut()), "out_device");
        null_arg!(
            db_device_open_embedded(
                &db_device_config { engines: null(), engine_count: 2, hw_slots: 0, idle_period_ms: 0 },
                &mut null_mut(),
            ),
            "config->engines"
        );
        null_arg!(db_device_connect(null(), null_mut()), "out_device");
        null_arg!(db_context_create(null(), 0, &mut null_mut()), "device");
        null_arg!(db_context_create(d, 0, null_mut()), "out_context");
        null_arg!(db_buffer_create(null(), 4096, &mut null_mut()), "device");
        null_arg!(db_buffer_create(d, 4096, null_mut()), "out_buffer");
        null_arg!(db_buffer_va(null(), &mut u64v), "buffer");
        null_arg!(db_buffer_va(b, null_mut()), "out_va");
        null_arg!(db_buffer_size(null(), &mut u64v), "buffer");
        null_arg!(db_buffer_size(b, null_mut()), "out_bytes");
        null_arg!(db_buffer_write(null(), 0, byte.as_ptr().cast(), 4), "buffer");
        null_arg!(db_buffer_write(b, 0, null(), 4), "data");
        null_arg!(db_buffer_read(null(), 0, byte.as_mut_ptr().cast(), 4), "buffer");
        null_arg!(db_buffer_read(b, 0, null_mut(), 4), "out_data");
        null_arg!(db_buffer_read_u32(null(), 0, &mut u32v), "buffer");
        null_arg!(db_buffer_read_u32(b, 0, null_mut()), "out_value");
        null_arg!(db_buffer_read_u64(null(), 0, &mut u64v), "buffer");
        null_arg!(db_buffer_read_u64(b, 0, null_mut()), "out_value");
        null_arg!(db_buffer_write_u32(null(), 0, 1), "buffer");
        null_arg!(db_buffer_write_u64(null(), 0, 1), "buffer");
        null_arg!(db_cmdbuf_create(null_mut()), "out_cmdbuf");
        null_arg!(db_cmdbuf_reset(null_mut()), "cmdbuf");
        null_arg!(db_cmdbuf_words(null(), null_mut(), 0, &mut usz), "cmdbuf");
        null_arg!(db_cmdbuf_words(cb, null_mut(), 0, null_mut()), "out_count");
        null_arg!(db_cmdbuf_nop(null_mut(), 1), "cmdbuf");
        null_arg!(db_cmdbuf_write_u32(null_mut(), 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_write_u64(null_mut(), 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_copy(null_mut(), 0, 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_fill(null_mut(), 0, 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_timestamp(null_mut(), 0), "cmdbuf");
        null_arg!(db_cmdbuf_indirect(null_mut(), 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_signal(null_mut(), 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_wait(null_mut(), 0, 0), "cmdbuf");
        null_arg!(db_cmdbuf_signal_fence(null_mut(), f, 0), "cmdbuf");
        null_arg!(db_cmdbuf_signal_fence(cb, null(), 0), "fence");
        null_arg!(db_cmdbuf_wait_fence(null_mut(), f, 0), "cmdbuf");
        null_arg!(db_cmdbuf_wait_fence(cb, null(), 0), "fence");
        null_arg!(db_cmdbuf_signal_fence_logged(null_mut(), f, 0), "cmdbuf");
        null_arg!(db_cmdbuf_signal_fence_logged(cb, null(), 0), "fence");
        null_arg!(db_cmdbuf_wait_fence_logged(null_mut(), f, 0), "cmdbuf");
        null_arg!(db_cmdbuf_wait_fence_logged(cb, null(), 0), "fence");
        null_arg!(db_cmdbuf_dispatch(null_mut(), 0, 1, 1, 1, 1, 1, 1, 0), "cmdbuf");
        null_arg!(db_cmdbuf_interrupt(null_mut(), 0), "cmdbuf");
        null_arg!(db_cmdbuf_synthetic(null_mut(), 0), "cmdbuf");
        null_arg!(db_cmdbuf_kick(null_mut(), &kick_in), "cmdbuf");
        null_arg!(db_cmdbuf_kick(cb, null()), "kick");
        null_arg!(db_cmdbuf_wait_points(null_mut(), null(), 0), "cmdbuf");
        null_arg!(db_cmdbuf_wait_points(cb, null(), 1), "points");
        null_arg!(db_cmdbuf_raw(null_mut(), null(), 0), "cmdbuf");
        null_arg!(db_cmdbuf_raw(cb, null(), 2), "words");
        null_arg!(db_queue_options_default(null_mut()), "out_options");
        null_arg!(db_queue_create(null(), null(), &mut null_mut()), "context");
        null_arg!(db_queue_create(ctx, &opts, null_mut()), "out_queue");
        null_arg!(db_queue_submit(null(), cb, &mut u64v), "queue");
        null_arg!(db_queue_submit(q, null(), &mut u64v), "cmdbuf");
        null_arg!(db_queue_submit(q, cb, null_mut()), "out_value");
        null_arg!(db_queue_prepare(null(), cb, &mut kick), "queue");
        null_arg!(db_queue_prepare(q, null(), &mut kick), "cmdbuf");
        null_arg!(db_queue_prepare(q, cb, null_mut()), "out_kick");
        null_arg!(db_queue_wait(null(), 0, 0), "queue");
        null_arg!(db_queue_finish(null(), 0), "queue");
        null_arg!(db_queue_completed(null(), &mut u64v), "queue");
        null_arg!(db_queue_completed(q, null_mut()), "out_value");
        null_arg!(db_queue_last_submitted(null(), &mut u64v), "queue");
        null_arg!(db_queue_last_submitted(q, null_mut()), "out_value");
        null_arg!(db_queue_progress_va(null(), &mut u64v), "queue");
        null_arg!(db_queue_progress_va(q, null_mut()), "out_va");
        null_arg!(db_queue_submission_mode(null(), &mut u32v), "queue");
        null_arg!(db_queue_submission_mode(q, null_mut()), "out_mode");
        null_arg!(db_queue_doorbell_status(null(), &mut u32v), "queue");
        null_arg!(db_queue_doorbell_status(q, null_mut()), "out_status");
        null_arg!(db_queue_reconnect(null()), "queue");
        null_arg!(db_queue_reconnects(null(), &mut u64v), "queue");
        null_arg!(db_queue_reconnects(q, null_mut()), "out_count");
        null_arg!(db_queue_query_status(null(), &mut st), "queue");
        null_arg!(db_queue_query_status(q, null_mut()), "out_status");
        null_arg!(db_queue_progress_fence(null(), &mut null_mut()), "queue");
        null_arg!(db_queue_progress_fence(q, null_mut()), "out_fence");
        null_arg!(db_fence_create(null(), 0, 0, 0, &mut null_mut()), "device");
        null_arg!(db_fence_create(d, 0, 0, 0, null_mut()), "out_fence");
        null_arg!(db_fence_open(null(), 1, &mut null_mut()), "device");
        null_arg!(db_fence_open(d, 1, null_mut()), "out_fence");
        null_arg!(db_fence_global_handle(null(), &mut u64v), "fence");
        null_arg!(db_fence_global_handle(f, null_mut()), "out_handle");
        null_arg!(db_fence_va(null(), &mut u64v), "fence");
        null_arg!(db_fence_va(f, null_mut()), "out_va");
        null_arg!(db_fence_value(null(), &mut u64v), "fence");
        null_arg!(db_fence_value(f, null_mut()), "out_value");
        null_arg!(db_fence_signal(null(), 1), "fence");
        null_arg!(db_fence_wait(null(), 0, 0), "fence");
        null_arg!(db_device_wait_fences(null(), fences.as_ptr(), values.as_ptr(), 1, 0, 0, null_mut()), "device");
        null_arg!(db_device_wait_fences(d, null(), values.as_ptr(), 1, 0, 0, null_mut()), "fences");
        null_arg!(db_device_wait_fences(d, fences.as_ptr(), null(), 1, 0, 0, null_mut()), "values");
        null_arg!(
            db_device_wait_fences(d, [f.cast_const(), null()].as_ptr(), [0, 0].as_ptr(), 2, 0, 0, null_mut()),
            "fences[1]"
        );
        // Optional pointers: NULL is their documented meaning, not an error.
        ok(db_queue_options_default(&mut opts));
        ok(create_and_destroy_default_queue(ctx));
        ok(db_buffer_write(b, 0, null(), 0));
        ok(db_buffer_read(b, 0, null_mut(), 0));
        ok(db_device_wait_fences(
            d,
            fences.as_ptr(),
            values.as_ptr(),
            1,
            db_wait_mode::DB_WAIT_ALL as u32,
            0,
            null_mut(),
        ));
        ok(db_cmdbuf_words(cb, null_mut(), 0, &mut usz));
        // Destroying NULL is a no-op.
        for s in [
            db_device_destroy(null_mut()),
            db_context_destroy(null_mut()),
            db_buffer_destroy(null_mut()),
            db_cmdbuf_destroy(null_mut()),
            db_queue_destroy(null_mut()),
            db_fence_destroy(null_mut()),
        ] {
            ok(s);
        }
        let _ = &mut byte;
        for s in [
            db_fence_destroy(f),
            db_cmdbuf_destroy(cb),
            db_buffer_destroy(b),
            db_queue_destroy(q),
            db_context_destroy(ctx),
        ] {
            ok(s);
        }
        ok(db_device_destroy(d));
    }
}

/// Creates a queue with NULL options (the defaults) on `ctx`, destroys it, and returns the
/// creation's status.
fn create_and_destroy_default_queue(ctx: *const db_context) -> i32 {
    let mut q = null_mut();
    // SAFETY: a live context and a writable output; the queue is destroyed at once.
    unsafe {
        let s = db_queue_create(ctx, null(), &mut q);
        ok(db_queue_destroy(q));
        s
    }
}

/// A value outside its domain is refused with the right status, and the message names the
/// argument or field and the value.
#[test]
fn a_bad_value_is_refused_with_its_field_and_value_named() {
    // SAFETY (whole test): every pointer is a live handle created here, or a local.
    unsafe {
        let mut d = null_mut();
        let kinds = [0u32, 9];
        let config = db_device_config { engines: kinds.as_ptr(), engine_count: 2, hw_slots: 0, idle_period_ms: 0 };
        fails(
            db_device_open_embedded(&config, &mut d),
            db_status::DB_INVALID_ARGUMENT,
            &["`config->engines[1]` = 9", "db_engine_kind"],
        );
        assert!(d.is_null(), "no output on failure");
        let config = db_device_config { engines: null(), engine_count: 0, hw_slots: 0, idle_period_ms: 4_000_000 };
        fails(db_device_open_embedded(&config, &mut d), db_status::DB_INVALID_ARGUMENT, &["idle_period", "4000s"]);

        let d = embedded(0);
        let mut ctx = null_mut();
        fails(db_context_create(d, 7, &mut ctx), db_status::DB_INVALID_ARGUMENT, &["`engine_kind` = 7"]);
        fails(
            db_context_create(d, db_engine_kind::DB_ENGINE_VIDEO as u32, &mut ctx),
            db_status::DB_NO_ENGINE,
            &["video"],
        );
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COPY as u32, &mut ctx));

        let mut opts = std::mem::zeroed::<db_queue_options>();
        ok(db_queue_options_default(&mut opts));
        assert_eq!(
            (opts.mode, opts.priority, opts.ring_bytes, opts.fallback_to_kernel_mode),
            (db_queue_mode::DB_QUEUE_USER_MODE as u32, db_priority::DB_PRIORITY_NORMAL as u32, 64 * 1024, 0)
        );
        let mut q = null_mut();
        for (bad, says) in [
            (db_queue_options { mode: 3, ..opts }, "`options->mode` = 3"),
            (db_queue_options { priority: 5, ..opts }, "`options->priority` = 5"),
            (db_queue_options { fallback_to_kernel_mode: 2, ..opts }, "`options->fallback_to_kernel_mode` = 2"),
        ] {
            fails(db_queue_create(ctx, &bad, &mut q), db_status::DB_INVALID_ARGUMENT, &[says]);
        }
        fails(
            db_queue_create(ctx, &db_queue_options { ring_bytes: 5000, ..opts }, &mut q),
            db_status::DB_INVALID_ARGUMENT,
            &["ring_bytes", "5000"],
        );
        assert!(q.is_null());

        let mut cb = null_mut();
        ok(db_cmdbuf_create(&mut cb));
        fails(db_cmdbuf_nop(cb, 70_000), db_status::DB_INVALID_ARGUMENT, &["`dwords` = 70000", "65535"]);
        let kick = db_gpu_kick { wptr_va: 0, doorbell_va: 0, aggregated_va: 0, wptr: 0, value: 0, has_aggregated: 2 };
        fails(db_cmdbuf_kick(cb, &kick), db_status::DB_INVALID_ARGUMENT, &["`kick->has_aggregated` = 2"]);
        assert_eq!(words(cb), Vec::<u32>::new(), "a refused packet leaves nothing behind");
        ok(db_cmdbuf_write_u64(cb, 0x1000, 1));
        let mut small = [0u32; 2];
        let mut n = 0;
        let len = umd::CommandBuffer::new().write_u64(0x1000, 1).len();
        fails(
            db_cmdbuf_words(cb, small.as_mut_ptr(), 2, &mut n),
            db_status::DB_INVALID_ARGUMENT,
            &["`capacity` = 2", &format!("{len} dwords")],
        );
        assert_eq!(small, [0, 0], "nothing copied on failure");

        let mut b = null_mut();
        ok(db_buffer_create(d, 100, &mut b));
        let mut size = 0;
        ok(db_buffer_size(b, &mut size));
        assert_eq!(size, 4096, "whole pages");
        let mut out = [0u8; 16];
        fails(
            db_buffer_read(b, 4090, out.as_mut_ptr().cast(), 16),
            db_status::DB_OUT_OF_BOUNDS,
            &["`offset` = 0xffa", "`bytes` = 0x10", "0x1000 bytes"],
        );
        fails(
            db_buffer_write(b, u64::MAX, out.as_ptr().cast(), 1),
            db_status::DB_OUT_OF_BOUNDS,
            &["`offset` = 0xffffffffffffffff"],
        );
        let mut v = 0u64;
        fails(db_buffer_read_u64(b, 4092, &mut v), db_status::DB_OUT_OF_BOUNDS, &["`offset` = 0xffc", "`bytes` = 0x8"]);

        let mut f = null_mut();
        fails(db_fence_create(d, 0, 3, 0, &mut f), db_status::DB_INVALID_ARGUMENT, &["`fence_type` = 3"]);
        fails(db_fence_create(d, 0, 0, 4, &mut f), db_status::DB_INVALID_ARGUMENT, &["`flags` = 0x4"]);
        ok(db_fence_create(d, 10, db_fence_type::DB_FENCE_DEFAULT as u32, 0, &mut f));
        fails(db_fence_global_handle(f, &mut v), db_status::DB_INVALID_ARGUMENT, &["DB_FENCE_SHAREABLE"]);
        fails(db_fence_signal(f, 9), db_status::DB_INVALID_ARGUMENT, &["9", "10"]);
        fails(db_fence_wait(f, 11, 1_000_000), db_status::DB_TIMEOUT, &["timed out"]);
        let fences = [f.cast_const()];
        fails(
            db_device_wait_fences(d, fences.as_ptr(), [0u64].as_ptr(), 1, 2, 0, null_mut()),
            db_status::DB_INVALID_ARGUMENT,
            &["`mode` = 2"],
        );
        let mut intra = null_mut();
        ok(db_fence_create(d, 0, db_fence_type::DB_FENCE_INTRA_GPU as u32, 0, &mut intra));
        fails(db_fence_value(intra, &mut v), db_status::DB_NO_CPU_ACCESS, &["IntraGpu"]);

        let mut kq = null_mut();
        ok(db_queue_create(
            ctx,
            &db_queue_options { mode: db_queue_mode::DB_QUEUE_KERNEL_MODE as u32, ..opts },
            &mut kq,
        ));
        fails(db_queue_reconnect(kq), db_status::DB_WRONG_QUEUE_MODE, &["kernel-mode", "user-mode"]);
        let mut kick = std::mem::zeroed::<db_gpu_kick>();
        fails(db_queue_prepare(kq, cb, &mut kick), db_status::DB_WRONG_QUEUE_MODE, &["kernel-mode"]);
        // A malformed command buffer on a kernel-mode queue: the kernel refuses it by packet.
        let mut bad = null_mut();
        ok(db_cmdbuf_create(&mut bad));
        ok(db_cmdbuf_raw(bad, [0xffff_ffffu32].as_ptr(), 1));
        fails(db_queue_submit(kq, bad, &mut v), db_status::DB_INVALID_ARGUMENT, &["packet at dword 0"]);
        fails(db_queue_wait(kq, 1, 1_000_000), db_status::DB_TIMEOUT, &["progress value 1"]);

        let missing = CString::new("/nonexistent/doorbell-capi-test.sock").unwrap();
        let mut dd = null_mut();
        fails(
            db_device_connect(missing.as_ptr(), &mut dd),
            db_status::DB_CONNECT,
            &["/nonexistent/doorbell-capi-test.sock"],
        );
        assert!(dd.is_null());

        for s in [
            db_cmdbuf_destroy(bad),
            db_queue_destroy(kq),
            db_fence_destroy(intra),
            db_fence_destroy(f),
            db_buffer_destroy(b),
            db_cmdbuf_destroy(cb),
            db_context_destroy(ctx),
            db_device_destroy(d),
        ] {
            ok(s);
        }
    }
}

/// A submission loop as a C driver writes it: user- and kernel-mode queues, packets, progress
/// values, native fences signalled from the GPU and the CPU, a queue waiting on another's
/// progress, the status query, and the doorbell going `DisconnectedRetry` when the engine
/// idles, then reconnected by hand and by the submission itself.
#[test]
fn a_submission_loop_with_fences_and_a_reconnect_works() {
    // SAFETY (whole test): every pointer is a live handle created here, or a local.
    unsafe {
        let d = embedded(2);
        let (mut ctx, mut copy_ctx, mut uq, mut kq, mut cq, mut b, mut cb) =
            (null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COMPUTE as u32, &mut ctx));
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COPY as u32, &mut copy_ctx));
        ok(db_queue_create(ctx, null(), &mut uq));
        let kernel = db_queue_options { mode: db_queue_mode::DB_QUEUE_KERNEL_MODE as u32, ..default_options() };
        ok(db_queue_create(ctx, &kernel, &mut kq));
        ok(db_queue_create(copy_ctx, null(), &mut cq));
        let mut mode = 9;
        ok(db_queue_submission_mode(uq, &mut mode));
        assert_eq!(mode, db_queue_mode::DB_QUEUE_USER_MODE as u32);
        ok(db_queue_submission_mode(kq, &mut mode));
        assert_eq!(mode, db_queue_mode::DB_QUEUE_KERNEL_MODE as u32);
        ok(db_buffer_create(d, 1 << 16, &mut b));
        let mut va = 0;
        ok(db_buffer_va(b, &mut va));
        ok(db_cmdbuf_create(&mut cb));

        // Both submission paths run the same packets with the same results.
        for (q, base) in [(uq, 0u64), (kq, 0x4000)] {
            ok(db_cmdbuf_reset(cb));
            ok(db_cmdbuf_write_u32(cb, va + base, 0xc0ffee));
            ok(db_cmdbuf_write_u64(cb, va + base + 8, 0x1234_5678_9abc_def0));
            ok(db_cmdbuf_fill(cb, va + base + 0x100, 256, 0xa5a5_5a5a));
            ok(db_cmdbuf_copy(cb, va + base + 0x100, va + base + 0x400, 256));
            ok(db_cmdbuf_timestamp(cb, va + base + 0x10));
            ok(db_cmdbuf_signal(cb, va + base + 0x18, 99));
            ok(db_cmdbuf_interrupt(cb, 7));
            let (mut v1, mut v2) = (0, 0);
            ok(db_queue_submit(q, cb, &mut v1));
            ok(db_queue_submit(q, cb, &mut v2));
            assert_eq!((v1, v2), (1, 2), "progress values count submissions");
            ok(db_queue_wait(q, v2, WAIT_NS));
            let mut completed = 0;
            ok(db_queue_completed(q, &mut completed));
            assert_eq!(completed, 2);
            ok(db_queue_last_submitted(q, &mut completed));
            assert_eq!(completed, 2);
            let (mut w32, mut w64, mut ts) = (0u32, 0u64, 0u64);
            ok(db_buffer_read_u32(b, base, &mut w32));
            ok(db_buffer_read_u64(b, base + 8, &mut w64));
            ok(db_buffer_read_u64(b, base + 0x10, &mut ts));
            assert_eq!((w32, w64), (0xc0ffee, 0x1234_5678_9abc_def0));
            assert!(ts > 0, "TIMESTAMP wrote the device clock");
            ok(db_buffer_read_u64(b, base + 0x18, &mut w64));
            assert_eq!(w64, 99);
            let mut copied = [0u8; 256];
            ok(db_buffer_read(b, base + 0x400, copied.as_mut_ptr().cast(), copied.len()));
            assert!(copied.chunks(4).all(|c| c == 0xa5a5_5a5au32.to_le_bytes()), "FILL then COPY");
            let mut st = std::mem::zeroed::<db_queue_status>();
            ok(db_queue_query_status(q, &mut st));
            assert_eq!((st.completed, st.last_queued, st.faulted, st.flags, st.fault[0]), (2, 2, false, 0, 0));
        }

        // Native fences: the copy queue waits on a fence the CPU signals, then signals another
        // from the GPU, which the CPU waits on; the compute queue waits on the copy queue's
        // progress.
        let (mut gate, mut done) = (null_mut(), null_mut());
        ok(db_fence_create(d, 0, db_fence_type::DB_FENCE_DEFAULT as u32, 0, &mut gate));
        ok(db_fence_create(d, 0, db_fence_type::DB_FENCE_DEFAULT as u32, 0, &mut done));
        ok(db_cmdbuf_reset(cb));
        ok(db_cmdbuf_wait_fence(cb, gate, 1));
        ok(db_cmdbuf_write_u32(cb, va + 0x8000, 0xf00d));
        ok(db_cmdbuf_signal_fence(cb, done, 5));
        let mut cv = 0;
        ok(db_queue_submit(cq, cb, &mut cv));
        let mut cq_progress = 0;
        ok(db_queue_progress_va(cq, &mut cq_progress));
        ok(db_cmdbuf_reset(cb));
        ok(db_cmdbuf_wait(cb, cq_progress, cv));
        ok(db_cmdbuf_write_u32(cb, va + 0x8004, 0xbeef));
        let mut uv = 0;
        ok(db_queue_submit(uq, cb, &mut uv));
        let mut value = 9;
        ok(db_fence_value(done, &mut value));
        assert_eq!(value, 0, "nothing ran before the gate opened");
        fails(db_fence_wait(done, 5, 1_000_000), db_status::DB_TIMEOUT, &[]);
        ok(db_fence_signal(gate, 1));
        ok(db_fence_wait(done, 5, WAIT_NS));
        ok(db_fence_value(done, &mut value));
        assert_eq!(value, 5);
        let mut w = 0u32;
        ok(db_buffer_read_u32(b, 0x8000, &mut w));
        assert_eq!(w, 0xf00d);
        // The compute queue's progress through its progress fence and a multi-fence wait.
        let mut pf = null_mut();
        ok(db_queue_progress_fence(uq, &mut pf));
        let fences = [pf.cast_const(), done.cast_const()];
        let mut index = 9;
        ok(db_device_wait_fences(
            d,
            fences.as_ptr(),
            [uv, 5].as_ptr(),
            2,
            db_wait_mode::DB_WAIT_ALL as u32,
            WAIT_NS,
            &mut index,
        ));
        assert_eq!(index, 0);
        ok(db_buffer_read_u32(b, 0x8004, &mut w));
        assert_eq!(w, 0xbeef);
        ok(db_device_wait_fences(
            d,
            fences.as_ptr(),
            [u64::MAX - 1, 5].as_ptr(),
            2,
            db_wait_mode::DB_WAIT_ANY as u32,
            WAIT_NS,
            &mut index,
        ));
        assert_eq!(index, 1, "only the second fence has reached its value");

        // The engine idles: the kernel disconnects the doorbell. Reconnect by hand, then let
        // a submission meet the next disconnect and reconnect by itself.
        let status = |q| {
            let mut s = 9;
            ok(db_queue_doorbell_status(q, &mut s));
            s
        };
        assert_eq!(status(uq), db_doorbell_status::DB_DOORBELL_CONNECTED as u32);
        wait_for("the idle compute engine to disconnect the doorbell", || {
            status(uq) == db_doorbell_status::DB_DOORBELL_DISCONNECTED_RETRY as u32
        });
        let mut reconnects = 0;
        ok(db_queue_reconnects(uq, &mut reconnects));
        let before = reconnects;
        ok(db_queue_reconnect(uq));
        ok(db_queue_reconnects(uq, &mut reconnects));
        assert_eq!(reconnects, before + 1);
        ok(db_cmdbuf_reset(cb));
        ok(db_cmdbuf_write_u32(cb, va + 0x9000, 1));
        ok(db_queue_submit(uq, cb, &mut uv));
        ok(db_queue_wait(uq, uv, WAIT_NS));
        wait_for("the doorbell to disconnect again", || {
            status(uq) == db_doorbell_status::DB_DOORBELL_DISCONNECTED_RETRY as u32
        });
        ok(db_cmdbuf_reset(cb));
        ok(db_cmdbuf_write_u32(cb, va + 0x9000, 2));
        ok(db_queue_submit(uq, cb, &mut uv));
        ok(db_queue_finish(uq, WAIT_NS));
        ok(db_buffer_read_u32(b, 0x9000, &mut w));
        assert_eq!(w, 2);
        let after = reconnects;
        ok(db_queue_reconnects(uq, &mut reconnects));
        assert!(reconnects > after, "the submission reconnected by itself");

        for s in [
            db_fence_destroy(pf),
            db_fence_destroy(gate),
            db_fence_destroy(done),
            db_cmdbuf_destroy(cb),
            db_buffer_destroy(b),
            db_queue_destroy(uq),
            db_queue_destroy(kq),
            db_queue_destroy(cq),
            db_context_destroy(ctx),
            db_context_destroy(copy_ctx),
            db_device_destroy(d),
        ] {
            ok(s);
        }
    }
}

fn default_options() -> db_queue_options {
    // SAFETY: a zeroed plain struct is a valid value; it is filled in next.
    let mut o = unsafe { std::mem::zeroed::<db_queue_options>() };
    // SAFETY: a writable output.
    ok(unsafe { db_queue_options_default(&mut o) });
    o
}

/// The handles of one device, made in one go.
struct Set {
    device: *mut db_device,
    context: *mut db_context,
    queue: *mut db_queue,
    buffer: *mut db_buffer,
    fence: *mut db_fence,
    cmdbuf: *mut db_cmdbuf,
}

impl Set {
    fn new() -> Set {
        // SAFETY: writable outputs and the live handles just made.
        unsafe {
            let d = embedded(0);
            let mut s = Set {
                device: d,
                context: null_mut(),
                queue: null_mut(),
                buffer: null_mut(),
                fence: null_mut(),
                cmdbuf: null_mut(),
            };
            ok(db_context_create(d, db_engine_kind::DB_ENGINE_COMPUTE as u32, &mut s.context));
            ok(db_queue_create(s.context, null(), &mut s.queue));
            ok(db_buffer_create(d, 4096, &mut s.buffer));
            ok(db_fence_create(d, 0, 0, 0, &mut s.fence));
            ok(db_cmdbuf_create(&mut s.cmdbuf));
            s
        }
    }

    /// Destroys handle `i` (0 device, 1 context, 2 queue, 3 buffer, 4 fence, 5 cmdbuf).
    fn destroy(&mut self, i: usize) {
        // SAFETY: each handle is live and destroyed once (set to NULL after).
        unsafe {
            ok(match i {
                0 => db_device_destroy(std::mem::replace(&mut self.device, null_mut())),
                1 => db_context_destroy(std::mem::replace(&mut self.context, null_mut())),
                2 => db_queue_destroy(std::mem::replace(&mut self.queue, null_mut())),
                3 => db_buffer_destroy(std::mem::replace(&mut self.buffer, null_mut())),
                4 => db_fence_destroy(std::mem::replace(&mut self.fence, null_mut())),
                _ => db_cmdbuf_destroy(std::mem::replace(&mut self.cmdbuf, null_mut())),
            });
        }
    }

    /// Uses every handle still alive (the device only through those made from it).
    fn use_what_is_left(&self) {
        // SAFETY: only handles that are not NULL (not destroyed) are used.
        unsafe {
            if !self.queue.is_null() && !self.cmdbuf.is_null() && !self.buffer.is_null() && !self.fence.is_null() {
                let mut va = 0;
                ok(db_buffer_va(self.buffer, &mut va));
                ok(db_cmdbuf_reset(self.cmdbuf));
                ok(db_cmdbuf_write_u32(self.cmdbuf, va, 0x77));
                let mut last = 0;
                ok(db_queue_last_submitted(self.queue, &mut last));
                let mut fv = 0;
                ok(db_fence_value(self.fence, &mut fv));
                ok(db_cmdbuf_signal_fence(self.cmdbuf, self.fence, fv + 1));
                let mut v = 0;
                ok(db_queue_submit(self.queue, self.cmdbuf, &mut v));
                assert_eq!(v, last + 1);
                ok(db_queue_wait(self.queue, v, WAIT_NS));
                ok(db_fence_wait(self.fence, fv + 1, WAIT_NS));
                let mut w = 0u32;
                ok(db_buffer_read_u32(self.buffer, 0, &mut w));
                assert_eq!(w, 0x77);
            }
            if !self.buffer.is_null() {
                ok(db_buffer_write_u64(self.buffer, 8, 5));
            }
            if !self.fence.is_null() {
                let mut v = 0;
                ok(db_fence_value(self.fence, &mut v));
                ok(db_fence_signal(self.fence, v + 10));
            }
            if !self.context.is_null() {
                let mut q = null_mut();
                ok(db_queue_create(self.context, null(), &mut q));
                ok(db_queue_destroy(q));
            }
            if !self.queue.is_null() {
                let mut st = std::mem::zeroed::<db_queue_status>();
                ok(db_queue_query_status(self.queue, &mut st));
                assert!(!st.faulted);
            }
        }
    }
}

/// Handles may be destroyed in any order: what is left keeps working (a queue after its
/// device and context are gone, a fence after its device), and nothing is used after it is
/// freed (the allocator would notice, and ASan in examples/c/run.sh would).
#[test]
fn handles_can_be_destroyed_in_any_order_and_what_is_left_keeps_working() {
    let orders: [[usize; 6]; 6] = [
        [0, 1, 2, 3, 4, 5], // the device first, what it made after
        [5, 4, 3, 2, 1, 0], // the usual order: the reverse of creation
        [1, 0, 3, 4, 5, 2], // the queue last, outliving context and device
        [0, 2, 1, 5, 3, 4], // the fence last
        [3, 0, 1, 4, 2, 5], // the buffer first: the queue then runs without it
        [4, 1, 5, 0, 3, 2],
    ];
    for order in orders {
        let mut s = Set::new();
        s.use_what_is_left();
        for (n, &i) in order.iter().enumerate() {
            // A queue whose buffer was freed must not be given packets touching it.
            if i == 3 && !s.queue.is_null() {
                s.destroy(3);
                s.use_what_is_left();
                continue;
            }
            s.destroy(i);
            if n < 5 {
                s.use_what_is_left();
            }
        }
    }
}

/// Several threads use one queue and one command buffer at once: their calls take turns, no
/// submission is lost, and another thread waits on the queue's progress fence meanwhile.
#[test]
fn threads_share_a_queue_and_a_command_buffer() {
    struct Shared(*mut db_queue, *mut db_cmdbuf, *mut db_fence, u64);
    // SAFETY: the handles are Send + Sync (the crate checks it); the pointers are only used
    // while the handles live (the threads are joined before they are destroyed).
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}
    const THREADS: u64 = 4;
    const EACH: u64 = 200;
    // SAFETY (whole test): every pointer is a live handle created here, or a local; the
    // threads are joined before anything is destroyed.
    unsafe {
        let d = embedded(0);
        let (mut ctx, mut q, mut cb, mut b, mut pf) = (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COMPUTE as u32, &mut ctx));
        ok(db_queue_create(ctx, null(), &mut q));
        ok(db_cmdbuf_create(&mut cb));
        ok(db_buffer_create(d, 4096, &mut b));
        ok(db_queue_progress_fence(q, &mut pf));
        let mut va = 0;
        ok(db_buffer_va(b, &mut va));
        let shared = Shared(q, cb, pf, va);
        std::thread::scope(|s| {
            let shared = &shared;
            // The waiter: the queue's progress fence, without the queue's lock.
            s.spawn(move || {
                ok(db_fence_wait(shared.2, THREADS * EACH, WAIT_NS));
            });
            for t in 0..THREADS {
                s.spawn(move || {
                    let mut own = null_mut();
                    ok(db_cmdbuf_create(&mut own));
                    let mut seen = Vec::new();
                    for i in 0..EACH {
                        // Each thread's own slot in the buffer, and the shared command
                        // buffer encoded to concurrently (contents not submitted).
                        ok(db_cmdbuf_reset(own));
                        ok(db_cmdbuf_write_u32(own, shared.3 + 8 * t, i as u32 + 1));
                        ok(db_cmdbuf_nop(shared.1, 1));
                        let mut v = 0;
                        ok(db_queue_submit(shared.0, own, &mut v));
                        seen.push(v);
                    }
                    assert!(seen.windows(2).all(|w| w[0] < w[1]), "values increase within a thread");
                    ok(db_cmdbuf_destroy(own));
                    seen
                });
            }
        });
        ok(db_queue_finish(q, WAIT_NS));
        let mut last = 0;
        ok(db_queue_last_submitted(q, &mut last));
        assert_eq!(last, THREADS * EACH, "every submission got its own value");
        for t in 0..THREADS {
            let mut w = 0u32;
            ok(db_buffer_read_u32(b, 8 * t, &mut w));
            assert_eq!(w as u64, EACH, "thread {t}'s last write");
        }
        let mut n = 0;
        ok(db_cmdbuf_words(cb, null_mut(), 0, &mut n));
        assert_eq!(n as u64, THREADS * EACH, "every NOP encoded once");
        for s in [
            db_fence_destroy(pf),
            db_buffer_destroy(b),
            db_cmdbuf_destroy(cb),
            db_queue_destroy(q),
            db_context_destroy(ctx),
            db_device_destroy(d),
        ] {
            ok(s);
        }
    }
}

/// Two clients of a daemon (in this process) through `db_device_connect`: a user-mode queue
/// runs, and a shareable fence created by one is opened by the other and signalled from its
/// GPU while the first waits.
#[test]
fn two_daemon_clients_share_a_fence_through_the_c_api() {
    let dir = std::env::temp_dir().join(format!("doorbell-capi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("d.sock");
    let daemon = daemon::Daemon::bind(&path, daemon::DaemonConfig::new()).unwrap();
    let stopper = daemon.stopper();
    let server = std::thread::spawn(move || daemon.run());
    let socket = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY (this block): every pointer is a live handle created here, or a local.
    unsafe {
        let (mut a, mut b) = (null_mut(), null_mut());
        ok(db_device_connect(socket.as_ptr(), &mut a));
        ok(db_device_connect(socket.as_ptr(), &mut b));
        let mut shared = null_mut();
        ok(db_fence_create(a, 0, db_fence_type::DB_FENCE_DEFAULT as u32, DB_FENCE_SHAREABLE, &mut shared));
        let mut global = 0;
        ok(db_fence_global_handle(shared, &mut global));
        let mut opened = null_mut();
        ok(db_fence_open(b, global, &mut opened));
        let (mut ctx, mut q, mut cb, mut buf) = (null_mut(), null_mut(), null_mut(), null_mut());
        ok(db_context_create(b, db_engine_kind::DB_ENGINE_COPY as u32, &mut ctx));
        ok(db_queue_create(ctx, null(), &mut q));
        ok(db_buffer_create(b, 4096, &mut buf));
        let mut va = 0;
        ok(db_buffer_va(buf, &mut va));
        ok(db_cmdbuf_create(&mut cb));
        ok(db_cmdbuf_write_u32(cb, va, 0xabcd));
        ok(db_cmdbuf_signal_fence(cb, opened, 3));
        let mut v = 0;
        ok(db_queue_submit(q, cb, &mut v));
        ok(db_fence_wait(shared, 3, WAIT_NS));
        ok(db_queue_wait(q, v, WAIT_NS));
        let mut w = 0;
        ok(db_buffer_read_u32(buf, 0, &mut w));
        assert_eq!(w, 0xabcd);
        for s in [
            db_cmdbuf_destroy(cb),
            db_buffer_destroy(buf),
            db_queue_destroy(q),
            db_context_destroy(ctx),
            db_fence_destroy(opened),
            db_fence_destroy(shared),
            db_device_destroy(b),
            db_device_destroy(a),
        ] {
            ok(s);
        }
    }
    stopper.stop();
    server.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A queue's progress fence outlives the queue: it keeps its last value and is destroyed on
/// its own.
#[test]
fn a_progress_fence_outlives_its_queue() {
    // SAFETY (whole test): every pointer is a live handle created here, or a local.
    unsafe {
        let d = embedded(0);
        let (mut ctx, mut q, mut cb, mut pf) = (null_mut(), null_mut(), null_mut(), null_mut());
        ok(db_context_create(d, db_engine_kind::DB_ENGINE_COPY as u32, &mut ctx));
        ok(db_queue_create(ctx, null(), &mut q));
        ok(db_queue_progress_fence(q, &mut pf));
        ok(db_cmdbuf_create(&mut cb));
        ok(db_cmdbuf_nop(cb, 1));
        let mut v = 0;
        ok(db_queue_submit(q, cb, &mut v));
        ok(db_queue_submit(q, cb, &mut v));
        ok(db_fence_wait(pf, v, WAIT_NS));
        ok(db_queue_destroy(q));
        ok(db_context_destroy(ctx));
        ok(db_device_destroy(d));
        let mut value = 0;
        ok(db_fence_value(pf, &mut value));
        assert_eq!(value, 2);
        ok(db_fence_destroy(pf));
        ok(db_cmdbuf_destroy(cb));
    }
}
