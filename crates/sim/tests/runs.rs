//! Runs on the real stack: the cost model's hand-computed completion times, determinism,
//! and each workload kind, dependency and event doing what it says.

use std::path::Path;

use sim::{Scenario, run, run_to_dir};

fn plan(text: &str) -> sim::Plan {
    Scenario::parse(Path::new("test.toml"), text).unwrap_or_else(|e| panic!("{e}"))
}

/// One queue, one command buffer outstanding, a 10 µs synthetic kernel; packets cost 50 ns.
/// Each command buffer is SYNTHETIC (10,000 ns + 50 ns) then PROGRESS_FENCE (50 ns): it ends
/// 10,100 ns after it starts, and the next starts when it ends (no think time). So the k-th
/// completes at k × 10,100 ns, and every latency is 10,100 ns.
#[test]
fn the_cost_model_gives_hand_computed_completion_times() {
    let p = plan(
        r#"
submissions = 3
[cost]
packet_ns = 50
[[group]]
name = "q"
[group.commands]
synthetic = { us = 10 }
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.latencies[0], vec![10_100, 10_100, 10_100]);
    assert_eq!(o.end, 30_300);
    // Two outstanding, a 2 µs think time: the first two run back to back (10,100 and 20,200),
    // the third is submitted at 10,100 + 2,000 = 12,100 and starts when the second ends
    // (20,200), ending at 30,300: latency 18,200.
    let p = plan(
        r#"
submissions = 3
[cost]
packet_ns = 50
[[group]]
name = "q"
[group.workload]
outstanding = 2
think_us = 2
[group.commands]
synthetic = { us = 10 }
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.latencies[0], vec![10_100, 20_200, 18_200]);
    // A doorbell-to-fetch latency of 300 ns: the firmware sees each ring 300 ns after it is
    // written, so every command buffer takes 300 + 10,100 ns from its submission.
    let p = plan(
        r#"
submissions = 3
[cost]
packet_ns = 50
doorbell_latency_ns = 300
[[group]]
name = "q"
[group.commands]
synthetic = { us = 10 }
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.latencies[0], vec![10_400, 10_400, 10_400]);
    assert_eq!(o.end, 31_200);
    // A FILL of 64,000 bytes at 32,000 bytes/µs costs 2,000 ns + 50; with the fence, 2,100.
    let p = plan(
        r#"
submissions = 2
[[group]]
name = "q"
[group.commands]
fill_bytes = 64000
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.latencies[0], vec![2_100, 2_100]);
}

/// A turn is 100 µs: a 250 µs synthetic kernel runs in three turns, but with one queue the
/// engine goes straight on, so it still ends at 250,000 + 3 × 50 (the packet is paid per
/// slice) + 50 (the fence).
#[test]
fn a_long_synthetic_kernel_runs_in_turns() {
    let p = plan(
        r#"
submissions = 1
[[group]]
name = "q"
[group.commands]
synthetic = { us = 250 }
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.latencies[0], vec![250_200]);
}

/// The simulator tells the device when a client next acts, so a ring cuts into a turn in
/// progress as on the live driver: a high-priority queue's 1 µs jobs, submitted every 500 µs
/// beside a low-priority queue running 2 ms kernels in 1 ms turns, start when they are rung
/// (a few packets' cost later), not when the low queue's turn ends.
#[test]
fn a_high_priority_ring_cuts_into_a_long_turn() {
    let p = plan(
        r#"
duration_ms = 5
[device]
slots = 2
[cost]
turn_us = 1000
[[group]]
name = "low"
priority = "low"
[group.commands]
synthetic = { us = 2000 }
[[group]]
name = "high"
priority = "high"
[group.workload]
kind = "periodic"
period_us = 500
[group.commands]
synthetic = { us = 1 }
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let high = &o.latencies[1];
    assert!(high.len() >= 9, "{high:?}");
    assert!(high.iter().all(|&l| l <= 2_000), "latencies (ns): {high:?}");
}

const MIXED: &str = r#"
name = "mixed"
duration_ms = 2
[device]
doorbell_pool = 3
[[group]]
name = "closed"
count = 4
[group.workload]
outstanding = 2
[group.commands]
synthetic = { dist = "exponential", us = 15 }
write_data = 1
[[group]]
name = "poisson"
count = 3
priority = "high"
after = "closed"
[group.workload]
kind = "poisson"
rate_per_s = 20000
[group.commands]
synthetic = { dist = "uniform", min_us = 1, max_us = 5 }
[[group]]
name = "km"
path = "kernel"
engine = "copy"
[group.workload]
kind = "bursts"
burst_size = 3
burst_period_us = 300
[group.commands]
fill_bytes = 4096
"#;

#[test]
fn the_same_scenario_and_seed_give_byte_identical_outputs() {
    let p = plan(MIXED);
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    run_to_dir(&p, 5, a.path(), &mut |_| {}).unwrap();
    run_to_dir(&p, 5, b.path(), &mut |_| {}).unwrap();
    run_to_dir(&p, 6, c.path(), &mut |_| {}).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(a.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    for n in ["summary.json", "queues.csv", "trace.json"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    for n in &names {
        let x = std::fs::read(a.path().join(n)).unwrap();
        let y = std::fs::read(b.path().join(n)).unwrap();
        assert!(x == y, "{n:?} differs between two runs with the same seed");
    }
    // Another seed draws other durations.
    let x = std::fs::read(a.path().join("queues.csv")).unwrap();
    let z = std::fs::read(c.path().join("queues.csv")).unwrap();
    assert_ne!(x, z, "seed 6 gave the same run as seed 5");
}

#[test]
fn every_workload_kind_completes_without_loss() {
    let p = plan(MIXED);
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let s = sim::output::summary(&p, &o);
    assert_eq!(s["lost"], 0, "{s:#}");
    for g in ["closed", "poisson", "km"] {
        assert!(s["latency_by_class"][g]["completed"].as_u64().unwrap() > 0, "{g}: {s:#}");
    }
    // Poisson at 20,000/s for 2 ms: about 40 per queue.
    let poisson: u64 = o.queues.iter().filter(|q| q.group == 1).map(|q| q.submitted).sum();
    assert!((60..=200).contains(&poisson), "{poisson}");
    // Bursts of 3 every 300 µs over 2 ms: 7 bursts.
    assert_eq!(o.queues.iter().filter(|q| q.group == 2).map(|q| q.submitted).sum::<u64>(), 21);
    // A pool of 3 doorbells for 7 user-mode queues: victimization happens.
    assert!(s["victimizations"].as_u64().unwrap() > 0, "{s:#}");
}

#[test]
fn a_trace_file_drives_submissions() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), "at_us,queue,synthetic_us\n0,0,5\n30,1,5\n10,0,7\n").unwrap();
    let path = dir.path().join("s.toml");
    let text =
        "duration_ms = 1\n[[group]]\nname = \"t\"\ncount = 2\n[group.workload]\nkind = \"trace\"\nfile = \"t.csv\"\n";
    std::fs::write(&path, text).unwrap();
    let p = Scenario::load(&path).unwrap();
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.queues[0].submitted, 2);
    assert_eq!(o.queues[1].submitted, 1);
    // Queue 1 alone at 30 µs: 5,000 + 50 + 50; queue 0's second, alone at 10 µs: 7,100.
    assert_eq!(o.queues[1].latency_max, 5_100);
    assert_eq!(o.latencies[0], vec![5_100, 7_100, 5_100]);
    // A row naming a queue outside the group is refused with the file and line.
    std::fs::write(dir.path().join("t.csv"), "0,0,5\n1,9,5\n").unwrap();
    let e = Scenario::load(&path).unwrap_err().to_string();
    assert!(e.contains("t.csv:2") && e.contains("1,9,5"), "{e}");
}

#[test]
fn a_killed_process_loses_only_its_own_work() {
    let p = plan(
        r#"
duration_ms = 1
[[group]]
name = "a"
count = 2
queues_per_process = 1
[group.workload]
outstanding = 4
[group.commands]
synthetic = { us = 20 }
[[event]]
at_ms = 0.3
action = "kill"
group = "a"
queue = 1
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert!(o.queues[1].ended.as_deref() == Some("process killed"), "{:?}", o.queues[1]);
    assert!(o.queues[0].ended.is_none(), "{:?}", o.queues[0]);
    assert_eq!(o.queues[0].submitted, o.queues[0].completed);
    assert!(o.queues[1].submitted > o.queues[1].completed);
}

/// A hung kernel among healthy queues at `dma_buffer` granularity: the hang timer's
/// preemption request is not answered, TDR resets, the hung queue ends, the others finish.
#[test]
fn a_hung_kernel_is_recovered_by_tdr_and_the_others_finish() {
    let p = plan(
        r#"
duration_ms = 30
drain_ms = 50
[device]
slots = 2
preemption_compute = "dma_buffer"
[device.tdr]
delay_ms = 5
hang_compute_ms = 5
[[group]]
name = "healthy"
count = 3
[group.commands]
synthetic = { us = 50 }
[[group]]
name = "victim"
[group.commands]
synthetic = { us = 50 }
[[event]]
at_ms = 1
action = "hang"
group = "victim"
"#,
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let s = sim::output::summary(&p, &o);
    assert!(s["recoveries"].as_u64().unwrap() >= 1, "{s:#}");
    assert!(o.queues[3].ended.is_some(), "{:?}", o.queues[3]);
    for q in &o.queues[..3] {
        assert_eq!(q.submitted, q.completed, "{q:?}");
        assert!(q.completed > 100, "{q:?}");
    }
}

/// A kernel call on the control path (`cost.kernel_call_ns`): the call returns, and takes
/// effect, that long after the client made it, and a queue's client makes one call at a time.
/// Two outstanding command buffers per queue, each a 10 µs `SYNTHETIC` (10,100 ns with the
/// progress fence), four in all.
///
/// A kernel-mode queue, 3 µs calls: the first two are due at 0; the first call lands at 3,000
/// and runs to 13,100; the second lands at 6,000 and runs after it, to 23,200. The third is due
/// at 13,100 (the first's completion), lands at 16,100 and runs 23,200 to 33,300 (20,200); the
/// fourth, due at 23,200, runs 33,300 to 43,400 (20,200).
///
/// A user-mode queue whose doorbell asks for a notification (`notify_on_submit`), 25 µs
/// calls: the ring comes before the call, so the first runs 0 to 10,100 at once, but its
/// client is in the call until 25,000: the second goes then and ends at 35,100. The third, due
/// at 10,100, waits for the second's call (until 50,000) and ends at 60,100 (50,000); the
/// fourth, due at 35,100, waits until 75,000 and ends at 85,100 (50,000).
#[test]
fn a_kernel_call_takes_its_time_on_the_control_path() {
    let text = |path: &str, notify: bool, call: u32| {
        format!(
            "submissions = 4\n[device]\nnotify_on_submit = {notify}\n[cost]\npacket_ns = 50\nkernel_call_ns = {call}\n\
             [[group]]\nname = \"q\"\npath = \"{path}\"\n[group.workload]\noutstanding = 2\n\
             [group.commands]\nsynthetic = {{ us = 10 }}\n"
        )
    };
    let o = run(&plan(&text("kernel", false, 0)), 1, &mut |_| {}).unwrap();
    assert_eq!((o.latencies[0].clone(), o.end), (vec![10_100, 20_200, 20_200, 20_200], 40_400), "free calls");
    let o = run(&plan(&text("kernel", false, 3_000)), 1, &mut |_| {}).unwrap();
    assert_eq!((o.latencies[0].clone(), o.end), (vec![13_100, 23_200, 20_200, 20_200], 43_400));
    let o = run(&plan(&text("user", true, 25_000)), 1, &mut |_| {}).unwrap();
    assert_eq!((o.latencies[0].clone(), o.end), (vec![10_100, 35_100, 50_000, 50_000], 85_100));
}

/// A closed loop deeper than its ring holds (200 outstanding, about 110 fit a 4 KiB ring)
/// keeps exactly 200 command buffers in the system: the rest wait in the client's backlog.
/// Each takes 1,100 ns (a 1 µs `SYNTHETIC`, two packets), so once the loop is full every
/// latency is 200 × 1,100 = 220,000 ns, plus the 50 ns a synthetic kernel cut by the end of
/// a turn pays again when it resumes (at most a few per 220 µs).
#[test]
fn a_closed_loop_deeper_than_its_ring_keeps_its_depth() {
    let p = plan(
        "duration_ms = 5\ndrain_ms = 0\n[cost]\npacket_ns = 50\n[[group]]\nname = \"q\"\n\
         [group.workload]\noutstanding = 200\n[group.commands]\nsynthetic = { us = 1 }\n",
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let l = &o.latencies[0];
    assert!(l.len() > 4000, "{}", l.len());
    for (k, &x) in l[..200].iter().enumerate() {
        let due = (k as u64 + 1) * 1_100;
        assert!((due..=due + 500).contains(&x), "{x}: the loop fills, one after the other");
    }
    for &x in &l[200..] {
        assert!((220_000..=220_500).contains(&x), "{x}: more than 200 in the loop");
    }
}

/// `preemptions` and `recoveries` are the firmware's exact counts, not what its log (the last
/// 4,096 entries) still holds: two always-busy queues of one process trade one slot every
/// 100 µs gang quantum, each trade a preemption (request, save, answer, restore: four log
/// entries), thousands of them. With an endless kernel each (granularity `shader`: they stop
/// inside it), every slot change but the first mapping is one preemption. Beside a hung kernel
/// reset early in the run, as many trades push the reset out of the log: it is still counted.
#[test]
fn preemptions_and_recoveries_are_counted_past_the_firmware_log() {
    let busy = r#"
duration_ms = 300
drain_ms = 0
[device]
engines = ["compute"]
slots = 1
gang_quantum_us = 100
[[group]]
name = "busy"
count = 2
queues_per_process = 2
[group.commands]
synthetic = { us = 10000000 }
"#;
    let o = run(&plan(busy), 1, &mut |_| {}).unwrap();
    assert!(o.preemptions > 2000, "{} preemptions: about 8,000 log entries", o.preemptions);
    assert_eq!(o.preemptions, o.slot_changes - 1, "{} preemptions, {} slot changes", o.preemptions, o.slot_changes);
    assert_eq!(o.recoveries, 0);

    let hung = r#"
duration_ms = 300
drain_ms = 0
[device]
engines = ["compute"]
slots = 1
gang_quantum_us = 100
preemption_compute = "dma_buffer"
[device.tdr]
delay_ms = 2
hang_compute_ms = 2
[[group]]
name = "victim"
[group.commands]
synthetic = { us = 20 }
[[group]]
name = "busy"
count = 2
queues_per_process = 2
[group.workload]
outstanding = 16
[group.commands]
synthetic = { us = 20 }
[[event]]
at_ms = 0.1
action = "hang"
group = "victim"
"#;
    let o = run(&plan(hung), 1, &mut |_| {}).unwrap();
    assert!(o.preemptions > 2000, "{} preemptions after the reset", o.preemptions);
    assert_eq!(o.recoveries, 1, "the hung kernel's reset");
    assert_eq!(o.faults, 1, "the hung queue, as the kernel saw it");
    assert!(o.queues[0].ended.is_some(), "{:?}", o.queues[0]);
}

/// Spec 002's interrupt suppression: fence signals interrupt the CPU only for a waiter.
#[test]
fn fence_signals_interrupt_only_when_a_cpu_waits() {
    let text = |waiter: bool| {
        format!(
            "duration_ms = 1\n[[group]]\nname = \"a\"\ncount = 2\n[group.workload]\ncpu_waiter = {waiter}\n\
             [group.commands]\nsynthetic = {{ us = 20 }}\nsignal = true\n"
        )
    };
    let quiet = run(&plan(&text(false)), 1, &mut |_| {}).unwrap();
    let waited = run(&plan(&text(true)), 1, &mut |_| {}).unwrap();
    let signals: u64 = waited.queues.iter().map(|q| q.completed).sum();
    assert!(signals > 20, "{signals}");
    assert_eq!(quiet.interrupts, 0);
    // One interrupt per waited signal (a wait already satisfied at its start needs none).
    assert!(waited.interrupts >= signals / 2 && waited.interrupts <= signals, "{} of {signals}", waited.interrupts);
    // A waiter without a fence to wait for is refused.
    let e = Scenario::parse(
        Path::new("w.toml"),
        "duration_ms = 1\n[[group]]\nname = \"a\"\n[group.workload]\ncpu_waiter = true\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("w.toml:5") && e.contains("cpu_waiter"), "{e}");
}

/// Slot switches cost device time: two processes' queues over one slot rotate at every
/// process quantum, each rotation restoring a queue stopped inside its synthetic kernel; with
/// a restore cost the same work completes less within the window, and the difference is
/// what the restores cost.
#[test]
fn restores_after_a_slot_switch_cost_device_time() {
    let text = |restore: u32| {
        format!(
            "duration_ms = 5\n[device]\nengines = [\"compute\"]\nslots = 1\nprocess_quantum_us = 200\n\
             [cost]\nrestore_cb_ns = {restore}\nrestore_packet_ns = {restore}\nrestore_inside_ns = {restore}\n\
             [[group]]\nname = \"a\"\ncount = 2\nqueues_per_process = 1\n[group.commands]\nsynthetic = {{ us = 500 }}\n"
        )
    };
    let free = run(&plan(&text(0)), 1, &mut |_| {}).unwrap();
    let costly = run(&plan(&text(50_000)), 1, &mut |_| {}).unwrap();
    let done = |o: &sim::Outcome| o.queues.iter().map(|q| q.completed_in_window).sum::<u64>();
    assert!(free.preemptions > 0, "the queues rotate");
    assert!(done(&costly) < done(&free), "{} vs {}", done(&costly), done(&free));
}

/// The example the simulator found a scheduler stall with (`examples/sim/gang-rotation.toml`):
/// consumers of one process wait on the GPU for producers of another, over two slots. Blocked
/// consumers used to keep their slots while their producers never got one again (seed 0 lost
/// 60 command buffers at the end of the drain); now a holder blocked in a `WAIT` yields its
/// slot and sleeps until the `WAIT` passes, and nothing is lost, whatever the interleaving.
#[test]
fn consumers_blocked_on_producers_never_stall_them() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = Scenario::load(&root.join("examples/sim/gang-rotation.toml")).unwrap();
    for seed in 0..8 {
        let o = run(&p, seed, &mut |_| {}).unwrap();
        let s = sim::output::summary(&p, &o);
        assert_eq!(s["lost"], 0, "seed {seed}: {s:#}");
        assert!(o.queues.iter().all(|q| q.ended.is_none() && q.submitted == q.completed), "seed {seed}");
    }
}

/// 10,000 queues and 10,000,000 submissions, all completed (about 6 s in release on 2
/// cores): behind `--ignored`, which CI runs in release.
#[test]
#[ignore = "long: `cargo test --release -- --ignored` (CI runs it separately)"]
fn ten_thousand_queues_and_ten_million_submissions_complete() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = Scenario::load(&root.join("examples/sim/ten-million.toml")).unwrap();
    let o = run(&p, 1, &mut |_| {}).unwrap();
    assert_eq!(o.queues.len(), 10_000);
    let (s, c): (u64, u64) = o.queues.iter().fold((0, 0), |(s, c), q| (s + q.submitted, c + q.completed));
    assert_eq!((s, c), (10_000_000, 10_000_000));
}

/// One queue over 1 ms that submits `us` of synthetic work every 100 µs; `top` goes first.
fn ticking(us: u32, top: &str) -> sim::Plan {
    plan(&format!(
        "duration_ms = 1\n{top}[[group]]\nname = \"tick\"\n[group.workload]\nkind = \"periodic\"\nperiod_us = 100\n[group.commands]\nsynthetic = {{ us = {us} }}\n"
    ))
}

/// The submission window is half-open, `[0, duration)`: a periodic queue with a 100 µs period
/// over 1 ms submits at 0, 100, …, 900 µs (10 times), not also at 1,000 µs; and a completion
/// exactly at the window's end is outside it.
#[test]
fn the_submission_window_is_half_open() {
    let o = run(&ticking(1, ""), 1, &mut |_| {}).unwrap();
    assert_eq!(o.queues[0].submitted, 10);
    assert_eq!(o.queues[0].completed, 10);
    assert_eq!(o.queues[0].completed_in_window, 10);
}

/// `timeseries.csv`'s busy share: a queue that runs 25 µs of work every 100 µs keeps its
/// engine busy a quarter of each 100 µs bucket (plus the packets' own cost), the other engine
/// not at all; and the buckets' busy time adds up to the run's.
#[test]
fn the_time_series_busy_share_is_the_engines_executing_time() {
    let o = run(&ticking(25, "samples = 10\n"), 1, &mut |_| {}).unwrap();
    let csv = sim::output::timeseries_csv(&o);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "t_ns,width_ns,completions,slots_held:compute,slots_held:copy,busy_share:compute,busy_share:copy"
    );
    let rows: Vec<Vec<f64>> = lines.map(|l| l.split(',').map(|x| x.parse().unwrap()).collect()).collect();
    // Ten buckets over the window, and one for the drain (the last command buffer ends after).
    assert_eq!(rows.len(), 11);
    for r in &rows[..10] {
        assert_eq!((r[1], r[2]), (100_000.0, 1.0), "{r:?}");
        assert!((0.25..0.26).contains(&r[5]), "compute busy share {r:?}");
        assert_eq!(r[6], 0.0, "copy {r:?}");
    }
    let total: f64 = rows.iter().map(|r| r[1] * r[5]).sum();
    assert!((total - o.busy_end_ns[0] as f64).abs() < 10.0 * rows.len() as f64, "{total} vs {:?}", o.busy_end_ns);
}
