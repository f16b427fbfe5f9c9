//! `agent_notes = true`: the virtual `.fencefs/` directory at the mount root (README,
//! policy, denials), read by real programs as root and as uid 1000, against a real mount.
//! Runs on whichever transport FENCEFS_TEST_TRANSPORT names.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Duration;

use common::*;

const AGENT: u32 = 1000;

/// A policy with visible rules, hidden ones (`vault`, `hid-*`, an `except` target, one
/// for uid 1000 only) and one that applies to root only.
const POLICY: &str = r#"agent_notes = true
mode = "workspace-write"
default = "read"
writable_roots = ["src"]

[[rule]]
path = "src/**"
access = "write"
except = ["src/secret-cfg"]

[[rule]]
path = "src/secret-cfg"
access = "none"

[[rule]]
path = "docs"
access = "read"
ask = "write"

[[rule]]
path = "src/locked"
access = "read"

[[rule]]
path = "vault"
access = "none"

[[rule]]
path = "hid-*"
access = "none"

[[rule]]
path = "private-agent"
access = "none"
uid = [1000]

[[rule]]
path = "team"
access = "write"
uid = [0]
"#;

fn setup(src: &std::path::Path) {
    mkdirp(&src.join("src"));
    mkdirp(&src.join("docs"));
    mkdirp(&src.join("vault"));
    put(&src.join("vault/key"), b"k", 0o644);
    put(&src.join("hid-a"), b"a", 0o644);
    put(&src.join("src/a.rs"), b"fn main() {}\n", 0o666);
    put(&src.join("src/locked"), b"l", 0o666);
    put(&src.join("src/secret-cfg"), b"s", 0o644);
    put(&src.join("private-agent"), b"p", 0o644);
    put(&src.join("README.md"), b"hello\n", 0o644);
    // uid 1000 may change what the policy lets it (and the kernel's permission checks).
    for d in ["", "src", "docs"] {
        fs::set_permissions(
            src.join(d),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
}

fn mount(name: &str, policy: &str) -> Mount {
    let mut b = Mount::builder(name).policy(policy).arg("--allow-other");
    setup(&b.host(""));
    b = b.watchdog(WATCHDOG);
    b.start()
}

/// `cat .fencefs/FILE` as `uid` (0: root, as the test).
fn note(m: &Mount, uid: u32, file: &str) -> String {
    let script = format!("cat .fencefs/{file}");
    let o = if uid == 0 {
        m.sh(&script)
    } else {
        m.sh_as(uid, &script)
    };
    o.assert_ok(&format!("cat .fencefs/{file} as {uid}"));
    o.stdout
}

/// Every name the hidden part of [`POLICY`] has; no note may show one to uid 1000.
const HIDDEN_NAMES: [&str; 4] = ["vault", "hid-", "secret-cfg", "private-agent"];

#[test]
fn policy_is_the_callers_view_and_names_nothing_hidden() {
    let m = mount("notes-policy", POLICY);
    let root = note(&m, 0, "policy");
    let agent = note(&m, AGENT, "policy");
    for (who, text) in [("root", &root), ("agent", &agent)] {
        assert!(text.contains("mode = workspace-write\n"), "{who}:\n{text}");
        assert!(text.contains("writable_roots = src\n"), "{who}:\n{text}");
        assert!(
            text.contains("protected = .git/hooks, .git/config\n"),
            "{who}:\n{text}"
        );
        assert!(text.contains("default = read\n"), "{who}:\n{text}");
        assert!(
            text.contains("src/**  write  (1 hidden exceptions)\n"),
            "{who}:\n{text}"
        );
        assert!(text.contains("docs  read  ask=write\n"), "{who}:\n{text}");
        for n in ["vault", "hid-", "secret-cfg"] {
            assert!(!text.contains(n), "{who} sees hidden {n}:\n{text}");
        }
    }
    // Root: vault, hid-*, src/secret-cfg hidden; the uid-1000 rule is someone else's.
    assert!(root.contains("uid 0 (gid 0)"), "{root}");
    assert!(root.contains("team  write\n"), "{root}");
    assert!(root.contains("\n3 hidden rules\n"), "{root}");
    assert!(
        root.contains("\n1 rules for other uids or gids\n"),
        "{root}"
    );
    assert!(!root.contains("private-agent"), "{root}");
    // uid 1000: its own hidden rule counted, root's rule not shown.
    assert!(agent.contains("uid 1000 (gid 1000)"), "{agent}");
    assert!(agent.contains("\n4 hidden rules\n"), "{agent}");
    assert!(
        agent.contains("\n1 rules for other uids or gids\n"),
        "{agent}"
    );
    for n in HIDDEN_NAMES.iter().chain(&["team"]) {
        assert!(!agent.contains(n), "agent sees {n}:\n{agent}");
    }
    // README: every errno explained, the mode named.
    let readme = note(&m, AGENT, "README");
    for w in [
        "ENOENT",
        "EACCES",
        "EROFS",
        "EPERM",
        "ask",
        "Mode: workspace-write.",
    ] {
        assert!(readme.contains(w), "README lacks {w}:\n{readme}");
    }
    assert_eq!(readme, note(&m, 0, "README"));
}

/// `line` without its leading timestamp.
fn untimed(line: &str) -> &str {
    line.split_once(' ').map_or(line, |(_, rest)| rest)
}

#[test]
fn denials_are_per_uid_and_no_oracle_for_hidden_names() {
    let m = mount("notes-denials", POLICY);
    // uid 1000: two hidden names, one on the host, one not; a mode refusal; a rule's.
    m.sh_as(
        AGENT,
        "cat hid-a; cat hid-b; cat vault/key; touch docs/new; echo x > src/locked; \
         cat src/secret-cfg; true",
    )
    .assert_ok("refusals as 1000");
    // Root: refusals of its own.
    m.sh("touch rootonly.txt; cat hid-root; true")
        .assert_ok("refusals as root");
    let agent = note(&m, AGENT, "denials");
    let lines: Vec<&str> = agent.lines().collect();
    let find = |needle: &str| -> Vec<&str> {
        lines
            .iter()
            .copied()
            .filter(|l| l.contains(needle))
            .collect()
    };
    let a = find(" hid-a ");
    let b = find(" hid-b ");
    assert!(!a.is_empty(), "no line for hid-a:\n{agent}");
    assert_eq!(a.len(), b.len(), "existing vs absent hidden name:\n{agent}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            untimed(x).replace("hid-a", "NAME"),
            untimed(y).replace("hid-b", "NAME"),
            "{agent}"
        );
        assert_eq!(untimed(x), "lookup hid-a ENOENT hidden");
    }
    // The hidden directory as named, nothing below it (the kernel stops there).
    assert!(
        find(" vault ")
            .iter()
            .all(|l| untimed(l) == "lookup vault ENOENT hidden"),
        "{agent}"
    );
    assert!(!agent.contains("vault/key"), "{agent}");
    assert!(
        find(" src/secret-cfg ")
            .iter()
            .any(|l| untimed(l) == "lookup src/secret-cfg ENOENT hidden"),
        "{agent}"
    );
    // The mode and the rule, with why.
    assert!(
        find(" docs/new ")
            .iter()
            .any(|l| untimed(l)
                == "create docs/new EROFS mode workspace-write: outside writable_roots"),
        "{agent}"
    );
    assert!(
        find(" src/locked ")
            .iter()
            .any(|l| untimed(l) == "open src/locked EACCES rule src/locked read"),
        "{agent}"
    );
    // uid A never sees uid B's.
    assert!(
        !agent.contains("rootonly") && !agent.contains("hid-root"),
        "{agent}"
    );
    let root = note(&m, 0, "denials");
    assert!(root.contains(" rootonly.txt EROFS "), "{root}");
    assert!(root.contains(" hid-root ENOENT hidden"), "{root}");
    assert!(
        !root.contains("hid-a") && !root.contains("docs/new"),
        "{root}"
    );
    // Timestamps are RFC 3339 UTC.
    for l in &lines {
        let t = l.split(' ').next().unwrap();
        assert!(
            t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{l}"
        );
    }
}

/// The errno of `r`, for the messages below.
fn erofs<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    assert_errno(r, libc::EROFS, what).ok();
}

#[test]
fn every_mutation_is_erofs_and_the_host_is_untouched() {
    let m = mount("notes-erofs", POLICY);
    mkdirp(&m.host("src/d0"));
    let before = tree(&m.host(""));
    let n = |p: &str| m.mnt(format!(".fencefs/{p}"));
    // In it.
    erofs(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(n("new")),
        "create",
    );
    erofs(mkdir_mode(&n("d"), 0o755), "mkdir");
    erofs(mknod(&n("fifo"), libc::S_IFIFO | 0o644, 0), "mknod");
    erofs(std::os::unix::fs::symlink("x", n("l")), "symlink");
    erofs(fs::hard_link(m.mnt("src/a.rs"), n("h")), "link into");
    erofs(fs::remove_file(n("README")), "unlink");
    erofs(fs::rename(n("policy"), m.mnt("src/p")), "rename out");
    erofs(fs::rename(m.mnt("src/a.rs"), n("a.rs")), "rename in");
    erofs(fs::rename(n("README"), n("R")), "rename within");
    // Of it.
    erofs(fs::hard_link(n("README"), m.mnt("src/r")), "link of");
    erofs(fs::remove_dir(m.mnt(".fencefs")), "rmdir");
    erofs(fs::rename(m.mnt(".fencefs"), m.mnt("src/f")), "rename dir");
    erofs(
        fs::rename(m.mnt("src/d0"), m.mnt(".fencefs")),
        "rename over",
    );
    for (what, flags) in [
        ("O_WRONLY", libc::O_WRONLY),
        ("O_RDWR", libc::O_RDWR),
        ("O_TRUNC", libc::O_RDONLY | libc::O_TRUNC),
        ("O_APPEND", libc::O_WRONLY | libc::O_APPEND),
    ] {
        erofs(open_flags(&n("denials"), flags, 0), what);
    }
    erofs(truncate(&n("README"), 0), "truncate");
    erofs(chmod(&n("README"), 0o600), "chmod");
    erofs(chmod(&m.mnt(".fencefs"), 0o700), "chmod dir");
    erofs(lchown(&n("policy"), 1, 1), "chown");
    erofs(utimes(&n("policy"), 5), "utimes");
    erofs(setxattr(&n("README"), "user.x", b"1"), "setxattr");
    erofs(removexattr(&n("README"), "user.x"), "removexattr");
    assert_errno(
        lgetxattr(&n("README"), b"user.x"),
        libc::ENODATA,
        "getxattr",
    )
    .ok();
    assert_eq!(llistxattr(&n("README")).unwrap(), Vec::<Vec<u8>>::new());
    // As uid 1000, through the programs an agent runs.
    let o = m.sh_as(
        AGENT,
        "for c in 'touch .fencefs/x' 'mkdir .fencefs/d' 'rm -f .fencefs/README' \
         'mv .fencefs/policy src/p' 'mv src/a.rs .fencefs/' 'ln -s a .fencefs/l' \
         'chmod 600 .fencefs/README' 'rmdir .fencefs' 'truncate -s0 .fencefs/denials'; \
         do sh -c \"$c\" 2>&1; done; echo x 2>&1 > .fencefs/README",
    );
    let out = format!("{}{}", o.stdout, o.stderr);
    let n_ro = out.matches("Read-only file system").count();
    assert_eq!(n_ro, 10, "every mutation as 1000 EROFS:\n{out}");
    // Nothing reached the host, and no `.fencefs` there.
    assert_eq!(tree(&m.host("")), before);
    assert!(!m.host(".fencefs").exists());
    assert_eq!(fs::read(m.host("src/a.rs")).unwrap(), b"fn main() {}\n");
}

/// Every path under `root` with its size (a host-side snapshot).
fn tree(root: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            let p = e.path();
            out.push((
                p.strip_prefix(root).unwrap().display().to_string(),
                md.len(),
            ));
            if md.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn contents_are_frozen_at_open_and_served_whole() {
    let m = mount("notes-frozen", POLICY);
    m.sh_as(AGENT, "cat hid-1; true").assert_ok("one refusal");
    // As 1000: a reader with offsets sees the text of its open, whatever happens later.
    let o = m.sh_as(
        AGENT,
        "exec 3< .fencefs/denials; head -c 10 <&3 > /tmp/.notes-a-$$; cat hid-2; \
         cat <&3 >> /tmp/.notes-a-$$; exec 3<&-; cat /tmp/.notes-a-$$; rm -f /tmp/.notes-a-$$",
    );
    o.assert_ok("frozen read");
    assert!(o.stdout.contains(" hid-1 "), "{}", o.stdout);
    assert!(!o.stdout.contains(" hid-2 "), "{}", o.stdout);
    assert_eq!(o.stdout.lines().count(), 1, "{}", o.stdout);
    // A new open sees the new line.
    assert!(note(&m, AGENT, "denials").contains(" hid-2 "));
    // Root: pread at offsets equals the whole read; st_size is the text's length.
    m.sh("cat hid-x; cat hid-y; true")
        .assert_ok("refusals as root");
    let mut f = File::open(m.mnt(".fencefs/denials")).unwrap();
    let size = fs::metadata(m.mnt(".fencefs/denials")).unwrap().len();
    let mut whole = Vec::new();
    f.read_to_end(&mut whole).unwrap();
    assert!(!whole.is_empty());
    assert_eq!(size, whole.len() as u64, "st_size is the generated length");
    let mut part = vec![0u8; 7];
    let n = f.read_at(&mut part, 5).unwrap();
    assert_eq!(&part[..n], &whole[5..5 + n]);
    assert_eq!(f.read_at(&mut part, whole.len() as u64).unwrap(), 0);
    drop(f);
    // The directory: read-only to opening as a file, listed with its three files.
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(m.mnt(".fencefs"));
    assert!(d.is_ok());
    assert_eq!(
        names_str(&m.mnt(".fencefs")).unwrap(),
        vec!["README", "denials", "feedback", "policy"]
    );
}

#[test]
fn cat_ls_and_recursive_grep_work_and_do_not_loop() {
    let m = mount("notes-tools", POLICY);
    let ls = m.sh_as(AGENT, "ls -lan .fencefs; echo ---; ls -a");
    ls.assert_ok("ls");
    let (inside, root) = ls.stdout.split_once("---\n").unwrap();
    for n in ["README", "policy", "denials"] {
        assert!(inside.contains(n), "ls lacks {n}:\n{}", ls.stdout);
    }
    // Reachable by name, never listed at the root.
    assert!(!root.contains(".fencefs"), "listed:\n{}", ls.stdout);
    // Owned by the caller, files rw-r--r-- (the fence answers EROFS, not the mode bits).
    assert!(
        inside
            .lines()
            .any(|l| l.starts_with("-rw-r--r--") && l.contains("1000") && l.ends_with(" README")),
        "{}",
        ls.stdout
    );
    // A recursive grep of the directory by name ends and finds the README's word; one of
    // the whole mount ends and does not enter it.
    let g = m.sh_as(
        AGENT,
        "timeout 60 grep -r -l 'EPERM' .fencefs; timeout 60 grep -r -l 'EPERM' . ; echo rc=$?",
    );
    assert!(g.stdout.contains(".fencefs/README"), "{}", g.stdout);
    assert!(!g.stdout.contains("./.fencefs"), "{}", g.stdout);
    assert!(
        !g.stdout.contains("rc=124"),
        "grep -r timed out: {}",
        g.stdout
    );
    let f = m.sh_as(
        AGENT,
        "timeout 60 find .fencefs | sort; timeout 60 find . | sort",
    );
    f.assert_ok("find");
    let found: Vec<&str> = f
        .stdout
        .lines()
        .filter(|l| l.contains(".fencefs"))
        .collect();
    assert_eq!(
        found,
        vec![
            ".fencefs",
            ".fencefs/README",
            ".fencefs/denials",
            ".fencefs/feedback",
            ".fencefs/policy"
        ]
    );
    // stat, wc, cp out of it (the kernel copies it by reading).
    let c = m.sh_as(
        AGENT,
        "wc -c < .fencefs/policy; cp .fencefs/policy src/policy.copy && cmp .fencefs/policy src/policy.copy && echo same",
    );
    c.assert_ok("cp");
    assert!(c.stdout.contains("same"), "{}", c.stdout);
    // statfs through it is the mount's.
    m.sh("df .fencefs >/dev/null").assert_ok("df");
}

#[test]
fn off_by_default_reload_turns_it_on_and_shadows_a_host_entry() {
    let off = "mode = \"workspace-write\"\ndefault = \"read\"\nwritable_roots = [\"src\"]\n";
    let mut b = Mount::builder("notes-reload")
        .policy(off)
        .arg("--allow-other");
    setup(&b.host(""));
    mkdirp(&b.host(".fencefs"));
    put(&b.host(".fencefs/mine"), b"host file", 0o644);
    b = b.watchdog(WATCHDOG);
    let m = b.start();
    // Off: the host's own `.fencefs` is an ordinary entry; nothing virtual.
    assert_eq!(fs::read(m.mnt(".fencefs/mine")).unwrap(), b"host file");
    assert_errno(fs::metadata(m.mnt(".fencefs/README")), libc::ENOENT, "off").ok();
    // On (reload): the virtual directory replaces it at once, and neither is listed.
    m.reload_with(&format!("agent_notes = true\n{off}"));
    assert!(
        eventually(Duration::from_secs(5), || fs::metadata(
            m.mnt(".fencefs/README")
        )
        .is_ok()),
        "notes on after reload: {}",
        m.stderr()
    );
    assert_errno(
        fs::metadata(m.mnt(".fencefs/mine")),
        libc::ENOENT,
        "shadowed",
    )
    .ok();
    let names = names_str(&m.mnt("")).unwrap();
    assert_eq!(names.iter().filter(|n| *n == ".fencefs").count(), 0);
    assert!(note(&m, AGENT, "policy").contains("\n0 hidden rules\n"));
    // A reload changes what `policy` shows at once.
    m.reload_with(&format!(
        "agent_notes = true\n{off}[[rule]]\npath = \"docs\"\naccess = \"write\"\n"
    ));
    assert!(
        eventually(Duration::from_secs(5), || note(&m, AGENT, "policy")
            .contains("docs  write\n")),
        "policy after reload"
    );
    // Off again: the host entry is back, unchanged.
    m.reload_with(off);
    assert!(
        eventually(Duration::from_secs(5), || fs::read(m.mnt(".fencefs/mine"))
            .is_ok_and(|d| d == b"host file")),
        "host entry back"
    );
    assert_errno(
        fs::metadata(m.mnt(".fencefs/README")),
        libc::ENOENT,
        "off again",
    )
    .ok();
    assert_eq!(fs::read(m.host(".fencefs/mine")).unwrap(), b"host file");
}

#[test]
fn denials_keep_the_last_100_and_a_bounded_number_of_uids() {
    let m = mount("notes-bounds", POLICY);
    // 130 refusals as 1000 in one shell: the last 100 are kept, newest last.
    m.sh_as(
        AGENT,
        "i=0; while [ $i -lt 130 ]; do cat hid-$i 2>/dev/null; i=$((i+1)); done; true",
    )
    .assert_ok("130 refusals");
    let d = note(&m, AGENT, "denials");
    let lines: Vec<&str> = d.lines().collect();
    assert_eq!(lines.len(), 100, "{d}");
    assert!(lines.last().unwrap().contains(" hid-129 "), "{d}");
    assert!(lines.first().unwrap().contains(" hid-30 "), "{d}");
    // A caller cycling uids evicts the uid written least recently, never grows past 64.
    for uid in 2000..2070u32 {
        m.sh_as(uid, "cat hid-cycle 2>/dev/null; true")
            .assert_ok("cycle");
    }
    assert_eq!(note(&m, AGENT, "denials"), "", "uid 1000 evicted");
    assert!(note(&m, 2069, "denials").contains(" hid-cycle "));
}

#[test]
fn layers_are_named_in_policy_and_denials() {
    let mut b = Mount::builder("notes-layers")
        .policy(POLICY)
        .arg("--allow-other");
    setup(&b.host(""));
    mkdirp(&b.host("src/gen"));
    fs::set_permissions(
        b.host("src/gen"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let second = b.outside().join("team.toml");
    fs::write(
        &second,
        "mode = \"workspace-write\"\nwritable_roots = [\"src\"]\ndefault = \"write\"\n\
         [[rule]]\npath = \"src/gen/**\"\naccess = \"read\"\n",
    )
    .unwrap();
    b = b.arg("-p").arg(&second);
    let m = b.start();
    let p = note(&m, AGENT, "policy");
    assert!(p.contains("layers = 2"), "{p}");
    assert!(
        p.contains(&format!("src/gen/**  read  [layer {}]", second.display())),
        "{p}"
    );
    m.sh_as(AGENT, "touch src/gen/x; true")
        .assert_ok("refusal in layer 2");
    let d = note(&m, AGENT, "denials");
    assert!(
        d.lines()
            .any(|l| l.contains(" src/gen") && l.contains("[layer ")),
        "{d}"
    );
}

#[test]
fn no_oracle_when_the_kernel_caches_names() {
    // No rule depends on the caller: names and negative entries are cached by the kernel.
    let p = "agent_notes = true\nmode = \"workspace-write\"\ndefault = \"read\"\n\
             [[rule]]\npath = \"hid-*\"\naccess = \"none\"\n";
    let m = mount("notes-cached", p);
    m.sh_as(
        AGENT,
        "for i in 1 2 3; do cat hid-a; cat hid-b; stat hid-a; stat hid-b; done; true",
    )
    .assert_ok("repeated refusals");
    let d = note(&m, AGENT, "denials");
    let a: Vec<String> = d
        .lines()
        .filter(|l| l.contains(" hid-a "))
        .map(|l| untimed(l).replace("hid-a", "NAME"))
        .collect();
    let b: Vec<String> = d
        .lines()
        .filter(|l| l.contains(" hid-b "))
        .map(|l| untimed(l).replace("hid-b", "NAME"))
        .collect();
    assert!(!a.is_empty(), "{d}");
    assert_eq!(a, b, "{d}");
}

#[test]
fn a_held_request_refused_says_who_refused_it() {
    // No approver is connected (no control socket): an `ask` rule's write is refused at
    // once, and the line says it was asked and who ended it.
    let p = "agent_notes = true\nmode = \"workspace-write\"\ndefault = \"read\"\n\
             writable_roots = [\".\"]\n\
             [[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";
    let m = mount("notes-asked", p);
    let o = m.sh_as(AGENT, "echo x > docs/new; true");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
    let d = note(&m, AGENT, "denials");
    let line = d
        .lines()
        .find(|l| l.contains(" docs/new "))
        .unwrap_or_else(|| panic!("no line for docs/new:\n{d}"));
    let rest = untimed(line);
    assert!(
        rest.starts_with("create docs/new EACCES rule docs read ask=write; asked, refused by "),
        "{rest}"
    );
    assert!(!m.host("docs/new").exists());
}

#[test]
fn staged_mount_says_so_and_stages_nothing_of_it() {
    let mut b = Mount::builder("notes-staged")
        .policy(POLICY)
        .arg("--allow-other");
    setup(&b.host(""));
    let dir = b.root().join("stage");
    b = b.arg("--stage").arg(&dir);
    let m = b.start();
    assert!(note(&m, AGENT, "README").contains("Changes are staged"));
    assert!(note(&m, AGENT, "policy").contains("\nstaging = on"));
    erofs(fs::write(m.mnt(".fencefs/README"), b"x"), "write, staged");
    erofs(fs::create_dir(m.mnt(".fencefs/d")), "mkdir, staged");
    // A staged change elsewhere works; nothing of `.fencefs` is staged or on the host.
    fs::write(m.mnt("src/new.rs"), b"x").unwrap();
    let st = run_fencefs(
        [
            "stage".as_ref(),
            "status".as_ref(),
            "--dir".as_ref(),
            dir.as_os_str(),
        ],
        Duration::from_secs(60),
    );
    assert!(st.stdout.contains("src/new.rs"), "{}", st.stdout);
    assert!(!st.stdout.contains(".fencefs"), "{}", st.stdout);
    assert!(!m.host(".fencefs").exists());
}

#[test]
fn a_long_hidden_path_is_cut_and_an_odd_name_quoted() {
    let p = "agent_notes = true\nmode = \"workspace-write\"\ndefault = \"read\"\n\
             [[rule]]\npath = \"**/zz-*\"\naccess = \"none\"\n";
    let (a, b, c) = ("a".repeat(250), "b".repeat(250), "c".repeat(100));
    let mut bld = Mount::builder("notes-long").policy(p).arg("--allow-other");
    setup(&bld.host(""));
    mkdirp(&bld.host(format!("{a}/{b}/{c}")));
    bld = bld.watchdog(WATCHDOG);
    let m = bld.start();
    m.sh_as(
        AGENT,
        &format!("cat {a}/{b}/{c}/zz-1; cat \"$(printf 'zz-\\033[31mred')\"; true"),
    )
    .assert_ok("refusals");
    let d = note(&m, AGENT, "denials");
    let long = d
        .lines()
        .find(|l| l.contains(&a))
        .unwrap_or_else(|| panic!("{d}"));
    assert!(long.ends_with("... ENOENT hidden"), "{long}");
    assert!(long.len() < 600, "{} bytes", long.len());
    // A terminal escape in a name is shown escaped, never raw.
    assert!(!d.contains('\u{1b}'), "{d:?}");
    assert!(d.contains("zz-\\033[31mred"), "{d}");
}

/// Open notes are bounded per uid: past 64 (files and the directory alike) an open is
/// EMFILE for that uid, another uid still opens, and closing frees the share.
#[test]
fn open_notes_are_bounded_per_uid_and_freed_on_close() {
    let m = mount("notes-open-bound", POLICY);
    let mut held = Vec::new();
    for _ in 0..63 {
        held.push(File::open(m.mnt(".fencefs/denials")).expect("open within the share"));
    }
    let dir = fs::read_dir(m.mnt(".fencefs")).expect("the directory counts too");
    let past = File::open(m.mnt(".fencefs/README"));
    assert_eq!(
        past.err().and_then(|e| e.raw_os_error()),
        Some(libc::EMFILE),
        "the 65th open note of one uid"
    );
    // Another uid's share is its own.
    let o = m.sh_as(AGENT, "head -c 6 .fencefs/README");
    o.assert_ok("uid 1000 opens while root holds 64");
    assert_eq!(o.stdout, "This d");
    drop(dir);
    held.truncate(10);
    // Released asynchronously by the kernel: allow it a moment on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let f = loop {
        match File::open(m.mnt(".fencefs/README")) {
            Ok(f) => break f,
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("closed notes were not freed: {e}"),
        }
    };
    let mut s = String::new();
    (&f).read_to_string(&mut s).unwrap();
    assert!(s.starts_with("This directory"), "{s}");
}
