//! Spec 001 (amdgpu user-mode queues): what the other files did not cover — per-IP support
//! (an engine without user queues, reported per engine by INFO, the UMD choosing per engine).

mod common;

use std::time::Duration;

use abi::EngineKind;
use abi::port::{Invalid, KernelError};
use kernel::SystemConfig;
use umd::{CommandBuffer, QueueOptions, SubmissionKind};

const T: Option<Duration> = Some(Duration::from_millis(50));

fn with_video() -> kernel::System {
    common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy, EngineKind::Video],
            ..gpu::GpuConfig::default()
        },
        ..SystemConfig::default()
    })
}

/// "A GPU may support user queues for GFX, compute, and SDMA, but not for VCN ... UMDs can
/// query this information via the INFO IOCTL and determine whether to use kernel queues or
/// user queues for each IP."
#[test]
fn engines_differ_in_the_queues_they_take_info_reports_it_and_the_umd_picks_per_engine() {
    let sys = with_video();
    let c = common::client(&sys);
    let info = c.device.info();
    let by_kind = |k| info.engines.iter().find(|e| e.kind == k).copied().unwrap();
    let (compute, copy, video) = (by_kind(EngineKind::Compute), by_kind(EngineKind::Copy), by_kind(EngineKind::Video));
    assert!(compute.user_queues && compute.kernel_queues);
    assert!(copy.user_queues && copy.kernel_queues);
    assert!(!video.user_queues && video.kernel_queues, "the video engine takes kernel queues only");
    // A user-mode queue on the video engine is refused with a typed error naming the engine.
    let vctx = c.context(EngineKind::Video);
    let e = vctx.create_queue(QueueOptions::user_mode()).err().expect("refused");
    assert_eq!(common::umd_refusal(&e), Some(("engine", &Invalid::Unsupported("user-mode queues"))), "{e}");
    // The UMD picks per engine.
    let preferred = QueueOptions { kind: SubmissionKind::Preferred, ..QueueOptions::default() };
    let mut vq = vctx.create_queue(preferred).unwrap();
    let mut cq = c.ctx.create_queue(preferred).unwrap();
    assert_eq!((vq.kind(), cq.kind()), (SubmissionKind::KernelMode, SubmissionKind::UserMode));
    // Both run work.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x7e).fill(c.buf.va() + 64, 64, 3);
    let v = vq.submit(&cb).unwrap();
    vq.wait(v, T).unwrap();
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(64).unwrap()), (0x7e, 3));
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0x7f);
    let v = cq.submit(&cb).unwrap();
    cq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0x7f);
    // With user queues only (amdgpu user_queue=2), the video engine takes no queue at all.
    let only = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy, EngineKind::Video],
            ..gpu::GpuConfig::default()
        },
        user_queue_mode: abi::port::UserQueueMode::UserOnly,
        ..SystemConfig::default()
    });
    let oc = common::client(&only);
    let v = oc.device.info().engines.iter().find(|e| e.kind == EngineKind::Video).copied().unwrap();
    assert!(!v.user_queues && !v.kernel_queues);
    let e = oc.context(EngineKind::Video).create_queue(preferred).err().expect("nothing to pick");
    assert!(matches!(e, umd::UmdError::Kernel(KernelError::InvalidArgument { field: "engine", .. })), "{e}");
}
