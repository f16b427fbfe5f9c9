//! Reloading the policy when the host edits a policy file inside SOURCE (the workspace
//! layer, an ignore file): debounced and rate-bounded, on a thread of its own so the host
//! watch thread never waits for a reload.
//!
//! The watch thread only [`Trigger::poke`]s (a lock and a notify). The reload thread waits
//! until the files have been quiet for [`QUIET`] (a file written in place — truncated,
//! then written — is not loaded half-written), but not longer than [`MAX_WAIT`] after the
//! first change of a burst (a host process rewriting the file in a loop cannot hold the
//! reload off for ever), and never starts two reloads less than [`MIN_GAP`] apart (a storm
//! costs at most one reload per `MIN_GAP`). A change during a reload arms the next one,
//! so the last state is always loaded. An invalid file keeps the old policy (logged with
//! file:line:column by the reload).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::fs::ops::Shared;

/// How long the files must be quiet before they are loaded.
pub const QUIET: Duration = Duration::from_millis(200);
/// The longest a reload waits after the first change of a burst.
pub const MAX_WAIT: Duration = Duration::from_secs(2);
/// The shortest time between the starts of two reloads.
pub const MIN_GAP: Duration = Duration::from_secs(1);

/// A burst of changes not loaded yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Burst {
    first: Instant,
    last: Instant,
}

/// Shared between the watch thread (pokes) and the reload thread (waits).
#[derive(Default)]
pub struct Trigger {
    burst: Mutex<Option<Burst>>,
    cv: Condvar,
}

impl Trigger {
    /// A policy file changed on the host (never blocks beyond the lock).
    pub fn poke(&self) {
        let now = Instant::now();
        let mut b = self.burst.lock();
        *b = Some(match *b {
            Some(x) => Burst { last: now, ..x },
            None => Burst {
                first: now,
                last: now,
            },
        });
        self.cv.notify_one();
    }
}

/// When the reload of `burst` may start, given the last reload's start.
fn due(burst: Burst, last_reload: Option<Instant>) -> Instant {
    let at = (burst.last + QUIET).min(burst.first + MAX_WAIT);
    match last_reload {
        Some(r) => at.max(r + MIN_GAP),
        None => at,
    }
}

/// Starts the reload thread; the returned trigger is poked on every relevant host change.
/// `what` names the change in the log ("a policy file in SOURCE").
pub(super) fn start(shared: Arc<Shared>, what: &'static str) -> Result<Arc<Trigger>, String> {
    let t = Arc::new(Trigger::default());
    let t2 = t.clone();
    std::thread::Builder::new()
        .name("fencefs-policy-watch".into())
        .spawn(move || run(&t2, &shared, what))
        .map_err(|e| e.to_string())?;
    Ok(t)
}

fn run(t: &Trigger, shared: &Shared, what: &str) {
    let mut last_reload: Option<Instant> = None;
    loop {
        {
            let mut b = t.burst.lock();
            loop {
                match *b {
                    None => t.cv.wait(&mut b),
                    Some(burst) => {
                        let at = due(burst, last_reload);
                        if Instant::now() >= at {
                            break;
                        }
                        t.cv.wait_until(&mut b, at);
                    }
                }
            }
            *b = None;
        }
        last_reload = Some(Instant::now());
        log::info!("{what} changed on the host: reloading");
        let _ = super::threads::reload_now(shared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_quiet_but_not_for_ever() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        // One change: loaded QUIET after it.
        let b = Burst {
            first: t0,
            last: t0,
        };
        assert_eq!(due(b, None), t0 + QUIET);
        // A change 150 ms later pushes it back.
        let b = Burst {
            first: t0,
            last: t0 + ms(150),
        };
        assert_eq!(due(b, None), t0 + ms(150) + QUIET);
        // A storm (a change every few ms for ever): loaded MAX_WAIT after the first.
        let b = Burst {
            first: t0,
            last: t0 + ms(5000),
        };
        assert_eq!(due(b, None), t0 + MAX_WAIT);
        // Never two reloads less than MIN_GAP apart.
        let b = Burst {
            first: t0,
            last: t0,
        };
        assert_eq!(due(b, Some(t0)), t0 + MIN_GAP);
    }

    #[test]
    fn poke_coalesces_into_one_burst() {
        let t = Trigger::default();
        t.poke();
        let first = (*t.burst.lock()).map(|b| b.first);
        std::thread::sleep(Duration::from_millis(5));
        t.poke();
        let b = (*t.burst.lock()).unwrap_or_else(|| panic!("armed"));
        assert_eq!(Some(b.first), first);
        assert!(b.last > b.first);
    }
}
