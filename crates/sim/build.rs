//! Embeds the git commit of the build as `DOORBELL_COMMIT` (`git rev-parse --short HEAD`), for
//! `summary.json`'s `commit`.
//!
//! It never fails the build: without git, outside a repository (a tarball, a vendored copy)
//! or inside another project's repository (this crate's manifest is not tracked there), the
//! commit is `unknown`. The value is fixed at build time, so every run of one build writes the
//! same commit; cargo reruns this script when `HEAD` or the branch it names moves.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DOORBELL_COMMIT");
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    // An explicit value (a packager building from a tarball) wins.
    let commit = std::env::var("DOORBELL_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        // The repository must be ours: this crate's manifest is tracked in it.
        git(&dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
        let commit = git(&dir, &["rev-parse", "--short", "HEAD"])?;
        // Rebuild when HEAD moves: HEAD itself, the branch it names, and packed refs.
        let mut watch = vec![git(&dir, &["rev-parse", "--git-path", "HEAD"])];
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watch.push(git(&dir, &["rev-parse", "--git-path", &branch]));
        }
        watch.push(git(&dir, &["rev-parse", "--git-path", "packed-refs"]));
        for p in watch.into_iter().flatten() {
            let p = dir.join(p);
            // A path that does not exist would make cargo rerun this script on every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
        Some(commit)
    });
    println!("cargo:rustc-env=DOORBELL_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
