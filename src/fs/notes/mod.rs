//! The agent's own view of the fence: with `agent_notes = true` the mount root has a
//! read-only virtual directory `.fencefs/` holding `README`, `policy`, `denials` and
//! `feedback` (the reviewer's decisions, staged mounts: `feedback.rs`),
//! generated for whoever reads them (SPEC "The agent's own view of the fence"). It is
//! reachable by name but never listed in the root, so nothing that copies or commits the
//! workspace by walking it (`git add -A`, `tar`, `rsync -a`, `cp -a`) picks it up.
//!
//! The directory is a synthetic node range, not a branch in every operation: its nodes
//! are the ids from [`BASE`] up, and its open files the handles from [`FH_BASE`] up; the
//! handlers hand a request for one of them to `serve.rs`, the name mutations meet
//! [`Notes::guard`] where every one of them builds its path (`Shared::child_path`).
//!
//! Invariants:
//! - The ids never collide with a host node's: host-backed ids are below `1 << 62`
//!   (`host/inode.rs`: the host inode number, else a counter from there up) and the
//!   synthetic range sits at the top of `u64`; handle ids count up from 1.
//! - Nothing of it is on the host and nothing reaches the host: every mutation in it, of
//!   it or into it (create, mkdir, mknod, symlink, link, unlink, rmdir, rename, setattr,
//!   setxattr, removexattr, open for writing) is EROFS; no passthrough backing file.
//! - A file's contents are generated at open for the opener and frozen in its handle, so
//!   reads at any offsets see one consistent text; it is served with direct I/O (the size
//!   the kernel saw at lookup never truncates it). Attributes are never cached (they are
//!   the caller's: owner, size).
//! - While on, `.fencefs` is never in the root's listing (the virtual one is found only by
//!   name) and a host entry of that name is shadowed (not listed, not reachable through
//!   the mount); off, the names resolve to the host as ever, and the
//!   cost is one integer comparison per request plus one name comparison per root lookup.
//! - Bounded whoever calls: at most [`OPEN_PER_UID`] open notes per uid and
//!   [`OPEN_TOTAL`] in all (EMFILE / ENFILE past them); the denials store is bounded too
//!   (`denials.rs`). Nothing here names a path hidden from the caller (`render.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo};
use parking_lot::Mutex;

use super::ctx::{Ctx, Error, Res};
use crate::approvals::Outcome;
use crate::audit::{errno_name, timestamp};
use crate::host::handle::ListEntry;
pub use crate::host::inode::ROOT;
use crate::policy::{By, Verdict};
use crate::reload::PolicyStore;

pub mod denials;
pub mod feedback;
pub mod render;
mod serve;

pub use denials::Denials;

/// The directory's name at the mount root.
pub const NAME: &[u8] = b".fencefs";
/// The first synthetic node id: `.fencefs/` itself.
pub const BASE: u64 = u64::MAX - 0xff;
/// `.fencefs/README`.
pub const README: u64 = BASE + 1;
/// `.fencefs/policy`.
pub const POLICY: u64 = BASE + 2;
/// `.fencefs/denials`.
pub const DENIALS: u64 = BASE + 3;
/// `.fencefs/feedback` (the reviewer's decisions; empty without staging).
pub const FEEDBACK: u64 = BASE + 4;
/// The files, in listing order.
pub const FILES: [(u64, &[u8]); 4] = [
    (README, b"README"),
    (POLICY, b"policy"),
    (DENIALS, b"denials"),
    (FEEDBACK, b"feedback"),
];
/// The first handle id of an open note.
pub const FH_BASE: u64 = 1 << 63;
/// Open notes (files and the directory) per uid.
pub const OPEN_PER_UID: usize = 64;
/// Open notes in all.
pub const OPEN_TOTAL: usize = 256;

/// Whether `ino` is one of the synthetic nodes.
pub fn owns(ino: u64) -> bool {
    ino >= BASE
}

/// Whether `fh` is an open note.
pub fn owns_fh(fh: u64) -> bool {
    fh >= FH_BASE
}

/// One open note: the opener's uid and the contents frozen at open (empty for the directory).
struct Open {
    uid: u32,
    data: Arc<Vec<u8>>,
}

/// The notes' state: the denials store and the open notes.
pub struct Notes {
    /// Each uid's last refusals.
    pub denials: Denials,
    /// The mount stages its changes (`--stage`): the notes say so.
    staged: bool,
    /// The reviewer's decisions (staged mounts).
    feedback: Option<Arc<feedback::Feedback>>,
    open: Mutex<HashMap<u64, Open>>,
    next: AtomicU64,
}

impl Default for Notes {
    fn default() -> Notes {
        Notes::new(None)
    }
}

impl Notes {
    /// The notes of a mount (`stage`: its `--stage DIR`).
    pub fn new(stage: Option<std::path::PathBuf>) -> Notes {
        Notes {
            denials: Denials::default(),
            staged: stage.is_some(),
            feedback: stage.map(|d| Arc::new(feedback::Feedback::new(d))),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(FH_BASE),
        }
    }

    /// EROFS for a name mutation of `.fencefs` at the root (while on) or of any name in it.
    pub fn guard(&self, policy: &PolicyStore, parent: u64, name: &[u8]) -> Res<()> {
        if owns(parent) || (parent == ROOT && name == NAME && policy.get().policy.agent_notes()) {
            return Err(Error(libc::EROFS));
        }
        Ok(())
    }

    /// The root listing while on: the host's `.fencefs` (if any) is shadowed and the
    /// virtual one is not listed either — it is reachable by name only, so what tools copy
    /// or commit by walking the workspace (`git add -A`, `tar`, `rsync -a`, `cp -a`)
    /// never holds it.
    pub fn root_listing(&self, ctx: &Ctx, entries: &mut Vec<ListEntry>) {
        if !ctx.snap.policy.agent_notes() {
            return;
        }
        entries.retain(|e| e.name != NAME);
    }

    /// The reviewer's decisions of a staged mount (their refresher runs unconfined).
    pub fn feedback(&self) -> Option<Arc<feedback::Feedback>> {
        self.feedback.clone()
    }

    /// Records a refusal for `.fencefs/denials` (while on): `asked` is the end of a held
    /// request (who or what refused it).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &Ctx,
        op: &str,
        path: &[u8],
        v: &Verdict,
        by: By,
        errno: i32,
        asked: Option<&Outcome>,
    ) {
        let policy = &ctx.snap.policy;
        if !policy.agent_notes() {
            return;
        }
        let mut p = match path {
            b"" => ".".to_string(),
            _ => crate::quote::quote(path).into_owned(),
        };
        // Cut as shown (escapes make a byte up to four characters), on a character.
        if p.len() > denials::MAX_PATH {
            let mut end = denials::MAX_PATH;
            while !p.is_char_boundary(end) {
                end -= 1;
            }
            p.truncate(end);
            p.push_str(if p.starts_with('"') { "...\"" } else { "..." });
        }
        let mut why = render::why(policy, ctx.caller, path, v, by, errno);
        if let Some(o) = asked {
            why.push_str(&format!("; asked, refused by {}", o.by));
        }
        let line = format!(
            "{} {op} {p} {} {why}",
            timestamp(SystemTime::now()),
            errno_name(errno)
        );
        self.denials.record(ctx.caller.uid, line);
    }

    /// A note's contents for the caller of `ctx`.
    fn contents(&self, ctx: &Ctx, ino: u64) -> Vec<u8> {
        let policy = &ctx.snap.policy;
        let text = match ino {
            README => render::readme(policy, self.staged),
            POLICY => render::policy(policy, ctx.caller, ctx.snap.generation, self.staged),
            DENIALS => {
                let mut s = String::new();
                for l in self.denials.lines(ctx.caller.uid) {
                    s.push_str(&l);
                    s.push('\n');
                }
                s
            }
            FEEDBACK => self
                .feedback
                .as_ref()
                .map_or_else(String::new, |f| f.render(policy, ctx.caller)),
            _ => String::new(),
        };
        text.into_bytes()
    }

    /// Registers an open note for `uid`.
    fn register(&self, uid: u32, data: Vec<u8>) -> Res<u64> {
        let mut open = self.open.lock();
        if open.len() >= OPEN_TOTAL {
            return Err(Error(libc::ENFILE));
        }
        if open.values().filter(|o| o.uid == uid).count() >= OPEN_PER_UID {
            return Err(Error(libc::EMFILE));
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        open.insert(
            fh,
            Open {
                uid,
                data: Arc::new(data),
            },
        );
        Ok(fh)
    }

    fn data(&self, fh: u64) -> Res<Arc<Vec<u8>>> {
        let open = self.open.lock();
        open.get(&fh)
            .map(|o| o.data.clone())
            .ok_or(Error(libc::EBADF))
    }

    fn release(&self, fh: u64) {
        self.open.lock().remove(&fh);
    }

    /// The attributes of synthetic node `ino` for the caller (`None`: not one of them, or off).
    fn attr(&self, ctx: &Ctx, ino: u64) -> Option<FileAttr> {
        if !ctx.snap.policy.agent_notes() {
            return None;
        }
        let (kind, perm, nlink, size) = match ino {
            BASE => (FileType::Directory, 0o755, 2, 0),
            README | POLICY | DENIALS | FEEDBACK => (
                FileType::RegularFile,
                0o644,
                1,
                self.contents(ctx, ino).len() as u64,
            ),
            _ => return None,
        };
        let now = SystemTime::now();
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            // The caller's own view: it owns it, so the kernel's permission checks
            // (`default_permissions`) let every mutation reach the daemon's EROFS.
            uid: ctx.caller.uid,
            gid: ctx.caller.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

/// Cache lifetimes of a synthetic node: none (its attributes are the caller's).
pub const TTL: Duration = Duration::ZERO;
