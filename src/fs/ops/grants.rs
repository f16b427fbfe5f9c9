//! The finer grants at the file-system edge: what `create`, `append` and `exec = false`
//! mean for a request on a node, beyond the pure decision in `policy/`.
//!
//! - `create`: a node this uid made through the mount (CREATE) stays writable by it
//!   while the creating handle is open ([`Handle::fresh`](crate::host::handle::Handle));
//!   every other mutation of an existing node needs `write`. The state is a flag on the
//!   handle, so it is bounded by the handle budget and does not survive the daemon: after
//!   a restart every file is pre-existing.
//! - `append`: an open for writing with O_APPEND and without O_TRUNC needs only `append`;
//!   a handle granted no more is append-only: each write must carry O_APPEND (a write
//!   whose flags lost it — `fcntl(F_SETFL)` — or a page-cache writeback of a shared map is
//!   EACCES), the host file is open with O_APPEND (a host `pwrite` then appends whatever
//!   its offset), the handle is never a kernel passthrough file and is served with direct
//!   I/O (so no shared writable map of it exists).
//! - `exec = false`: an exec-open (`FMODE_EXEC`) of a covered file is EACCES and its
//!   execute bits read as cleared (`Shared::attr`); the host mode never changes.
//!
//! Invariants: every refusal here is counted and audited like the policy's own; nothing
//! here widens what the policy grants (a fresh node only turns a `write` need into the
//! `create` need the same policy decides).

use super::{Ctx, Error, Res, Shared};
use crate::fs::attr;
use crate::host::handle::Handle;
use crate::policy::{By, Need, Special};

/// What a write request says about itself (FUSE `write_in`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteKind {
    /// FUSE_WRITE_KILL_SUIDGID: the writer lacks CAP_FSETID.
    pub kill_setid: bool,
    /// The file's flags carry O_APPEND and the write is not a page-cache writeback
    /// (FUSE_WRITE_CACHE).
    pub append: bool,
}

/// `FUSE_WRITE_CACHE` (write_flags): a write from the page cache.
pub const WRITE_CACHE: u32 = 1;

impl WriteKind {
    /// From the FUSE `write_flags` and `flags` words.
    pub fn from_flags(write_flags: u32, kill_setid: bool, flags: i32) -> WriteKind {
        WriteKind {
            kill_setid,
            append: flags & libc::O_APPEND != 0 && write_flags & WRITE_CACHE == 0,
        }
    }
}

impl Shared {
    /// Whether node `ino` cannot be executed by the caller: an `exec = false` rule covers
    /// one of its paths (a hard link never widens). Free when the policy has none.
    pub(super) fn no_exec(&self, ctx: &Ctx, ino: u64) -> bool {
        let policy = &ctx.snap.policy;
        if !policy.has_noexec() {
            return false;
        }
        match self.inodes.paths_kind(ino) {
            Ok((paths, _)) => paths
                .iter()
                .any(|p| policy.exec_denied(p, ctx.caller).is_some()),
            Err(_) => false,
        }
    }

    /// Refuses an exec-open of a node an `exec = false` rule covers: EACCES, audited as
    /// `exec` by that rule.
    pub(super) fn check_exec(&self, ctx: &Ctx, ino: u64) -> Res<()> {
        let policy = &ctx.snap.policy;
        if !policy.has_noexec() || self.learning() {
            return Ok(());
        }
        let (paths, kind) = self.inodes.paths_kind(ino)?;
        for p in &paths {
            if let Some(rule) = policy.exec_denied(p, ctx.caller) {
                let v = policy.verdict_for(p, ctx.caller, kind == libc::S_IFDIR);
                ctx.need.set(None);
                self.audit(ctx, "exec", p, &v, By::Rule(rule), Some(libc::EACCES));
                return Err(Error(libc::EACCES));
            }
        }
        Ok(())
    }

    /// The need of a mutation of existing node `ino` (write, truncate, chmod, xattrs):
    /// `Create` while the caller's creating handle on it is open, else `Write`.
    pub(super) fn mutate_need(&self, ctx: &Ctx, ino: u64) -> Need {
        if self.handles.fresh_for(ino, ctx.caller.uid) {
            Need::Create
        } else {
            Need::Write
        }
    }

    /// The need of an open with `flags`: `Append` for a write with O_APPEND and without
    /// O_TRUNC, `Create` for any write to a node the caller's creating handle holds open.
    pub(super) fn open_need(&self, ctx: &Ctx, ino: u64, flags: i32) -> Need {
        let need = attr::classify(flags).need;
        if matches!(need, Need::Write | Need::Append) && self.mutate_need(ctx, ino) == Need::Create
        {
            Need::Create
        } else {
            need
        }
    }

    /// The need access(W_OK) is decided with: the first of `write` (or `create` on a node
    /// the caller is creating), `append` for a file, `create` for a directory, that the
    /// policy grants; the first one when none does (its refusal is the answer).
    pub(super) fn access_write_need(&self, ctx: &Ctx, ino: u64) -> Need {
        let first = self.mutate_need(ctx, ino);
        let is_dir = matches!(self.inodes.paths_kind(ino), Ok((_, k)) if k == libc::S_IFDIR);
        let other = if is_dir { Need::Create } else { Need::Append };
        if !self.grants_ino(ctx, ino, first) && self.grants_ino(ctx, ino, other) {
            other
        } else {
            first
        }
    }

    /// Whether every path of `ino` grants `need`, decided silently (no audit, no ask):
    /// for shaping a handle the policy already allowed.
    pub(super) fn grants_ino(&self, ctx: &Ctx, ino: u64, need: Need) -> bool {
        let Ok((paths, kind)) = self.inodes.paths_kind(ino) else {
            return false;
        };
        !paths.is_empty()
            && paths.iter().all(|p| {
                ctx.snap
                    .policy
                    .check_for(
                        p,
                        ctx.caller,
                        need,
                        Special::default(),
                        kind == libc::S_IFDIR,
                    )
                    .is_ok()
            })
    }

    /// Whether `path` grants `need`, decided silently.
    pub(super) fn grants(&self, ctx: &Ctx, path: &[u8], is_dir: bool, need: Need) -> bool {
        ctx.snap
            .policy
            .check_for(path, ctx.caller, need, Special::default(), is_dir)
            .is_ok()
    }

    /// Refuses a write through append-only handle `h` that does not append: EACCES,
    /// audited as `write`.
    pub(super) fn check_append(&self, ctx: &Ctx, h: &Handle, kind: WriteKind) -> Res<()> {
        if !h.append_only || kind.append || self.learning() {
            return Ok(());
        }
        if let Ok((paths, _)) = self.inodes.paths_kind(h.ino)
            && let Some(p) = paths.first()
        {
            let v = ctx.snap.policy.verdict_for(p, ctx.caller, false);
            ctx.need.set(Some(Need::Write));
            self.audit(ctx, "write", p, &v, v.grant_by, Some(libc::EACCES));
        }
        Err(Error(libc::EACCES))
    }
}

/// The need a write through `h` is re-decided with (`--revoke`).
pub(super) fn write_need(h: &Handle) -> Need {
    if h.fresh {
        Need::Create
    } else if h.append_only {
        Need::Append
    } else {
        Need::Write
    }
}
