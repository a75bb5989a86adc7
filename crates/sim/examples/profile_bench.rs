//! Runs `doorbell bench sim`'s scenario alone (no live run, no outputs), for profilers:
//! `cargo run --release -p sim --example profile_bench -- [QUEUES] [MS] [TOP-LEVEL KEYS]`
//! (say `'latency_rows = 0'`).
fn main() {
    let mut args = std::env::args().skip(1);
    let queues: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let ms: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000.0);
    let extra = args.next().unwrap_or_default();
    let text = format!(
        "name = \"bench-sim\"\nduration_ms = {ms}\ndrain_ms = 0\n{extra}\n[device]\nengines = [\"compute\"]\nslots = 8\n\
         [[group]]\nname = \"q\"\ncount = {queues}\n[group.workload]\noutstanding = 2\n[group.commands]\nsynthetic = {{ us = 2 }}\n"
    );
    let plan = sim::Scenario::parse(std::path::Path::new("bench-sim.toml"), &text).expect("scenario");
    let o = sim::run(&plan, 1, &mut |_| {}).expect("run");
    let subs: u64 = o.queues.iter().map(|q| q.submitted).sum();
    println!(
        "events {} submissions {} setup {:.3} s run {:.3} s ({:.0} ns/submission)",
        o.events,
        subs,
        o.setup_seconds,
        o.run_seconds,
        o.run_seconds * 1e9 / subs.max(1) as f64
    );
}
