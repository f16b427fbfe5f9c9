//! Atomic saves as one question, the file-system half (SPEC.md "Approvals": "An atomic
//! save is one question"; the names and bounds are in `approvals/saves.rs`).
//!
//! On a live mount with an approver connected, the create of a recognised temporary
//! sibling of an existing NAME (or a nameless `sedXXXXXX` / `tmpXXXXXXXX`) that an `ask`
//! rule would put to a person is made at once, *provisionally*: that uid's writes, mode
//! changes and removal of it pass unasked, and its rename over NAME is the one question
//! (op `save`, `write NAME`). Its end:
//!
//! - allowed while the caller waits: the rename runs, the file is an ordinary file;
//! - allowed after the caller was refused (the directory's hold ran out): the daemon lands
//!   the save itself — the temporary file renamed over NAME if it is still there, else
//!   the bytes it held (the daemon keeps a descriptor) copied byte-exact to a new sibling
//!   made as the caller and renamed over NAME — and the allow covers that uid's retry;
//! - denied, timed out, or never asked within [`TEMP_TTL`](saves::TEMP_TTL): the temporary
//!   file is removed from the host (only if that name is still the same file).
//!
//! Invariants: nothing here widens access: NAME is always asked for (or granted by the
//! policy or a remembered answer); a provisional file lifts only its creator's refusals on
//! its own path; every provisional file is either renamed by its creator, removed by its
//! creator, landed by an allow, or removed by the daemon — never a leftover; the table is
//! bounded (`approvals/saves.rs`). Staged mounts and `--learn` never make one.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::{Ctx, Error, Res, Shared};
use crate::approvals::saves::{self, Target, Temps};
use crate::approvals::{Outcome, Resume};
use crate::fs::kcache::Inval;
use crate::host::path::join;
use crate::host::sys::{self, Name};
use crate::policy::{Need, Special, Verdict};

/// What the daemon keeps of one provisional file.
pub struct Kept {
    /// Its node (as the kernel knows it).
    fuse_ino: u64,
    /// Its directory's node and its name there.
    parent: u64,
    name: Vec<u8>,
    /// The host file it is (a name reused by another file is never touched).
    dev: u64,
    ino: u64,
    /// Its creator (the landing's copy is made as it).
    caller: (u32, u32, u32),
    /// A descriptor of it: its bytes survive its creator's removal of the name.
    file: OwnedFd,
}

/// The provisional files of this mount, and how many there are (read without the lock
/// on every write: zero, the common case, costs one atomic load).
#[derive(Default)]
pub struct Saves {
    table: Mutex<Temps<Kept>>,
    live: AtomicUsize,
}

/// The table, locked; its count is refreshed when the guard goes.
pub struct Table<'a>(MutexGuard<'a, Temps<Kept>>, &'a AtomicUsize);

impl Drop for Table<'_> {
    fn drop(&mut self) {
        self.1.store(self.0.len(), Ordering::Release);
    }
}

impl std::ops::Deref for Table<'_> {
    type Target = Temps<Kept>;
    fn deref(&self) -> &Temps<Kept> {
        &self.0
    }
}

impl std::ops::DerefMut for Table<'_> {
    fn deref_mut(&mut self) -> &mut Temps<Kept> {
        &mut self.0
    }
}

impl Saves {
    fn lock(&self) -> Table<'_> {
        Table(self.table.lock(), &self.live)
    }

    /// Whether node `ino` is a provisional file: its size is capped
    /// ([`MAX_TEMP_BYTES`](saves::MAX_TEMP_BYTES)) and it is never a passthrough file.
    pub fn capped(&self, ino: u64) -> bool {
        self.any() && self.lock().any(|k| k.fuse_ino == ino)
    }

    /// Whether some file is provisional (or reserved by a create in flight), without the
    /// lock. A file is admitted before its create is answered, so a request that names it
    /// (its write, rename or unlink) always finds it counted.
    fn any(&self) -> bool {
        self.live.load(Ordering::Acquire) != 0
    }
}

/// How often the table is swept of expired files at the latest.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The parent path and the last component of a workspace path.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

impl Shared {
    /// Whether a create of `name` (`path`) in `parent` is made provisionally: the create
    /// would be asked, the name is a recognised temporary file (of an existing NAME whose
    /// write is granted or askable), there is room, and an approver could be asked about
    /// its rename. Then it is reserved and audited (`by: provisional`) and its verdict
    /// returned; the caller makes the file and reports it with [`Shared::provisional_made`].
    /// Without an `ask` rule in the policy no create is askable: nothing is decided here,
    /// so a create is decided once (the hot path).
    pub(super) fn provisional_create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &Name,
        path: &[u8],
        sp: Special,
    ) -> Option<Verdict> {
        if !ctx.snap.policy.has_asks()
            || self.learning()
            || self.bases.is_some()
            || sp.setid
            || ctx.approved.is_some()
            || !ctx.may_hold
        {
            return None;
        }
        let roots = self.inodes.roots();
        if !roots.is_empty() && (roots.fence_at(path).is_some() || roots.alias_of(path).is_some()) {
            return None;
        }
        let policy = &ctx.snap.policy;
        let d = policy
            .check_for(path, ctx.caller, Need::Create, sp, false)
            .err()?;
        d.askable(policy, Need::Create)?;
        if self.approvals.remembered(ctx.caller.uid, path) {
            return None;
        }
        // Someone to ask about the rename, or an answer already remembered for NAME.
        let mut answered = false;
        if let Target::Named(names) = saves::target(name.bytes()) {
            let (dir, _) = split(path);
            let found = names.iter().any(|n| {
                let regular = Name::new(n)
                    .and_then(|n| self.inodes.probe(parent, &n))
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
                let p = join(dir, n);
                answered |= regular && self.answered(ctx, &p);
                regular
                    && match policy.check_for(&p, ctx.caller, Need::Write, sp, false) {
                        Ok(_) => true,
                        Err(d) => d.askable(policy, Need::Write).is_some(),
                    }
            });
            if !found {
                return None;
            }
        } else if saves::target(name.bytes()) == Target::Not {
            return None;
        }
        if !answered && self.approvals.approvers() == 0 {
            return None;
        }
        let now = Instant::now();
        self.sweep_now(now);
        if !self.saves.lock().admit(ctx.caller.uid, path, now) {
            return None;
        }
        let o = Outcome {
            allow: true,
            by: "provisional",
            approver: None,
        };
        ctx.need.set(Some(Need::Create));
        self.audit_line(
            ctx,
            "create",
            path,
            &d.verdict,
            d.by,
            crate::fs::decide::Line::Outcome(o),
        );
        Some(d.verdict)
    }

    /// Whether a write of `path` by the caller is already answered yes: remembered, or
    /// allowed in the `--answers` file.
    fn answered(&self, ctx: &Ctx, path: &[u8]) -> bool {
        let uid = ctx.caller.uid;
        self.approvals.remembered(uid, path)
            || self
                .approvals
                .answers()
                .and_then(|f| f.lookup(uid, [(path, true)]))
                == Some(true)
    }

    /// The provisional file `path` was made (`file`: its open host file) or, `None`, its
    /// create failed.
    pub(super) fn provisional_made(
        &self,
        ctx: &Ctx,
        parent: u64,
        path: &[u8],
        file: Option<(u64, &OwnedFd)>,
    ) {
        let uid = ctx.caller.uid;
        let kept = file.and_then(|(fuse_ino, f)| {
            let st = sys::fstat(f.as_fd()).ok()?;
            Some(Kept {
                fuse_ino,
                parent,
                name: split(path).1.to_vec(),
                dev: st.st_dev,
                ino: st.st_ino,
                caller: (uid, ctx.caller.gid, ctx.pid),
                // Readable whatever the caller opened it for (a landing copies it).
                file: sys::reopen(self.inodes.proc_fd.as_fd(), f.as_fd(), libc::O_RDONLY).ok()?,
            })
        });
        let mut t = self.saves.lock();
        match kept {
            Some(k) => t.fill(uid, path, k),
            None => drop(t.take(uid, path)),
        }
    }

    /// EFBIG when node `ino` is a provisional file and `end` lies past its cap.
    pub(super) fn cap(&self, ino: u64, end: u64) -> Res<()> {
        if end > saves::MAX_TEMP_BYTES && self.saves.capped(ino) {
            return Err(Error(libc::EFBIG));
        }
        Ok(())
    }

    /// Whether the caller's refusals on `path` are lifted: its live provisional file.
    pub(crate) fn provisional(&self, ctx: &Ctx, path: &[u8]) -> bool {
        self.saves.any()
            && self
                .saves
                .lock()
                .covers(ctx.caller.uid, path, Instant::now())
    }

    /// The op a rename of `old` over `new` is asked as: `save` when `old` is the caller's
    /// provisional file and `new` an existing name in the same directory.
    pub(super) fn rename_op(
        &self,
        ctx: &Ctx,
        old: &[u8],
        new: &[u8],
        replaces: bool,
    ) -> &'static str {
        if replaces && split(old).0 == split(new).0 && self.provisional(ctx, old) {
            "save"
        } else {
            "rename"
        }
    }

    /// The caller renamed or removed `path`: unless its save question waits for an answer
    /// with its bytes, it is provisional no more.
    /// With no provisional file at all (the common case) it takes no lock.
    pub(super) fn provisional_gone(&self, ctx: &Ctx, path: &[u8], removed: bool) {
        if !self.saves.any() {
            return;
        }
        let mut t = self.saves.lock();
        if !(removed && t.is_parked(ctx.caller.uid, path)) {
            t.take(ctx.caller.uid, path);
        }
    }

    /// A step of save question `temp` → `target` of `uid` (`Core::serve_in`'s
    /// continuations): `late` is its end after the caller was refused.
    pub fn save_step(&self, uid: u32, temp: &[u8], target: &[u8], o: Outcome, late: bool) {
        if o.allow && !late {
            return; // the rename re-runs as approved
        }
        if !late && o.by == "dir-hold" {
            self.saves.lock().park(uid, temp, Instant::now());
            return;
        }
        let Some(kept) = self.saves.lock().take(uid, temp).and_then(|t| t.data) else {
            return;
        };
        if o.allow
            && let Err(e) = self.land(&kept, target)
        {
            log::warn!(
                "an allowed save of {} could not land: {e:?}",
                String::from_utf8_lossy(target)
            );
        }
        self.discard(kept, temp);
    }

    /// Lands an allowed save whose caller was already refused: the temporary file renamed
    /// over `target`, or its bytes copied to a new sibling renamed over it.
    fn land(&self, k: &Kept, target: &[u8]) -> Res<()> {
        let pfd = self.inodes.up_dir(k.parent)?;
        let tname = split(target).1;
        let to = Name::new(tname)?;
        let from = Name::new(&k.name)?;
        if self.same_file(k) {
            sys::renameat2(pfd.as_fd(), &from, pfd.as_fd(), &to, 0)?;
        } else {
            let st = sys::fstat(k.file.as_fd())?;
            let mut n = b".".to_vec();
            n.extend_from_slice(tname);
            n.extend_from_slice(format!(".fencefs-save.{}", k.ino).as_bytes());
            let copy = Name::new(&n)?;
            let (uid, gid, pid) = k.caller;
            let ctx = self.ctx(uid, gid, pid);
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
            let out = self.create_as_caller(&ctx, &pfd, &copy, false, || {
                sys::openat(pfd.as_fd(), &copy, flags, st.st_mode & 0o777)
            })?;
            let put = copy_all(&k.file, out)
                .and_then(|()| sys::renameat2(pfd.as_fd(), &copy, pfd.as_fd(), &to, 0));
            if let Err(e) = put {
                let _ = sys::unlinkat(pfd.as_fd(), &copy, 0);
                return Err(e.into());
            }
        }
        self.forget_names(k.parent, target, &[tname, &k.name]);
        Ok(())
    }

    /// Whether the provisional file's name is still that file on the host.
    fn same_file(&self, k: &Kept) -> bool {
        let Ok(pfd) = self.inodes.fd(k.parent) else {
            return false;
        };
        Name::new(&k.name)
            .and_then(|n| sys::fstatat_nofollow(pfd.as_fd(), &n))
            .is_ok_and(|st| (st.st_dev, st.st_ino) == (k.dev, k.ino))
    }

    /// Removes a provisional file from the host if its name is still that file.
    fn discard(&self, k: Kept, path: &[u8]) {
        if !self.same_file(&k) {
            return;
        }
        let Ok(pfd) = self.inodes.up_dir(k.parent) else {
            return;
        };
        if let Ok(n) = Name::new(&k.name)
            && sys::unlinkat(pfd.as_fd(), &n, 0).is_ok()
        {
            self.forget_names(k.parent, path, &[&k.name]);
        }
    }

    /// The daemon changed `names` in `parent` (beside `path`) on the host: the table and
    /// the kernel forget them.
    fn forget_names(&self, parent: u64, path: &[u8], names: &[&[u8]]) {
        let dir = split(path).0;
        for n in names {
            if self.inodes.child(parent, n).is_some() {
                self.inodes.remove_alias(parent, n, &join(dir, n), None);
            }
        }
        self.kcache.send(Inval {
            entries: names.iter().map(|n| (parent, n.to_vec())).collect(),
            ..Inval::default()
        });
    }

    /// Removes the expired provisional files now (on this thread).
    fn sweep_now(&self, now: Instant) {
        let due = self.saves.lock().due(now);
        for (_, path, kept) in due {
            if let Some(k) = kept {
                self.discard(k, &path);
            }
        }
    }
}

/// Copies every byte of `src` (from offset 0) to `out` and syncs it.
fn copy_all(src: &OwnedFd, out: OwnedFd) -> std::io::Result<()> {
    let src = File::from(src.try_clone()?);
    let mut out = File::from(out);
    let mut buf = vec![0u8; 1 << 16];
    let mut off = 0u64;
    loop {
        let n = src.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    out.sync_all()
}

/// The sweep the approvals table runs (`Approvals::set_sweep`): expired provisional files
/// are removed on the resume thread (which may reach the host).
pub fn sweeper(shared: Weak<Shared>) -> crate::approvals::Sweep {
    Box::new(move |now| {
        let Some(s) = shared.upgrade() else {
            return (Vec::new(), None);
        };
        let due = s.saves.lock().due(now);
        let next = s.saves.lock().next().unwrap_or(now + SWEEP_EVERY);
        let jobs = due
            .into_iter()
            .filter_map(|(_, path, kept)| {
                let k = kept?;
                let s: Arc<Shared> = s.clone();
                Some(Box::new(move |_: Outcome| s.discard(k, &path)) as Resume)
            })
            .collect();
        (jobs, Some(next.min(now + SWEEP_EVERY)))
    })
}
