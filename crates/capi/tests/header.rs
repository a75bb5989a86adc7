//! `include/doorbell.h` is what cbindgen makes of this crate now.
//!
//! The header is generated (cbindgen's library API, with the crate's `cbindgen.toml`) and
//! compared with the checked-in file; CI runs `cargo test`, so the two cannot drift apart.
//! `DOORBELL_BLESS=1 cargo test -p doorbell-c --test header` rewrites the file instead.

use std::path::Path;

fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("crates/capi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen parses crates/capi/src");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/doorbell.h");
    let generated = generate();
    if std::env::var_os("DOORBELL_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write include/doorbell.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in.lines().zip(generated.lines()).position(|(a, b)| a != b);
        let line = first.unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        let show = |s: &str| s.lines().nth(line).unwrap_or("<end of file>").to_owned();
        panic!(
            "{} is out of date: it first differs at line {}:\n  checked in: {}\n  generated:  {}\n\
             Regenerate it with: DOORBELL_BLESS=1 cargo test -p doorbell-c --test header",
            path.display(),
            line + 1,
            show(&checked_in),
            show(&generated),
        );
    }
}

/// Every function the library exports is declared in the header, and nothing else is: a
/// `#[unsafe(no_mangle)]` function that cbindgen could not see (a macro, a cfg) would be
/// missing from C.
#[test]
fn the_header_declares_every_exported_function() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut exported = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.trim() == "#[unsafe(no_mangle)]" {
                let decl = lines.find(|l| l.contains("extern \"C\" fn ")).expect("a function after no_mangle");
                let name = decl.split("fn ").nth(1).unwrap().split('(').next().unwrap();
                exported.push(name.to_owned());
            }
        }
    }
    exported.sort();
    let header = generate();
    let mut declared: Vec<String> = header
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            // Declarations: `int32_t db_x(`, `const char *db_last_error(void);`.
            let name = l.split('(').next()?.rsplit([' ', '*']).next()?;
            (name.starts_with("db_") && l.contains('(') && !l.starts_with('*') && !l.starts_with("/"))
                .then(|| name.to_owned())
        })
        .collect();
    declared.sort();
    declared.dedup();
    assert_eq!(declared, exported);
    assert!(exported.len() > 50, "{} functions found: the scan is broken", exported.len());
}

/// Every public constant is in the header (cbindgen silently leaves out one it cannot
/// evaluate, such as another crate's constant).
#[test]
fn the_header_defines_every_public_constant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let header = generate();
    let mut found = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for l in text.lines().filter(|l| l.starts_with("pub const DB_")) {
            let name = l["pub const ".len()..].split(':').next().unwrap();
            assert!(header.contains(&format!("#define {name} ")), "{name} is not defined in the header");
            found += 1;
        }
    }
    assert!(found >= 5, "{found} constants found: the scan is broken");
}

/// No panic unwinds into C: the body of every exported function is one call of the guard
/// (`guard(|| ...)`, which runs it under `catch_unwind`), of a helper that is one (`with_cb`,
/// `with_queue`), or a `catch_unwind` of its own (`db_last_error`, `db_status_name`). Checked
/// on the source, so a new function that forgets it fails here.
#[test]
fn every_exported_function_runs_its_body_under_catch_unwind() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let helpers: Vec<String> =
        ["guard", "with_cb", "with_cb_fence", "with_queue"].iter().map(|h| h.to_string()).collect();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // The helpers themselves must start with the guard.
        for h in ["with_cb", "with_cb_fence", "with_queue"] {
            if let Some(at) = text.find(&format!("unsafe fn {h}(")) {
                let body = &text[at..];
                let first = body.lines().skip_while(|l| !l.trim_end().ends_with('{')).nth(1).unwrap().trim();
                assert!(first.starts_with("guard("), "{h} in {} starts with {first:?}", path.display());
            }
        }
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            if l.trim() != "#[unsafe(no_mangle)]" {
                continue;
            }
            // Skip attributes and the signature, up to the line that opens the body.
            let mut name = String::new();
            for l in lines.by_ref() {
                if let Some(rest) = l.split("fn ").nth(1).filter(|_| l.contains("extern \"C\" fn ")) {
                    name = rest.split('(').next().unwrap().to_owned();
                }
                if l.trim_end().ends_with('{') && !l.trim_start().starts_with("#[") && !name.is_empty() {
                    break;
                }
            }
            // The first statement, with any SAFETY comment and `unsafe {` wrapper skipped.
            let first = lines
                .by_ref()
                .map(str::trim)
                .find(|l| !l.starts_with("//") && *l != "unsafe {")
                .unwrap_or_default()
                .trim_start_matches("unsafe { ");
            let guarded =
                helpers.iter().any(|h| first.starts_with(&format!("{h}("))) || first.starts_with("catch_unwind(");
            assert!(guarded, "{name} ({}) starts with {first:?}, not the guard", path.display());
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} functions checked: the scan is broken");
}
