//! The `fencefs` binary: parses the command line (or, run by mount(8) as a mount helper,
//! its `-o` options, then daemonizes) and hands over to `fencefs::app`.
#![deny(unsafe_code)]

use std::ffi::OsString;

use clap::Parser;
use fencefs::cli::{Cli, Command};

fn main() {
    fencefs::logging::init();
    fencefs::out::quiet_on_epipe();
    let args: Vec<OsString> = std::env::args_os().collect();
    let command = if fencefs::fuse_opts::is_helper_form(&args, |p| p.exists()) {
        Command::Mount(mount_helper(&args[1..]))
    } else {
        Cli::parse().command
    };
    let code = fencefs::app::run(command);
    // The counts of rate-limited lines not yet reported.
    log::logger().flush();
    std::process::exit(code);
}

/// PATH for a daemon started by mount(8), which passes none (the shell's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `fencefs SOURCE MOUNTPOINT -o OPTS`, as mount(8) runs it through mount.fuse3: parse the
/// options, then daemonize (returns in the child, which mounts; the parent exits 0 once
/// the mount is ready, or with the child's error).
#[allow(unsafe_code)] // set_var/remove_var before any thread exists (SAFETY lines below)
fn mount_helper(args: &[OsString]) -> fencefs::cli::MountArgs {
    // Silent on success, as mount helpers are (boot logs, `mount -a`): the INFO lines
    // ("transport: ...") only when stderr is the journal or a file; warnings and errors
    // always. RUST_LOG, when set, decides instead.
    if std::env::var_os("RUST_LOG").is_none() && !fencefs::daemon::stderr_is_a_log() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let fail = |code: i32, msg: String| -> ! {
        eprintln!("fencefs: {msg}");
        std::process::exit(code)
    };
    let mut m = fencefs::fuse_opts::parse(args).unwrap_or_else(|e| fail(2, e));
    let cwd = std::env::current_dir().unwrap_or_else(|e| fail(1, format!("cwd: {e}")));
    fencefs::fuse_opts::absolutize(&mut m, &cwd);
    // mount(8) drops PATH from a helper's environment; fencefs needs fusermount3.
    if std::env::var_os("PATH").is_none_or(|p| p.is_empty()) {
        // SAFETY: still single-threaded: nothing has spawned a thread yet.
        unsafe { std::env::set_var("PATH", DEFAULT_PATH) };
    }
    // Readiness goes to mount(8) through the exit status; a $NOTIFY_SOCKET inherited from
    // whatever ran mount(8) is not this process's to notify.
    // SAFETY: as above.
    unsafe { std::env::remove_var("NOTIFY_SOCKET") };
    m.ready_fd = Some(fencefs::daemon::fork_and_wait().unwrap_or_else(|e| fail(1, e)));
    m.daemonized = true;
    m
}
