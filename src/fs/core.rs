//! What the FUSE entry points share with requests that finish on another thread: the
//! operations ([`Shared`]), the kernel-passthrough backing ids, and [`Core::serve`], which
//! runs an operation and — when its refusal is one an approver could lift — parks the
//! kernel's reply with the approvals table instead of answering.
//!
//! Invariants: a parked reply is answered exactly once, by its continuation (allowed: the
//! operation re-runs under the policy in force then, as approved; refused: EACCES); no
//! worker thread waits for an approver.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use fuser::FopenFlags;
use parking_lot::Mutex;

use super::ctx::{Ctx, Error, Res};
use super::decide::Line;
use super::ops::{Opened, Shared};
use crate::approvals::{self, Hold, Outcome, Resume};
use crate::host::sys;

/// A kernel passthrough backing id, closed on the FUSE connection when dropped.
pub struct BackingFile {
    /// The id the kernel knows the host file by.
    pub id: u32,
    dev: Arc<OwnedFd>,
    /// The host file's identity on a staged mount (a node's object changes at its
    /// copy-up); `(0, 0)` elsewhere.
    key: (u64, u64),
}

/// How a handle's I/O is served.
enum Served {
    /// By the kernel, through this backing file.
    Kernel(Arc<BackingFile>),
    /// By the daemon.
    Daemon,
    /// By the daemon, uncached: the inode is passed through to another host object (a
    /// reader of a staged file's lower copy), and the kernel mixes no cached I/O with it.
    Direct,
}

impl Drop for BackingFile {
    fn drop(&mut self) {
        if let Err(e) = crate::host::sys::fuse_backing_close(self.dev.as_fd(), self.id) {
            log::debug!("closing backing id {}: {e}", self.id);
        }
    }
}

#[derive(Default)]
struct Backing {
    by_ino: HashMap<u64, Weak<BackingFile>>,
    by_fh: HashMap<u64, Arc<BackingFile>>,
}

/// Who sent a request (from its FUSE header), whatever transport carried it.
#[derive(Clone, Copy, Debug)]
pub struct Rq {
    /// Caller uid.
    pub uid: u32,
    /// Caller gid.
    pub gid: u32,
    /// Caller pid (0: the kernel itself).
    pub pid: u32,
}

impl From<&fuser::Request> for Rq {
    fn from(r: &fuser::Request) -> Rq {
        Rq {
            uid: r.uid(),
            gid: r.gid(),
            pid: r.pid(),
        }
    }
}

/// State of the mounted file system reachable from any thread.
pub struct Core {
    /// The operations and everything they share with the signal and notify threads.
    pub shared: Arc<Shared>,
    /// Kernel FUSE passthrough negotiated: file I/O bypasses the daemon.
    pub(crate) passthrough: AtomicBool,
    /// Offer FUSE over io_uring at INIT (the transport checked it can serve it).
    pub offer_uring: AtomicBool,
    /// The kernel took the offer: requests come on the rings once they are registered.
    pub uring: AtomicBool,
    /// Every ring queue registered: `/dev/fuse` carries only FORGET, BATCH_FORGET and
    /// INTERRUPT from now on (`fs/forgets.rs` paces its readers).
    pub rings: AtomicBool,
    /// Backing ids by node (the kernel wants one per inode while any handle is open)
    /// and the strong references held by each open handle.
    backing: Mutex<Backing>,
    /// The FUSE connection's device, for backing ids (set once the session is up).
    dev: OnceLock<Arc<OwnedFd>>,
    /// Whether READDIRPLUS batches carry attributes (`fs/plus.rs`).
    pub(super) plus: super::plus::PlusAdvisor,
}

impl Core {
    pub(crate) fn new(shared: Arc<Shared>) -> Core {
        Core {
            shared,
            passthrough: AtomicBool::new(false),
            offer_uring: AtomicBool::new(false),
            uring: AtomicBool::new(false),
            rings: AtomicBool::new(false),
            backing: Mutex::new(Backing::default()),
            dev: OnceLock::new(),
            plus: Default::default(),
        }
    }

    /// Gives the core the FUSE device (a descriptor of the connection) that backing ids
    /// are opened and closed on. Without it, files are served through the daemon.
    pub fn set_device(&self, dev: OwnedFd) {
        let _ = self.dev.set(Arc::new(dev));
    }

    /// The backing id to pass an opened file's I/O through to its host file, reusing the
    /// inode's id while one is alive. `None`: serve I/O through the daemon.
    fn backing_for(&self, ino: u64, file: &OwnedFd, writer: (u32, u32)) -> Served {
        if !self.passthrough.load(Ordering::Relaxed) {
            return Served::Daemon;
        }
        let Some(dev) = self.dev.get() else {
            return Served::Daemon;
        };
        // Only a staged mount served by the daemon changes the host file behind a node
        // (its copy-up): elsewhere no open pays for the identity check.
        let key = if self.shared.inodes.union().is_some() {
            match sys::fstat(file.as_fd()) {
                Ok(st) => (st.st_dev, st.st_ino),
                Err(_) => return Served::Daemon,
            }
        } else {
            (0, 0)
        };
        let mut b = self.backing.lock();
        let id = match b.by_ino.get(&ino).and_then(Weak::upgrade) {
            Some(id) if id.key != key => return Served::Direct,
            Some(id) => id,
            None => match self.as_writer(writer, || {
                fuser::BackingId::create_raw(dev.as_fd(), file.as_fd())
            }) {
                Ok(id) => {
                    let id = Arc::new(BackingFile {
                        id,
                        dev: dev.clone(),
                        key,
                    });
                    b.by_ino.insert(ino, Arc::downgrade(&id));
                    id
                }
                Err(e) => {
                    log::debug!(
                        "passthrough refused for inode {ino}: {e}; serving through the daemon"
                    );
                    return Served::Daemon;
                }
            },
        };
        Served::Kernel(id)
    }

    /// Runs `f` (the backing-file open) with the credentials the kernel should keep for
    /// the backing file, with which it runs every write through it: the opener's
    /// file-system ids (as root), and never CAP_FSETID, so the host clears set-ID bits on
    /// those writes as for an unprivileged writer. FUSE_HANDLE_KILLPRIV_V2 leaves clearing
    /// to the daemon, which never sees a passthrough write; the kernel's own "remove
    /// privileges" request before a write (an empty SETATTR, `Shared::do_setattr`) covers
    /// what the kernel knows of the mode, this covers the rest. One backing file serves
    /// every handle of an inode, so later openers write with the first one's ids.
    fn as_writer<T>(
        &self,
        (uid, gid): (u32, u32),
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let _ids = if self.shared.as_root && (uid, gid) != (0, 0) {
            Some(sys::FsIds::assume(uid, gid)?)
        } else {
            None
        };
        let _cap = sys::WithoutFsetid::new()?;
        f()
    }

    /// Registers an opened file as a handle, through the kernel when it can (the handle
    /// then keeps the backing id and gives its descriptor back); returns the `fh` and the
    /// backing id.
    /// Registers an opened file; returns its `fh`, the kernel's backing id when the
    /// kernel serves its I/O, and whether the daemon must serve it uncached.
    pub(super) fn register(&self, o: Opened) -> (u64, Option<u32>, bool) {
        let ino = o.ino;
        // An append-only handle's writes must reach the daemon (grants.rs).
        // So must a provisional file's (its size is capped, `fs/ops/saves.rs`).
        let b = if o.append_only || self.shared.saves.capped(o.ino) {
            Served::Daemon
        } else {
            self.backing_for(ino, &o.file, o.writer)
        };
        let fh = self.shared.register(o, matches!(b, Served::Kernel(_)));
        match b {
            Served::Kernel(id) => {
                let raw = id.id;
                self.backing.lock().by_fh.insert(fh, id);
                (fh, Some(raw), false)
            }
            Served::Daemon => (fh, None, false),
            Served::Direct => (fh, None, true),
        }
    }

    pub(super) fn release_backing(&self, ino: u64, fh: u64) {
        if !self.passthrough.load(Ordering::Relaxed) {
            return;
        }
        let mut b = self.backing.lock();
        b.by_fh.remove(&fh);
        if b.by_ino.get(&ino).is_some_and(|w| w.strong_count() == 0) {
            b.by_ino.remove(&ino);
        }
    }

    pub(super) fn ctx(&self, rq: Rq) -> Ctx {
        self.shared.ctx(rq.uid, rq.gid, rq.pid)
    }

    /// The open flags of a handle served through the daemon; `append_only`: direct I/O,
    /// so that no shared writable map (whose writeback would not append) can exist.
    pub(super) fn open_flags(&self, append_only: bool) -> FopenFlags {
        if self.shared.settings.revoke || append_only {
            // Every read and write must reach the daemon to be re-checked.
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    /// Runs `op` for the kernel request `req` and answers with `answer`. When `op` was
    /// refused in a way an approver could lift (`Ctx::ask`), the reply is parked with the
    /// approvals table and this returns at once; the continuation re-runs `op` (allowed)
    /// or answers EACCES (denied, timed out, no approver) from the resume thread. A
    /// directory change is answered EACCES once its `--ask-dir-hold` runs out, or at once
    /// when it cannot be held (`approvals::Hold`); its question may outlive it.
    pub(super) fn serve<R, T>(
        self: &Arc<Self>,
        rq: Rq,
        reply: R,
        op: impl Fn(&Core, &Ctx) -> Res<T> + Send + 'static,
        answer: impl FnOnce(&Core, &Ctx, R, Res<T>) + Send + 'static,
    ) where
        R: Send + 'static,
        T: 'static,
    {
        self.serve_in(&[], rq, reply, op, answer)
    }

    /// [`serve`](Self::serve) for a directory change: the kernel holds `dirs` (the parent
    /// directories) locked while the request is in flight, so while it is held they are
    /// marked busy and the notify thread does not wait for them (`kcache`).
    pub(super) fn serve_in<R, T>(
        self: &Arc<Self>,
        dirs: &[u64],
        rq: Rq,
        reply: R,
        op: impl Fn(&Core, &Ctx) -> Res<T> + Send + 'static,
        answer: impl FnOnce(&Core, &Ctx, R, Res<T>) + Send + 'static,
    ) where
        R: Send + 'static,
        T: 'static,
    {
        let mut ctx = self.ctx(rq);
        ctx.may_hold = true;
        let r = op(self, &ctx);
        let ask = match &r {
            Err(_) => ctx.ask.borrow_mut().take(),
            Ok(_) => None,
        };
        let Some(ask) = ask else {
            return answer(self, &ctx, reply, r);
        };
        let (uid, gid, pid) = (ctx.caller.uid, ctx.caller.gid, ctx.pid);
        let request = approvals::Request {
            op: ask.op,
            paths: ask.paths.iter().map(|(p, _, _)| p.clone()).collect(),
            need: ask.need.as_str(),
            uid,
            gid,
            pid,
            rule: ask.paths.first().and_then(|(_, _, by)| match by {
                crate::policy::By::Rule(i) => {
                    let r = ctx.snap.policy.rule(*i);
                    Some((r.pattern.clone(), r.line))
                }
                _ => None,
            }),
            generation: ctx.snap.generation,
            checks: ask.checks.clone(),
            retry: approvals::dirs::is_dir_change(ask.op)
                || (approvals::dirs::is_inode_change(ask.op) && !dirs.is_empty()),
        };
        let core = self.clone();
        let asked = ask.clone();
        // An atomic save: its provisional file waits for, is landed or removed by, the
        // answer (`fs/ops/saves.rs`).
        let save = ask.save.clone().zip(request.paths.first().cloned());
        let save_late = save.clone();
        // Busy from before the request is held until its answer is sent.
        let busy = self.shared.kcache.hold_dirs(dirs);
        let resume: Resume = Box::new(move |o: Outcome| {
            if let Some((temp, target)) = &save {
                core.shared.save_step(uid, temp, target, o, false);
            }
            let mut again = core.shared.ctx(uid, gid, pid);
            if o.allow {
                again.approved = Some(o);
                let r = op(&core, &again);
                answer(&core, &again, reply, r);
            } else {
                // The refusal it would have had, audited with who ended it.
                core.shared.audit_ask(&again, &asked, Line::Outcome(o));
                answer(&core, &again, reply, Err(Error(libc::EACCES)));
            }
            drop(busy);
        });
        // A directory change's question may end after its caller was refused (its hold ran
        // out): that end is audited too.
        let late: Option<Resume> = request.retry.then(|| {
            let core = self.clone();
            let asked = ask.clone();
            Box::new(move |o: Outcome| {
                let again = core.shared.ctx(uid, gid, pid);
                core.shared.audit_ask(&again, &asked, Line::Outcome(o));
                if let Some((temp, target)) = &save_late {
                    core.shared.save_step(uid, temp, target, o, true);
                }
            }) as Resume
        });
        match self.shared.approvals.hold(request, resume, late) {
            Hold::Held(_) => self.shared.audit_ask(&ctx, &ask, Line::Held),
            Hold::Posted(_, resume) => {
                self.shared.audit_ask(&ctx, &ask, Line::Held);
                resume(Outcome::deny("dir-hold"));
            }
            Hold::Refused(resume, by) => resume(Outcome::deny(by)),
        }
    }
}
