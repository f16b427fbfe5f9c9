//! `fencefs run`, before anything is mounted: where things are. The workspace (canonical)
//! and the cwd, who runs it, the $HOME to fence, the run's private directories (one per
//! workspace: policies written for the run and the control socket under
//! `$XDG_RUNTIME_DIR/fencefs/<hash>/`, the staging area under
//! `$XDG_STATE_HOME/fencefs/<hash>/stage`), the policy layers, and the `mount` arguments
//! each daemon gets.
//!
//! Invariants: nothing here mounts, forks or starts a thread (the process must stay single
//! threaded until it has entered its namespaces). Directories made here are 0700 and must
//! be owned by the caller (a shared /tmp fallback is refused otherwise). Every failure is
//! one line naming what is wrong and what to do.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::Digest;

use clap::Parser;

use crate::cli::{Cli, Command, HomeChoice, MountArgs, RunArgs};

/// The default policy of a run: the built-in presets and the workspace's own layer.
const DEFAULT_POLICY: &str = "\
# Written by `fencefs run`: its default policy (see `fencefs presets`).
mode = \"workspace-write\"
default = \"write\"
writable_roots = [\".\"]
presets = [\"secrets\", \"agent-config\"]
workspace_policy = \".fencefs.toml\"
";

/// The policy of the $HOME fence: the rest of $HOME read-only.
const HOME_POLICY: &str = "\
# Written by `fencefs run --home fence` (see `fencefs presets`: home).
mode = \"workspace-write\"
default = \"read\"
writable_roots = [\".\"]
presets = [\"secrets\", \"home\"]
";

/// Everything a run needs to know before it mounts.
pub(super) struct Setup {
    /// The workspace, canonical.
    pub(super) ws: PathBuf,
    /// Where COMMAND starts (the caller's cwd).
    pub(super) cwd: PathBuf,
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// $HOME, canonical, when it is fenced (not the workspace nor inside it).
    pub(super) home: Option<PathBuf>,
    /// The run's private directory for this workspace (policies, control socket).
    pub(super) runtime: PathBuf,
    /// The staging area (None: live), and whether an earlier run left it.
    pub(super) stage: Option<PathBuf>,
    pub(super) stage_continued: bool,
    /// What hides the staging area from COMMAND: the run's own directory holding it, or
    /// a `--stage-dir` itself.
    pub(super) stage_cover: Option<PathBuf>,
    pub(super) control: PathBuf,
    /// The agent's checkpoint channel (staged runs): in a directory of its own beside the
    /// run's, which stays in COMMAND's reach (named in $FENCEFS_CHECKPOINT).
    pub(super) checkpoint: Option<PathBuf>,
    /// The workspace's policy layers, and a few words on them for the "fence up" line.
    pub(super) policy: Vec<PathBuf>,
    pub(super) policy_words: String,
    /// The $HOME fence's policy file.
    pub(super) home_policy: PathBuf,
}

/// Works out the run's paths and writes its policy files.
pub(super) fn setup(a: &RunArgs) -> Result<Setup, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let ws_arg = a.workspace.clone().unwrap_or_else(|| cwd.clone());
    let ws = ws_arg
        .canonicalize()
        .map_err(|e| format!("workspace '{}': {e}", ws_arg.display()))?;
    if !ws.is_dir() {
        return Err(format!("workspace '{}' is not a directory", ws.display()));
    }
    if ws == Path::new("/") {
        return Err("the workspace cannot be / (pass --workspace DIR)".into());
    }
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let hash = hash(&ws);
    let runtime = private_dir(&runtime_base(uid)?.join(&hash), uid)?;
    let (stage, stage_cover) = stage_paths(a, &ws, &hash, uid)?;
    let stage_continued = stage.as_deref().is_some_and(Path::exists);
    let (policy, policy_words) = if a.policy.is_empty() {
        let p = runtime.join("policy.toml");
        write(&p, DEFAULT_POLICY)?;
        (
            vec![p],
            "presets secrets, agent-config + .fencefs.toml".to_string(),
        )
    } else {
        let words: Vec<String> = a.policy.iter().map(|p| p.display().to_string()).collect();
        (a.policy.clone(), words.join(", "))
    };
    let home_policy = runtime.join("home-policy.toml");
    let home = match a.home {
        HomeChoice::Keep => None,
        HomeChoice::Fence => home_to_fence(&ws)?,
    };
    if home.is_some() {
        write(&home_policy, HOME_POLICY)?;
    }
    // One socket per run: two runs in one workspace each keep theirs.
    let control = a
        .control
        .clone()
        .unwrap_or_else(|| runtime.join(format!("control.{}", std::process::id())));
    let checkpoint = match &stage {
        Some(_) => {
            let dir = private_dir(&runtime_base(uid)?.join(format!("{hash}-agent")), uid)?;
            Some(dir.join(format!("checkpoint.{}", std::process::id())))
        }
        None => None,
    };
    Ok(Setup {
        ws,
        cwd,
        uid,
        gid,
        home,
        runtime,
        stage,
        stage_continued,
        stage_cover,
        control,
        checkpoint,
        policy,
        policy_words,
        home_policy,
    })
}

/// The staging area (None: `--live`) and what hides it from COMMAND: by default
/// `$XDG_STATE_HOME/fencefs/<hash>/stage` and its private `<hash>` directory, else
/// `--stage-dir` itself.
fn stage_paths(
    a: &RunArgs,
    ws: &Path,
    hash: &str,
    uid: u32,
) -> Result<(Option<PathBuf>, Option<PathBuf>), String> {
    Ok(match (&a.stage_dir, a.live) {
        (_, true) => (None, None),
        (Some(d), false) => (Some(d.clone()), Some(d.clone())),
        (None, false) => {
            let base = state_base()?;
            if base.starts_with(ws) {
                return Err(format!(
                    "the staging area's default place, {}, lies inside the workspace: pass \
                     --stage-dir DIR outside it (or set XDG_STATE_HOME), or --live",
                    base.display()
                ));
            }
            let dir = private_dir(&base.join(hash), uid)?;
            (Some(dir.join("stage")), Some(dir))
        }
    })
}

/// Where a `fencefs run` of workspace `ws` (canonical) with the default places keeps its
/// private runtime directory (its control sockets `control.PID`) and its staging area, as
/// [`setup`] names them; nothing is made or checked (`fencefs review` looks there).
pub(crate) fn places(ws: &Path) -> (PathBuf, Option<PathBuf>) {
    let uid = nix::unistd::geteuid().as_raw();
    let base = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("fencefs"),
        None if uid == 0 => PathBuf::from("/run/fencefs"),
        None => PathBuf::from(format!("/tmp/fencefs-{uid}")),
    };
    let h = hash(ws);
    let stage = state_base().ok().map(|b| b.join(&h).join("stage"));
    (base.join(&h), stage)
}

/// The first 16 hex digits of SHA-256 of the workspace's path: its directories' name.
fn hash(ws: &Path) -> String {
    let d = sha2::Sha256::digest(ws.as_os_str().as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `$XDG_RUNTIME_DIR/fencefs`, or `/run/fencefs` for root, or `/tmp/fencefs-UID`.
fn runtime_base(uid: u32) -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("fencefs"));
    }
    if uid == 0 {
        return Ok(PathBuf::from("/run/fencefs"));
    }
    let base = PathBuf::from(format!("/tmp/fencefs-{uid}"));
    private_dir(&base, uid)
}

/// `$XDG_STATE_HOME/fencefs`, by default `~/.local/state/fencefs`.
fn state_base() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("fencefs"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or("neither XDG_STATE_HOME nor HOME is set: pass --stage-dir DIR or --live")?;
    Ok(PathBuf::from(home).join(".local/state/fencefs"))
}

/// Makes `dir` (and its parents) 0700; it must be the caller's and nobody else's.
fn private_dir(dir: &Path, uid: u32) -> Result<PathBuf, String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("'{}': {e}", dir.display()))?;
    let md = std::fs::symlink_metadata(dir).map_err(|e| format!("'{}': {e}", dir.display()))?;
    if !md.is_dir() || md.uid() != uid || md.mode() & 0o077 != 0 {
        return Err(format!(
            "'{}' must be a directory of uid {uid} with mode 0700",
            dir.display()
        ));
    }
    Ok(dir.to_path_buf())
}

/// Writes `text` to `path` atomically (another run may be reading it).
fn write(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("'{}': {e}", path.display()))
}

/// $HOME, canonical, unless it is missing, the workspace, or inside the workspace (then
/// the workspace's fence already covers it).
fn home_to_fence(ws: &Path) -> Result<Option<PathBuf>, String> {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return Ok(None);
    };
    let home = PathBuf::from(home)
        .canonicalize()
        .map_err(|e| format!("HOME: {e} (or pass --home keep)"))?;
    if home == Path::new("/") || home.starts_with(ws) {
        return Ok(None);
    }
    Ok(Some(home))
}

/// The `mount` arguments of the workspace's daemon.
pub(super) fn workspace_mount(a: &RunArgs, s: &Setup) -> Result<MountArgs, String> {
    let mut v: Vec<OsString> = Vec::new();
    for p in &s.policy {
        v.extend(["--policy".into(), p.into()]);
    }
    v.extend(["--control".into(), s.control.clone().into()]);
    if let Some(d) = &s.stage {
        v.extend(["--stage".into(), d.into()]);
    }
    if let Some(c) = &s.checkpoint {
        v.extend(["--checkpoint-socket".into(), c.into()]);
    }
    if let Some(x) = &a.audit {
        v.extend(["--audit".into(), x.into()]);
    }
    if let Some(x) = &a.answers {
        v.extend(["--answers".into(), x.into()]);
    }
    if let Some(x) = &a.ask_exec {
        v.extend(["--ask-exec".into(), x.clone()]);
    }
    if let Some(x) = a.ask_timeout {
        v.extend(["--ask-timeout".into(), x.to_string().into()]);
    }
    for m in &a.map_uid {
        v.extend(["--map-uid".into(), m.into()]);
    }
    for m in &a.map_gid {
        v.extend(["--map-gid".into(), m.into()]);
    }
    let mut m = mount_args(v, &s.ws)?;
    m.hold_asks = true;
    Ok(m)
}

/// The `mount` arguments of the $HOME fence's daemon.
pub(super) fn home_mount(s: &Setup, home: &Path) -> Result<MountArgs, String> {
    mount_args(vec!["--policy".into(), s.home_policy.clone().into()], home)
}

/// `fencefs mount OPTS DIR DIR`, parsed as the command line would be, mounted directly.
fn mount_args(opts: Vec<OsString>, dir: &Path) -> Result<MountArgs, String> {
    let mut argv: Vec<OsString> = vec!["fencefs".into(), "mount".into()];
    argv.extend(opts);
    argv.extend([dir.into(), dir.into()]);
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Mount(mut m),
        }) => {
            m.direct = true;
            Ok(m)
        }
        Ok(_) => Err("internal: not a mount".into()),
        Err(e) => Err(e.to_string().lines().next().unwrap_or("").to_string()),
    }
}
