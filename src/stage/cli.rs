//! `fencefs stage status|diff|apply|discard|checkpoint|log|rewind`: parsing and output.
//!
//! A staging area is reached with `--dir DIR` (no daemon needed) or through a running
//! mount's control SOCKET (the first argument without `--dir`). `status`, `diff` and `log`
//! only read, so `--dir` works while a mount serves DIR; `apply`, `discard`, `checkpoint`
//! and `rewind` with `--dir` take DIR's lock (refused while a mount runs on it: use its
//! SOCKET). Names are printed quoted as git quotes them (no byte of a name reaches the
//! terminal raw).

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::Subcommand;

use super::Area;
use super::changes::{Change, Kind, Layers};
use super::diff::quote;
use super::tree::Layer;
use super::{layers as ckpt, view};

/// `fencefs stage`.
#[derive(clap::Args, Debug)]
pub struct StageArgs {
    /// What to do.
    #[command(subcommand)]
    pub op: StageOp,
}

/// Where the staging area is: a running mount's control socket or `--dir DIR`.
#[derive(clap::Args, Debug)]
pub struct At {
    /// The staging area itself (no daemon needed).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The stage operations.
#[derive(Subcommand, Debug)]
pub enum StageOp {
    /// One line per changed path (A M m D R T; C for a conflict).
    Status {
        #[command(flatten)]
        at: At,
        /// One JSON array instead.
        #[arg(long)]
        json: bool,
        /// Only the changes made after checkpoint N.
        #[arg(long, value_name = "N")]
        since: Option<u64>,
        /// `SOCKET` (without --dir), then the paths to show (default: all).
        args: Vec<OsString>,
    },
    /// The staged changes as a git diff (`git apply` / `patch -p1` in SOURCE).
    Diff {
        #[command(flatten)]
        at: At,
        /// Only the changes made after checkpoint N.
        #[arg(long, value_name = "N")]
        since: Option<u64>,
        /// `SOCKET` (without --dir), then the paths to show (default: all).
        args: Vec<OsString>,
    },
    /// Carry staged changes into SOURCE (each file written beside, synced, renamed).
    Apply {
        #[command(flatten)]
        at: At,
        /// Apply conflicts too (the staged version wins).
        #[arg(long)]
        force: bool,
        /// Apply the state checkpoint N sealed (what a diff at N showed): a path changed
        /// after N is refused and stays staged.
        #[arg(long = "at", value_name = "N")]
        checkpoint: Option<u64>,
        /// `SOCKET` (without --dir), then the paths to apply (default: all); `PATH@ID`
        /// (the `id` of `status --json`) is refused if the change is not the one shown.
        args: Vec<OsString>,
    },
    /// Drop staged changes (all when no PATH is given).
    Discard {
        #[command(flatten)]
        at: At,
        /// `SOCKET` (without --dir), then the paths to discard (default: all); `PATH@ID`
        /// as for apply.
        args: Vec<OsString>,
    },
    /// Record the staged state as checkpoint N (printed).
    Checkpoint {
        #[command(flatten)]
        at: At,
        /// A message for the log.
        #[arg(short, long)]
        message: Option<String>,
        /// `SOCKET` (without --dir).
        args: Vec<OsString>,
    },
    /// List the checkpoints (N, time, changed paths, message).
    Log {
        #[command(flatten)]
        at: At,
        /// JSON instead.
        #[arg(long)]
        json: bool,
        /// `SOCKET` (without --dir).
        args: Vec<OsString>,
    },
    /// Make the merged view what it was at checkpoint N (later checkpoints are removed).
    Rewind {
        #[command(flatten)]
        at: At,
        /// `SOCKET` (without --dir), then N.
        args: Vec<OsString>,
    },
    /// (Internal: what `apply --dir` leaves running after it answered.) Remove what is in
    /// DIR/trash now; needs no lock.
    #[command(hide = true)]
    EmptyTrash {
        /// The staging area.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
}

/// The paths given, workspace-relative (a leading `./` and trailing `/` dropped).
fn paths(args: &[OsString]) -> Vec<Vec<u8>> {
    args.iter()
        .map(|a| {
            let mut p = a.as_bytes();
            while let Some(r) = p.strip_prefix(b"./") {
                p = r;
            }
            while let Some(r) = p.strip_suffix(b"/") {
                p = r;
            }
            if p == b"." { Vec::new() } else { p.to_vec() }
        })
        .collect()
}

/// Opens the area named by `at` and `args` (without --dir the first argument is a
/// control socket); returns it with the remaining arguments.
fn area(at: &At, args: &[OsString]) -> Result<(Area, Vec<Vec<u8>>), String> {
    match &at.dir {
        Some(d) => Ok((Area::open(d)?, paths(args))),
        None => Err("give the staging area: a mount's control SOCKET or --dir DIR".to_string()),
    }
}

/// The layers of an area: its staged tree and the SOURCE it records.
pub fn layers(a: &Area) -> Result<Layers, String> {
    let src = crate::host::sys::open_root(&a.source)
        .map_err(|e| format!("source '{}': {e}", a.source.display()))?;
    let up = a.upper.try_clone().map_err(|e| e.to_string())?;
    Ok(Layers {
        upper: Layer::new(up).map_err(|e| e.to_string())?,
        lower: Layer::new(src).map_err(|e| e.to_string())?,
    })
}

/// Repairs what an interrupted apply left (see [`Layers::repair`]), saying so.
pub fn repair(l: &Layers) -> Result<(), String> {
    for p in l
        .repair()
        .map_err(|e| format!("repairing the staged tree: {e}"))?
    {
        log::warn!(
            "stage: the rename of {} was already in SOURCE (an apply stopped midway): redirect dropped",
            quote(&p)
        );
    }
    Ok(())
}

/// The changes of `l` that concern one of `paths` (all when empty).
pub fn selected(l: &Layers, paths: &[Vec<u8>]) -> Result<Vec<Change>, String> {
    let all = l
        .changes()
        .map_err(|e| format!("reading the staged tree: {e}"))?;
    Ok(all
        .into_iter()
        .filter(|c| paths.is_empty() || paths.iter().any(|p| c.touches(p)))
        .collect())
}

/// A status line: letters, the path (quoted as git does), `/` for a directory.
pub fn status_line(c: &Change) -> String {
    let slash = |p: &[u8], dir: bool| {
        let mut q = quote(p);
        if dir {
            q.push('/');
        }
        q
    };
    let path = slash(&c.path, c.dir);
    match (&c.kind, c.entries) {
        (Kind::Renamed { from }, _) => {
            format!("{} {} -> {}", c.letters(), slash(from, true), path)
        }
        (Kind::Added, Some(n)) => format!(
            "{} {path} ({n} {})",
            c.letters(),
            if n == 1 { "entry" } else { "entries" }
        ),
        _ => format!("{} {path}", c.letters()),
    }
}

/// `--json`: one object per change, with its review `id` ([`super::ids`]).
pub fn json(c: &Change, id: &str) -> serde_json::Value {
    let s = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let mut v = serde_json::json!({
        "path": s(&c.path),
        "change": c.word(),
        "conflict": c.conflict,
        "id": id,
    });
    if let Kind::Renamed { from } = &c.kind {
        v["from"] = s(from).into();
    }
    if let Some(n) = c.entries {
        v["entries"] = n.into();
    }
    v
}

/// [`json`] with the staged file's size when it is large or sparse (`"size"`,
/// `"allocated"`, `"sparse"`: [`super::space::add_json`]).
pub fn json_in(l: &Layers, c: &Change, id: &str) -> serde_json::Value {
    let mut v = json(c, id);
    super::space::add_json(&mut v, l, c);
    v
}

/// Appends what an apply or discard did to `DIR/audit.jsonl` (one JSON line: time, op,
/// the operator's uid and pid, the paths asked for, each result line), synced. A failure
/// to record is logged, never a reason to undo the work.
fn record(area: &Area, op: &str, uid: u32, paths: &[Vec<u8>], report: &super::apply::Report) {
    let extra = serde_json::json!({"results": report.lines, "refused": report.refused});
    record_line(area, op, uid, paths, &extra);
}

/// Appends one audit line to `DIR/audit.jsonl`: time, `op`, the operator's `uid`, this
/// process's pid, the paths, and `extra`'s fields.
pub fn record_line(area: &Area, op: &str, uid: u32, paths: &[Vec<u8>], extra: &serde_json::Value) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut line = serde_json::json!({
        "ts": crate::audit::timestamp(std::time::SystemTime::now()),
        "op": op,
        "uid": uid,
        "pid": std::process::id(),
        "paths": paths.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>(),
    });
    if let (Some(m), Some(e)) = (line.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    let path = area.dir.join("audit.jsonl");
    let res = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| {
            writeln!(f, "{line}")?;
            f.sync_all()
        });
    if let Err(e) = res {
        log::warn!("{}: {e}", path.display());
    }
}

/// A usage error (a bad argument, as clap's own): exit 2.
fn usage(msg: String) -> i32 {
    eprintln!("fencefs: {}", crate::quote::escape(msg.as_bytes()));
    2
}

fn fail(msg: String) -> i32 {
    eprintln!("fencefs: {}", crate::quote::escape(msg.as_bytes()));
    EXIT_ERR
}

/// Exit status for a failed command (the same as every other subcommand's).
const EXIT_ERR: i32 = 1;

/// Runs `fencefs stage …`; returns the exit code.
pub fn run(a: StageArgs) -> i32 {
    match run_op(a.op) {
        Ok(code) => code,
        Err(msg) => fail(msg),
    }
}

/// The CLI's arguments for one operation, as the control socket takes them.
#[derive(Default)]
struct Req {
    json: bool,
    force: bool,
    at: Option<u64>,
    since: Option<u64>,
    message: Option<String>,
    to: Option<u64>,
}

/// Through a running mount's control socket: `args[0]` is SOCKET (then the paths, or N
/// for rewind).
fn via_socket(op: &str, args: &[OsString], o: Req) -> Result<i32, String> {
    let socket = PathBuf::from(&args[0]);
    let ps: Vec<String> = paths(&args[1..])
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let mut req = serde_json::json!({"cmd": "stage", "op": op});
    match op {
        "status" | "diff" => {
            req["paths"] = ps.into();
            if let Some(n) = o.since {
                req["since"] = n.into();
            }
        }
        "apply" => {
            req["paths"] = ps.into();
            req["force"] = o.force.into();
            if let Some(n) = o.at {
                req["at"] = n.into();
            }
        }
        "discard" => req["paths"] = ps.into(),
        "checkpoint" => {
            if let Some(m) = &o.message {
                req["message"] = m.clone().into();
            }
        }
        "rewind" => req["to"] = o.to.into(),
        _ => {}
    }
    let a = crate::control::client::call_once(&socket, &req)?;
    if a["ok"] != serde_json::Value::Bool(true) {
        return Err(a["error"].as_str().unwrap_or("refused").to_string());
    }
    let esc = |s: &str| crate::quote::escape(s.as_bytes()).into_owned();
    match op {
        "status" if o.json => println!("{}", json_text(&a["changes"])),
        "status" => {
            for l in a["lines"].as_array().into_iter().flatten() {
                println!("{}", esc(l.as_str().unwrap_or_default()));
            }
        }
        "diff" => {
            let d = a["diff"].as_str().unwrap_or_default();
            shown(std::io::stdout().lock(), |out| out.write_all(d.as_bytes()))
                .map_err(|e| format!("diff: {e}"))?;
        }
        "log" => {
            let list: Vec<ckpt::Checkpoint> =
                serde_json::from_value(a["checkpoints"].clone()).map_err(|e| e.to_string())?;
            print_log(&list, o.json);
        }
        "checkpoint" => println!("checkpoint {}", a["checkpoint"]["n"]),
        "rewind" => println!("rewound to checkpoint {}", a["rewound_to"]),
        "apply" | "discard" => {
            for l in a["lines"].as_array().into_iter().flatten() {
                println!("{}", esc(l.as_str().unwrap_or_default()));
            }
            return Ok(if a["refused"].as_u64().unwrap_or(0) > 0 {
                1
            } else {
                0
            });
        }
        _ => println!("{}", json_text(&a)),
    }
    Ok(0)
}

/// `stage log`: one line per checkpoint (`N  TIME  K changes  MESSAGE`, `(ended)` for one
/// an apply or discard ended), or the JSON array.
fn print_log(list: &[ckpt::Checkpoint], json: bool) {
    if json {
        println!(
            "{}",
            json_text(&serde_json::to_value(list).unwrap_or_default())
        );
        return;
    }
    for c in list {
        let ended = if c.ended { " (ended)" } else { "" };
        let m = crate::quote::escape(c.message.as_bytes());
        let sep = if m.is_empty() { "" } else { "  " };
        println!(
            "{}  {}  {} change{}{sep}{m}{ended}",
            c.n,
            c.ts,
            c.changes,
            if c.changes == 1 { "" } else { "s" }
        );
    }
}

/// The paths changed since the last live checkpoint (since SOURCE when none): what a new
/// checkpoint records in the log.
pub fn count_since_last(area: &Area) -> Result<u64, String> {
    let last = ckpt::live(&area.dir)?.last().copied();
    let st = view::staged(area, last)?;
    Ok(st
        .layers
        .changes()
        .map_err(|e| format!("reading the staged tree: {e}"))?
        .len() as u64)
}

/// What an apply is asked for besides its paths.
#[derive(Clone, Copy, Default)]
pub struct Opts {
    /// `--force`: conflicts too.
    pub force: bool,
    /// `--at N`: only what checkpoint N sealed.
    pub at: Option<u64>,
}

/// `apply` or `discard` of `paths` on the area `dir` (its lock held, or the mount
/// quiesced): checkpoints are squashed first (and so ended as rewind targets), then the
/// staged tree is worked on; recorded in `DIR/audit.jsonl` with the operator's `uid`.
pub fn apply_or_discard(
    dir: &std::path::Path,
    op: &str,
    ps: &[Vec<u8>],
    o: Opts,
    uid: u32,
) -> Result<super::apply::Report, String> {
    let force = o.force;
    let area = Area::open(dir)?;
    if let Some(what) = ckpt::recover(&area.dir)? {
        log::warn!("stage: {what}");
    }
    let area = area.reopen()?;
    // `--at N`: what N sealed, as PATH@ID arguments, taken before the squash ends N.
    let (at_args, why);
    let ps = match o.at {
        Some(n) => {
            at_args = view::sealed_args(&area, n, ps)?;
            why = format!("changed after checkpoint {n}");
            if at_args.is_empty() {
                return Ok(super::apply::Report::default());
            }
            &at_args[..]
        }
        None => {
            why = "changed since it was shown".to_string();
            ps
        }
    };
    let area = if view::squash(&area)? {
        area.reopen()?
    } else {
        area
    };
    let l = layers(&area)?;
    repair(&l)?;
    if let Some(what) = super::intent::recover(&area.dir, &l)? {
        log::warn!("stage: {what}");
    }
    // PATH@ID: refused unless the change is still the one shown; none left: nothing to do.
    let (kept, refused) = super::ids::check(&l, ps, &why);
    let mut report = if !ps.is_empty() && kept.is_empty() {
        super::apply::Report::default()
    } else if op == "apply" {
        // A PATH@ID applies the change it names and nothing below it (`--at N`: a later
        // write below a directory N changed is not N's).
        let list: Vec<_> = l
            .changes()
            .map_err(|e| format!("reading the staged tree: {e}"))?
            .into_iter()
            .filter(|c| kept.is_empty() || kept.iter().any(|k| k.selects(c)))
            .collect();
        super::apply::apply(&l, &list, force, &area.dir, kept.is_empty())
    } else {
        let list = l
            .changes()
            .map_err(|e| format!("reading the staged tree: {e}"))?;
        let kept: Vec<Vec<u8>> = kept.into_iter().map(|k| k.path).collect();
        super::discard::discard(&l, &list, &kept)
    };
    report.refused += refused.len();
    report.lines.splice(0..0, refused);
    record(
        &area,
        if op == "apply" {
            "stage-apply"
        } else {
            "stage-discard"
        },
        uid,
        ps,
        &report,
    );
    Ok(report)
}

fn rewind_arg(args: &[OsString]) -> Result<u64, String> {
    let [n] = args else {
        return Err("rewind takes one checkpoint number N".into());
    };
    n.to_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
        format!(
            "rewind: '{}' is not a checkpoint number",
            n.to_string_lossy()
        )
    })
}

/// JSON as printed: every character a terminal acts on (C1 controls, bidi and format
/// characters, which JSON allows raw in strings) as `\uXXXX`: the same JSON.
fn json_text(v: &serde_json::Value) -> String {
    crate::quote::json_safe(&v.to_string()).into_owned()
}

/// Runs `write` on stdout: the exact bytes when stdout is a pipe or a file (a diff for
/// `git apply`), every complete line through [`crate::quote::text`] when it is a terminal, so a
/// staged file's contents cannot redraw what the operator reads before `stage apply`.
fn shown(
    out: std::io::StdoutLock<'_>,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::IsTerminal;
    if out.is_terminal() {
        let mut t = crate::quote::TextWriter::new(out);
        write(&mut t)?;
        t.flush()
    } else {
        let mut out = out;
        write(&mut out)?;
        out.flush()
    }
}

fn run_op(op: StageOp) -> Result<i32, String> {
    let sock = |at: &At, args: &[OsString]| at.dir.is_none() && !args.is_empty();
    match &op {
        StageOp::Status {
            at,
            json,
            since,
            args,
        } if sock(at, args) => {
            let o = Req {
                json: *json,
                since: *since,
                ..Req::default()
            };
            return via_socket("status", args, o);
        }
        StageOp::Diff { at, since, args } if sock(at, args) => {
            let o = Req {
                since: *since,
                ..Req::default()
            };
            return via_socket("diff", args, o);
        }
        StageOp::Apply {
            at,
            args,
            force,
            checkpoint,
        } if sock(at, args) => {
            let o = Req {
                force: *force,
                at: *checkpoint,
                ..Req::default()
            };
            return via_socket("apply", args, o);
        }
        StageOp::Discard { at, args } if sock(at, args) => {
            return via_socket("discard", args, Req::default());
        }
        StageOp::Checkpoint { at, message, args } if sock(at, args) => {
            if args.len() > 1 {
                return Err("checkpoint takes no paths".into());
            }
            let o = Req {
                message: message.clone(),
                ..Req::default()
            };
            return via_socket("checkpoint", args, o);
        }
        StageOp::Log { at, json, args } if sock(at, args) => {
            let o = Req {
                json: *json,
                ..Req::default()
            };
            return via_socket("log", args, o);
        }
        StageOp::Rewind { at, args } if sock(at, args) => {
            let o = Req {
                to: Some(match rewind_arg(&args[1..]) {
                    Ok(n) => n,
                    Err(e) => return Ok(usage(e)),
                }),
                ..Req::default()
            };
            return via_socket("rewind", &args[..1], o);
        }
        _ => {}
    }
    let uid = nix::unistd::getuid().as_raw();
    match op {
        StageOp::EmptyTrash { dir } => {
            let area = Area::open(&dir)?;
            ckpt::empty_trash_entries(&area.dir)?;
            Ok(0)
        }
        StageOp::Status {
            at,
            json: js,
            since,
            args,
        } => {
            let (area, ps) = area(&at, &args)?;
            let st = view::staged(&area, since)?;
            let list = st.selected(&ps)?;
            if js {
                let arr = view::json_list(&area, &st, &list, since)?;
                println!("{}", json_text(&serde_json::Value::Array(arr)));
            } else {
                for c in &list {
                    println!("{}", status_line(c));
                }
            }
            Ok(0)
        }
        StageOp::Diff { at, since, args } => {
            let (area, ps) = area(&at, &args)?;
            let st = view::staged(&area, since)?;
            let list = st.selected(&ps)?;
            shown(std::io::stdout().lock(), |mut out| {
                super::diff::write(&st.layers, &list, &mut out)
            })
            .map_err(|e| format!("diff: {e}"))?;
            Ok(0)
        }
        StageOp::Apply {
            at,
            force,
            args,
            checkpoint,
        } => {
            let (area, ps) = area(&at, &args)?;
            area.lock()?;
            let o = Opts {
                force,
                at: checkpoint,
            };
            let report = apply_or_discard(&area.dir, "apply", &ps, o, uid)?;
            for line in &report.lines {
                println!("{line}");
            }
            ckpt::empty_trash_later(&area.dir, false);
            Ok(if report.refused > 0 { 1 } else { 0 })
        }
        StageOp::Discard { at, args } => {
            let (area, ps) = area(&at, &args)?;
            area.lock()?;
            let report = apply_or_discard(&area.dir, "discard", &ps, Opts::default(), uid)?;
            for line in &report.lines {
                println!("{line}");
            }
            Ok(if report.refused > 0 { 1 } else { 0 })
        }
        StageOp::Checkpoint { at, message, args } => {
            if !args.is_empty() {
                return Err("checkpoint takes no paths".into());
            }
            let (area, _) = area(&at, &args)?;
            area.lock()?;
            let area = super::recover(area)?;
            let n = count_since_last(&area)?;
            let c = ckpt::checkpoint(&area.dir, message.as_deref().unwrap_or(""), n)?;
            println!("checkpoint {}", c.n);
            Ok(0)
        }
        StageOp::Log { at, json, args } => {
            let (area, _) = area(&at, &[])?;
            if !args.is_empty() {
                return Err("log takes no paths".into());
            }
            print_log(&ckpt::log(&area.dir)?, json);
            Ok(0)
        }
        StageOp::Rewind { at, args } => {
            let to = match rewind_arg(&args) {
                Ok(n) => n,
                Err(e) => return Ok(usage(e)),
            };
            let (area, _) = area(&at, &[])?;
            area.lock()?;
            let area = super::recover(area)?;
            let r = ckpt::rewind(&area.dir, to);
            record_line(
                &area,
                "stage-rewind",
                uid,
                &[],
                &serde_json::json!({"to": to, "ok": r.is_ok()}),
            );
            r?;
            ckpt::empty_trash(&area.dir)?;
            println!("rewound to checkpoint {to}");
            Ok(0)
        }
    }
}
