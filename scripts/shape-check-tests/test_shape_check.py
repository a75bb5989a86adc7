#!/usr/bin/env python3
"""Tests of scripts/shape-check: small crates written to a temporary directory, checked by
the script as CI runs it (`--root DIR --json`), so a checker that misreads Rust, misses a
violation or reports a false one fails here; fixtures/ holds the sources too long to write
inline. Run: python3 -m unittest discover -s scripts/shape-check-tests (`.ci/run` does, before the
check itself)."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "shape-check")
FIXTURES = os.path.join(HERE, "fixtures")


def body(n):
    """n lines of statements, for a function body."""
    return "".join("    let _x%d = %d;\n" % (k, k) for k in range(n))


def fn_of(name, total, indent=""):
    """A function of exactly `total` lines (signature and closing brace included)."""
    lines = body(total - 2)
    return "%sfn %s() {\n%s%s}\n" % (indent, name, textwrap.indent(lines, indent), indent)


class Tree:
    """A repository with crates/NAME/src/FILE files in a temporary directory."""

    def __init__(self, files):
        self.dir = tempfile.TemporaryDirectory()
        for rel, text in files.items():
            path = os.path.join(self.dir.name, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

    def run(self, *args):
        p = subprocess.run([sys.executable, SCRIPT, "--root", self.dir.name, *args], capture_output=True, text=True)
        return p

    def report(self, *args):
        p = self.run("--json", *args)
        self.rc = p.returncode
        return json.loads(p.stdout)

    def __del__(self):
        self.dir.cleanup()

    def rules(self, *args):
        return sorted((v["path"], v["rule"]) for v in self.report(*args)["violations"])


def report_of(root):
    """The report on a repository tree already on disk (a fixture directory)."""
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, "--json"], capture_output=True, text=True)
    return json.loads(p.stdout)


def check(files, *args):
    t = Tree(files)
    return t.rules(*args)


class Functions(unittest.TestCase):
    def test_limit_is_120_lines(self):
        src = fn_of("ok", 120) + fn_of("long", 121)
        self.assertEqual(check({"crates/a/src/lib.rs": src}), [("crates/a/src/lib.rs", "fn-lines:long")])

    def test_the_reported_line_and_length(self):
        src = "//! a crate\n\n" + fn_of("long", 130)
        v = Tree({"crates/a/src/lib.rs": src}).report()["violations"]
        self.assertEqual((v[0]["line"], v[0]["message"]), (3, "fn long of 130 lines (limit 120)"))

    def test_braces_in_strings_chars_comments_do_not_count(self):
        # Every kind of literal and comment with unbalanced braces in it: were any read as
        # a brace, `tricky` would end early (or late) and the file would not balance.
        with open(os.path.join(FIXTURES, "tricky.rs"), encoding="utf-8") as f:
            src = f.read()
        rep = Tree({"crates/a/src/lib.rs": src}).report()
        got = {v["rule"]: v["message"] for v in rep["violations"]}
        self.assertEqual(sorted(got), ["fn-lines:tricky"])
        self.assertIn("of 121 lines", got["fn-lines:tricky"])

    def test_names_in_impls_traits_and_nested_fns(self):
        src = (
            "struct S;\nimpl<T: Clone> From<T> for S {\n" + fn_of("from", 121, "    ") + "}\n"
            "impl S {\n" + fn_of("new", 121, "    ") + "}\n"
            "trait Tr {\n    fn decl(&self);\n" + fn_of("provided", 121, "    ") + "}\n"
            "fn outer() {\n" + fn_of("inner", 121, "    ") + "}\n"
        )
        self.assertEqual(
            [r for _, r in check({"crates/a/src/lib.rs": src})],
            ["fn-lines:S::from", "fn-lines:S::new", "fn-lines:Tr::provided", "fn-lines:outer", "fn-lines:outer::inner"],
        )

    def test_same_name_twice_gets_a_number(self):
        src = "struct S;\nimpl S {\n" + fn_of("f", 121, "    ") + "}\nimpl S {\n" + fn_of("f", 121, "    ") + "}\n"
        self.assertEqual([r for _, r in check({"crates/a/src/lib.rs": src})], ["fn-lines:S::f", "fn-lines:S::f#2"])

    def test_fn_pointer_types_and_declarations_are_not_functions(self):
        src = "type F = fn(u32) -> u32;\nextern \"C\" {\n    fn ext(x: u32);\n}\n" "struct H {\n    f: fn(),\n}\n" + fn_of("short", 10)
        self.assertEqual(check({"crates/a/src/lib.rs": src}), [])


class TestCode(unittest.TestCase):
    def test_cfg_test_modules_and_test_fns_are_exempt(self):
        src = (
            fn_of("short", 5)
            + "#[cfg(test)]\nmod tests {\n    use super::*;\n" + fn_of("long_helper", 200, "    ") + "}\n"
            + "#[cfg(all(test, loom))]\nmod loom_tests {\n" + fn_of("long", 200, "    ") + "}\n"
            + "#[test]\n" + fn_of("long_test", 200)
        )
        self.assertEqual(check({"crates/a/src/lib.rs": src}), [])

    def test_cfg_not_test_is_not_test_code(self):
        src = "#[cfg(not(test))]\n" + fn_of("long", 121)
        self.assertEqual(check({"crates/a/src/lib.rs": src}), [("crates/a/src/lib.rs", "fn-lines:long")])

    def test_a_test_module_file_is_exempt(self):
        files = {
            "crates/a/src/lib.rs": "#[cfg(test)]\nmod tests;\nmod real;\n",
            "crates/a/src/tests.rs": fn_of("long", 900) + "mod more;\n",
            "crates/a/src/tests/more.rs": fn_of("long_too", 300),
            "crates/a/src/real.rs": fn_of("long", 121),
        }
        self.assertEqual(check(files), [("crates/a/src/real.rs", "fn-lines:long")])


class Files(unittest.TestCase):
    def test_limit_is_800_lines(self):
        files = {
            "crates/a/src/lib.rs": "mod big;\nmod fine;\n",
            "crates/a/src/big.rs": "// x\n" * 801,
            "crates/a/src/fine.rs": "// x\n" * 800,
        }
        self.assertEqual(check(files), [("crates/a/src/big.rs", "file-lines")])

    def test_only_src_is_walked(self):
        files = {
            "crates/a/src/lib.rs": "",
            "crates/a/tests/t.rs": "// x\n" * 900,
            "crates/a/examples/e.rs": fn_of("long", 200),
            "crates/a/benches/b.rs": fn_of("long", 200),
            "crates/a/device/k.cu": "// x\n" * 900,
        }
        self.assertEqual(check(files), [])

    def test_a_file_no_root_declares_is_still_checked(self):
        files = {"crates/a/src/lib.rs": "", "crates/a/src/orphan.rs": fn_of("long", 121)}
        self.assertEqual(check(files), [("crates/a/src/orphan.rs", "fn-lines:long")])

    def test_unbalanced_braces_are_reported(self):
        self.assertEqual(check({"crates/a/src/lib.rs": "fn f() {\n"}), [("crates/a/src/lib.rs", "unreadable")])


class Circles(unittest.TestCase):
    def test_two_modules_using_each_other(self):
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\n",
            "crates/a/src/x.rs": "use crate::y::B;\npub struct A;\n",
            "crates/a/src/y.rs": "pub struct B;\npub fn f() { let _ = crate::x::A; }\n",
        }
        t = Tree(files)
        rep = t.report()
        self.assertEqual([(v["path"], v["rule"], v["line"]) for v in rep["violations"]], [("crates/a/src/x.rs", "import-circle:x,y", 1)])
        self.assertIn("x -> y (x.rs:1); y -> x (y.rs:2)", rep["violations"][0]["message"])

    def test_a_reexporting_parent_is_not_in_a_circle(self):
        # mod.rs declares and re-exports its children; a child names a sibling's type
        # through the parent (`super::Config`, re-exported) and the parent's own type.
        files = {
            "crates/a/src/lib.rs": "pub mod p;\npub use p::*;\n",
            "crates/a/src/p/mod.rs": "mod one;\nmod two;\npub use one::Config;\npub use two::*;\npub struct Own;\n",
            "crates/a/src/p/one.rs": "pub struct Config;\n",
            "crates/a/src/p/two.rs": "use super::{Config, Own};\nuse crate::Config as C2;\npub fn run(_: Config, _: Own, _: C2) {}\n",
        }
        self.assertEqual(check(files), [])

    def test_a_parent_calling_a_child_that_uses_the_parent(self):
        files = {
            "crates/a/src/lib.rs": "mod child;\npub struct Shared;\npub fn go() { child::work(); }\n",
            "crates/a/src/child.rs": "use crate::Shared;\npub fn work() { let _ = Shared; }\n",
        }
        self.assertEqual(check(files), [("crates/a/src/lib.rs", "import-circle:crate,child")])

    def test_a_reexport_is_followed_to_its_definition(self):
        # x uses crate::B, which the root re-exports from y: the edge is x -> y, and
        # y -> x closes a circle that does not include the root.
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\npub use y::B;\n",
            "crates/a/src/x.rs": "use crate::B;\npub struct A;\n",
            "crates/a/src/y.rs": "pub struct B;\nuse super::x::A;\n",
        }
        self.assertEqual(check(files), [("crates/a/src/x.rs", "import-circle:x,y")])

    def test_uses_in_function_bodies_and_three_module_circles(self):
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\nmod z;\n",
            "crates/a/src/x.rs": "pub fn f() {\n    use crate::y::g;\n    g();\n}\n",
            "crates/a/src/y.rs": "pub fn g() { crate::z::h(); }\n",
            "crates/a/src/z.rs": "pub fn h() { let _ = super::x::f; }\n",
        }
        self.assertEqual(check(files), [("crates/a/src/x.rs", "import-circle:x,y,z")])

    def test_test_code_inline_modules_visibility_and_other_crates_are_no_edges(self):
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\n",
            "crates/a/src/x.rs": (
                "pub struct A;\npub(in crate::y) struct Hidden;\nuse std::fmt;\nuse other::y::Z;\n"
                "pub trait T: sealed::S {}\nmod sealed {\n    pub trait S {}\n    impl S for super::A {}\n}\n"
            ),
            "crates/a/src/y.rs": "use crate::x::A;\n#[cfg(test)]\nmod tests {\n    use crate::x::A;\n}\n",
        }
        self.assertEqual(check(files), [])

    def test_each_crate_root_is_its_own_tree(self):
        files = {
            "crates/a/src/lib.rs": "mod x;\n",
            "crates/a/src/x.rs": "",
            "crates/a/src/main.rs": "mod cli;\npub struct Args;\nfn main() { cli::parse(); }\n",
            "crates/a/src/cli.rs": "pub fn parse() -> crate::Args { crate::Args }\n",
        }
        # The circle is main.rs's tree's (lib.rs's has none), reported at the root's file.
        self.assertEqual(check(files), [("crates/a/src/main.rs", "import-circle:crate,cli")])

    def test_a_declaration_or_a_reexport_alone_is_never_an_edge(self):
        # The root declares x and re-exports from it every way there is, and x uses the
        # root's own items: x -> crate is an edge, crate -> x is not.
        files = {
            "crates/a/src/lib.rs": (
                "pub mod x;\nmod y;\npub use x::A;\npub(crate) use x::B as Bee;\npub use x::*;\n"
                "pub use y::{self as why, C};\npub struct Root;\npub fn own() -> Root { Root }\n"
            ),
            "crates/a/src/x.rs": "use crate::Root;\npub struct A;\npub struct B;\npub fn f() -> Root { crate::own() }\n",
            "crates/a/src/y.rs": "pub struct C;\npub fn g() { let _ = super::Root; }\n",
        }
        self.assertEqual(check(files), [])

    def test_a_parent_module_calling_a_child_that_uses_the_parent(self):
        # The same as at the root, one level down (p/mod.rs and p/c.rs), with the child
        # reaching the parent by a glob: `use super::*` is an edge to the parent.
        files = {
            "crates/a/src/lib.rs": "mod p;\n",
            "crates/a/src/p/mod.rs": "mod c;\npub struct Own;\npub fn go() { c::work(); }\n",
            "crates/a/src/p/c.rs": "use super::*;\npub fn work() { let _ = Own; }\n",
        }
        self.assertEqual(check(files), [("crates/a/src/p/mod.rs", "import-circle:p,p::c")])

    def test_cfg_doc_imports_are_no_edges(self):
        # A `#[cfg(doc)] use` exists for an intra-doc link; rustc builds no code with it.
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\n",
            "crates/a/src/x.rs": "#[cfg(doc)]\nuse crate::y::B;\n/// Not [`B`].\npub struct A;\n",
            "crates/a/src/y.rs": "use crate::x::A;\npub struct B(A);\n",
        }
        self.assertEqual(check(files), [])

    def test_paths_in_attribute_arguments_are_edges_but_not_in_cfg_or_doc(self):
        # clap's derive expands `default_value_t = crate::y::K` into x's code.
        files = {
            "crates/a/src/lib.rs": "mod x;\nmod y;\nmod z;\n",
            "crates/a/src/x.rs": "pub struct A {\n    #[arg(long, default_value_t = crate::y::K)]\n    f: u32,\n}\n",
            "crates/a/src/y.rs": "pub const K: u32 = 1;\npub fn f(_: &crate::x::A) {}\n",
            "crates/a/src/z.rs": (
                "#[cfg_attr(feature = \"s\", derive(crate::y::D))]\n#[doc = crate::y::DOC]\npub struct B;\n"
                "#[cfg(test)]\n#[arg(default_value_t = crate::y::K)]\npub struct T;\n"
            ),
        }
        files["crates/a/src/y.rs"] += "pub fn g(_: crate::z::B) {}\n"
        self.assertEqual(check(files), [("crates/a/src/x.rs", "import-circle:x,y")])

    def test_a_dispatching_root_that_defines_what_its_subcommands_use(self):
        # fixtures/hub: main.rs dispatches to its subcommands and defines the error type they
        # return; bench dispatches to bench_fences, which uses bench's helper. Both are real
        # circles (each file is two layers), and they share modules, so they are one.
        rep = report_of(os.path.join(FIXTURES, "hub"))
        self.assertEqual(
            [(v["path"], v["rule"], v["line"]) for v in rep["violations"]],
            [("crates/cli/src/main.rs", "import-circle:crate,bench,bench_fences,demo", 21)],
        )
        self.assertIn("crate -> demo (main.rs:21)", rep["violations"][0]["message"])
        self.assertIn("bench_fences -> bench (bench_fences.rs:4)", rep["violations"][0]["message"])

    def test_the_same_root_in_layers_has_no_circle(self):
        # fixtures/hub-layered: the error type in error.rs (re-exported by the root), the
        # shared helper in measure.rs; main still dispatches to every subcommand.
        rep = report_of(os.path.join(FIXTURES, "hub-layered"))
        self.assertEqual(rep["violations"], [])


class Allowlist(unittest.TestCase):
    FILES = {"crates/a/src/lib.rs": fn_of("long", 121) + fn_of("other", 130)}

    def allow(self, text):
        t = Tree(self.FILES)
        path = os.path.join(t.dir.name, "allow.txt")
        with open(path, "w") as f:
            f.write(text)
        return t, path

    def test_without_a_list_every_violation_fails(self):
        t = Tree(self.FILES)
        rep = t.report()
        self.assertEqual((t.rc, rep["new"], rep["ok"]), (1, 2, False))

    def test_listed_violations_pass(self):
        t, path = self.allow("# open ones\ncrates/a/src/lib.rs  fn-lines:long  a reason\ncrates/a/src/lib.rs  fn-lines:other  another\n")
        rep = t.report("--allow", path)
        self.assertEqual((t.rc, rep["new"], rep["allowed"], rep["stale"]), (0, 0, 2, []))

    def test_an_unlisted_violation_fails(self):
        t, path = self.allow("crates/a/src/lib.rs  fn-lines:long  a reason\n")
        p = t.run("--allow", path)
        self.assertEqual(p.returncode, 1)
        self.assertIn("crates/a/src/lib.rs:122: fn other of 130 lines (limit 120) [fn-lines:other]", p.stdout)
        self.assertNotIn("fn long", p.stdout)

    def test_a_stale_entry_fails(self):
        t, path = self.allow(
            "crates/a/src/lib.rs  fn-lines:long  a reason\ncrates/a/src/lib.rs  fn-lines:other  x\ncrates/a/src/lib.rs  file-lines  fixed since\n"
        )
        p = t.run("--allow", path)
        self.assertEqual(p.returncode, 1)
        self.assertIn("allow.txt:3: stale entry: crates/a/src/lib.rs file-lines no longer happens", p.stdout)

    def test_a_malformed_entry_is_an_error(self):
        t, path = self.allow("crates/a/src/lib.rs fn-lines:long\n")
        self.assertEqual(t.run("--allow", path).returncode, 2)


class Repository(unittest.TestCase):
    def test_every_file_of_this_repository_reads(self):
        p = subprocess.run([sys.executable, SCRIPT, "--json"], capture_output=True, text=True)
        rep = json.loads(p.stdout)
        self.assertEqual([v for v in rep["violations"] if v["rule"] == "unreadable"], [])


if __name__ == "__main__":
    unittest.main()
