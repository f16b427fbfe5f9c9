//! `fencefs run` on a real terminal (tmux panes): as uid 1000 under a job-control shell,
//! Ctrl-Z stops the job and `fg` continues it, Ctrl-C ends COMMAND (130), a window resize
//! reaches COMMAND as SIGWINCH with the new size, raw mode reads a key without Enter; as
//! root, the staged run's end-of-run choice applies the changes.
//!
//! Each test runs its own tmux server (`-S` socket in its own directory) and kills that
//! server only (with what runs in its panes) when it ends.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::run::*;
use common::*;

/// A tmux server of this test's own.
struct Tmux {
    sock: PathBuf,
}

impl Tmux {
    /// Starts a 80x24 session running `cmd` (a shell command line) with `env`.
    fn start(dir: &Path, cmd: &str, env: &[(&str, String)]) -> Tmux {
        let t = Tmux {
            sock: dir.join("tmux.sock"),
        };
        let mut c = t.cmd();
        c.args(["new-session", "-d", "-x", "80", "-y", "24", "-s", "t"]);
        for (k, v) in env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        c.arg(cmd);
        assert!(
            c.status()
                .expect("tmux (scripts/test.sh installs it)")
                .success()
        );
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
        self.tmux(&["capture-pane", "-p", "-t", "t", "-S", "-100"])
    }

    /// Waits until the pane shows `what`; panics with the screen otherwise.
    #[track_caller]
    fn wait_for(&self, what: &str) {
        if !eventually(Duration::from_secs(15), || self.screen().contains(what)) {
            panic!("{what:?} never showed; the pane:\n{}", self.screen());
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

/// A job-control shell as uid 1000 in the test's private namespace (see `AS_USER`).
const USER_SHELL: &str = r#"set -e
mount -t tmpfs -o size=64k,mode=0755 fencefs-test-dev "$D"
mknod -m 0666 "$D/fuse" c 10 229
mount --bind "$D/fuse" /dev/fuse
cd "$CWD"
exec setpriv --reuid 1000 --regid 1000 --clear-groups env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  LC_ALL=C TERM=screen HOME="$H" XDG_RUNTIME_DIR="$R" PS1='sh> ' FENCEFS="$BIN" bash --norc --noprofile -i"#;

fn user_shell(f: &Fixture) -> Tmux {
    let env = [
        ("D", f.w.root.join("dev").display().to_string()),
        ("CWD", f.ws().display().to_string()),
        ("H", f.home().display().to_string()),
        ("R", f.w.root.join("run").display().to_string()),
        ("BIN", BIN.to_string()),
    ];
    let cmd = format!(
        "unshare -m --propagation private sh -c {}",
        shell_quote(USER_SHELL)
    );
    let t = Tmux::start(&f.w.root, &cmd, &env);
    t.wait_for("sh>");
    t
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn job_control_signals_window_size_and_raw_mode_as_an_ordinary_user() {
    let f = Fixture::new("run-tty");
    let t = user_shell(&f);
    // Ctrl-Z stops the job (the shell gets its prompt back), fg continues it. The job
    // is a script (its markers then show only as its output) that says when it is
    // continued, before the answer is typed (typed earlier, the shell could take it).
    let job = f.w.root.join("outside/job.sh");
    put(
        &job,
        b"trap 'echo cont-mark' CONT\necho ready-mark\nx=\n\
          while [ -z \"$x\" ]; do read x; done\necho got-$x\ncat a.txt\n",
        0o644,
    );
    t.keys(&[
        &format!("$FENCEFS run --live -- sh {}", job.display()),
        "Enter",
    ]);
    t.wait_for("ready-mark");
    t.keys(&["C-z"]);
    t.wait_for("Stopped");
    t.keys(&["fg", "Enter"]);
    t.wait_for("cont-mark");
    t.keys(&["yes", "Enter"]);
    t.wait_for("got-yes");
    t.wait_for("hello");
    t.keys(&["echo status=$?", "Enter"]);
    t.wait_for("status=0");
    // (Markers are typed as wait""ing: the screen shows them once COMMAND prints them.)
    // Ctrl-C ends COMMAND; fencefs run exits 130 and leaves nothing behind.
    t.keys(&[
        "$FENCEFS run --live -- sh -c 'echo wait\"\"ing; sleep 60'",
        "Enter",
    ]);
    t.wait_for("waiting");
    t.keys(&["C-c"]);
    t.keys(&["echo int=$?", "Enter"]);
    t.wait_for("int=130");
    // A resize reaches COMMAND as SIGWINCH, with the new size.
    t.keys(&[
        "$FENCEFS run --live -- sh -c 'trap \"printf winch=; stty size\" WINCH; echo trap\"\"ped; \
         while :; do sleep 0.1; done'",
        "Enter",
    ]);
    t.wait_for("trapped");
    t.tmux(&["resize-window", "-t", "t", "-x", "100", "-y", "30"]);
    t.wait_for("winch=30 100");
    t.keys(&["C-c"]);
    // Raw mode: one key, no Enter.
    t.keys(&[
        "$FENCEFS run --live -- sh -c 'stty raw -echo; echo raw-rea\"\"dy; \
         k=$(dd bs=1 count=1 2>/dev/null); stty sane; echo key=$k'",
        "Enter",
    ]);
    t.wait_for("raw-ready");
    t.keys(&["q"]);
    t.wait_for("key=q");
    assert!(!is_mounted(&f.ws()), "nothing mounted on the host");
}

#[test]
fn a_staged_run_on_a_terminal_offers_to_apply_as_root() {
    let f = Fixture::new("run-tty-staged");
    let env = [
        ("HOME", f.home().display().to_string()),
        (
            "XDG_RUNTIME_DIR",
            f.w.root.join("run").display().to_string(),
        ),
        (
            "XDG_STATE_HOME",
            f.w.root.join("state").display().to_string(),
        ),
    ];
    let cmd = format!(
        "cd {} && {BIN} run -- sh -c 'echo staged > new.txt'; echo run-exited=$?; sleep 60",
        shell_quote(&f.ws().display().to_string())
    );
    let t = Tmux::start(&f.w.root, &cmd, &env);
    t.wait_for("A new.txt");
    t.wait_for("[a]pply all");
    assert!(
        !f.ws().join("new.txt").exists(),
        "staged: the workspace is untouched"
    );
    t.keys(&["a", "Enter"]);
    t.wait_for("run-exited=0");
    assert_eq!(std::fs::read(f.ws().join("new.txt")).unwrap(), b"staged\n");
}
