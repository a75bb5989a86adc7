//! Regressions for bugs `doorbell sim swarm` found (issue 27), one test each; each fails
//! without its fix. (The kernel queue that took a one-slot engine's last slot from a user queue
//! is `spec001::a_kernel_queue_never_takes_the_last_slot_from_user_queues`.)

mod common;

use abi::port::KernelPort;
use abi::port::{NativeFenceType, WaitMode};
use kernel::Termination;

/// A process killed while a thread of it was blocked in a CPU fence wait takes the wait with
/// it: the kernel's census counts none afterwards. Before the fix
/// the waits' entries stayed forever (the census checker's "holds N waits").
#[test]
fn a_process_killed_in_its_waits_leaves_no_wait_behind() {
    let sys = common::sim();
    let base = sys.census();
    let port = sys.open_process().unwrap();
    let pid = port.process();
    let c = common::client_on(port.clone());
    let fence = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let fence_wait = sys.begin_fence_wait(pid, &[(fence.handle(), 5)], WaitMode::All).unwrap();
    assert!(fence_wait.is_some(), "the fence is at 0: the wait blocks");
    assert_eq!(sys.census().waits, base.waits + 1);
    // The process dies; its thread never ends its wait.
    port.terminate(Termination::Abnormal);
    drop((fence_wait, fence, c));
    let after = sys.census();
    assert_eq!(after.waits, base.waits, "no wait outlives its process");
    assert_eq!(after.processes, base.processes);
}
