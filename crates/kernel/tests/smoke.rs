//! Smoke tests: both submission paths on the deterministic driver.

mod common;

use std::time::Duration;

use umd::CommandBuffer;

#[test]
fn user_mode_write_data_runs_on_the_sim() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xdead_beef).write_u64(c.buf.va() + 8, 42);
    let v = q.submit(&cb).unwrap();
    q.wait(v, Some(Duration::from_millis(10))).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xdead_beef);
    assert_eq!(c.buf.read_u64(8).unwrap(), 42);
}

#[test]
fn kernel_mode_write_data_runs_on_the_sim() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 7);
    let v = q.submit(&cb).unwrap();
    q.wait(v, Some(Duration::from_millis(10))).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 7);
}
