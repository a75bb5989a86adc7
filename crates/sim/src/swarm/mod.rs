//! Swarm testing (issue 27): seeds draw configurations and fault schedules, checkers watch
//! every instant, and every failure is one command to reproduce.
//!
//! As TigerBeetle's VOPR and FoundationDB's simulation do, each seed of
//! `doorbell sim swarm --seeds N [--from S]` draws a whole world ([`draw`]: a device, a
//! population of processes and queues with workloads, and a fault schedule), runs it on the
//! deterministic driver through [`crate::run::run_observed`], and [`check`]'s checkers look at
//! it at every instant: completions exactly once, fences that never go backwards, liveness
//! after the faults, hangs detected where a hang timer runs, hung queues that report their
//! fault (a record, a `DisconnectedAbort` doorbell), an empty census at teardown. A
//! violation names its checker, the instant, the queue's recent history and the command that
//! replays the seed, which gives the same run byte for byte (the simulator's determinism:
//! `tests/determinism.rs`).
//!
//! Each checker has a deliberately broken twin (`--inject`), and a test runs each twin until
//! its checker catches it: a checker that never fires is not a checker.
//!
//! Invariants: a seed's result depends only on the seed and the twin (the seeds run in
//! parallel, and the report lists them in seed order); a run that fails outright (the stack
//! refused what the scenario asked) is a violation too, of `run-completes`.

pub mod check;
pub mod draw;

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;

pub use check::{CHECKERS, Inject, Violation};

/// The checker a failed run is charged to.
pub const RUN_COMPLETES: &str = "run-completes";

/// What one seed did.
#[derive(Clone, Debug)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// The first violation of each checker that fired.
    pub violations: Vec<Violation>,
    /// Instants the checkers looked at.
    pub instants: u64,
    /// Faults applied (scenario events and the swarm's own), per kind.
    pub faults: BTreeMap<String, u64>,
    /// Queues in the drawn world.
    pub queues: usize,
    /// Virtual time the run took (ns).
    pub virtual_ns: u64,
    /// Drawn scenarios the checks refused before this one.
    pub redraws: u32,
}

/// Runs seed `seed` (with twin `inject`) and checks it.
pub fn run_seed(seed: u64, inject: Option<Inject>) -> SeedResult {
    let d = match draw::draw(seed) {
        Ok(d) => d,
        Err(e) => {
            let v = run_failed(seed, inject, format!("no scenario drawn from this seed passed the checks: {e}"));
            let (faults, queues, virtual_ns, redraws) = (BTreeMap::new(), 0, 0, 0);
            return SeedResult { seed, violations: vec![v], instants: 0, faults, queues, virtual_ns, redraws };
        }
    };
    let mut checker = check::Checker::new(seed, &d.plan, &d.faults, inject);
    let mut plan = d.plan.clone();
    if inject == Some(Inject::SilentHangTimer) {
        // The system runs without the timers the checker expects.
        plan.system.tdr.hang_compute = None;
        plan.system.tdr.hang_copy = None;
    }
    let mut faults = BTreeMap::new();
    for (_, a) in &plan.events {
        let kind = match a {
            crate::scenario::Action::Kill { .. } => "kill",
            crate::scenario::Action::Hang { .. } => "hang",
            crate::scenario::Action::D3 => "d3",
            crate::scenario::Action::Suspend { .. } => "suspend",
        };
        *faults.entry(kind.to_string()).or_default() += 1;
    }
    let queues = plan.groups.iter().map(|g| g.count as usize).sum();
    let outcome = crate::run::run_observed(&plan, seed, &mut |_| {}, Some(&mut checker));
    let mut virtual_ns = 0;
    let mut violations = Vec::new();
    match outcome {
        Ok(o) => {
            checker.finish(&o);
            virtual_ns = o.end;
        }
        Err(e) => violations.push(run_failed(seed, inject, format!("the run failed: {e}"))),
    }
    for (k, n) in std::mem::take(&mut checker.applied) {
        *faults.entry(k).or_default() += n;
    }
    violations.extend(checker.violations.values().map(|(v, _)| v.clone()));
    SeedResult { seed, violations, instants: checker.instants, faults, queues, virtual_ns, redraws: d.redraws }
}

/// A `run-completes` violation of seed `seed`: `what` went wrong before any checker could look.
fn run_failed(seed: u64, inject: Option<Inject>, what: String) -> Violation {
    let repro = check::Checker::repro(seed, inject);
    Violation { seed, checker: RUN_COMPLETES, instant_ns: 0, queue: None, what, history: Vec::new(), repro }
}

/// A swarm's request.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seeds to run.
    pub seeds: u64,
    /// The first seed.
    pub from: u64,
    /// Stop starting seeds after this many minutes (wall clock).
    pub minutes: Option<f64>,
    /// The broken twin to run with.
    pub inject: Option<Inject>,
}

/// A swarm's result.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Seeds run, in seed order.
    pub seeds: Vec<SeedResult>,
    /// Seeds asked for but not run (the time limit came first).
    pub skipped: u64,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
}

impl Report {
    /// Every violation, in seed order.
    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.seeds.iter().flat_map(|s| &s.violations)
    }
    /// Instants checked in all.
    pub fn instants(&self) -> u64 {
        self.seeds.iter().map(|s| s.instants).sum()
    }
    /// Faults injected, per kind.
    pub fn faults(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for s in &self.seeds {
            for (k, n) in &s.faults {
                *out.entry(k.clone()).or_default() += n;
            }
        }
        out
    }
    /// The `--json` object (`violations` lists every violation, `known` those of them the
    /// known list names, `fixed` the listed ones that did not happen).
    pub fn json(&self, o: &Options, verdict: &Verdict<'_>) -> serde_json::Value {
        serde_json::json!({
            "passed": verdict.passed(),
            "known": verdict.known.iter().map(|v| serde_json::json!({"seed": v.seed, "checker": v.checker})).collect::<Vec<_>>(),
            "fixed": verdict.fixed.iter().map(|(s, c)| serde_json::json!({"seed": s, "checker": c})).collect::<Vec<_>>(),
            "seeds": self.seeds.len(),
            "from": o.from,
            "skipped": self.skipped,
            "inject": o.inject.map(Inject::name),
            "checkers": CHECKERS.iter().chain([&RUN_COMPLETES]).collect::<Vec<_>>(),
            "violations": self.violations().collect::<Vec<_>>(),
            "instants_checked": self.instants(),
            "faults_injected": self.faults(),
            "queues": self.seeds.iter().map(|s| s.queues).sum::<usize>(),
            "virtual_seconds": self.seeds.iter().map(|s| s.virtual_ns).sum::<u64>() as f64 / 1e9,
            "redraws": self.seeds.iter().map(|s| s.redraws as u64).sum::<u64>(),
            "wall_seconds": self.wall_seconds,
        })
    }
}

/// Runs the seeds of `o` in parallel (rayon), in batches so that a time limit is kept;
/// `done(result)` is called as each seed ends.
pub fn swarm(o: &Options, done: &(dyn Fn(&SeedResult) + Sync)) -> Report {
    let start = Instant::now();
    let batch = (rayon::current_num_threads() as u64 * 4).max(1);
    let mut report = Report::default();
    let mut next = 0u64;
    while next < o.seeds {
        if o.minutes.is_some_and(|m| start.elapsed().as_secs_f64() >= m * 60.0) {
            break;
        }
        let end = (next + batch).min(o.seeds);
        let mut results: Vec<SeedResult> = (next..end)
            .into_par_iter()
            .map(|k| {
                let r = run_seed(o.from.wrapping_add(k), o.inject);
                done(&r);
                r
            })
            .collect();
        results.sort_by_key(|r| r.seed);
        report.seeds.extend(results);
        next = end;
    }
    report.skipped = o.seeds - next;
    report.wall_seconds = start.elapsed().as_secs_f64();
    report
}

/// Violations already known and not yet fixed, each a seed and a checker (a file of
/// `SEED CHECKER` lines, `#` comments): a swarm run against them fails only on a violation
/// not listed, or on a listed one that no longer happens (fixed: take it off the list).
#[derive(Clone, Debug, Default)]
pub struct Known(pub Vec<(u64, String)>);

impl Known {
    /// Parses the file's text; `path` names it in errors.
    pub fn parse(path: &str, text: &str) -> Result<Known, String> {
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(seed), Some(checker), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!("{path}:{}: `{line}`: expected SEED CHECKER", n + 1));
            };
            let seed = seed.parse().map_err(|_| format!("{path}:{}: seed `{seed}` is not a number", n + 1))?;
            if !CHECKERS.contains(&checker) && checker != RUN_COMPLETES {
                return Err(format!("{path}:{}: no checker `{checker}` (one of {})", n + 1, CHECKERS.join(", ")));
            }
            out.push((seed, checker.to_string()));
        }
        Ok(Known(out))
    }
    fn contains(&self, v: &Violation) -> bool {
        self.0.iter().any(|(s, c)| *s == v.seed && c == v.checker)
    }
}

/// A swarm's result held against the known violations.
#[derive(Clone, Debug, Default)]
pub struct Verdict<'a> {
    /// Violations not on the list: failures.
    pub new: Vec<&'a Violation>,
    /// Listed violations that happened again.
    pub known: Vec<&'a Violation>,
    /// Listed (seed, checker) pairs, within the seeds run, that did not fire: fixed.
    pub fixed: Vec<(u64, String)>,
}

impl Verdict<'_> {
    /// Whether the run passes: nothing new, nothing listed that is fixed.
    pub fn passed(&self) -> bool {
        self.new.is_empty() && self.fixed.is_empty()
    }
}

impl Report {
    /// This report against `known`.
    pub fn verdict<'a>(&'a self, known: &Known) -> Verdict<'a> {
        let (known_hit, new): (Vec<_>, Vec<_>) = self.violations().partition(|v| known.contains(v));
        let ran: std::collections::BTreeSet<u64> = self.seeds.iter().map(|s| s.seed).collect();
        let fixed = known
            .0
            .iter()
            .filter(|(s, c)| ran.contains(s) && !known_hit.iter().any(|v| v.seed == *s && v.checker == c))
            .cloned()
            .collect();
        Verdict { new, known: known_hit, fixed }
    }
}

impl std::str::FromStr for Inject {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Inject::ALL.iter().copied().find(|i| i.name() == s).ok_or_else(|| {
            let names: Vec<_> = Inject::ALL.iter().map(|i| i.name()).collect();
            format!("--inject {s}: no such twin (one of {})", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds a twin may take to be caught.
    const CATCH_WITHIN: u64 = 20;

    /// Each broken twin is caught by its checker within a few seeds, on a seed whose run
    /// without the twin that checker passes (so the twin, not the seed, made it fire).
    #[test]
    fn every_twin_is_caught_by_its_checker() {
        let fired = |seed: u64, inject: Option<Inject>, checker: &str| {
            run_seed(seed, inject).violations.iter().any(|v| v.checker == checker)
        };
        for &inject in Inject::ALL {
            let checker = inject.caught_by();
            let caught =
                (0..CATCH_WITHIN).find(|&seed| fired(seed, Some(inject), checker) && !fired(seed, None, checker));
            assert!(caught.is_some(), "{} not caught by {checker} in {CATCH_WITHIN} seeds", inject.name());
        }
    }

    /// Seeds on which the swarm found a bug, each checker it broke, and the fix: the seed
    /// passes that checker now. (Each fix also has a test of its own where the shape is simple
    /// enough to build by hand: `kernel/tests/swarm_regressions.rs`, `spec001.rs`.) A change
    /// to what a seed draws (`draw.rs`) changes these worlds: then find each bug's seed again
    /// with the fix reverted.
    #[test]
    fn seeds_that_found_bugs_pass_now() {
        let found: &[(u64, &str, &str)] = &[
            (10, "census", "a killed process's CPU waits stayed in the kernel"),
            (106, "census", "a killed process's held-back kernel-mode submission left the scheduler's wait"),
            (114, "exactly-once", "a failed reconnect read as a refusal, and the work ran anyway"),
            (117, "exactly-once", "a lost device's queue, not preemptible, ran what it had published before the loss"),
            (408, "hang-detected", "realtime queues blocked on a high-priority one took the only slot in turns"),
            (1519, "liveness", "the same starvation, of a queue behind realtime queues blocked in WAITs"),
            (
                1654,
                "hang-detected",
                "idle kernel queues held every slot while busy ones, hung kernels among them, waited",
            ),
            (1940, "hang-detected", "a hung kernel waiting on a stopped upstream never starts: no timer can catch it"),
            (514, "hang-detected", "the checker: an upstream reset before the hang's bound, noted only after it"),
            (1606, "exactly-once", "a kernel-mode queue waiting on a hung upstream held back its context's others"),
            (1580, "liveness", "a queue blocked in a WAIT it could not leave held a slot its upstream needed"),
            (
                1884,
                "exactly-once",
                "the same with one slot: no quantum can stop it, and with no hang timer nobody asked",
            ),
            (
                56,
                "monotone-fence",
                "a killed consumer wrote AlwaysSignaled into its producer's shared fence, which fell back",
            ),
            (
                19,
                "monotone-fence",
                "a TDR left the guilty device's other queues running: they signalled its fences back down",
            ),
        ];
        for &(seed, checker, bug) in found {
            let r = run_seed(seed, None);
            let v: Vec<_> = r.violations.iter().filter(|v| v.checker == checker).collect();
            assert!(v.is_empty(), "seed {seed} ({bug}): {v:?}");
            assert!(r.instants > 0);
        }
    }

    /// The same seed gives the same result.
    #[test]
    fn a_seed_replays() {
        let a = run_seed(3, None);
        let b = run_seed(3, None);
        assert_eq!(a.instants, b.instants);
        assert_eq!(a.virtual_ns, b.virtual_ns);
        assert_eq!(a.faults, b.faults);
        assert_eq!(format!("{:?}", a.violations), format!("{:?}", b.violations));
        assert!(a.instants > 0);
    }

    #[test]
    fn a_known_list_parses_names_its_errors_and_judges_a_report() {
        let k = Known::parse("k.txt", "# open\n7 liveness  # why\n\n9 census\n").unwrap();
        assert_eq!(k.0, vec![(7, "liveness".to_string()), (9, "census".to_string())]);
        let e = Known::parse("k.txt", "7\n").unwrap_err();
        assert!(e.contains("k.txt:1") && e.contains("SEED CHECKER"), "{e}");
        let e = Known::parse("k.txt", "x census\n").unwrap_err();
        assert!(e.contains("seed `x`"), "{e}");
        let e = Known::parse("k.txt", "3 nothing\n").unwrap_err();
        assert!(e.contains("no checker `nothing`"), "{e}");
        let v = |seed, checker| Violation {
            seed,
            checker,
            instant_ns: 0,
            queue: None,
            what: String::new(),
            history: Vec::new(),
            repro: String::new(),
        };
        let seed = |s: u64, vs: Vec<Violation>| SeedResult {
            seed: s,
            violations: vs,
            instants: 1,
            faults: BTreeMap::new(),
            queues: 1,
            virtual_ns: 1,
            redraws: 0,
        };
        // 7 fires as listed, 8 fires unlisted, 9 is listed but passes; 11 is listed, not run.
        let k = Known::parse("k", "7 liveness\n9 census\n11 census\n").unwrap();
        let r = Report {
            seeds: vec![seed(7, vec![v(7, "liveness")]), seed(8, vec![v(8, "census")]), seed(9, vec![])],
            ..Report::default()
        };
        let verdict = r.verdict(&k);
        assert_eq!(verdict.known.len(), 1);
        assert_eq!(verdict.new.iter().map(|v| v.seed).collect::<Vec<_>>(), vec![8]);
        assert_eq!(verdict.fixed, vec![(9, "census".to_string())]);
        assert!(!verdict.passed());
        let only_known = Report { seeds: vec![seed(7, vec![v(7, "liveness")])], ..Report::default() };
        assert!(only_known.verdict(&k).passed());
    }

    #[test]
    fn inject_names_parse_and_unknown_ones_are_refused() {
        for &i in Inject::ALL {
            assert_eq!(i.name().parse::<Inject>(), Ok(i));
        }
        let e = "lost".parse::<Inject>().unwrap_err();
        assert!(e.contains("lost") && e.contains("lost-completions"), "{e}");
    }
}
