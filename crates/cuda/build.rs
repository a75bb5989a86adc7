//! Builds the engine program (`device/*.cu`) for the CPU: the emulated backend, so that every
//! CPU test runs the very source the GPU runs (see `device/common.cuh`).
fn main() {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-strict-aliasing")
        .warnings(true);
    let dir = std::path::Path::new("device");
    let mut cpps: Vec<_> = std::fs::read_dir(dir).expect("device/").filter_map(|e| e.ok().map(|e| e.path())).collect();
    cpps.sort();
    for p in &cpps {
        println!("cargo:rerun-if-changed={}", p.display());
        if p.extension().is_some_and(|x| x == "cpp") {
            build.file(p);
        }
    }
    build.compile("doorbell_engine_emulated");
}
