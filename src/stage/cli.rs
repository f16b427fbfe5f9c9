//! `fencefs stage status|diff|apply|discard|checkpoint|log|rewind`: parsing and output.
//!
//! A staging area is reached with `--dir DIR` (no daemon needed) or through a running
//! mount's control SOCKET (the first argument without `--dir`). `status`, `diff` and `log`
//! only read, so `--dir` works while a mount serves DIR; `apply`, `discard`, `checkpoint`
//! and `rewind` with `--dir` take DIR's lock (refused while a mount runs on it: use its
//! SOCKET). Names are printed quoted as git quotes them (no byte of a name reaches the
//! terminal raw).

use super::StageError;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::Subcommand;

use super::Area;
use super::render::status_line;
use super::request::Op;
use super::session::{Opts, apply_or_discard, count_for_checkpoint, record_line, recover};
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
    /// A staged text file's hunks, numbered (for `apply|discard PATH#N[,M…][@ID]`).
    Hunks {
        #[command(flatten)]
        at: At,
        /// JSON instead (each line escaped for a terminal).
        #[arg(long)]
        json: bool,
        /// `SOCKET` (without --dir), then the path.
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
        /// (the `id` of `status --json`) is refused if the change is not the one shown;
        /// `PATH#N[,M…][@ID]` applies only those hunks of a text file (`stage hunks`).
        args: Vec<OsString>,
    },
    /// Drop staged changes (all when no PATH is given).
    Discard {
        #[command(flatten)]
        at: At,
        /// A note for the agent, shown with each discarded path in `.fencefs/feedback`.
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// `SOCKET` (without --dir), then the paths to discard (default: all); `PATH@ID`
        /// and `PATH#N[,M…][@ID]` as for apply.
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
fn area(at: &At, args: &[OsString]) -> Result<(Area, Vec<Vec<u8>>), StageError> {
    match &at.dir {
        Some(d) => Ok((Area::open(d)?, paths(args))),
        None => Err("give the staging area: a mount's control SOCKET or --dir DIR".into()),
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
    // A walk holds a descriptor per level of a deep tree.
    crate::host::sys::raise_nofile_limit();
    match run_op(a.op) {
        Ok(code) => code,
        Err(StageError::Usage(msg)) => usage(msg),
        Err(e) => fail(e.to_string()),
    }
}

/// The paths after SOCKET, as the control socket takes them.
fn socket_paths(args: &[OsString]) -> Vec<String> {
    paths(&args[1..])
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// `op` through the running mount's control socket `socket`; its answer printed (`json`:
/// as JSON).
fn via_socket(socket: &OsString, op: Op, json: bool) -> Result<i32, StageError> {
    let a = crate::control::client::call_once(&PathBuf::from(socket), &op.request())?;
    if a["ok"] != serde_json::Value::Bool(true) {
        return Err(a["error"].as_str().unwrap_or("refused").into());
    }
    let esc = |s: &str| crate::quote::escape(s.as_bytes()).into_owned();
    let lines = || {
        for l in a["lines"].as_array().into_iter().flatten() {
            println!("{}", esc(l.as_str().unwrap_or_default()));
        }
    };
    match op {
        Op::Status { .. } if json => println!("{}", json_text(&a["changes"])),
        Op::Hunks { .. } if json => println!("{}", json_text(&a["hunks"])),
        Op::Hunks { .. } => {
            let d = a["text"].as_str().unwrap_or_default();
            shown(std::io::stdout().lock(), |out| out.write_all(d.as_bytes()))
                .map_err(StageError::op("hunks"))?;
        }
        Op::Status { .. } => lines(),
        Op::Diff { .. } => {
            let d = a["diff"].as_str().unwrap_or_default();
            shown(std::io::stdout().lock(), |out| out.write_all(d.as_bytes()))
                .map_err(StageError::op("diff"))?;
        }
        Op::Log => {
            let list: Vec<ckpt::Checkpoint> = serde_json::from_value(a["checkpoints"].clone())
                .map_err(|e| StageError::Invalid(e.to_string()))?;
            print_log(&list, json);
        }
        Op::Checkpoint { .. } => println!("checkpoint {}", a["checkpoint"]["n"]),
        Op::Rewind { .. } => println!("rewound to checkpoint {}", a["rewound_to"]),
        Op::Apply { .. } | Op::Discard { .. } => {
            lines();
            return Ok(if a["refused"].as_u64().unwrap_or(0) > 0 {
                1
            } else {
                0
            });
        }
        Op::Feedback { .. } => println!("{}", json_text(&a)),
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

fn rewind_arg(args: &[OsString]) -> Result<u64, StageError> {
    let [n] = args else {
        return Err(StageError::Usage(
            "rewind takes one checkpoint number N".into(),
        ));
    };
    n.to_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
        StageError::Usage(format!(
            "rewind: '{}' is not a checkpoint number",
            n.to_string_lossy()
        ))
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

fn run_op(op: StageOp) -> Result<i32, StageError> {
    let sock = |at: &At, args: &[OsString]| at.dir.is_none() && !args.is_empty();
    let ps = socket_paths;
    match &op {
        StageOp::Status {
            at,
            json,
            since,
            args,
        } if sock(at, args) => {
            let since = *since;
            return via_socket(
                &args[0],
                Op::Status {
                    paths: ps(args),
                    since,
                },
                *json,
            );
        }
        StageOp::Hunks { at, json, args } if sock(at, args) => {
            return via_socket(&args[0], Op::Hunks { paths: ps(args) }, *json);
        }
        StageOp::Diff { at, since, args } if sock(at, args) => {
            let since = *since;
            return via_socket(
                &args[0],
                Op::Diff {
                    paths: ps(args),
                    since,
                },
                false,
            );
        }
        StageOp::Apply {
            at,
            args,
            force,
            checkpoint,
        } if sock(at, args) => {
            let op = Op::Apply {
                paths: ps(args),
                force: *force,
                at: *checkpoint,
                note: None,
            };
            return via_socket(&args[0], op, false);
        }
        StageOp::Discard { at, args, note } if sock(at, args) => {
            let note = note.clone();
            return via_socket(
                &args[0],
                Op::Discard {
                    paths: ps(args),
                    note,
                },
                false,
            );
        }
        StageOp::Checkpoint { at, message, args } if sock(at, args) => {
            if args.len() > 1 {
                return Err("checkpoint takes no paths".into());
            }
            let message = message.clone();
            return via_socket(&args[0], Op::Checkpoint { message }, false);
        }
        StageOp::Log { at, json, args } if sock(at, args) => {
            return via_socket(&args[0], Op::Log, *json);
        }
        StageOp::Rewind { at, args } if sock(at, args) => {
            let to = Some(rewind_arg(&args[1..])?);
            return via_socket(&args[0], Op::Rewind { to }, false);
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
            .map_err(StageError::op("diff"))?;
            Ok(0)
        }
        StageOp::Hunks { at, json, args } => {
            let (area, ps) = area(&at, &args)?;
            let [p] = &ps[..] else {
                return Err(StageError::Usage("hunks takes one PATH".into()));
            };
            let st = view::staged(&area, None)?;
            if json {
                println!("{}", json_text(&super::partial::list_json(&st.layers, p)?));
                return Ok(0);
            }
            let mut buf = Vec::new();
            super::partial::write_list(&st.layers, p, &mut buf)?;
            shown(std::io::stdout().lock(), |out| out.write_all(&buf))
                .map_err(StageError::op("hunks"))?;
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
                ..Opts::default()
            };
            let report = apply_or_discard(&area.dir, "apply", &ps, o, uid)?;
            for line in &report.lines {
                println!("{line}");
            }
            ckpt::empty_trash_later(&area.dir, false);
            Ok(if report.refused > 0 { 1 } else { 0 })
        }
        StageOp::Discard { at, args, note } => {
            let (area, ps) = area(&at, &args)?;
            area.lock()?;
            let o = Opts {
                note,
                ..Opts::default()
            };
            let report = apply_or_discard(&area.dir, "discard", &ps, o, uid)?;
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
            let area = recover(area)?;
            let n = count_for_checkpoint(&area).unwrap_or(0);
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
            let to = rewind_arg(&args)?;
            let (area, _) = area(&at, &[])?;
            area.lock()?;
            let area = recover(area)?;
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
