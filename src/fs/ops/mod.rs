//! The operations: take one policy snapshot, decide, audit, then touch the host through
//! handles. Each `do_*` returns `Result<T, Error>`; the handlers in `fs/handlers.rs` only reply.
//!
//! This file holds what every family of operations shares: the daemon-wide state ([`Shared`], [`Settings`], [`Stats`]), the results handed to the
//! glue ([`Lookup`], [`Opened`]), and the helpers more than one family calls: `attr` (every
//! attribute reply is made there, ids mapped), `stat_ino`, `io_fd`, the caller's host ids
//! and the set-ID clearing a write or truncate owes (`kills_setid` / `kill_setid`).
//! The request vocabulary (`Ctx`, `Error`, `Res`, `Ask`) lives in `fs/ctx.rs`, which
//! `fs/notes` uses too; it is re-exported here for the families' `use super::…`.
//! The operations themselves are `impl Shared` blocks, one file per family:
//!
//! - `names`: lookup, forget, readlink, mknod / mkdir / symlink / create, unlink / rmdir,
//!   rename, link: everything that adds, removes or moves a name;
//! - `data`: open, read, write, fsync, fallocate, lseek, copy_file_range, release, and
//!   registering an opened file as a handle;
//! - `dirs`: opendir and the filtered listing behind readdir / readdirplus;
//! - `attrs`: getattr, setattr, access, statfs;
//! - `xattr`: getxattr, listxattr, setxattr, removexattr;
//! - `saves`: an atomic save's provisional temporary file (made, lifted, capped, landed or
//!   removed), which `names`, `data`, `attrs` and the decision consult.
//!
//! Invariants for all of them: an operation on a name or node is decided (and audited)
//! against `ctx.snap`, the one snapshot of the request, before anything on the host is
//! changed or returned; I/O on a handle relies on the rights decided at open (re-decided
//! with `--revoke`); the host is reached only through inode handles, never a path string;
//! every host error keeps its errno (`From<io::Error> for Error`).
// The families' public `do_*` docs link to the private helpers here (`kill_setid`,
// `not_empty`): the book's API docs are built with private items (scripts/test.sh).
#![allow(rustdoc::private_intra_doc_links)]

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use fuser::{FileAttr, FileType};

use super::attr::to_attr;
use super::kcache::{Inval, KernelCache};
use crate::approvals::Approvals;
use crate::audit::Audit;
use crate::host::handle::{Handle, HandleFd, Handles, Slots};
use crate::host::inode::Inodes;
use crate::host::path::join;
use crate::host::programs::Programs;
use crate::host::sys::{self, Name};
use crate::idmap::IdMap;
use crate::policy::Caller;
use crate::reload::PolicyStore;

pub use super::ctx::{Ask, Ctx, Error, Res};

mod attrs;
mod copy;
mod data;
mod dirs;
mod grants;

pub use grants::WriteKind;
pub use saves::{Saves, sweeper};
mod names;
mod saves;
mod staged;
mod xattr;

pub use attrs::SetAttr;

/// Cache lifetimes for one reply.
#[derive(Clone, Copy)]
pub struct Ttl {
    /// Entry (name → inode) lifetime.
    pub entry: Duration,
    /// Attribute lifetime.
    pub attr: Duration,
}

/// Daemon-wide settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Re-check every read and write against the policy in force.
    pub revoke: bool,
    /// Kernel cache lifetime for names and attributes when no rule depends on the caller.
    pub ttl: Duration,
    /// Use kernel FUSE passthrough for file I/O where the kernel allows it.
    pub passthrough: bool,
    /// `--learn`: report-only; what was used is recorded here (see `learn.rs`).
    pub learn: Option<Arc<crate::learn::Recorder>>,
    /// Serve extended attributes; false (`--no-xattr`): GETXATTR, LISTXATTR, SETXATTR and
    /// REMOVEXATTR are answered ENOSYS before anything else is looked at, so the kernel
    /// stops sending them and its callers get EOPNOTSUPP.
    pub xattr: bool,
}

/// Everything the operations share.
pub struct Shared {
    /// Inode table.
    pub inodes: Inodes,
    /// Open handles.
    pub handles: Handles,
    /// Policy in force.
    pub policy: PolicyStore,
    /// Audit writer.
    pub audit: Option<Audit>,
    /// Settings.
    pub settings: Settings,
    /// The daemon runs as root: created files are chowned to the caller.
    pub as_root: bool,
    /// Caller ↔ host uid map.
    pub uids: IdMap,
    /// Caller ↔ host gid map.
    pub gids: IdMap,
    /// What the kernel caches on the daemon's word (hidden negative entries, invalidations).
    pub kcache: KernelCache,
    /// Held closed while a staged mount swaps its merged view (`fs::gate`; `None`
    /// without staging).
    pub gate: Option<Arc<crate::fs::gate::Gate>>,
    /// A staged mount's base records (`fs/ops/staged.rs`; `None` without staging).
    pub bases: Option<Arc<crate::stage::base::Bases>>,
    /// Requests held for an approver.
    pub approvals: Arc<Approvals>,
    /// Decisions made (for `status`).
    pub stats: Stats,
    /// Resolves callers' programs for `exe` / `ancestor_exe` rules.
    pub programs: Programs,
    /// The virtual `.fencefs/` directory (`agent_notes = true`): open notes, denials.
    pub notes: super::notes::Notes,
    /// Atomic saves' provisional temporary files (`saves.rs`).
    pub saves: Saves,
}

/// Decision counters.
#[derive(Default)]
pub struct Stats {
    /// Operations allowed.
    pub allowed: AtomicU64,
    /// Operations refused.
    pub denied: AtomicU64,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A visible file.
    Found(FileAttr),
    /// No such name on the host.
    Absent,
    /// The policy hides the name (answered exactly like `Absent`).
    Hidden,
}

/// A host file opened for a caller, not yet registered as a handle: the glue first offers
/// it to the kernel as a passthrough backing file.
pub struct Opened {
    /// The node.
    pub ino: u64,
    /// The open host file.
    pub file: OwnedFd,
    /// The opener's host file-system ids (uid, gid): a passthrough backing file's writes
    /// run with them.
    pub writer: (u32, u32),
    /// The caller that opened it (uid, gid, as the policy sees them): `--revoke` decides
    /// the kernel's own I/O on the handle (writeback, no caller) for it.
    opener: (u32, u32),
    read: bool,
    write: bool,
    exec: bool,
    /// See [`Handle::fresh`].
    fresh: bool,
    /// See [`Handle::append_only`]: never a passthrough file, served with direct I/O.
    pub append_only: bool,
    slots: Slots,
}

impl Shared {
    /// Host attributes as the caller sees them (ids mapped). Every attribute reply to the
    /// kernel is made here. When the policy may hide something, a directory's link count is
    /// 1 (what `find` and fts read as "unknown", as btrfs reports): the host's count
    /// includes hidden subdirectories.
    fn attr(&self, ctx: &Ctx, ino: u64, st: &libc::stat) -> FileAttr {
        let mut a = to_attr(ino, st);
        a.uid = self.uids.to_caller(a.uid);
        a.gid = self.gids.to_caller(a.gid);
        if a.kind == FileType::Directory && ctx.snap.policy.may_hide() {
            a.nlink = 1;
        }
        if a.kind == FileType::RegularFile && a.perm & 0o111 != 0 && self.no_exec(ctx, ino) {
            a.perm &= !0o111;
        }
        a
    }

    /// Builds the request context (one policy snapshot). With program rules in the
    /// policy, the calling process's program (and its ancestors', for `ancestor_exe`) is
    /// resolved now (`host/programs.rs`) and matched once for the whole request.
    pub fn ctx(&self, uid: u32, gid: u32, pid: u32) -> Ctx {
        let snap = self.policy.get();
        let caller = if !snap.policy.has_programs() {
            Caller::new(uid, gid)
        } else if pid == 0 {
            // A caller outside the daemon's pid namespace: its program cannot be read.
            Caller::unknown_program(uid, gid)
        } else {
            let chain = self
                .programs
                .chain(pid, snap.policy.has_ancestor_programs());
            if chain.exe.is_empty() {
                // Queue full, answer late, process gone: the most restrictive answer.
                Caller::unknown_program(uid, gid)
            } else {
                Caller {
                    progs: snap.policy.match_programs(&chain.exe, &chain.ancestors),
                    ..Caller::new(uid, gid)
                }
            }
        };
        Ctx {
            caller,
            pid,
            snap,
            approved: None,
            ask: RefCell::new(None),
            may_hold: false,
            inside: self.gate.as_ref().map(|g| g.enter()),
            need: Cell::new(None),
        }
    }

    /// The root node `ino` is in, for the budgets (`host/budget.rs`): `(0, 0)` for SOURCE.
    pub(super) fn root_id(&self, ino: u64) -> (u64, u64) {
        let roots = self.inodes.roots();
        if roots.iter().next().is_none() {
            return (0, 0);
        }
        self.inodes.path(ino).map_or((0, 0), |p| roots.id_of(&p))
    }

    /// Cache lifetimes under this snapshot: zero when rules depend on the caller, so a
    /// name or attribute cached for one caller never serves another; zero too while a
    /// reload takes back the kernel's caches, and for a request decided under a policy no
    /// longer in force (see `kcache`: call this after the reply's node is registered).
    /// Whether the kernel may keep a directory's listing across opens (it drops it when
    /// the directory's mtime changes, and the host watch drops it on host changes). Not
    /// on a staged mount whose host changes are not watched (an ordinary user's daemon has
    /// no fanotify): a merged directory shows its upper part's mtime, which a host change
    /// below it leaves as it was, so a new host file would never be listed.
    pub fn listings_cacheable(&self) -> bool {
        self.inodes.union().is_none() || self.inodes.watching()
    }

    pub fn ttl(&self, ctx: &Ctx) -> Ttl {
        if ctx.snap.policy.has_id_rules()
            || !self.kcache.caching()
            || ctx.snap.generation != self.policy.generation()
        {
            Ttl {
                entry: Duration::ZERO,
                attr: Duration::ZERO,
            }
        } else {
            Ttl {
                entry: self.settings.ttl,
                attr: self.settings.ttl,
            }
        }
    }

    fn child_path(&self, parent: u64, name: &Name) -> Res<Vec<u8>> {
        // Every name mutation builds its path here: none reaches `.fencefs/` (EROFS).
        self.notes.guard(&self.policy, parent, name.bytes())?;
        let pp = self.inodes.path(parent)?;
        Ok(join(&pp, name.bytes()))
    }

    fn stat_ino(&self, ino: u64) -> Res<libc::stat> {
        let fd = self.inodes.fd(ino)?;
        Ok(sys::fstat(fd.as_fd())?)
    }

    /// A descriptor for I/O on handle `h`: its own, or (a passthrough handle, whose file
    /// the kernel holds) the node reopened with `flags` for this call.
    fn io_fd<'a>(&self, h: &'a Handle, flags: i32) -> Res<HandleFd<'a>> {
        if let Some(f) = &h.file {
            return Ok(HandleFd::Held(f));
        }
        if let Some(p) = h.pin.get() {
            let fd = sys::reopen(self.inodes.proc_fd.as_fd(), p.fd.as_fd(), flags)?;
            return Ok(HandleFd::Temp(fd));
        }
        let node = self.inodes.fd(h.ino)?;
        Ok(HandleFd::Temp(sys::reopen(
            self.inodes.proc_fd.as_fd(),
            node.as_fd(),
            flags,
        )?))
    }

    /// The caller's host uid and gid.
    fn host_ids(&self, ctx: &Ctx) -> (u32, u32) {
        (
            self.uids.to_host(ctx.caller.uid),
            self.gids.to_host(ctx.caller.gid),
        )
    }

    /// Whether the kernel would have the file system clear set-ID bits for this caller
    /// (FUSE_HANDLE_KILLPRIV_V2: a write, truncate or fallocate by a caller without
    /// CAP_FSETID). The kernel says so on writes; for truncates, opens with `O_TRUNC` and
    /// fallocate fuser does not pass its flag on, so it is read from the caller: any host
    /// uid but root, as the caller's own kernel would decide for an unprivileged process.
    fn kills_setid(&self, ctx: &Ctx) -> bool {
        self.uids.to_host(ctx.caller.uid) != 0
    }

    /// Clears the set-user-ID bit, and the set-group-ID bit of a group-executable file,
    /// of the regular file behind `fd`, as a local disk does when a caller without
    /// CAP_FSETID writes or truncates it (the daemon's own write, as root, would keep
    /// them). `security.capability` needs no help: the host drops it on every write,
    /// truncate and chown, whoever makes it.
    ///
    /// The kernel may hold the old mode (an open or a write replies without attributes),
    /// so a change queues an invalidation of `ino`'s attributes.
    fn kill_setid(&self, ino: u64, fd: BorrowedFd<'_>) -> Res<()> {
        let st = sys::fstat(fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let mut kill = st.st_mode & libc::S_ISUID;
        if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            kill |= libc::S_ISGID;
        }
        if kill != 0 {
            sys::fchmod_fd(self.inodes.proc_fd.as_fd(), fd, st.st_mode & 0o7777 & !kill)?;
            self.kcache.send(Inval {
                inodes: vec![(ino, -1)],
                ..Inval::default()
            });
        }
        Ok(())
    }

    fn handle(&self, fh: u64) -> Res<Arc<Handle>> {
        self.handles.get(fh).ok_or(Error(libc::EBADF))
    }
}
