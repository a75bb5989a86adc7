//! The four example kernels on the deterministic driver, on both submission paths, against
//! their CPU references (bit for bit), at several wave widths and dispatch slice sizes.

mod common;

use runtime::verify::verify_all;

fn check(width: u32, dispatch_budget: u64, size: usize) {
    let sys = common::sim_with(kernel::SystemConfig {
        gpu: gpu::GpuConfig { wave_width: width, dispatch_budget, ..gpu::GpuConfig::default() },
        ..kernel::SystemConfig::default()
    });
    let c = common::client(&sys);
    for mut q in [c.user_queue(), c.kernel_queue()] {
        let results = verify_all(&c.device, &mut q, size);
        assert_eq!(results.len(), 4);
        for (name, r) in results {
            let v =
                r.unwrap_or_else(|e| panic!("{name} (width {width}, budget {dispatch_budget}, {:?}): {e}", q.kind()));
            assert!(v.elements >= 1 && v.dispatches >= 1, "{name}: {v:?}");
        }
    }
}

#[test]
fn examples_match_their_references_on_both_paths() {
    check(32, 16 * 1024, 1000);
}

#[test]
fn examples_match_at_other_wave_widths_and_when_sliced_finely() {
    check(1, 97, 130);
    check(64, 13, 257);
    check(7, 1, 64);
}
