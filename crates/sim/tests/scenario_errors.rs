//! A bad scenario is refused before anything runs, naming the file, line, key and value.

use std::path::Path;

use sim::{Scenario, ScenarioError};

fn refuse(text: &str) -> (usize, String, String, String) {
    match Scenario::parse(Path::new("bad.toml"), text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(ScenarioError::Invalid { file, line, key, value, why }) => {
            assert_eq!(file, "bad.toml");
            (line, key, value, why)
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

const GOOD: &str = r#"
duration_ms = 1
[[group]]
name = "a"
count = 2
"#;

#[test]
fn a_good_scenario_parses() {
    let p = Scenario::parse(Path::new("good.toml"), GOOD).unwrap();
    assert_eq!(p.name, "good");
    assert_eq!(p.groups[0].count, 2);
    assert_eq!(p.duration, Some(1_000_000));
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let (line, key, value, why) = refuse("duration_ms = 1\nsloots = 4\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (2, "sloots", "4"), "{why}");
    assert!(why.contains("unknown field"), "{why}");
    let (line, key, _, _) =
        refuse("duration_ms = 1\n[device]\nslots = 4\nengine = [\"compute\"]\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str()), (4, "engine"));
}

#[test]
fn a_wrong_type_is_named() {
    let (line, key, value, why) = refuse("duration_ms = 1\n[device]\nslots = \"eight\"\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (3, "slots", "\"eight\""), "{why}");
    assert!(why.contains("invalid type"), "{why}");
}

#[test]
fn a_negative_rate_is_refused() {
    let text = "duration_ms = 1\n[[group]]\nname = \"a\"\n[group.workload]\nkind = \"poisson\"\nrate_per_s = -5.0\n";
    let (line, key, value, why) = refuse(text);
    assert_eq!(line, 6);
    assert!(key.contains("workload.rate_per_s") && key.contains("\"a\""), "{key}");
    assert_eq!(value, "-5");
    assert!(why.contains("at least 0"), "{why}");
}

#[test]
fn an_engine_the_device_lacks_is_refused() {
    let text = "duration_ms = 1\n[device]\nengines = [\"compute\"]\n[[group]]\nname = \"a\"\nengine = \"copy\"\n";
    let (line, key, value, why) = refuse(text);
    assert_eq!((line, value.as_str()), (6, "copy"));
    assert!(key.starts_with("group.engine"), "{key}");
    assert!(why.contains("no such engine"), "{why}");
}

#[test]
fn a_dependency_cycle_is_refused() {
    let text = "duration_ms = 1\n[[group]]\nname = \"a\"\nafter = \"b\"\n[[group]]\nname = \"b\"\nafter = \"c\"\n[[group]]\nname = \"c\"\nafter = \"a\"\n";
    let (line, key, value, why) = refuse(text);
    assert_eq!((line, value.as_str()), (4, "b"));
    assert!(key.starts_with("group.after"), "{key}");
    assert!(why.contains("cycle"), "{why}");
    // A dependency on a group that does not exist.
    let (line, _, value, why) = refuse("duration_ms = 1\n[[group]]\nname = \"a\"\nafter = \"zz\"\n");
    assert_eq!((line, value.as_str()), (4, "zz"), "{why}");
}

#[test]
fn events_name_existing_groups_and_queues() {
    let text = "duration_ms = 1\n[[group]]\nname = \"a\"\ncount = 2\n[[event]]\nat_ms = 0.5\naction = \"kill\"\ngroup = \"a\"\nqueue = 2\n";
    let (line, key, value, _) = refuse(text);
    assert_eq!((line, key.as_str(), value.as_str()), (9, "event.queue", "2"));
    let text =
        "duration_ms = 1\n[[group]]\nname = \"a\"\n[[event]]\nat_ms = 0.5\naction = \"explode\"\ngroup = \"a\"\n";
    let (line, key, value, _) = refuse(text);
    assert_eq!((line, key.as_str(), value.as_str()), (6, "event.action", "explode"));
}

#[test]
fn other_ranges_are_checked() {
    let (_, key, value, _) = refuse("[[group]]\nname = \"a\"\n");
    assert_eq!((key.as_str(), value.as_str()), ("duration_ms", "(missing)"));
    let (line, key, ..) = refuse("duration_ms = 1\n[[group]]\nname = \"a\"\nring_bytes = 5000\n");
    assert_eq!(line, 4);
    assert!(key.contains("ring_bytes"));
    let (line, key, value, _) =
        refuse("duration_ms = 1\n[device]\ndoorbell_model = \"global\"\ndoorbell_pool = 4\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (4, "device.doorbell_pool", "4"));
    let (line, key, value, _) = refuse("duration_ms = -1\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (1, "duration_ms", "-1"));
}

/// Issue 11: zero or absurd TDR timeouts are refused with the key, its line and the value.
#[test]
fn zero_or_absurd_tdr_settings_are_refused() {
    for (setting, key, value) in [
        ("delay_ms = 0", "device.tdr.delay_ms", "0"),
        ("delay_ms = 1e9", "device.tdr.delay_ms", "1000000000"),
        ("ddi_delay_ms = 4000000", "device.tdr.ddi_delay_ms", "4000000"),
        ("limit_time_ms = 0", "device.tdr.limit_time_ms", "0"),
        ("hang_compute_ms = 1e12", "device.tdr.hang_compute_ms", "1000000000000"),
        ("limit_count = 0", "device.tdr.limit_count", "0"),
        ("limit_count = 5000", "device.tdr.limit_count", "5000"),
    ] {
        let text = format!("duration_ms = 1\n[device.tdr]\n{setting}\n[[group]]\nname = \"a\"\n");
        let (line, k, v, why) = refuse(&text);
        assert_eq!((line, k.as_str(), v.as_str()), (3, key, value), "{setting}: {why}");
    }
    // Zero turns a hang timer off: accepted.
    Scenario::parse(Path::new("ok.toml"), "duration_ms = 1\n[device.tdr]\nhang_copy_ms = 0\n[[group]]\nname = \"a\"\n")
        .unwrap();
}

/// More client processes than the device has doorbell pages for is refused at load, naming
/// the key to change and its value, not as a kernel error once the run has started.
#[test]
fn more_processes_than_doorbell_pages_is_refused_at_load_naming_queues_per_process() {
    let text = "duration_ms = 1\n[[group]]\nname = \"a\"\ncount = 100\nqueues_per_process = 1\n[group.commands]\nsynthetic = { us = 10 }\n";
    let e = sim::Scenario::parse(std::path::Path::new("many.toml"), text).unwrap_err().to_string();
    assert!(e.contains("many.toml:5") && e.contains("queues_per_process") && e.contains("= 1"), "{e}");
    assert!(e.contains("need 100 client processes") && e.contains("holds 63") && e.contains("at most 256"), "{e}");
    // Two per process fit (50 processes).
    let text = text.replace("queues_per_process = 1", "queues_per_process = 2");
    sim::Scenario::parse(std::path::Path::new("many.toml"), &text).unwrap();
}

#[test]
fn a_warm_up_as_long_as_the_window_is_refused() {
    let (line, key, value, why) = refuse("duration_ms = 1\nwarmup_ms = 1\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (2, "warmup_ms", "1"), "{why}");
    assert!(why.contains("less than duration_ms (1)"), "{why}");
    let (line, key, value, _) = refuse("duration_ms = 2\nwarmup_ms = 2.5\n[[group]]\nname = \"a\"\n");
    assert_eq!((line, key.as_str(), value.as_str()), (2, "warmup_ms", "2.5"));
    let (_, key, value, why) = refuse("duration_ms = 2\nwarmup_ms = -1\n[[group]]\nname = \"a\"\n");
    assert_eq!((key.as_str(), value.as_str()), ("warmup_ms", "-1"), "{why}");
    // Shorter than the window, or a run bounded by count only: accepted.
    let p =
        Scenario::parse(Path::new("ok.toml"), "duration_ms = 2\nwarmup_ms = 0.5\n[[group]]\nname = \"a\"\n").unwrap();
    assert_eq!(p.warmup, 500_000);
    let p = Scenario::parse(Path::new("ok.toml"), "submissions = 5\nwarmup_ms = 3\n[[group]]\nname = \"a\"\n").unwrap();
    assert_eq!(p.warmup, 3_000_000);
}
