//! dev
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let plan = sim::Scenario::load(std::path::Path::new(&path)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let t = std::time::Instant::now();
    let (o, _s) = sim::run_to_dir(&plan, plan.seed, std::path::Path::new("/tmp/simout"), &mut |_| {}).unwrap();
    eprintln!("wall {:?} events {}", t.elapsed(), o.events);
}
