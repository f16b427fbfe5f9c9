//! Extended attributes: getxattr, listxattr, setxattr, removexattr.
//!
//! Invariants: reading needs `read`, changing needs `write`; setting
//! `security.capability` counts as setting a set-ID bit (`allow_setid`); the other
//! `security.*` names and `trusted.*` are changed only for a caller with host privilege
//! (EPERM otherwise, after the policy, in every mode and with `--learn` too), and a
//! `trusted.*` name is read and listed only for such a caller (ENODATA, left out); names the mount
//! does not mirror are EOPNOTSUPP everywhere and left out of lists; only regular files and
//! directories carry attributes (symlinks and special files report none and accept none);
//! a change of `system.posix_acl_access`, which the host reflects in the mode's group
//! bits, drops the kernel's cached attributes of the node (the kernel keeps them
//! otherwise, and the watch skips the daemon's own changes).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::{Ctx, Error, Res, Shared};
use crate::fs::attr;
use crate::fs::kcache::Inval;
use crate::host::sys::{self, Xattr};
use crate::policy::{By, Need, Special};

/// The longest name list a `listxattr` can return (the kernel's `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 65_536;

impl Shared {
    /// On a staged mount served by the daemon: a name of the staging format's own
    /// (overlayfs's markers), which the merged view neither shows nor lets be set, as
    /// overlayfs answers (EOPNOTSUPP).
    fn staged_marker(&self, name: &[u8]) -> bool {
        attr::overlay_marker(name) && self.inodes.union().is_some()
    }

    fn xattr_target(&self, ino: u64) -> Res<(Arc<OwnedFd>, bool)> {
        // The node's type is fixed (a different type under the same number is a new node).
        let ok = matches!(self.inodes.kind(ino)?, libc::S_IFREG | libc::S_IFDIR);
        let fd = self.inodes.fd(ino)?;
        Ok((fd, ok))
    }

    /// getxattr: `read`. Symlinks and special files report no attributes; names the mount
    /// does not mirror ([`attr::unmirrored_xattr`]) are EOPNOTSUPP everywhere.
    pub fn do_getxattr(&self, ctx: &Ctx, ino: u64, name: &[u8], size: u32) -> Res<Xattr> {
        if attr::unmirrored_xattr(name) || self.staged_marker(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        self.allow_ino(ctx, "getxattr", ino, Need::Read, Special::default())?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok || (name.starts_with(b"trusted.") && !self.programs.host_admin(ctx.pid)) {
            return Err(Error(libc::ENODATA));
        }
        Ok(sys::getxattr_fd(fd.as_fd(), name, size as usize)?)
    }

    /// listxattr: `read`; the names the mount does not mirror are left out (so the whole
    /// list is read, at most `XATTR_LIST_MAX` bytes, and then sized for the caller).
    pub fn do_listxattr(&self, ctx: &Ctx, ino: u64, size: u32) -> Res<Xattr> {
        self.allow_ino(ctx, "listxattr", ino, Need::Read, Special::default())?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok {
            return Ok(Xattr::empty(size as usize));
        }
        let all = match sys::listxattr_fd(fd.as_fd(), XATTR_LIST_MAX)? {
            Xattr::Data(v) => v,
            Xattr::Size(_) => Vec::new(),
        };
        let mut list = attr::mirrored_xattr_list(&all);
        if self.inodes.union().is_some() {
            list = attr::without_markers(&list);
        }
        if list.windows(8).any(|w| w == b"trusted.") && !self.programs.host_admin(ctx.pid) {
            list = attr::without_trusted(&list);
        }
        match size as usize {
            0 => Ok(Xattr::Size(list.len())),
            n if n < list.len() => Err(Error(libc::ERANGE)),
            _ => Ok(Xattr::Data(list)),
        }
    }

    /// setxattr: `write`. Setting `security.capability` (file capabilities) counts as
    /// setting a set-ID bit: it needs `allow_setid`. The attribute lands on the host, where
    /// a capability (v3, with the caller's user namespace root as `rootid`) takes effect in
    /// every user namespace whose root is that host uid — outside the mount's `nosuid`.
    pub fn do_setxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Res<()> {
        if attr::unmirrored_xattr(name) || self.staged_marker(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        let sp = Special {
            device: false,
            setid: name == b"security.capability",
        };
        let need = self.mutate_need(ctx, ino);
        self.allow_ino(ctx, "setxattr", ino, need, sp)?;
        self.privileged(ctx, "setxattr", ino, name)?;
        let (_, ok) = self.xattr_target(ino)?;
        if !ok {
            return Err(Error(libc::EPERM));
        }
        let mut note = self.note_node(ino);
        let fd = self.for_change(ino, &mut note)?;
        sys::setxattr_fd(fd.as_fd(), name, value, flags)?;
        self.noted(note);
        self.acl_changed(ino, name);
        Ok(())
    }

    /// Refuses (EPERM, audited) a change of an attribute only host privilege may change
    /// ([`attr::privileged_xattr`]) by a caller without it (`Programs::host_admin`): root
    /// in a guest's kernel or in a user namespace is not root on the host, where the
    /// attribute lands.
    fn privileged(&self, ctx: &Ctx, op: &'static str, ino: u64, name: &[u8]) -> Res<()> {
        if !attr::privileged_xattr(name) || self.programs.host_admin(ctx.pid) {
            return Ok(());
        }
        if let Ok((paths, kind)) = self.inodes.paths_kind(ino)
            && let Some(p) = paths.first()
        {
            let v = ctx
                .snap
                .policy
                .verdict_for(p, ctx.caller, kind == libc::S_IFDIR);
            self.audit(ctx, op, p, &v, By::Mode, Some(libc::EPERM));
        }
        Err(Error(libc::EPERM))
    }

    /// An access ACL set or removed through the mount may have changed the mode (its
    /// mask is the group bits): the kernel's cached mode must go.
    fn acl_changed(&self, ino: u64, name: &[u8]) {
        if name == b"system.posix_acl_access" {
            self.kcache.send(Inval {
                inodes: vec![(ino, -1)],
                ..Inval::default()
            });
        }
    }

    /// removexattr: `write`.
    pub fn do_removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Res<()> {
        if attr::unmirrored_xattr(name) || self.staged_marker(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        let need = self.mutate_need(ctx, ino);
        self.allow_ino(ctx, "removexattr", ino, need, Special::default())?;
        self.privileged(ctx, "removexattr", ino, name)?;
        let (_, ok) = self.xattr_target(ino)?;
        if !ok {
            return Err(Error(libc::ENODATA));
        }
        let mut note = self.note_node(ino);
        let fd = self.for_change(ino, &mut note)?;
        sys::removexattr_fd(fd.as_fd(), name)?;
        self.noted(note);
        self.acl_changed(ino, name);
        Ok(())
    }
}
