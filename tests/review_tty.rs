//! `fencefs review` on a real terminal (a tmux pane) over a real staged mount: navigate
//! the paths, the last turn alone, rewind to a checkpoint, keep one hunk (SOURCE gets it alone), discard
//! another with a note (the merged view loses it, `DIR/feedback.jsonl` has the note), a
//! keep refused because the agent wrote after the screen was drawn (the new state shown),
//! a 5,000-file apply with its progress line,
//! redraw at 200×60 and back at 80×24, a file whose contents and a name whose bytes are
//! escape sequences and bidi characters shown escaped, and quitting leaves the terminal
//! as it was (cooked mode, the shell's screen back), also when it is sent SIGTERM.
//!
//! The test runs its own tmux server (`-S` socket in its own directory) and kills that
//! server only when it ends. The screens it sees are written to
//! `target/tmp/review-screens/` (the book's chapter shows them).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::stage::*;
use common::*;

/// A tmux server of this test's own, one session `t` running a command.
struct Tmux {
    sock: PathBuf,
}

impl Tmux {
    fn start(dir: &Path, cmd: &str) -> Tmux {
        let t = Tmux {
            sock: dir.join("tmux.sock"),
        };
        let ok = t
            .cmd()
            .args(["new-session", "-d", "-x", "80", "-y", "24", "-s", "t"])
            .arg(cmd)
            .status()
            .expect("tmux (scripts/test.sh installs it)")
            .success();
        assert!(ok);
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.sock).env_remove("TMUX");
        c
    }

    fn tmux(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().expect("tmux");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut a = vec!["send-keys", "-t", "t"];
        a.extend_from_slice(keys);
        self.tmux(&a);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "t"])
    }

    #[track_caller]
    fn wait_for(&self, what: &str) -> String {
        self.wait_for_within(what, Duration::from_secs(20))
    }

    #[track_caller]
    fn wait_for_within(&self, what: &str, d: Duration) -> String {
        let mut last = String::new();
        if eventually(d, || {
            last = self.screen();
            last.contains(what)
        }) {
            return last;
        }
        panic!("{what:?} never showed; the pane:\n{}", self.screen());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

fn numbered() -> String {
    (1..=30).map(|i| format!("line {i}\n")).collect()
}

fn edit(s: &str, n: usize, new: &str) -> String {
    s.replacen(&format!("line {n}\n"), &format!("{new}\n"), 1)
}

/// Keeps a screen for the book.
fn keep_screen(name: &str, screen: &str) {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("review-screens");
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join(format!("{name}.txt")), screen).unwrap();
}

#[test]
fn review_keeps_a_hunk_discards_one_with_a_note_and_shows_no_raw_escape() {
    let base = numbered();
    let (m, dir, sock) = staged_live("review-tty", |src| {
        put(&src.join("f.txt"), base.as_bytes(), 0o644);
        put(&src.join("esc.txt"), b"plain\n", 0o644);
    });
    let agent = edit(&edit(&edit(&base, 2, "TWO"), 15, "FIFTEEN"), 28, "XXVIII");
    fs::write(m.mnt("f.txt"), &agent).unwrap();
    fs::write(m.mnt("esc.txt"), b"\x1b[2J\x1b[31mred\x1b]0;pwned\x07\n").unwrap();
    fs::write(m.mnt("evil\u{202e}txt.rs"), b"x\n").unwrap();
    // A new directory big enough that its apply takes a while.
    m.sh("mkdir gen && i=0; while [ $i -lt 5000 ]; do echo $i > gen/$i; i=$((i+1)); done")
        .assert_ok("gen/");
    via(&sock, "checkpoint", &["-m", "turn 1"]).assert_ok("checkpoint");
    fs::write(m.mnt("later.txt"), b"turn 2\n").unwrap();
    let cmd = format!(
        "{BIN} review {}; echo review-exit=$?; stty -a | tr ' ' '\\n' | grep -x -- '-*icanon'; echo stty-done; sleep 600",
        sock.display()
    );
    let t = Tmux::start(m.root(), &cmd);
    let s = t.wait_for("5 changed");
    keep_screen("start", &s);
    assert!(s.contains("A later.txt"), "{s}");
    // The bidi name is quoted as git quotes it; the escape-laden file is shown escaped.
    // (cut to the pane's width at 80 columns)
    assert!(s.contains("A \"evil\\342\\200\\256txt"), "{s}");
    // `t`: the last turn only (after checkpoint 1), then everything again.
    t.keys(&["t"]);
    let s = t.wait_for("1 changed since #1");
    assert!(s.contains("A later.txt"), "{s}");
    t.keys(&["t"]);
    t.wait_for("5 changed");
    // Rewind to checkpoint 1: the turn after it is gone from the merged view.
    t.keys(&["r"]);
    t.wait_for("rewind to checkpoint");
    t.keys(&["1", "Enter"]);
    t.wait_for("rewound to checkpoint 1");
    t.wait_for("4 changed");
    assert!(!m.mnt("later.txt").exists());
    // esc.txt (first): its hunk escaped, nothing raw.
    t.keys(&["k", "k", "k", "k"]);
    let s = t.wait_for("hunk 1 of 1");
    assert!(s.contains("+\\033[2J\\033[31mred\\033]0;pwned\\a"), "{s}");
    keep_screen("escaped", &s);
    // f.txt (after the quoted name): three hunks; the second kept.
    t.keys(&["j", "j"]);
    t.wait_for("hunk 1 of 3");
    t.keys(&["n"]);
    let s = t.wait_for("hunk 2 of 3");
    keep_screen("hunks", &s);
    t.keys(&["a"]);
    t.wait_for("applied M f.txt#2");
    assert_eq!(
        fs::read_to_string(m.host("f.txt")).unwrap(),
        edit(&base, 15, "FIFTEEN")
    );
    assert_eq!(fs::read_to_string(m.mnt("f.txt")).unwrap(), agent);
    t.wait_for("hunk 1 of 2");
    // Discard (now) hunk 1 with a note.
    t.keys(&["d"]);
    t.wait_for("note for the agent");
    t.keys(&["-l", "keep line 2 as it was"]);
    let s = t.wait_for("keep line 2 as it was");
    keep_screen("note", &s);
    t.keys(&["Enter"]);
    t.wait_for("discarded M f.txt#1");
    assert_eq!(
        fs::read_to_string(m.mnt("f.txt")).unwrap(),
        edit(&edit(&base, 15, "FIFTEEN"), 28, "XXVIII")
    );
    let fb = fs::read_to_string(dir.join("feedback.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = fb
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{fb}");
    assert_eq!(lines[0]["decision"], "applied");
    assert_eq!(lines[0]["hunks"], serde_json::json!([2]));
    assert_eq!(lines[1]["decision"], "discarded");
    assert_eq!(lines[1]["path"], "f.txt");
    assert_eq!(lines[1]["hunks"], serde_json::json!([1]));
    assert_eq!(lines[1]["note"], "keep line 2 as it was");
    // The agent writes again after the screen was drawn: the keep is refused, nothing is
    // written, and the new state is shown.
    m.sh("echo more >> f.txt").assert_ok("append");
    t.keys(&["a"]);
    let s = t.wait_for("shown again");
    assert!(s.contains("refused M f.txt#1@"), "{s}");
    t.wait_for("+more");
    assert_eq!(
        fs::read_to_string(m.host("f.txt")).unwrap(),
        edit(&base, 15, "FIFTEEN")
    );
    // A long apply runs off the UI thread: the screen is redrawn with a progress line
    // while it runs.
    t.keys(&["j", "A"]);
    let mut seen = String::new();
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = t.screen();
            seen.contains("apply gen@") && seen.contains(" … ")
        }),
        "no progress line; the pane:\n{seen}"
    );
    keep_screen("progress", &seen);
    // (5,000 files with a syncfs per batch: seconds on a loaded machine.)
    t.wait_for_within("applied A gen/ (5000 entries)", Duration::from_secs(180));
    assert_eq!(fs::read_to_string(m.host("gen/4999")).unwrap(), "4999\n");
    assert_eq!(fs::read_dir(m.host("gen")).unwrap().count(), 5000);
    // Resize: 200×60, then back to 80×24; the keys line is whole both times.
    t.tmux(&["resize-window", "-t", "t", "-x", "200", "-y", "60"]);
    assert!(
        eventually(Duration::from_secs(10), || {
            let s = t.screen();
            s.lines().count() == 60 && s.lines().last().unwrap_or("").contains("q quit")
        }),
        "{}",
        t.screen()
    );
    keep_screen("large", &t.screen());
    t.tmux(&["resize-window", "-t", "t", "-x", "80", "-y", "24"]);
    assert!(
        eventually(Duration::from_secs(10), || {
            let s = t.screen();
            s.lines().count() == 24
                && s.lines().all(|l| l.chars().count() <= 80)
                && s.lines().last().unwrap_or("").contains("q quit")
        }),
        "{}",
        t.screen()
    );
    // Quit: the shell's screen is back, in cooked mode (icanon, not -icanon).
    t.keys(&["q"]);
    let s = t.wait_for("stty-done");
    let after = s
        .lines()
        .skip_while(|l| !l.contains("review-exit=0"))
        .nth(1)
        .unwrap_or("");
    assert_eq!(after.trim(), "icanon", "{s}");
    assert!(!s.contains("changed"), "the alternate screen is gone: {s}");
}

/// `fencefs stage OP SOCKET ARGS…`.
fn via(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into()];
    v.push(sock.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// The pid of the `fencefs review` process whose arguments include `sock`.
fn review_pid(sock: &Path) -> Option<u32> {
    let want = sock.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        (args.get(1) == Some(&&b"review"[..]) && args.contains(&want)).then_some(pid)
    })
}

#[test]
fn sigterm_restores_the_terminal() {
    let (m, _dir, sock) = staged_live("review-term", |src| put(&src.join("a"), b"a\n", 0o644));
    fs::write(m.mnt("a"), b"b\n").unwrap();
    let cmd = format!(
        "{BIN} review {}; echo review-exit=$?; stty -a | tr ' ' '\\n' | grep -x -- '-*icanon'; echo stty-done; sleep 600",
        sock.display()
    );
    let t = Tmux::start(m.root(), &cmd);
    t.wait_for("1 changed");
    let pid = review_pid(&sock).expect("the review process");
    // Our own child's child (tmux runs it for this test): SIGTERM it.
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    let s = t.wait_for("stty-done");
    let after = s
        .lines()
        .skip_while(|l| !l.contains("review-exit=0"))
        .nth(1)
        .unwrap_or("");
    assert_eq!(after.trim(), "icanon", "{s}");
    assert!(!s.contains("changed"), "the alternate screen is gone: {s}");
}

#[test]
fn review_on_a_dir_no_daemon_serves() {
    let base = numbered();
    let (mut m, dir, _sock) = staged_live("review-dir", |src| {
        put(&src.join("f.txt"), base.as_bytes(), 0o644);
        put(&src.join("g.txt"), b"g\n", 0o644);
    });
    let agent = edit(&edit(&base, 2, "TWO"), 28, "XXVIII");
    fs::write(m.mnt("f.txt"), &agent).unwrap();
    fs::write(m.mnt("g.txt"), b"G\n").unwrap();
    stop(&mut m);
    let cmd = format!(
        "{BIN} review --dir {}; echo review-exit=$?; sleep 600",
        dir.display()
    );
    let t = Tmux::start(m.root(), &cmd);
    t.wait_for("2 changed");
    t.wait_for("hunk 1 of 2");
    // Keep hunk 2 of f.txt, discard g.txt whole with a note; each takes DIR's lock.
    t.keys(&["n", "a"]);
    t.wait_for("applied M f.txt#2");
    assert_eq!(
        fs::read_to_string(m.host("f.txt")).unwrap(),
        edit(&base, 28, "XXVIII")
    );
    t.keys(&["j", "D"]);
    t.wait_for("note for the agent");
    t.keys(&["-l", "no"]);
    t.keys(&["Enter"]);
    t.wait_for("discarded M g.txt");
    t.wait_for("1 changed");
    assert_eq!(fs::read(m.host("g.txt")).unwrap(), b"g\n");
    assert_eq!(stage(&["status"], &dir).stdout, "M f.txt\n");
    let fb = fs::read_to_string(dir.join("feedback.jsonl")).unwrap();
    assert!(
        fb.contains(r#""path":"g.txt""#) && fb.contains(r#""note":"no""#),
        "{fb}"
    );
    t.keys(&["q"]);
    t.wait_for("review-exit=0");
}

#[test]
fn without_arguments_review_finds_the_run_of_the_current_workspace() {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let b = Mount::builder("review-find").policy(WRITE);
    put(&b.host("sub/a.txt"), b"a\n", 0o644);
    let src = b.host("").canonicalize().unwrap();
    // Where `fencefs run` puts a run's control sockets: $XDG_RUNTIME_DIR/fencefs/HASH.
    let hash: String = sha2::Sha256::digest(src.as_os_str().as_bytes())
        .iter()
        .take(8)
        .map(|x| format!("{x:02x}"))
        .collect();
    let xdg = b.root().join("xdg-run");
    let rt = xdg.join("fencefs").join(&hash);
    fs::create_dir_all(&rt).unwrap();
    let dir = stage_dir(&b);
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(rt.join("control.4242"))
        .start();
    fs::write(m.mnt("sub/a.txt"), b"A\n").unwrap();
    // Run from a directory below the workspace.
    let cmd = format!(
        "cd {} && XDG_RUNTIME_DIR={} {BIN} review; echo review-exit=$?; sleep 600",
        src.join("sub").display(),
        xdg.display()
    );
    let t = Tmux::start(m.root(), &cmd);
    let s = t.wait_for("1 changed");
    assert!(s.contains("M sub/a.txt") && s.contains("/xdg-run/"), "{s}");
    t.keys(&["q"]);
    t.wait_for("review-exit=0");
}
