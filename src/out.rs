//! Standard output for the subcommands that print (`ctl`, `approve`, `explain`, `check`,
//! `answers`, …): a reader that goes away (`fencefs ctl SOCK held | head -c1`) ends the
//! command quietly with exit status 0, as every Unix filter does, instead of a panic.
//!
//! Invariants:
//! - [`outln!`](crate::outln) / [`out!`](macro@crate::out) never panic: EPIPE exits 0 (after
//!   the logger's pending counts), any other write error exits 1 with one line on stderr.
//! - [`quiet_on_epipe`] is the safety net for a `println!` that does not come through
//!   here: a panic whose message is std's "failed printing to stdout: Broken pipe" exits 0
//!   without a backtrace; every other panic is reported as before.

use std::io::{self, Write};

/// Writes `args` to stdout (flushed, so a prompt shows at once); EPIPE ends the process
/// with status 0.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut o = io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        gone(&e);
    }
}

/// The end of a write to stdout that failed.
fn gone(e: &io::Error) -> ! {
    log::logger().flush();
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("fencefs: stdout: {e}");
    std::process::exit(1);
}

/// Installs the panic hook that turns std's EPIPE panic of `println!` into exit 0.
pub fn quiet_on_epipe() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            log::logger().flush();
            std::process::exit(0);
        }
        prev(info);
    }));
}

/// `println!` to stdout through [`write`](fn@write): EPIPE exits 0.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` to stdout through [`write`](fn@write) (flushed): EPIPE exits 0.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*)) };
}
