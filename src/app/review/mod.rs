//! `fencefs review`: a terminal UI over a staging area's changes, like reviewing a pull
//! request: the changed paths beside the selected one's hunks, keys to keep (apply) or
//! discard a hunk or a path (with a note for the agent, kept in `DIR/feedback.jsonl`),
//! and to rewind to a checkpoint.
//!
//! Parts: [`backend`] (the control socket or `--dir DIR`), [`model`] (state, keys, the
//! worker thread a change runs on), [`draw`] (the screen). This file owns the terminal:
//! raw mode and the alternate screen on entry, restored on every way out — quit, an
//! error, a panic (the hook restores first), SIGTERM/SIGHUP/SIGQUIT (waited for on a
//! thread of their own, they end the loop) — and the event loop, which redraws on every
//! key, on resize and every 100 ms while a change runs.
//!
//! Invariants: the UI thread never waits on a change (apply, discard, rewind run on the
//! worker); nothing but the model's escaped text reaches the terminal.

mod backend;
mod draw;
mod model;

use std::io::{self, IsTerminal};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossterm::event::{self, Event, KeyEventKind};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use nix::sys::signal::{SigSet, Signal};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

use crate::cli::ReviewArgs;
use backend::Backend;

/// Puts the terminal back as it was (idempotent).
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

/// The terminal in raw mode on the alternate screen while alive.
struct Tty;

impl Tty {
    fn enter() -> io::Result<Tty> {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
        terminal::enable_raw_mode()?;
        let t = Tty;
        execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
        Ok(t)
    }
}

impl Drop for Tty {
    fn drop(&mut self) {
        restore();
    }
}

/// Runs `fencefs review`; returns the exit code.
pub fn run(a: ReviewArgs) -> i32 {
    let backend = match (&a.dir, &a.socket) {
        (Some(d), None) => Backend::Dir(d.clone()),
        (None, Some(s)) => Backend::Socket(s.clone()),
        (None, None) => match find_run() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("fencefs: review: {}", crate::quote::escape(e.as_bytes()));
                return 2;
            }
        },
        _ => {
            eprintln!("fencefs: review: give a mount's control SOCKET or --dir DIR");
            return 2;
        }
    };
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        eprintln!("fencefs: review needs a terminal (use `fencefs stage` in scripts)");
        return 2;
    }
    match ui(backend, a.since) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "fencefs: review: {}",
                crate::quote::escape(e.to_string().as_bytes())
            );
            1
        }
    }
}

/// Set by the signal thread on SIGTERM, SIGHUP or SIGQUIT: the loop quits (restoring the
/// terminal) instead of the process dying in raw mode.
static STOP: AtomicBool = AtomicBool::new(false);

/// Blocks SIGTERM, SIGHUP and SIGQUIT in this thread (and the threads it starts) and
/// waits for them on a thread of their own.
fn catch_signals() -> io::Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set.thread_block().map_err(io::Error::from)?;
    std::thread::spawn(move || {
        if set.wait().is_ok() {
            STOP.store(true, Ordering::Relaxed);
        }
    });
    Ok(())
}

/// Without SOCKET or DIR: the `fencefs run` of this directory's workspace (this directory
/// or the nearest parent that has one): its control socket that answers (the newest
/// first), else its staging area.
fn find_run() -> Result<Backend, String> {
    let cwd = std::env::current_dir()
        .and_then(|d| d.canonicalize())
        .map_err(|e| format!("current directory: {e}"))?;
    for ws in cwd.ancestors().take_while(|d| *d != Path::new("/")) {
        let (rt, stage) = super::run::places(ws);
        let mut socks: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&rt)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().as_bytes().starts_with(b"control."))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        socks.sort();
        for (_, s) in socks.into_iter().rev() {
            let status = serde_json::json!({"cmd": "status"});
            if crate::control::client::call_once(&s, &status).is_ok() {
                return Ok(Backend::Socket(s));
            }
        }
        if let Some(st) = stage.filter(|s| s.join("fencefs-stage").exists()) {
            return Ok(Backend::Dir(st));
        }
    }
    Err("no `fencefs run` of this directory's workspace: give a mount's control SOCKET or --dir DIR".into())
}

fn ui(backend: Backend, since: Option<u64>) -> io::Result<()> {
    catch_signals()?;
    let _tty = Tty::enter()?;
    let mut term = Terminal::new(CrosstermBackend::new(io::stdout()))?;
    term.clear()?;
    let mut m = model::Model::new(backend, since);
    while !m.quit && !STOP.load(Ordering::Relaxed) {
        term.draw(|f| draw::draw(f, &m))?;
        // The wait is ours: crossterm's poll spins forever on a hung-up terminal (its
        // window or tmux server gone: every read is EOF), leaving an orphan at 100% CPU.
        if hung_up(100)? {
            break;
        }
        if event::poll(Duration::ZERO)? {
            match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => m.key(k),
                Event::Resize(..) => term.autoresize()?,
                _ => {}
            }
        }
        m.poll();
    }
    Ok(())
}

/// Waits up to `ms` for the terminal (stdin); whether it hung up.
fn hung_up(ms: u16) -> io::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let stdin = io::stdin();
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(&stdin),
        PollFlags::POLLIN,
    )];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(_) => Ok(fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        })),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
    }
}
