//! A hung kernel under each of the two mechanisms that catch it (issue 25): with
//! `preemption_compute = "shader"` it yields to every preemption request, so TDR never fires,
//! and the hang timer resets it once it has run `hang_compute_ms` without completing
//! (notable `hang timeout`); at `dma_buffer` it cannot yield, and TDR resets it (notable
//! `tdr`). Either way `recoveries` counts the reset, the hung queue ends and the healthy queues
//! finish everything they submitted.

use std::path::Path;

use sim::{Scenario, run};

/// The scenario at `level`: six healthy queues and a victim on four slots of one compute
/// engine, a 10 ms hang timer, the victim's next kernel hung at 10 ms.
fn scenario(level: &str) -> sim::Plan {
    let text = format!(
        r#"
duration_ms = 80
drain_ms = 20
[device]
engines = ["compute"]
slots = 4
preemption_compute = "{level}"
[device.tdr]
delay_ms = 10
hang_compute_ms = 10
[[group]]
name = "healthy"
count = 6
[group.commands]
synthetic = {{ us = 50 }}
[[group]]
name = "victim"
[group.commands]
synthetic = {{ us = 50 }}
[[event]]
at_ms = 10
action = "hang"
group = "victim"
"#
    );
    Scenario::parse(Path::new("hang.toml"), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the scenario at `level`; checks what both mechanisms share and returns the kinds of
/// the kernel's notable events.
fn run_at(level: &str) -> Vec<&'static str> {
    let o = run(&scenario(level), 1, &mut |_| {}).unwrap();
    assert!(o.recoveries >= 1, "{level}: {} recoveries", o.recoveries);
    assert_eq!(o.faults, 1, "{level}: the hung queue, as the kernel saw it");
    let victim = &o.queues[6];
    assert!(victim.ended.is_some(), "{level}: {victim:?}");
    for q in &o.queues[..6] {
        assert!(q.ended.is_none(), "{level}: {q:?}");
        assert_eq!(q.submitted, q.completed, "{level}: {q:?}");
        assert!(q.completed > 100, "{level}: {q:?}");
    }
    o.marks.iter().map(|m| m.kind).collect()
}

#[test]
fn a_hung_kernel_that_yields_is_reset_by_the_hang_timer() {
    let kinds = run_at("shader");
    assert!(kinds.contains(&"hang timeout"), "{kinds:?}");
    assert!(!kinds.contains(&"tdr"), "it answered every request: {kinds:?}");
}

#[test]
fn a_hung_kernel_that_cannot_yield_is_reset_by_tdr() {
    let kinds = run_at("dma_buffer");
    assert!(kinds.contains(&"tdr"), "{kinds:?}");
    assert!(!kinds.contains(&"hang timeout"), "{kinds:?}");
}
