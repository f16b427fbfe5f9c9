//! `fencefs run`'s fixture: a workspace, a fake HOME and runtime directory owned by uid
//! 1000, and the wrapper that runs `fencefs run` as uid 1000 with no capabilities inside a
//! private mount namespace of the test's own, where /dev/fuse is a 0666 node bound over the
//! host's (0600 on the test machines; the host's /dev never changes).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;

pub const AGENT: u32 = 1000;
pub const LIMIT: Duration = Duration::from_secs(30);

/// The shell that prepares the test's private namespace, then becomes `fencefs run` as
/// uid 1000: `$D` a tmpfs holding a 0666 /dev/fuse node, bound over /dev/fuse.
pub const AS_USER: &str = r#"set -e
mount -t tmpfs -o size=64k,mode=0755 fencefs-test-dev "$D"
mknod -m 0666 "$D/fuse" c 10 229
mount --bind "$D/fuse" /dev/fuse
cd "$CWD"
exec setpriv --reuid 1000 --regid 1000 --clear-groups env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  LC_ALL=C HOME="$H" XDG_RUNTIME_DIR="$R" "$BIN" run "$@""#;

/// One test's tree: ROOT/src the workspace, ROOT/outside/home uid 1000's HOME, ROOT/run
/// its XDG_RUNTIME_DIR, ROOT/dev the device tmpfs's mount point.
pub struct Fixture {
    pub w: Workspace,
}

impl Fixture {
    pub fn new(name: &str) -> Fixture {
        require_fuse();
        let w = Workspace::new(name);
        for d in ["outside/home/.ssh", "outside/home/.cache", "run", "dev"] {
            mkdirp(&w.root.join(d));
        }
        put(&w.src().join("a.txt"), b"hello\n", 0o644);
        put(&w.src().join(".env"), b"TOKEN=secret\n", 0o600);
        put(&w.src().join(".git/config"), b"[core]\n", 0o644);
        // Read-only by agent-config, writable on the host: the run's proof checks it.
        put(&w.src().join(".mcp.json"), b"{}\n", 0o644);
        put(&w.home().join(".ssh/id_ed25519"), b"KEY\n", 0o600);
        put(&w.home().join(".bashrc"), b"# rc\n", 0o644);
        for d in [w.src(), w.home(), w.root.join("run")] {
            chown_tree(&d, AGENT);
        }
        fs::set_permissions(w.root.join("outside"), fs::Permissions::from_mode(0o755)).unwrap();
        Fixture { w }
    }

    pub fn ws(&self) -> PathBuf {
        self.w.src()
    }

    pub fn home(&self) -> PathBuf {
        self.w.home()
    }

    /// `fencefs run ARGS -- sh -c SCRIPT` as uid 1000, in `cwd`.
    pub fn cmd(&self, cwd: &Path, args: &[&str], script: &str) -> Command {
        let mut c = Command::new("unshare");
        c.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            AS_USER,
            "as-user",
        ])
        .args(args)
        .args(["--", "sh", "-c", script])
        .env("D", self.w.root.join("dev"))
        .env("CWD", cwd)
        .env("H", self.home())
        .env("R", self.w.root.join("run"))
        .env("BIN", BIN);
        c
    }

    pub fn run(&self, args: &[&str], script: &str) -> Out {
        run_bounded(self.cmd(&self.ws(), args, script), LIMIT, "fencefs run")
    }
}

pub trait HomeDir {
    fn home(&self) -> PathBuf;
}

impl HomeDir for Workspace {
    fn home(&self) -> PathBuf {
        self.outside().join("home")
    }
}
