//! The documentation follows the code: every policy key the parser accepts is described in
//! fencefs-policy(5) and the book's policy chapter (docs/src/policy.md); every command-line
//! option and every `-o` mount option is in fencefs(1) and the book (docs/src/); every
//! TOML policy the README and the book show compiles; the man pages render without groff
//! warnings; the bash completion completes; `--version` names the commit the binary was
//! built from.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::CommandFactory;

const T: Duration = Duration::from_secs(30);

/// One chapter of the book (docs/src/NAME).
fn chapter(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/src")
        .join(name);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The book's Markdown files (docs/src/**/*.md), sorted.
fn book_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src"),
        &mut out,
    );
    out.sort();
    assert!(out.len() >= 10, "the book has only {out:?}");
    out
}

/// Every chapter of the book, in file-name order.
fn book() -> String {
    book_files()
        .iter()
        .map(|p| fs::read_to_string(p).unwrap())
        .collect()
}

/// Roff source as plain text: `\-` is `-`, font escapes go.
fn plain(roff: &str) -> String {
    roff.replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
        .replace("\\fP", "")
}

/// The words after "(expected one of: " in the parser's own unknown-key errors.
fn keys_from(stderr: &str, file: &Path, line: usize) -> Vec<String> {
    let prefix = format!(
        "{}:{line}:1: unknown key \"zzz\" (expected one of: ",
        file.display()
    );
    let l = stderr
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {stderr}"));
    l.trim_end_matches(')')
        .split(", ")
        .map(str::to_string)
        .collect()
}

/// Every key of the policy format, as the parser itself lists them: (top level, rule).
fn policy_keys() -> (Vec<String>, Vec<String>) {
    let ws = Workspace::new("doc-keys");
    let p = ws.root.join("keys.toml");
    fs::write(
        &p,
        "zzz = 1\n[[rule]]\npath = \"a\"\naccess = \"read\"\nzzz = 1\n",
    )
    .unwrap();
    let o = run_fencefs([Path::new("check"), &p], T);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    (keys_from(&o.stderr, &p, 1), keys_from(&o.stderr, &p, 5))
}

fn generated_docs() -> (Workspace, PathBuf) {
    let ws = Workspace::new("doc-gen");
    let out = ws.root.join("docs");
    let o = run_fencefs([Path::new("generate-docs"), &out], T);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let mut listed: Vec<&str> = o.stdout.lines().collect();
    listed.sort();
    let want = [
        "completions/_fencefs",
        "completions/fencefs.bash",
        "completions/fencefs.fish",
        "man/fencefs-policy.5",
        "man/fencefs.1",
        "schema/fencefs-policy.schema.json",
    ]
    .map(|f| out.join(f).display().to_string());
    assert_eq!(listed, want);
    (ws, out)
}

/// Whether `text` has `key = ` with no other name character right before it.
fn assigned(text: &str, key: &str) -> bool {
    let pat = format!("{key} = ");
    text.match_indices(&pat).any(|(i, _)| {
        !text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// man's output without overstrike bold and underline (`X\bX`, `_\bX`).
fn no_overstrike(s: &str) -> String {
    let mut out: Vec<char> = vec![];
    for c in s.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out.into_iter().collect()
}

#[test]
fn every_policy_key_is_in_the_policy_man_page_and_the_book() {
    let (top, rule) = policy_keys();
    assert_eq!(top.len(), 11, "{top:?}");
    assert!(rule.contains(&"path".to_string()) && rule.contains(&"access".to_string()));
    let man = fencefs::docs::POLICY_MAN;
    let policy = chapter("policy.md");
    let policy_section = &policy[policy.find("# Policy file").unwrap()..];
    for k in top.iter().chain(&rule) {
        let in_man = if k == "rule" {
            man.contains("\\fB[[rule]]\\fR")
        } else {
            man.contains(&format!("\\fB{k}\\fR = "))
        };
        assert!(
            in_man,
            "policy key '{k}' is not described in doc/fencefs-policy.5"
        );
        let in_book = if k == "rule" {
            policy_section.contains("[[rule]]")
        } else {
            assigned(policy_section, k)
        };
        assert!(
            in_book,
            "policy key '{k}' is not in the book's Policy file chapter (docs/src/policy.md)"
        );
    }
    for word in [
        "none",
        "list",
        "read",
        "write",
        "read-only",
        "workspace-write",
        "danger",
    ] {
        assert!(
            man.contains(word) && policy_section.contains(&format!("`{word}`")),
            "{word}"
        );
    }
}

#[test]
fn every_option_is_in_fencefs_1_and_the_book() {
    let book = book();
    let (_ws, out) = generated_docs();
    let man = plain(&fs::read_to_string(out.join("man/fencefs.1")).unwrap());
    let cli = fencefs::cli::Cli::command();
    let mut n = 0;
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        assert!(
            man.contains(&format!(".SS \"fencefs {}\"", sub.get_name()))
                || man.contains(&format!(".SS fencefs {}", sub.get_name())),
            "fencefs(1) lacks a section for `{}`",
            sub.get_name()
        );
        assert!(
            book.contains(&format!("fencefs {}", sub.get_name())),
            "the book (docs/src) lacks `fencefs {}`",
            sub.get_name()
        );
        for a in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = a.get_long().filter(|l| *l != "help") else {
                continue;
            };
            n += 1;
            let flag = format!("--{long}");
            assert!(
                man.contains(&flag),
                "fencefs(1) lacks {flag} of `{}`",
                sub.get_name()
            );
            assert!(
                book.contains(&flag),
                "the book (docs/src) lacks {flag} of `{}`",
                sub.get_name()
            );
        }
    }
    assert!(n >= 20, "only {n} options found");
    let operating = chapter("operating.md");
    let fstab = &operating[operating
        .find("## fstab and `mount -t fuse.fencefs`")
        .unwrap()..];
    for o in fencefs::fuse_opts::options() {
        let spelled = match &o.value {
            Some(_) => format!("`{}=", o.name),
            None => format!("`{}`", o.name),
        };
        assert!(
            fstab.contains(&spelled),
            "the book's fstab section (docs/src/operating.md) lacks -o {spelled}"
        );
        assert!(
            man.contains(&format!("\n{}", o.name)),
            "fencefs(1) lacks -o {}",
            o.name
        );
    }
    for (g, _) in fencefs::fuse_opts::GENERIC {
        assert!(
            fstab.contains(&format!("`{g}`")),
            "the book's fstab section (docs/src/operating.md) lacks generic option {g}"
        );
        assert!(
            man.contains(&format!("\n{g}\n")),
            "fencefs(1) lacks generic option {g}"
        );
    }
}

#[test]
fn man_pages_render_without_warnings() {
    let (_ws, out) = generated_docs();
    for (page, title) in [
        ("man/fencefs.1", "FENCEFS(1)"),
        ("man/fencefs-policy.5", "FENCEFS-POLICY(5)"),
    ] {
        let o = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l"])
            .arg(out.join(page))
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0")
            .output()
            .expect("man (man-db; scripts/test.sh installs it)");
        let stdout = no_overstrike(&String::from_utf8_lossy(&o.stdout));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{page}: {stderr}");
        assert_eq!(stderr, "", "{page}: groff warnings");
        assert!(stdout.starts_with(title), "{page}: {stdout}");
        assert!(stdout.contains("SEE ALSO"), "{page}");
    }
}

#[test]
fn bash_completion_completes_subcommands_and_options() {
    let (_ws, out) = generated_docs();
    let complete = |words: &str| {
        let script = format!(
            "source '{}'; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; \
             _fencefs fencefs \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            out.join("completions/fencefs.bash").display()
        );
        let o = Command::new("bash").arg("-c").arg(script).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    assert_eq!(complete("fencefs mo"), ["mount"]);
    assert_eq!(complete("fencefs ex"), ["explain"]);
    assert_eq!(complete("fencefs mount --audit-m"), ["--audit-max-size"]);
    assert_eq!(
        complete("fencefs mount --no-"),
        [
            "--no-confine",
            "--no-git-worktree",
            "--no-passthrough",
            "--no-watch",
            "--no-xattr"
        ]
    );
}

#[test]
fn version_names_the_commit() {
    let o = run_fencefs(["--version"], T);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let commit = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        o.stdout,
        format!("fencefs {} (commit {commit})\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn every_policy_in_the_readme_and_the_book_compiles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    files.extend(book_files());
    let mut n = 0;
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```toml\n") {
            let block = &rest[start + 8..];
            let end = block.find("```").expect("an unterminated ```toml block");
            let line = text.len() - rest.len() + start;
            let line = text[..line].lines().count() + 1;
            let name = format!("{}:{line}", f.display());
            // An `--answers` file's example is checked as one.
            if block[..end].contains("[[answer]]") {
                let r = fencefs::approvals::answers::parse(&name, &block[..end]);
                assert!(
                    r.is_ok(),
                    "the answers block at {name} is invalid: {r:?}",
                    r = r.err()
                );
            } else if let Err(errors) = fencefs::policy::Policy::parse(&block[..end], &name) {
                panic!("the policy block at {name} does not compile: {errors:?}");
            }
            n += 1;
            rest = &block[end + 3..];
        }
    }
    assert!(n >= 3, "only {n} policy blocks found");
}
