//! The command line (clap): `mount`, `check`, `explain`. Parsing only; no I/O.
//! (`fuse_opts` maps mount(8)'s `SOURCE MOUNTPOINT -o OPTS` form onto [`MountArgs`].)

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::policy::Mode;

/// `fencefs --version`: the crate version and the git commit it was built from (build.rs;
/// "unknown" outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FENCEFS_COMMIT"),
    ")"
);

/// fencefs: a FUSE mirror of a workspace where a policy decides every operation.
#[derive(Parser, Debug)]
#[command(name = "fencefs", version = VERSION, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// One value, parsed once at start: the size of `Mount`'s arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write the man pages and shell completions into DIR (packaging; see docs.rs).
    #[command(hide = true)]
    GenerateDocs {
        /// Output directory (created): man/, completions/.
        dir: PathBuf,
    },
    /// Mount SOURCE at MOUNTPOINT and serve it until unmounted or SIGINT/SIGTERM.
    // MOUNTPOINT is required unless the mount is handed over (`--fuse-fd-from`); set here,
    // not on MountArgs, which vhost-user flattens without a MOUNTPOINT.
    #[command(mut_arg("mountpoint", |a| a.required_unless_present("fuse_fd_from")))]
    Mount(MountArgs),
    /// Run COMMAND with the workspace (and $HOME) fenced at their own paths, in a private
    /// namespace: no root needed; exits with COMMAND's status.
    Run(RunArgs),
    /// `fencefs run`'s init: pid 1 of COMMAND's PID namespace (internal).
    #[command(hide = true, name = "run-init")]
    RunInit {
        /// COMMAND enters one more user namespace first (root's COMMAND).
        #[arg(long)]
        lock: bool,
        /// COMMAND's working directory.
        #[arg(long)]
        cwd: PathBuf,
        /// COMMAND and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
    /// Serve SOURCE to a VM as a vhost-user virtio-fs device on SOCKET (QEMU's
    /// vhost-user-fs-pci, cloud-hypervisor's --fs); exits 0 when the VM disconnects.
    VhostUser(VhostArgs),
    /// Validate policies (a set of layers): `ok: N rules` (exit 0) or every error with
    /// file:line:column (exit 1).
    Check {
        /// The policy files (layers, in order).
        #[arg(required = true)]
        policy: Vec<PathBuf>,
    },
    /// Print every built-in preset's rules, each with the reason it is there.
    Presets,
    /// Print the policy file's JSON Schema (for editors: taplo, VS Code "Even Better TOML").
    Schema,
    /// Print the access PATH gets and what decided it; with OP also allow/deny and the errno.
    Explain(ExplainArgs),
    /// Draft a policy from an audit log written with --audit-allowed: what the session
    /// used and no more (directories used alike folded), on stdout.
    Learn(LearnArgs),
    /// Kubernetes CSI node plugin (Identity and Node services) on a Unix socket: mounts
    /// `fencefs.dev` inline volumes and hands each one's FUSE descriptor to the pod's
    /// `fencefs mount --fuse-fd-from` sidecar.
    Csi(CsiArgs),
    /// Send one command to a daemon's control socket and print the answer.
    Ctl {
        /// The daemon's `--control` socket.
        socket: PathBuf,
        /// status | reload | held | learn (write `--learn`'s draft now)
        #[arg(value_parser = ["status", "reload", "held", "learn"])]
        what: String,
    },
    /// Review staged changes: status, diff, apply, discard (`mount --stage DIR`).
    Stage(crate::stage::cli::StageArgs),
    /// Review staged changes in a terminal UI: keep or discard paths and single hunks.
    Review(ReviewArgs),
    /// List the answers remembered for good in an --answers FILE, for review.
    Answers {
        /// The daemon's --answers file.
        file: PathBuf,
    },
    /// Print (print) or add to the agent's user settings (install) the agent's own hook
    /// that seals a checkpoint before each prompt, with the prompt's first line.
    Hooks(HooksArgs),
    /// The hook the agent runs: reads the agent's hook event (JSON with `prompt`) on stdin
    /// and asks the checkpoint channel ($FENCEFS_CHECKPOINT) for a checkpoint; exits 0.
    CheckpointHook(CheckpointHookArgs),
    /// Approve or deny held requests: an approver on this terminal (y / a / A / n).
    Approve {
        /// The daemon's `--control` socket.
        socket: PathBuf,
        /// Answer every request without asking (for scripts and tests).
        #[arg(long, value_name = "allow|deny", value_parser = ["allow", "deny"])]
        auto: Option<String>,
    },
}

/// The agents `fencefs hooks` knows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookAgent {
    /// Claude Code (~/.claude/settings.json, UserPromptSubmit).
    ClaudeCode,
    /// Codex CLI (~/.codex/hooks.json, UserPromptSubmit).
    Codex,
    /// Gemini CLI (~/.gemini/settings.json, BeforeAgent).
    Gemini,
}

/// `fencefs hooks`.
#[derive(clap::Args, Debug)]
pub struct HooksArgs {
    /// print: show the configuration; install: add it to the settings file (a backup of
    /// the file beside it, every other setting kept).
    #[arg(value_parser = ["print", "install"])]
    pub action: String,
    /// The agent.
    #[arg(value_enum)]
    pub agent: HookAgent,
    /// The settings file (default: the agent's user settings file).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// The hook's command (default: this fencefs, `checkpoint-hook --agent AGENT`).
    #[arg(long, value_name = "CMD")]
    pub command: Option<String>,
}

/// `fencefs checkpoint-hook`.
#[derive(clap::Args, Debug)]
pub struct CheckpointHookArgs {
    /// The agent whose hook event is read (gemini: `{}` is printed on stdout).
    #[arg(long, value_enum, default_value = "claude-code")]
    pub agent: HookAgent,
    /// The checkpoint channel (default: $FENCEFS_CHECKPOINT; unset: do nothing).
    #[arg(long, value_name = "SOCKET")]
    pub socket: Option<PathBuf>,
    /// The message, instead of the prompt read from stdin.
    #[arg(short, long, value_name = "MESSAGE")]
    pub message: Option<String>,
}

/// `fencefs mount`.
#[derive(clap::Args, Debug)]
pub struct MountArgs {
    /// Policy file (TOML); repeat it for layers, each of which can only tighten. Without it:
    /// mode read-only, default access read.
    #[arg(short, long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// read-only | workspace-write | danger. Overrides the file's mode, also after reloads.
    #[arg(short, long, value_name = "MODE", value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// Append audit events as JSON lines to FILE ('-' = stderr).
    #[arg(long, value_name = "FILE|-")]
    pub audit: Option<String>,
    /// Log allowed operations too (default: refusals only).
    #[arg(long)]
    pub audit_allowed: bool,
    /// Learn a policy: report-only (what a grant, the mode or an ask would refuse is
    /// allowed and audited as would-deny; none rules still hide; set-ID bits, device
    /// nodes and the policy files stay refused), and at unmount a draft policy of what
    /// was used replaces OUT.toml (mode 0600, never written through a symlink).
    #[arg(long, value_name = "OUT.toml")]
    pub learn: Option<PathBuf>,
    /// Rotate the audit file before it would exceed SIZE bytes (suffix K, M or G:
    /// binary multiples; 0 = never rotate). Not for `--audit -`.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size,
          requires = "audit")]
    pub audit_max_size: u64,
    /// Rotated audit files kept (FILE.1 … FILE.N; 0 = none).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(0..=1000), requires = "audit")]
    pub audit_keep: u32,
    /// Let other uids (container users) use the mount; the kernel checks Unix permissions.
    #[arg(long)]
    pub allow_other: bool,
    /// FUSE worker threads of the /dev/fuse loop (default: number of CPUs); with io_uring
    /// they only carry FORGET and INTERRUPT (the rings have one queue thread per CPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// Re-check every read and write against the policy in force (slower).
    #[arg(long)]
    pub revoke: bool,
    /// Do not confine the FUSE worker threads (Landlock to SOURCE, no_new_privs).
    #[arg(long)]
    pub no_confine: bool,
    /// Serve file I/O through the daemon even where kernel passthrough is available.
    #[arg(long)]
    pub no_passthrough: bool,
    /// How requests reach the daemon: FUSE over io_uring where the kernel offers it
    /// (auto), io_uring or fail (io-uring; as root it turns the kernel's switch on), or
    /// the classic /dev/fuse loop (dev-fuse).
    #[arg(long, value_enum, value_name = "HOW", default_value = "auto")]
    pub transport: crate::transport::Choice,
    /// Seconds the kernel may cache names and attributes (default: 10 when host changes
    /// are watched, 1 otherwise; 0 disables caching).
    #[arg(long, value_name = "SECONDS")]
    pub cache_ttl: Option<f64>,
    /// Do not watch SOURCE for changes made by other processes (fanotify).
    #[arg(long)]
    pub no_watch: bool,
    /// Serve no extended attributes (as virtiofsd without --xattr): every xattr request is
    /// answered ENOSYS, so the kernel stops asking and callers get EOPNOTSUPP (no ACLs,
    /// no security.* labels or capabilities, no user.* attributes through the mount).
    #[arg(long)]
    pub no_xattr: bool,
    /// Serve the host directory DIR at PATH in the mount (PATH=DIR, repeatable; PATH is
    /// relative to the mount's root and must not exist in SOURCE).
    #[arg(long = "root", value_name = "PATH=DIR")]
    pub root: Vec<String>,
    /// When SOURCE is a linked git worktree, serve it as it is (its `.git` file names a
    /// host path) instead of serving the repository git needs through the mount.
    #[arg(long)]
    pub no_git_worktree: bool,
    /// Map a caller uid to a host uid (CONTAINER:HOST, repeatable): files of HOST appear
    /// owned by CONTAINER; files CONTAINER creates or chowns land on the host as HOST.
    #[arg(long, value_name = "CONTAINER:HOST")]
    pub map_uid: Vec<String>,
    /// Map a caller gid to a host gid (CONTAINER:HOST, repeatable).
    #[arg(long, value_name = "CONTAINER:HOST")]
    pub map_gid: Vec<String>,
    /// Serve the control socket (status, reload, approvals) at SOCKET; it must live
    /// outside the mount and out of the agent's reach.
    #[arg(long, value_name = "SOCKET")]
    pub control: Option<PathBuf>,
    /// Members of GROUP (name or gid) may also use the control socket (mode 0660).
    #[arg(long, value_name = "GROUP", requires = "control")]
    pub control_group: Option<String>,
    /// Seconds a request held for an approver waits before it is refused.
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub ask_timeout: u64,
    /// Seconds a held directory change (create, mkdir, mknod, symlink, link, unlink,
    /// rmdir, rename: the kernel keeps its directory locked meanwhile) waits at most; then
    /// it fails with EACCES, its question stays open until --ask-timeout, and an allow
    /// given then lets the same uid's retry through for 120 s. 0: never held (refused at
    /// once, question posted).
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub ask_dir_hold: u64,
    // The help text shows `[[answer]]` as written (not a doc link).
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Keep answers given with "remember":"always" in FILE (TOML, one [[answer]] table
    /// each; a person may edit it, it is re-read on reload) and consult them before asking.
    /// A rewrite keeps FILE's mode and owner; a new FILE is 0600.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// Run CMD for every newly held request, the ask event as one JSON line on its stdin
    /// (no shell: CMD is split at spaces). At most 4 run at once, each killed after 10 s;
    /// a failure goes to the log; it runs with umask 0077. For notifications: it never
    /// delays or decides a request.
    #[arg(long, value_name = "CMD", requires = "control")]
    pub ask_exec: Option<OsString>,
    /// At most N host descriptors held for one uid's open files and directories (default:
    /// a quarter of what the daemon has for open handles); past it that uid gets EMFILE.
    /// Kernel-passthrough files hold none.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_open_per_uid: Option<u32>,
    /// Write "ready\n" to this file descriptor (then close it) once the mount serves
    /// requests. With $NOTIFY_SOCKET set, systemd also gets READY=1 (Type=notify).
    #[arg(long, value_name = "FD")]
    pub ready_fd: Option<i32>,
    /// Stage every change in DIR (created 0700, outside SOURCE and the mount point):
    /// SOURCE stays untouched until `fencefs stage apply`.
    #[arg(long, value_name = "DIR")]
    pub stage: Option<PathBuf>,
    /// Serve the agent's checkpoint channel at SOCKET (mode 0600; needs --stage): it only
    /// seals checkpoints (`fencefs checkpoint-hook`), at most one a second and 1,000 per
    /// staging area. Hand it to an agent's container explicitly; keep --control away.
    #[arg(long, value_name = "SOCKET", requires = "stage")]
    pub checkpoint_socket: Option<PathBuf>,
    /// Set when started by mount(8) (`fuse_opts`): stdio is detached once the mount is
    /// ready, after the waiting parent has been told.
    #[arg(skip)]
    pub daemonized: bool,
    /// Set by `fencefs run`: mount with mount(2) directly (inside the run's private user
    /// and mount namespace, where fusermount3 cannot work) and unmount by detaching.
    #[arg(skip)]
    pub direct: bool,
    /// Set by `fencefs run`: requests wait for an approver even while none is connected
    /// (until --ask-timeout); without --ask-exec, a newly held one prints one line on
    /// stderr saying how to answer it (at most one every 30 s).
    #[arg(skip)]
    pub hold_asks: bool,
    /// Serve the FUSE descriptor handed over on the Unix socket SOCKET instead of mounting
    /// (no MOUNTPOINT, no privilege): binds SOCKET (0600) once the policy loaded, takes one
    /// `/dev/fuse` descriptor a privileged mounter (`fencefs csi`) sends (SCM_RIGHTS) and
    /// serves it; the mount ends when the mounter unmounts it.
    #[arg(long, value_name = "SOCKET")]
    pub fuse_fd_from: Option<PathBuf>,
    /// Reload when a policy file (`-p`) changes: its directory is watched, so an editor's
    /// write and the kubelet's swap of a ConfigMap's `..data` symlink both reload (an
    /// invalid file keeps the policy in force, as SIGHUP).
    #[arg(long)]
    pub watch_policy: bool,
    /// The host directory to mirror.
    pub source: PathBuf,
    /// Where to mount it (none with --fuse-fd-from).
    #[arg(default_value = NO_MOUNTPOINT, hide_default_value = true)]
    pub mountpoint: PathBuf,
}

/// `fencefs csi`.
#[derive(clap::Args, Debug)]
pub struct CsiArgs {
    /// The gRPC endpoint the kubelet calls (`unix:///csi/csi.sock`).
    #[arg(long, value_name = "unix://PATH")]
    pub endpoint: String,
    /// This node's name, as NodeGetInfo reports it (the DaemonSet passes spec.nodeName).
    #[arg(long, value_name = "NODE")]
    pub node_id: String,
    /// The driver's name (the CSIDriver object's name).
    #[arg(long, value_name = "NAME", default_value = "fencefs.dev")]
    pub driver_name: String,
}

/// What `fencefs run --home` does with $HOME.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HomeChoice {
    /// Serve $HOME through a fence with the built-in `home` preset.
    Fence,
    /// Leave $HOME as it is.
    Keep,
}

/// `fencefs run`.
#[derive(clap::Args, Debug)]
// The help texts show placeholders such as `<workspace hash>` as written (not HTML).
#[allow(rustdoc::invalid_html_tags)]
pub struct RunArgs {
    /// The directory to fence (default: the current directory).
    #[arg(short, long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Policy layers, as `mount` (default: the presets secrets and agent-config, plus the
    /// workspace's .fencefs.toml when it has one).
    #[arg(short, long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// Write through to the workspace (as the policy allows) instead of staging.
    #[arg(long)]
    pub live: bool,
    /// Where the staging area lives (default: $XDG_STATE_HOME/fencefs/<workspace hash>/stage).
    #[arg(long, value_name = "DIR", conflicts_with = "live")]
    pub stage_dir: Option<PathBuf>,
    /// Fence $HOME with the `home` preset (fence), or leave it as it is (keep).
    #[arg(long, value_enum, value_name = "fence|keep", default_value = "fence")]
    pub home: HomeChoice,
    /// Append audit events as JSON lines to FILE ('-' = stderr).
    #[arg(long, value_name = "FILE|-")]
    pub audit: Option<String>,
    /// Keep answers given with "remember":"always" in FILE (as `mount --answers`).
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// Run CMD for every newly held request (as `mount --ask-exec`).
    #[arg(long, value_name = "CMD")]
    pub ask_exec: Option<OsString>,
    /// Seconds a request held for an approver waits before it is refused.
    #[arg(long, value_name = "SECONDS")]
    pub ask_timeout: Option<u64>,
    /// The control socket (default: $XDG_RUNTIME_DIR/fencefs/<workspace hash>/control.<pid>).
    #[arg(long, value_name = "SOCKET")]
    pub control: Option<PathBuf>,
    /// Map a caller uid to a host uid (CONTAINER:HOST, repeatable), as `mount`.
    #[arg(long, value_name = "CONTAINER:HOST")]
    pub map_uid: Vec<String>,
    /// Map a caller gid to a host gid (CONTAINER:HOST, repeatable), as `mount`.
    #[arg(long, value_name = "CONTAINER:HOST")]
    pub map_gid: Vec<String>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<OsString>,
}

/// What `vhost-user`'s hidden MOUNTPOINT reads when none is given (one is an error).
pub const NO_MOUNTPOINT: &str = "-";

/// `fencefs vhost-user`: the mount options, no MOUNTPOINT (the guest mounts the tag).
#[derive(clap::Args, Debug)]
#[command(mut_arg("mountpoint", |a| a.required(false).hide(true).default_value(NO_MOUNTPOINT)))]
pub struct VhostArgs {
    /// The vhost-user socket to listen on (the hypervisor connects to it).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// After the VM disconnects, wait for the next connection instead of exiting.
    #[arg(long)]
    pub keep_serving: bool,
    /// Request queues the device offers (the guest uses up to what the hypervisor's
    /// num-request-queues says), each served by its own thread.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub request_queues: u16,
    /// The mount options (those about the FUSE mount itself do not apply).
    #[command(flatten)]
    pub mount: MountArgs,
}

/// `fencefs learn`.
#[derive(clap::Args, Debug)]
pub struct LearnArgs {
    /// The audit log (JSON lines; rotated files can be concatenated).
    pub audit: PathBuf,
    /// A base policy (repeat it for layers): paths it hides are never granted, and its
    /// `none` rules are kept in the draft.
    #[arg(short, long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,
}

/// `fencefs explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Policy file; repeat it for layers (default: the built-in read-only policy).
    #[arg(short, long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// Mode override.
    #[arg(short, long, value_name = "MODE", value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// Caller uid (default 0).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub uid: u32,
    /// Caller gid (default 0).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gid: u32,
    /// A root of the mount, as `mount --root PATH=DIR` gives it (repeatable): `explain`
    /// then names the root PATH is in.
    #[arg(long = "root", value_name = "PATH=DIR")]
    pub root: Vec<String>,
    /// Also read the workspace layer and the ignore files in DIR, as a mount of DIR would.
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// Workspace-relative path (taken as a file; end it with '/' for a directory).
    pub path: String,
    /// read | write | create | append | delete | rename | list
    #[arg(value_parser = ["read", "write", "create", "append", "delete", "rename", "list"])]
    pub op: Option<String>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

/// A byte count: digits with an optional K, M or G (×1024, ×1024², ×1024³; either case).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad =
        || format!("invalid size '{s}': expected a number of bytes, optionally with K, M or G");
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size '{s}': too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("64K"), Ok(65_536));
        assert_eq!(parse_size("64k"), Ok(65_536));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        for bad in ["", "K", "-1", "1.5M", "1T", "12 K", "0x10", "64MB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err(), "overflow");
    }

    #[test]
    fn audit_rotation_options_default_and_parse() {
        let m = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Command::Mount(m),
            }) => Ok((m.audit_max_size, m.audit_keep)),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(
            m(&["fencefs", "mount", "--audit", "f", "s", "p"]),
            Ok((64 << 20, 4))
        );
        assert_eq!(
            m(&[
                "fencefs",
                "mount",
                "--audit",
                "f",
                "--audit-max-size",
                "64K",
                "--audit-keep",
                "2",
                "s",
                "p"
            ]),
            Ok((65_536, 2))
        );
        assert_eq!(
            m(&["fencefs", "mount", "--audit-keep", "2", "s", "p"]),
            Err(clap::error::ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            m(&[
                "fencefs",
                "mount",
                "--audit",
                "f",
                "--audit-max-size",
                "1T",
                "s",
                "p"
            ]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }
}

/// `fencefs review`.
#[derive(clap::Args, Debug)]
pub struct ReviewArgs {
    /// The staging area itself (no daemon serving it).
    #[arg(long, value_name = "DIR", conflicts_with = "socket")]
    pub dir: Option<PathBuf>,
    /// Only the changes made after checkpoint N.
    #[arg(long, value_name = "N")]
    pub since: Option<u64>,
    /// A running mount's control socket (without --dir; neither: the `fencefs run` of the
    /// current directory's workspace).
    pub socket: Option<PathBuf>,
}
