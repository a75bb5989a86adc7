//! The `doorbell` binary end to end (live systems; each waits on events, not on time).

use std::process::Command;

fn doorbell() -> Command {
    Command::new(env!("CARGO_BIN_EXE_doorbell"))
}

#[test]
fn trace_writes_a_perfetto_timeline_with_a_track_per_queue() {
    let out = std::env::temp_dir().join(format!("doorbell-trace-{}.json", std::process::id()));
    let st = doorbell().args(["trace", out.to_str().unwrap(), "--rounds", "5"]).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).ok();
    let ev = doc["traceEvents"].as_array().unwrap();
    let boxes: Vec<_> = ev.iter().filter(|e| e["ph"] == "X").collect();
    let tracks: Vec<_> = ev.iter().filter(|e| e["name"] == "thread_name").collect();
    assert_eq!(tracks.len(), 3);
    // 5 rounds: producer signals F, middle waits F and signals G, consumer waits G.
    assert_eq!(boxes.len(), 20);
    for b in &boxes {
        let (queued, end) = (b["args"]["queued_ns"].as_u64().unwrap(), b["args"]["end_gpu_ns"].as_u64().unwrap());
        assert!(end >= queued, "executed after it was queued: {b}");
        assert!(b["args"]["fence"].as_u64().unwrap() > 0);
    }
    // Each consumer wait ends no earlier than the middle stage's matching signal.
    let end_of = |name: &str| boxes.iter().find(|b| b["name"] == name).unwrap()["args"]["end_gpu_ns"].as_u64().unwrap();
    for r in 1..=5 {
        assert!(end_of(&format!("wait G={r}")) >= end_of(&format!("signal G={r}")));
        assert!(end_of(&format!("wait F={r}")) >= end_of(&format!("signal F={r}")));
    }
}

#[test]
fn run_reports_assembler_errors_with_line_and_column() {
    let src = std::env::temp_dir().join(format!("doorbell-bad-{}.dbk", std::process::id()));
    std::fs::write(&src, "nop\nadd v1, v2\n").unwrap();
    let st = doorbell().args(["run", src.to_str().unwrap()]).output().unwrap();
    std::fs::remove_file(&src).ok();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(err.contains(":2:") && err.contains("too few operands"), "{err}");
}

#[test]
fn run_executes_an_example_kernel() {
    let saxpy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/saxpy.dbk");
    let st = doorbell()
        .args(["run", saxpy, "--grid", "2", "--group", "64", "--args", "buf:512:iotaf,buf:512:iotaf,f:2.0,128"])
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let out = String::from_utf8_lossy(&st.stdout);
    // y[1] = 2 * 1 + 1 = 3.0 = 0x40400000.
    assert!(out.contains("0x40400000"), "{out}");
}
